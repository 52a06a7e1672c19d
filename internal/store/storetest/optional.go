package storetest

import (
	"context"
	"database/sql"
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

func testNotifier(t *testing.T, open Open) {
	t.Run("NotifyWakesListener", func(t *testing.T) {
		t.Parallel()
		e := setup(t, open)
		n := e.s.(store.Notifier)
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
		notify, err := n.NotifySQL(e.ctx, e.db)
		require.NoError(t, err)
		_, err = e.db.ExecContext(e.ctx, notify)
		require.NoError(t, err)
		select {
		case <-woke:
		case err := <-done:
			require.FailNow(t, "Listen returned instead of waking", "%v", err)
		case <-time.After(wait):
			require.FailNow(t, "Notify did not wake the listener")
		}
		tx, err := e.db.BeginTx(e.ctx, nil)
		require.NoError(t, err)
		_, err = tx.ExecContext(e.ctx, notify)
		require.NoError(t, err)
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

func testLogical(t *testing.T, open Open) {
	t.Run("Park", func(t *testing.T) {
		t.Parallel()
		e := setup(t, open)
		lg := e.s.(store.Logical)
		lease := now.Add(time.Minute)
		p3 := ev("p-3")
		p3.Key = "k-3"
		rows := []store.ParkRow{
			{Event: full("p-2"), Status: "pending", Attempts: 1, Due: lease, Lease: lease, Created: now.Add(-3 * time.Second)},
			{Event: ev("p-1"), Status: "failed", Attempts: 1, LastErr: "boom", Due: now.Add(time.Hour), Created: now.Add(-2 * time.Second)},
			{Event: p3, Status: "pending", Due: now, Created: now.Add(-time.Second)},
		}
		at := now.Add(time.Second)
		assert.ElementsMatch(t, []string{"p-2", "p-1", "p-3"}, e.parked(lg.Park(rows, at)))
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
			lease, _ := c.row.Lease.(time.Time)
			sameTimePtr(t, lease, r.LockedUntil, "locked_until of %s", id)
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
		assert.Equal(t, []string{"p-4"}, e.parked(lg.Park(again, at)))
		assert.Equal(t, "failed", e.get("p-1").Status, "the first write wins")
		assert.EqualValues(t, 4, e.rows())

		// A parked event's ID is in named_id, whoever chose it: a generated
		// event the stream offers again is skipped.
		g := generated()
		assert.Equal(t, []string{g.ID}, e.parked(lg.Park([]store.ParkRow{{Event: g, Status: "pending", Due: now, Created: now}}, at)))
		named, ok := e.namedID(e.get(g.ID).Seq)
		assert.True(t, ok, "a parked generated ID is in named_id")
		assert.Equal(t, g.ID, named)
		assert.Equal(t, hexOf(uuid.MustParse(g.ID)), e.idColumn(e.get(g.ID).Seq), "the id column is the UUID")
		assert.Empty(t, e.parked(lg.Park([]store.ParkRow{{Event: g, Status: "pending", Due: now, Created: now}}, at)), "the same generated event parked again")
		assert.Equal(t, hexOf(store.RowID("p-2")), e.idColumn(e.get("p-2").Seq), "the id column of a named ID")
		assert.True(t, e.nulls(e.get("p-1").Seq)["idempotency_key"], "a key that is the ID is NULL")
		assert.EqualValues(t, 5, e.rows())

		// Parked rows wait in the retry index (they have their due time):
		// the watermark does not hide them.
		if w := e.walker(); w != nil {
			_, high := e.lowOpen()
			got := e.claimIDs(store.ClaimSpec{Now: now.Add(2 * time.Hour), Lease: now.Add(3 * time.Hour), Limit: 10, From: high.Int64 + 1})
			assert.ElementsMatch(t, []string{"p-2", "p-3", "p-4", g.ID}, got, "the parked pending rows, due, whatever From")
			for _, r := range e.walk(w.Walk(0, 100, nil, now)) {
				assert.False(t, r.Open, "a parked row is not a new row: seq %d", r.Seq)
			}
		}

		// InsertRows rows in one statement (Logical mode parks in chunks of it).
		n := e.s.Limits().InsertRows
		many := make([]store.ParkRow, n)
		for i, id := range ids("m", n) {
			many[i] = store.ParkRow{Event: ev(id), Status: "pending", Attempts: 1, LastErr: "x", Due: now, Lease: lease, Created: now}
		}
		assert.Len(t, e.parked(lg.Park(many, at)), n)
	})

	t.Run("Blocked", func(t *testing.T) {
		t.Parallel()
		e := setup(t, open)
		lg := e.s.(store.Logical)
		e.insert(now,
			agg("a1-1", "A", "1"), agg("a1-2", "A", "1"), // pending
			agg("a2-1", "A", "2"), // sent
			agg("b1-1", "B", "1"), // failed
			agg("b2-1", "B", "2"), // pending
		)
		e.sent(now, "a2-1")
		e.failed(now, "x", "b1-1")
		blocked := func(types, ids []string) [][2]string {
			t.Helper()
			q := lg.Blocked(types, ids)
			rs, err := e.db.QueryContext(e.ctx, q.SQL, q.Args...)
			require.NoError(t, err, "%s", q.SQL)
			defer rs.Close()
			var out [][2]string
			for rs.Next() {
				var k [2]string
				require.NoError(t, rs.Scan(&k[0], &k[1]))
				out = append(out, k)
			}
			require.NoError(t, rs.Err())
			return out
		}
		assert.ElementsMatch(t, [][2]string{{"A", "1"}, {"B", "1"}},
			blocked([]string{"A", "A", "B", "C"}, []string{"1", "2", "1", "1"}), "the aggregates with an unsent row, once each")
		assert.Empty(t, blocked([]string{"A", "B"}, []string{"2", "3"}), "pairwise: (A,2) is sent and (B,3) has no row")
		assert.Empty(t, blocked([]string{"B", "A"}, []string{"3", "3"}))
	})

	t.Run("Slots", func(t *testing.T) {
		t.Parallel()
		e := setup(t, open)
		lg := e.s.(store.Logical)
		// CheckLogical passes, or names what to change.
		if err := lg.CheckLogical(e.ctx, e.db); err != nil {
			assert.ErrorIs(t, err, errs.ErrServerSetting, "the shared server runs with wal_level=replica")
			t.Logf("CheckLogical: %v", err)
		}
		const slot = "no_such_slot"
		var (
			active bool
			lag    int64
		)
		q := lg.SlotStats(slot)
		assert.ErrorIs(t, e.db.QueryRowContext(e.ctx, q.SQL, q.Args...).Scan(&active, &lag), sql.ErrNoRows, "SlotStats of a missing slot")
		var held bool
		q = lg.SlotHeldBy(slot, 1)
		require.NoError(t, e.db.QueryRowContext(e.ctx, q.SQL, q.Args...).Scan(&held))
		assert.False(t, held)
		emitted, err := lg.Emit(e.ctx, e.db, slot, "outbox", []byte(`{"id":"x"}`))
		require.NoError(t, err)
		assert.False(t, emitted, "Emit without the slot")
		var pos string
		q = lg.WALPosition()
		require.NoError(t, e.db.QueryRowContext(e.ctx, q.SQL, q.Args...).Scan(&pos))
		assert.NotEmpty(t, pos)
		var timeout string
		require.NoError(t, e.db.QueryRowContext(e.ctx, lg.SessionTimeout()).Scan(&timeout))
		assert.NotEmpty(t, timeout)
	})
}

// parked runs a Park statement and returns the IDs it inserted, each
// checked against the seq it returned.
func (e *env) parked(q store.Query) []string {
	e.t.Helper()
	rs, err := e.db.QueryContext(e.ctx, q.SQL, q.Args...)
	require.NoError(e.t, err, "%.200s", q.SQL)
	var (
		out  []string
		seqs []int64
	)
	for rs.Next() {
		var (
			seq int64
			id  string
		)
		require.NoError(e.t, rs.Scan(&seq, &id))
		out, seqs = append(out, id), append(seqs, seq)
	}
	require.NoError(e.t, rs.Err())
	require.NoError(e.t, rs.Close())
	if len(seqs) > 0 {
		assert.Equal(e.t, out, e.idsAt(seqs), "Park returns each inserted row's seq and ID")
	}
	return out
}
