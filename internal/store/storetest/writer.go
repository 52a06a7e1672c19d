package storetest

import (
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// key is what KeysOf reads of one row.
type key struct {
	Key     string
	Created time.Time
}

// keysOf runs KeysOf.
func (e *env) keysOf(ids ...string) map[string]key {
	e.t.Helper()
	q := e.s.KeysOf(ids)
	rs, err := e.db.QueryContext(e.ctx, q.SQL, q.Args...)
	require.NoError(e.t, err, "%s", q.SQL)
	defer rs.Close()
	out := map[string]key{}
	for rs.Next() {
		var (
			id, k   string
			created store.DBTime
		)
		require.NoError(e.t, rs.Scan(&id, &k, &created))
		out[id] = key{k, created.T}
	}
	require.NoError(e.t, rs.Err())
	return out
}

// full is an event with every field set, its occurrence time in another
// zone than UTC.
func full(id string) store.Event {
	return store.Event{
		ID: id, Type: "order.paid", AggregateType: "order", AggregateID: "42", Key: "pay-" + id,
		Payload:    []byte(`{"amount":12.5,"items":["a","b"],"note":"ünïcødé \"quoted\""}`),
		Headers:    []byte(`{"trace":"abc","tenant":"t-1"}`),
		OccurredAt: now.Add(-90 * time.Second).In(time.FixedZone("UTC+5", 5*3600)),
	}
}

func testWriter(t *testing.T, open Open) {
	t.Run("InsertRoundTrip", func(t *testing.T) {
		t.Parallel()
		e := setup(t, open)
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

		// KeysOf: id, key and the created_at the INSERT wrote.
		assert.Equal(t, map[string]key{"e-1": {f.Key, now}, "e-2": {"e-2", now}}, e.keysOf("e-1", "e-2", "missing"))
	})

	t.Run("GeneratedWithoutConflictClause", func(t *testing.T) {
		t.Parallel()
		e := setup(t, open)
		g := generated("g-1")
		require.EqualValues(t, 1, e.insert(now, g))
		// A generated ID cannot repeat, so the INSERT has no clause to skip
		// one: should one repeat, the INSERT fails (and with it the
		// caller's transaction) rather than drop an event silently.
		q := e.s.Insert([]store.Event{g}, now)
		_, err := e.db.ExecContext(e.ctx, q.SQL, q.Args...)
		assert.Error(t, err, "a repeated generated ID must fail the INSERT: %s", q.SQL)
		// One caller-named row keeps the clause for the whole statement.
		assert.EqualValues(t, 1, e.insert(now, g, ev("named")), "the generated duplicate skipped, the named row written")
		assert.EqualValues(t, 2, e.rows())
	})

	t.Run("DuplicatesSkipped", func(t *testing.T) {
		t.Parallel()
		e := setup(t, open)
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
}
