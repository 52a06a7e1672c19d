package storetest

import (
	"database/sql"
	"encoding/hex"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// key is what Held reads of one row.
type key struct {
	Key     string
	Created time.Time
}

// keysOf runs Held of ids alone.
func (e *env) keysOf(ids ...string) map[string]key {
	e.t.Helper()
	held, err := e.s.Held(e.ctx, e.db, ids, nil)
	require.NoError(e.t, err, "Held of %d IDs", len(ids))
	out := make(map[string]key, len(held))
	for id, h := range held {
		out[id] = key{h.Key, h.Created}
	}
	return out
}

// keysByKey runs Held of keys alone.
func (e *env) keysByKey(keys ...string) map[string]key {
	e.t.Helper()
	held, err := e.s.Held(e.ctx, e.db, nil, keys)
	require.NoError(e.t, err, "Held of %d keys", len(keys))
	out := make(map[string]key, len(held))
	for id, h := range held {
		out[id] = key{h.Key, h.Created}
	}
	return out
}

// full is an event with every field set, its occurrence time in another
// zone than UTC.
func full(id string) store.Event {
	return store.Event{
		ID: id, Type: "order.paid", AggregateType: "order", AggregateID: "42", Key: "pay-" + id, NamedID: true,
		Payload:    []byte(`{"amount":12.5,"items":["a","b"],"note":"ünïcødé \"quoted\""}`),
		Headers:    []byte(`{"trace":"abc","tenant":"t-1"}`),
		OccurredAt: now.Add(-90 * time.Second).In(time.FixedZone("UTC+5", 5*3600)),
	}
}

func testWriter(t *testing.T, su *suite) {
	t.Run("InsertRoundTrip", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		f, bare := full("e-1"), ev("e-2")
		require.EqualValues(t, 2, e.insert(now, f, bare))

		r := e.get("e-1")
		assert.Positive(t, r.Seq)
		assert.Equal(t, f.ID, r.ID)
		assert.Equal(t, f.Type, r.EventType)
		assert.Equal(t, f.AggregateType, r.AggregateType)
		assert.Equal(t, f.AggregateID, r.AggregateID)
		assert.Equal(t, f.Key, r.Key)
		assert.JSONEq(t, string(f.Payload), r.Payload)
		if assert.NotNil(t, r.Headers) {
			assert.JSONEq(t, string(f.Headers), *r.Headers)
		}
		// Written as pending, never attempted, due now.
		assert.Equal(t, "pending", r.Status)
		assert.Equal(t, 0, r.Attempts)
		assert.Nil(t, r.LastError)
		assert.Nil(t, r.LockedUntil)
		assert.Nil(t, r.SentAt)
		sameTime(t, now, r.AvailableAt, "available_at")
		sameTime(t, now, r.CreatedAt, "created_at")
		sameTime(t, now, r.UpdatedAt, "updated_at")
		sameTime(t, f.OccurredAt, r.OccurredAt, "occurred_at written from another zone")

		b := e.get("e-2")
		assert.Nil(t, b.Headers, "no headers: NULL")
		assert.Empty(t, b.AggregateType)
		assert.Empty(t, b.AggregateID)
		assert.Greater(t, b.Seq, r.Seq, "the rows of one INSERT are numbered in their order")

		// Held: id, key and the created_at the INSERT wrote; by a chosen
		// key too, under the row's ID.
		assert.Equal(t, map[string]key{"e-1": {f.Key, now}, "e-2": {"e-2", now}}, e.keysOf("e-1", "e-2", "missing"))
		assert.Equal(t, map[string]key{"e-1": {f.Key, now}}, e.keysByKey(f.Key, "missing"))
		held, err := e.s.Held(e.ctx, e.db, []string{"e-2"}, []string{f.Key})
		require.NoError(t, err)
		assert.Len(t, held, 2, "Held of IDs and keys at once")
	})

	t.Run("GeneratedWithoutConflictClause", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		g := generated()
		require.EqualValues(t, 1, e.insert(now, g))
		// A generated ID cannot repeat, so it enters no unique index: should
		// one ever repeat, two rows hold it (the event is delivered twice, at
		// least once as always).
		assert.EqualValues(t, 1, e.insert(now, g), "a repeated generated ID is written again: no index holds it")
		assert.EqualValues(t, 2, e.rows())
		// And a statement of generated rows has no clause to skip a
		// duplicate: an event marked generated whose key is taken (which
		// Publish never writes) fails the INSERT rather than being skipped.
		taken := ev("taken")
		taken.Key = "k-taken"
		require.EqualValues(t, 1, e.insert(now, taken))
		clash := generated()
		clash.Key = "k-taken"
		_, err := e.tryInsert(now, clash)
		assert.Error(t, err, "an INSERT of generated rows must carry no conflict clause")
		// One caller-named row keeps the clause for the whole statement.
		assert.EqualValues(t, 1, e.insert(now, clash, ev("named")), "the clashing row skipped, the named row written")
		assert.EqualValues(t, 4, e.rows())
	})

	// Publish asks for the seqs only with DeliverAfterCommit: without, the
	// statement returns no rows, and its row count still tells how many
	// rows it wrote (a chosen ID or key already taken skipped).
	t.Run("InsertWithoutSeqs", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		first := ev("w-1")
		first.Key = "k-w-1"
		rows := []store.Event{generated(), generated(), first}
		got, err := e.s.Insert(e.ctx, e.db, rows, now, false)
		require.NoError(t, err)
		assert.Nil(t, got.Seqs, "an Insert not asked for its seqs returns none")
		assert.Equal(t, 3, got.Written)
		assert.EqualValues(t, 3, e.rows())

		again := ev("w-1")
		again.Key = "k-w-1"
		other := ev("w-2")
		got, err = e.s.Insert(e.ctx, e.db, []store.Event{again, other, generated()}, now, false)
		require.NoError(t, err)
		assert.Nil(t, got.Seqs)
		assert.Equal(t, 2, got.Written, "the taken ID skipped, the other two written")
		assert.EqualValues(t, 5, e.rows())
	})

	t.Run("DuplicatesSkipped", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		first := ev("x")
		first.Key, first.Type = "kx", "first"
		require.EqualValues(t, 1, e.insert(now, first))

		later := now.Add(time.Minute)
		sameID := ev("x")
		sameID.Key, sameID.Type = "other", "second"
		sameKey := ev("y")
		sameKey.Key, sameKey.Type = "kx", "second"
		n := e.insert(later, sameID, sameKey, ev("z"), ev("z"))
		assert.EqualValues(t, 1, n, "a duplicate ID, a duplicate key and the same event twice in one statement are skipped")

		// The first write wins.
		x := e.get("x")
		assert.Equal(t, "first", x.EventType)
		assert.Equal(t, "kx", x.Key)
		sameTime(t, now, x.CreatedAt, "created_at of the first write")
		_, ok := e.find("y")
		assert.False(t, ok, "the event with a taken key is not written")
		assert.EqualValues(t, 2, e.rows())
		assert.EqualValues(t, 0, e.insert(later, ev("z")), "a default event (its key its ID) again")

		// created_at tells the rows this INSERT wrote from older ones.
		assert.Equal(t, map[string]key{"x": {"kx", now}, "z": {"z", later}}, e.keysOf("x", "y", "z"))
	})

	// Schema version 3's lean row: a generated event leaves NULL every
	// column another column gives, and reads back as if they were written.
	t.Run("LeanGenerated", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		g := generated()
		g.OccurredAt = now
		require.EqualValues(t, 1, e.insert(now, g))
		r := e.get(g.ID)
		nulls := e.nulls(r.Seq)
		assert.True(t, nulls["named_id"], "a generated ID is not in named_id")
		assert.True(t, nulls["idempotency_key"], "a key that is the ID is NULL")
		assert.True(t, nulls["created_at"], "created_at is NULL when the event occurred at the INSERT's time")
		assert.True(t, nulls["updated_at"], "updated_at is NULL until the row changes")
		assert.Equal(t, e.walker() != nil, nulls["available_at"], "available_at is NULL (due at once) exactly where the store walks new rows by seq")
		assert.Equal(t, hexOf(uuid.MustParse(g.ID)), e.idColumn(r.Seq), "the id column holds the generated UUID")

		check := func(r store.Row, how string) {
			t.Helper()
			assert.Equal(t, g.ID, r.ID, how)
			assert.Equal(t, g.ID, r.Key, "%s: the key is the ID", how)
			assert.Equal(t, "pending", r.Status, how)
			sameTime(t, now, r.OccurredAt, "%s: occurred_at", how)
			sameTime(t, now, r.CreatedAt, "%s: created_at is occurred_at", how)
			sameTime(t, now, r.UpdatedAt, "%s: updated_at is created_at", how)
			sameTime(t, now, r.AvailableAt, "%s: available_at is created_at", how)
		}
		check(r, "Get")
		byID := store.Filter{IDs: []string{g.ID}}
		rows := e.listOn(e.db, store.Page{Filter: byID, Limit: 10})
		if assert.Len(t, rows, 1, "List by the generated ID") {
			check(rows[0], "List")
		}
		assert.EqualValues(t, 1, e.countOf(byID), "Count by the generated ID")
		assert.Equal(t, []string{g.ID}, e.purged(byID), "Purge by the generated ID")
		assert.Empty(t, e.keysOf(g.ID), "Held of IDs finds only IDs the publisher chose: a generated one is held by no other row")

		got := e.claim(store.ClaimSpec{Now: now, Lease: now.Add(time.Minute), Limit: 10})
		require.Len(t, got, 1)
		c := got[0]
		assert.Equal(t, r.Seq, c.Seq)
		assert.Equal(t, g.ID, c.ID)
		assert.Equal(t, g.ID, c.Key)
		sameTime(t, now, c.OccurredAt, "claimed occurred_at")
		sameTime(t, now, c.CreatedAt, "claimed created_at is occurred_at")

		// An event that occurred before the INSERT has its created_at.
		g2 := generated()
		require.EqualValues(t, 1, e.insert(now, g2))
		r2 := e.get(g2.ID)
		assert.False(t, e.nulls(r2.Seq)["created_at"], "created_at written when it is not occurred_at")
		sameTime(t, now, r2.CreatedAt, "created_at")
		sameTime(t, now, r2.AvailableAt, "available_at is created_at")
		sameTime(t, g2.OccurredAt, r2.OccurredAt, "occurred_at")
		got = e.claim(store.ClaimSpec{Now: now, Lease: now.Add(time.Minute), Limit: 10})
		require.Len(t, got, 1)
		assert.Equal(t, g2.ID, got[0].ID)
		sameTime(t, now, got[0].CreatedAt, "claimed created_at")
	})

	// A generated ID with a key the publisher chose: the key is unique, the
	// ID in no index.
	t.Run("GeneratedIDChosenKey", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		k := generated()
		k.Generated, k.Key = false, "k-1"
		require.EqualValues(t, 1, e.insert(now, k))
		r := e.get(k.ID)
		assert.Equal(t, k.ID, r.ID)
		assert.Equal(t, "k-1", r.Key)
		nulls := e.nulls(r.Seq)
		assert.True(t, nulls["named_id"], "a generated ID is not in named_id")
		assert.False(t, nulls["idempotency_key"], "a key of its own is written")
		other := generated()
		other.Generated, other.Key = false, "k-1"
		assert.EqualValues(t, 0, e.insert(now, other), "another event with the key is skipped")
		assert.EqualValues(t, 1, e.rows())
		assert.Empty(t, e.keysOf(k.ID), "Held of IDs finds only IDs the publisher chose")
		assert.Equal(t, map[string]key{k.ID: {"k-1", now}}, e.keysByKey("k-1", "k-2"), "Held of keys finds the row of a generated ID by its chosen key")
		got := e.claim(store.ClaimSpec{Now: now, Lease: now.Add(time.Minute), Limit: 10})
		require.Len(t, got, 1)
		assert.Equal(t, k.ID, got[0].ID)
		assert.Equal(t, "k-1", got[0].Key)
	})

	// An ID the publisher chose that is no UUID: kept in named_id, the id
	// column derived from it (store.RowID).
	t.Run("NamedID", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		o := ev("order-42")
		require.EqualValues(t, 1, e.insert(now, o))
		r := e.get("order-42")
		assert.Equal(t, "order-42", r.ID)
		assert.Equal(t, "order-42", r.Key)
		named, ok := e.namedID(r.Seq)
		assert.True(t, ok, "named_id is written")
		assert.Equal(t, "order-42", named)
		nulls := e.nulls(r.Seq)
		assert.True(t, nulls["idempotency_key"], "a key that is the ID is NULL")
		assert.Equal(t, hexOf(store.RowID("order-42")), e.idColumn(r.Seq), "the id column is the UUID derived from the ID")
		assert.Equal(t, map[string]key{"order-42": {"order-42", now}}, e.keysOf("order-42"))

		got := e.claim(store.ClaimSpec{Now: now, Lease: now.Add(time.Minute), Limit: 10})
		require.Len(t, got, 1)
		assert.Equal(t, "order-42", got[0].ID)
		assert.Equal(t, "order-42", got[0].Key)
		assert.Equal(t, r.Seq, got[0].Seq)

		again := ev("order-42")
		again.Type = "second"
		assert.EqualValues(t, 0, e.insert(now.Add(time.Minute), again), "the same named ID (and key) again is skipped")
		other := ev("order-42")
		other.Key = "another-key"
		assert.EqualValues(t, 0, e.insert(now.Add(time.Minute), other), "the same named ID with another key is skipped")
		assert.EqualValues(t, 1, e.rows())
		assert.Equal(t, "order.created", e.get("order-42").EventType, "the first write wins")

		// With a key of its own.
		o2 := ev("order-43")
		o2.Key = "k-43"
		require.EqualValues(t, 1, e.insert(now, o2))
		assert.Equal(t, "k-43", e.get("order-43").Key)
		assert.Equal(t, map[string]key{"order-43": {"k-43", now}}, e.keysOf("order-43"))
		o3 := ev("order-44")
		o3.Key = "k-43"
		assert.EqualValues(t, 0, e.insert(now, o3), "a named event with a taken key is skipped")
	})

	// An ID the publisher chose that is the canonical text of a UUID: in
	// named_id, and the id column is the UUID itself.
	t.Run("NamedUUID", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		const id = "0190f0c4-8a6e-7b3c-9d2e-5f1a2b3c4d5e"
		require.EqualValues(t, 1, e.insert(now, ev(id)))
		r := e.get(id)
		assert.Equal(t, id, r.ID)
		assert.Equal(t, id, r.Key)
		named, ok := e.namedID(r.Seq)
		assert.True(t, ok, "named_id is written")
		assert.Equal(t, id, named)
		assert.Equal(t, hexOf(uuid.MustParse(id)), e.idColumn(r.Seq), "the id column is the UUID")
		got := e.claim(store.ClaimSpec{Now: now, Lease: now.Add(time.Minute), Limit: 10})
		require.Len(t, got, 1)
		assert.Equal(t, id, got[0].ID)
		assert.Equal(t, id, got[0].Key)
		assert.EqualValues(t, 0, e.insert(now, ev(id)), "the same named UUID again is skipped")
		assert.Equal(t, map[string]key{id: {id, now}}, e.keysOf(id))

		// IDs compare byte for byte: the same UUID spelt in capitals is
		// another ID, and not a UUID's canonical text.
		upper := strings.ToUpper(id)
		require.EqualValues(t, 1, e.insert(now, ev(upper)))
		u := e.get(upper)
		assert.Equal(t, upper, u.ID)
		assert.Equal(t, hexOf(store.RowID(upper)), e.idColumn(u.Seq), "the id column is derived from the non-canonical text")
		assert.Equal(t, r.Seq, e.get(id).Seq, "Get of the canonical text finds its own row only")
		assert.EqualValues(t, 2, e.rows())
	})

	// An event whose key is an earlier default event's ID, and a default
	// event whose ID is an earlier event's own key: the ID and the key
	// are unique each in its own index (a default event's key is NULL), so
	// both are written, on every store.
	t.Run("KeyMeetsID", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		require.EqualValues(t, 1, e.insert(now, ev("x")))
		y := ev("y")
		y.Key = "x"
		assert.EqualValues(t, 1, e.insert(now, y), "a key equal to an earlier default event's ID")
		a := ev("a")
		a.Key = "k"
		require.EqualValues(t, 1, e.insert(now, a))
		assert.EqualValues(t, 1, e.insert(now, ev("k")), "a default event whose ID is an earlier event's key")
		assert.EqualValues(t, 4, e.rows())
	})
}

