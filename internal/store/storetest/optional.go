package storetest

import (
	"cmp"
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gorm-outbox/outbox/internal/errs"
	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// wait bounds how long a check waits for something another goroutine or
// the database does: a timeout, never a pause.
const wait = 10 * time.Second

func testNotifier(t *testing.T, su *suite) {
	t.Run("NotifyWakesListener", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		var n store.Notifier = e.s
		ch := n.Channel()
		assert.NotEmpty(t, ch)
		assert.LessOrEqual(t, len(ch), 63, "the channel name fits PostgreSQL's identifiers")

		conn, err := e.db.Conn(e.ctx)
		require.NoError(t, err)
		defer func() { _ = conn.Close() }()
		ctx, cancel := context.WithCancel(e.ctx)
		defer cancel()
		ready := make(chan struct{})
		woke := make(chan struct{}, 16)
		done := make(chan error, 1)
		go func() {
			done <- n.Listen(ctx, conn, func() { close(ready) }, func() { woke <- struct{}{} })
		}()
		select {
		case <-ready:
		case err := <-done:
			require.FailNow(t, "Listen returned before it was ready", "%v", err)
		case <-time.After(wait):
			require.FailNow(t, "Listen never called ready")
		}

		// From another connection of the pool, and from a transaction
		// once it commits.
		notify, err := n.PrepareNotify(e.ctx, e.db)
		require.NoError(t, err)
		require.NoError(t, notify(e.ctx, e.db))
		select {
		case <-woke:
		case err := <-done:
			require.FailNow(t, "Listen returned instead of waking", "%v", err)
		case <-time.After(wait):
			require.FailNow(t, "Notify did not wake the listener")
		}
		tx, err := e.db.BeginTx(e.ctx, nil)
		require.NoError(t, err)
		require.NoError(t, notify(e.ctx, tx))
		require.NoError(t, tx.Commit())
		select {
		case <-woke:
		case <-time.After(wait):
			require.FailNow(t, "Notify in a committed transaction did not wake the listener")
		}

		// Listen ends with its context.
		cancel()
		select {
		case err := <-done:
			assert.ErrorIs(t, err, context.Canceled)
		case <-time.After(wait):
			require.FailNow(t, "Listen did not return when its context ended")
		}
	})
}

func testLogical(t *testing.T, su *suite) {
	t.Run("Park", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		lease := now.Add(time.Minute)
		p3 := ev("p-3")
		p3.Key = "k-3"
		rows := []store.ParkRow{
			{Event: full("p-2"), Status: "pending", Attempts: 1, Due: lease, Lease: lease, Created: now.Add(-3 * time.Second)},
			{Event: ev("p-1"), Status: "failed", Attempts: 1, LastErr: "boom", Due: now.Add(time.Hour), Created: now.Add(-2 * time.Second)},
			{Event: p3, Status: "pending", Due: now, Created: now.Add(-time.Second)},
		}
		at := now.Add(time.Second)
		assert.ElementsMatch(t, []string{"p-2", "p-1", "p-3"}, e.parked(rows, at))
		assert.Equal(t, []string{"p-2", "p-1", "p-3"}, e.list(store.Page{Limit: 10}), "seq follows the order given")

		for _, c := range []struct {
			row     store.ParkRow
			lastErr string
		}{{rows[0], ""}, {rows[1], "boom"}, {rows[2], ""}} {
			id := c.row.Event.ID
			r := e.get(id)
			assert.Equal(t, c.row.Status, r.Status, id)
			assert.Equal(t, c.row.Attempts, r.Attempts, id)
			assert.Equal(t, c.row.Event.Key, r.Key, id)
			assert.Equal(t, c.row.Event.Type, r.EventType, id)
			assert.Equal(t, c.row.Event.AggregateID, r.AggregateID, id)
			assert.JSONEq(t, string(c.row.Event.Payload), r.Payload, id)
			if c.row.Event.Headers == nil {
				assert.Nil(t, r.Headers, id)
			} else if assert.NotNil(t, r.Headers, id) {
				assert.JSONEq(t, string(c.row.Event.Headers), *r.Headers, id)
			}
			if c.lastErr == "" {
				assert.Nil(t, r.LastError, id)
			} else if assert.NotNil(t, r.LastError, id) {
				assert.Equal(t, c.lastErr, *r.LastError, id)
			}
			sameTime(t, c.row.Due, r.AvailableAt, "available_at of %s", id)
			sameTimePtr(t, c.row.Lease, r.LockedUntil, "locked_until of %s", id)
			sameTime(t, c.row.Event.OccurredAt, r.OccurredAt, "occurred_at of %s", id)
			sameTime(t, c.row.Created, r.CreatedAt, "created_at of %s", id)
			sameTime(t, at, r.UpdatedAt, "updated_at of %s", id)
		}

		// A row whose ID or key is in the table already is skipped.
		sameID := ev("p-1")
		sameID.Key = "other"
		sameKey := ev("p-9")
		sameKey.Key = "k-3"
		again := []store.ParkRow{
			{Event: sameID, Status: "pending", Due: now, Created: now},
			{Event: sameKey, Status: "pending", Due: now, Created: now},
			{Event: ev("p-4"), Status: "pending", Due: now, Created: now},
		}
		assert.Equal(t, []string{"p-4"}, e.parked(again, at))
		assert.Equal(t, "failed", e.get("p-1").Status, "the first write wins")
		assert.EqualValues(t, 4, e.rows())

		// A parked event's ID is in named_id, whoever chose it: a generated
		// event the stream offers again is skipped.
		g := generated()
		assert.Equal(t, []string{g.ID}, e.parked([]store.ParkRow{{Event: g, Status: "pending", Due: now, Created: now}}, at))
		named, ok := e.namedID(e.get(g.ID).Seq)
		assert.True(t, ok, "a parked generated ID is in named_id")
		assert.Equal(t, g.ID, named)
		assert.Equal(t, hexOf(uuid.MustParse(g.ID)), e.idColumn(e.get(g.ID).Seq), "the id column is the UUID")
		assert.Empty(t, e.parked([]store.ParkRow{{Event: g, Status: "pending", Due: now, Created: now}}, at), "the same generated event parked again")
		assert.Equal(t, hexOf(store.RowID("p-2")), e.idColumn(e.get("p-2").Seq), "the id column of a named ID")
		assert.True(t, e.nulls(e.get("p-1").Seq)["idempotency_key"], "a key that is the ID is NULL")
		assert.EqualValues(t, 5, e.rows())

		// Parked rows wait in the retry index (they have their due time):
		// the watermark does not hide them.
		if e.walker() != nil {
			_, high := e.lowOpen()
			got := e.claimIDs(store.ClaimSpec{Now: now.Add(2 * time.Hour), Lease: now.Add(3 * time.Hour), Limit: 10, From: high + 1})
			assert.ElementsMatch(t, []string{"p-2", "p-3", "p-4", g.ID}, got, "the parked pending rows, due, whatever From")
			for _, r := range e.walk(0, 100, nil, now) {
				assert.False(t, r.Open, "a parked row is not a new row: seq %d", r.Seq)
			}
		}
		assert.Empty(t, e.parked(nil, at), "Park of no rows")
	})

	t.Run("Blocked", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		lg := e.logical()
		e.insert(now,
			agg("a1-1", "A", "1"), agg("a1-2", "A", "1"), // pending
			agg("a2-1", "A", "2"), // sent
			agg("b1-1", "B", "1"), // failed
			agg("b2-1", "B", "2"), // pending
		)
		e.sent(now, "a2-1")
		e.failed(now, "x", "b1-1")
		blocked := func(types, ids []string) map[store.Aggregate]bool {
			t.Helper()
			aggs := make([]store.Aggregate, len(types))
			for i := range types {
				aggs[i] = store.Aggregate{Type: types[i], ID: ids[i]}
			}
			got, err := lg.Blocked(e.ctx, e.db, aggs)
			require.NoError(t, err)
			for a, b := range got {
				assert.True(t, b, "Blocked holds only the blocked aggregates: %v", a)
			}
			return got
		}
		assert.Equal(t, map[store.Aggregate]bool{{Type: "A", ID: "1"}: true, {Type: "B", ID: "1"}: true},
			blocked([]string{"A", "A", "B", "C"}, []string{"1", "2", "1", "1"}), "the aggregates with an unsent row")
		assert.Empty(t, blocked([]string{"A", "B"}, []string{"2", "3"}), "pairwise: (A,2) is sent and (B,3) has no row")
		assert.Empty(t, blocked([]string{"B", "A"}, []string{"3", "3"}))
		assert.Empty(t, blocked(nil, nil), "no aggregates")
	})

	t.Run("Slots", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		lg := e.logical()
		// CheckLogical passes, or names what to change.
		logicalErr := lg.CheckLogical(e.ctx, e.db)
		if logicalErr != nil {
			assert.ErrorIs(t, logicalErr, errs.ErrServerSetting, "the shared server runs with wal_level=replica")
			t.Logf("CheckLogical: %v", logicalErr)
		}
		const missing = "no_such_slot"
		_, err := lg.SlotStats(e.ctx, e.db, missing)
		assert.ErrorIs(t, err, errs.ErrNoSlot, "SlotStats of a missing slot")
		held, err := lg.SlotHeldBy(e.ctx, e.db, missing, 1)
		require.NoError(t, err)
		assert.False(t, held)
		emitted, err := lg.Emit(e.ctx, e.db, missing, "outbox", []byte(`{"id":"x"}`))
		require.NoError(t, err)
		assert.False(t, emitted, "Emit without the slot")
		pos, err := lg.WALPosition(e.ctx, e.db)
		require.NoError(t, err)
		assert.NotZero(t, pos, "the flushed WAL position")
		require.EqualValues(t, 1, e.insert(now, ev("moves-the-wal")))
		later, err := lg.WALPosition(e.ctx, e.db)
		require.NoError(t, err)
		assert.GreaterOrEqual(t, later, pos, "the flushed WAL position does not go back")

		// CreateSlot: on a server that decodes its WAL it creates the slot
		// (ExerciseSlots checks the rest); on one that cannot, it fails and
		// leaves no slot. Slots belong to the cluster, publications to the
		// database: both are dropped.
		slot := randomSlot()
		t.Cleanup(func() { dropSlot(e.db, slot) })
		logger := slog.New(slog.DiscardHandler)
		replaced, err := lg.CreateSlot(e.ctx, e.db, slot, logger)
		if logicalErr != nil {
			assert.Error(t, err, "CreateSlot on a server that cannot decode its WAL")
			_, err = lg.SlotStats(e.ctx, e.db, slot)
			assert.ErrorIs(t, err, errs.ErrNoSlot, "CreateSlot that failed leaves no slot")
			return
		}
		require.NoError(t, err)
		assert.False(t, replaced, "a first slot replaces none")
		st, err := lg.SlotStats(e.ctx, e.db, slot)
		require.NoError(t, err)
		assert.False(t, st.Active, "nobody streams the new slot")
	})
}