// nulls reports which of the columns NULL stands in for another's are
// NULL in the row at seq, read with literal SQL.
func (e *env) nulls(seq int64) map[string]bool {
	e.t.Helper()
	cols := []string{"named_id", "idempotency_key", "available_at", "created_at", "updated_at"}
	sel := make([]string, len(cols))
	for i, c := range cols {
		sel[i] = "CASE WHEN " + c + " IS NULL THEN 1 ELSE 0 END"
	}
	vals := make([]int, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	q := fmt.Sprintf("SELECT %s FROM %s WHERE seq = %s", strings.Join(sel, ", "), e.qt, e.ph(1))
	require.NoError(e.t, e.db.QueryRowContext(e.ctx, q, seq).Scan(ptrs...), "%s", q)
	out := map[string]bool{}
	for i, c := range cols {
		out[c] = vals[i] == 1
	}
	return out
}

// namedID reads the named_id column of the row at seq.
func (e *env) namedID(seq int64) (string, bool) {
	e.t.Helper()
	var s sql.NullString
	q := fmt.Sprintf("SELECT named_id FROM %s WHERE seq = %s", e.qt, e.ph(1))
	require.NoError(e.t, e.db.QueryRowContext(e.ctx, q, seq).Scan(&s), "%s", q)
	return s.String, s.Valid
}

// idColumn reads the id column of the row at seq as 32 hex digits, as
// the database's Dialect.IDHex spells it (a native UUID, text, or 16
// bytes).
func (e *env) idColumn(seq int64) string {
	e.t.Helper()
	var s string
	q := fmt.Sprintf("SELECT %s FROM %s WHERE seq = %s", e.d.IDHex, e.qt, e.ph(1))
	require.NoError(e.t, e.db.QueryRowContext(e.ctx, q, seq).Scan(&s), "%s", q)
	return s
}

func hexOf(u uuid.UUID) string { return hex.EncodeToString(u[:]) }