// randomSlot is a fresh replication slot (and publication) name.
func randomSlot() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return "storetest_" + hex.EncodeToString(b)
}

// dropSlot drops the slot and the publication named name, if they exist,
// on a fresh context (the test's has ended by cleanup).
func dropSlot(db *sql.DB, name string) {
	_, _ = db.Exec("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = '" + name + "'")
	_, _ = db.Exec(`DROP PUBLICATION IF EXISTS "` + name + `"`)
}

// parked runs Park and returns the IDs it inserted, by seq, each checked
// against the seq it returned.
func (e *env) parked(rows []store.ParkRow, at time.Time) []string {
	e.t.Helper()
	got, err := e.logical().Park(e.ctx, e.db, rows, at)
	require.NoError(e.t, err, "Park of %d rows", len(rows))
	type parked struct {
		id  string
		seq int64
	}
	var out []parked
	for id, seq := range got {
		out = append(out, parked{id, seq})
	}
	slices.SortFunc(out, func(a, b parked) int { return cmp.Compare(a.seq, b.seq) })
	ids := make([]string, len(out))
	seqs := make([]int64, len(out))
	for i, p := range out {
		ids[i], seqs[i] = p.id, p.seq
	}
	if len(seqs) > 0 {
		assert.Equal(e.t, ids, e.idsAt(seqs), "Park returns each inserted row's seq by its ID")
	}
	return ids
}

func testReplicas(t *testing.T, su *suite) {
	t.Run("Positions", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		var r store.Replicas = e.s
		pos, err := r.WALInsertPosition(e.ctx, e.db)
		require.NoError(t, err)
		require.Regexp(t, `^[0-9A-F]+/[0-9A-F]+$`, pos, "a WAL position")
		n, err := r.ReplicasFlushed(e.ctx, e.db, pos)
		require.NoError(t, err)
		assert.Zero(t, n, "no standby streams from the test's server")
		n, err = r.ReplicasFlushed(e.ctx, e.db, "0/0")
		require.NoError(t, err)
		assert.Zero(t, n, "no standby at all")

		// A commit moves the write position on; a transaction reads it too.
		require.EqualValues(t, 1, e.insert(now, ev("moves-the-wal")))
		tx, err := e.db.BeginTx(e.ctx, nil)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback() }()
		later, err := r.WALInsertPosition(e.ctx, tx)
		require.NoError(t, err)
		assert.Greater(t, lsn(t, later), lsn(t, pos), "the write position after a commit")
	})
}

// lsn is a WAL position's number.
func lsn(t *testing.T, pos string) uint64 {
	t.Helper()
	var hi, lo uint64
	_, err := fmt.Sscanf(pos, "%X/%X", &hi, &lo)
	require.NoError(t, err, "WAL position %q", pos)
	return hi<<32 | lo
}
