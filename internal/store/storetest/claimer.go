package storetest

import (
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const µs = time.Microsecond

func testClaimer(t *testing.T, su *suite) {
	t.Run("OldestFirst", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		e.insert(now.Add(-1*time.Second), ev("r1"))
		e.insert(now.Add(-3*time.Second), ev("r2"))
		e.insert(now.Add(-2*time.Second), ev("c-z"), ev("c-a"))
		e.insert(now.Add(time.Second), ev("future"))
		lease := now.Add(time.Minute)
		one := func(at time.Time) []string {
			t.Helper()
			var order []string
			for range 6 {
				got := e.claimIDs(store.ClaimSpec{Now: at, Lease: lease, Limit: 1})
				if len(got) == 0 {
					break
				}
				order = append(order, got...)
			}
			return order
		}
		if e.walker() != nil {
			// New rows are due at once (available_at NULL), whatever the
			// INSERT's time, and read in write order (seq).
			assert.Equal(t, []string{"r1", "r2", "c-z", "c-a", "future"}, one(now), "claimed one at a time: new rows in seq order")
		} else {
			// An INSERT makes its rows due at its own time: oldest by
			// available_at, then by seq (the IDs sort the other way).
			assert.Equal(t, []string{"r2", "c-z", "c-a", "r1"}, one(now), "claimed one at a time: (available_at, seq) order, the future row left")
			assert.Equal(t, []string{"future"}, e.claimIDs(store.ClaimSpec{Now: now.Add(time.Second), Lease: lease, Limit: 10}), "due at its time")
		}

		// Rows waiting for a retry: oldest due time first, then seq; the
		// rows not due yet left.
		var outs []store.Outcome
		for id, due := range map[string]time.Time{
			"r1": now.Add(3 * time.Minute), "r2": now.Add(time.Minute), "c-z": now.Add(2 * time.Minute),
			"c-a": now.Add(2 * time.Minute), "future": now.Add(time.Hour),
		} {
			outs = append(outs, e.outcome(id, "pending", "retry", due))
		}
		require.EqualValues(t, 5, e.markFailed(outs, now, lease))
		lease = now.Add(2 * time.Hour)
		assert.Equal(t, []string{"r2", "c-z", "c-a", "r1"}, one(now.Add(3*time.Minute)), "retries claimed one at a time: (available_at, seq) order, the later one left")
		assert.Equal(t, []string{"future"}, e.claimIDs(store.ClaimSpec{Now: now.Add(time.Hour), Lease: now.Add(3 * time.Hour), Limit: 10}), "due at its time")
	})

	t.Run("Limit", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		e.insert(now, ev("l1"), ev("l2"), ev("l3"))
		assert.Equal(t, []string{"l1", "l2"}, e.claimIDs(store.ClaimSpec{Now: now, Lease: now.Add(time.Minute), Limit: 2}))
	})

	t.Run("AttemptAndLease", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		f := full("c-1")
		e.insert(now, f)
		at, lease := now.Add(10*time.Second), now.Add(time.Minute)
		got := e.claim(store.ClaimSpec{Now: at, Lease: lease, Limit: 10})
		require.Len(t, got, 1)
		c := got[0]
		r := e.get("c-1")
		assert.Equal(t, r.Seq, c.Seq)
		assert.Equal(t, f.ID, c.ID)
		assert.Equal(t, f.Type, c.Type)
		assert.Equal(t, f.AggregateType, c.AggregateType)
		assert.Equal(t, f.AggregateID, c.AggregateID)
		assert.Equal(t, f.Key, c.Key)
		assert.JSONEq(t, string(f.Payload), string(c.Payload))
		assert.JSONEq(t, string(f.Headers), string(c.Headers))
		assert.Equal(t, 1, c.Attempts, "the claim counts an attempt")
		sameTime(t, f.OccurredAt, c.OccurredAt, "occurred_at")
		sameTime(t, now, c.CreatedAt, "created_at")

		assert.Equal(t, "pending", r.Status)
		assert.Equal(t, 1, r.Attempts, "attempts in the table")
		sameTimePtr(t, lease, r.LockedUntil, "locked_until is the lease")
		// The claim changes no indexed column, so that PostgreSQL makes it
		// a HOT update: updated_at (the failed index's key) is left to the
		// outcome, and still reads as the row's creation.
		sameTime(t, now, r.UpdatedAt, "updated_at is left by the claim")

		// Not again while the lease lives; again once it has expired.
		assert.Empty(t, e.claim(store.ClaimSpec{Now: lease.Add(-µs), Lease: lease.Add(time.Hour), Limit: 10}), "claimed again under a live lease")
		lease2 := lease.Add(time.Minute)
		got = e.claim(store.ClaimSpec{Now: lease.Add(µs), Lease: lease2, Limit: 10})
		require.Len(t, got, 1, "claimed again once the lease expired")
		assert.Equal(t, 2, got[0].Attempts)
		r = e.get("c-1")
		assert.Equal(t, 2, r.Attempts)
		sameTimePtr(t, lease2, r.LockedUntil, "locked_until is the new lease")
	})

	t.Run("RowsApart", func(t *testing.T) {
		// One statement's rows are scanned into the same variables: a
		// row with a key and headers must leave nothing in the next.
		t.Parallel()
		e := setup(t, su)
		f, g := full("c-1"), generated()
		// Written a second apart, so that each row's created_at is its own.
		e.insert(now.Add(-time.Second), f)
		e.insert(now, g)
		got := e.claim(store.ClaimSpec{Now: now, Lease: now.Add(time.Minute), Limit: 10})
		require.Len(t, got, 2)
		byID := map[string]store.Claimed{got[0].ID: got[0], got[1].ID: got[1]}
		c, b := byID[f.ID], byID[g.ID]
		assert.Equal(t, f.Key, c.Key)
		assert.JSONEq(t, string(f.Headers), string(c.Headers))
		assert.JSONEq(t, string(f.Payload), string(c.Payload))
		sameTime(t, f.OccurredAt, c.OccurredAt, "occurred_at of the full row")
		sameTime(t, now.Add(-time.Second), c.CreatedAt, "created_at of the full row")
		assert.Equal(t, g.ID, b.Key, "a generated event's key is its ID")
		assert.Nil(t, b.Headers, "no headers")
		assert.Empty(t, b.AggregateType)
		assert.JSONEq(t, string(g.Payload), string(b.Payload))
		sameTime(t, g.OccurredAt, b.OccurredAt, "occurred_at")
		sameTime(t, now, b.CreatedAt, "created_at")
	})

	t.Run("Seqs", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		e.insert(now, ev("a"), ev("b"), ev("c"), ev("later"))
		// later waits for a retry an hour from now: not due.
		l0 := e.settle("later")
		require.EqualValues(t, 1, e.markFailed([]store.Outcome{e.outcome("later", "pending", "retry", now.Add(time.Hour))}, now, l0))
		seq := e.seqOf("a", "b", "c", "later")
		lease := now.Add(time.Minute)
		missing := seq["later"] + 100
		assert.Equal(t, []string{"b", "c"}, e.claimIDs(store.ClaimSpec{Now: now, Lease: lease, Limit: 10, Seqs: []int64{seq["c"], seq["b"], seq["later"], missing}}),
			"only the due rows among the seqs")
		assert.Empty(t, e.claimIDs(store.ClaimSpec{Now: now, Lease: lease, Limit: 10, Seqs: []int64{seq["b"]}}), "a leased row")
		assert.Equal(t, []string{"a"}, e.claimIDs(store.ClaimSpec{Now: now, Lease: lease, Limit: 10}))
		assert.Equal(t, []string{"later"}, e.claimIDs(store.ClaimSpec{Now: now.Add(time.Hour), Lease: now.Add(2 * time.Hour), Limit: 10, Seqs: []int64{seq["later"]}}),
			"the retry at its time")
	})

	t.Run("Ordered", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		e.ensureOrdering()
		e.insert(now,
			agg("a1", "acct", "A"), agg("b1", "acct", "B"), agg("a2", "acct", "A"),
			agg("user-a", "user", "A"), // the same ID, another type: another aggregate
			ev("n1"), ev("n2"),
			agg("t1", "acct", ""), agg("t2", "acct", ""), // no aggregate ID: not ordered
		)
		l1 := now.Add(30 * time.Second)
		spec := func(at, lease time.Time) store.ClaimSpec {
			return store.ClaimSpec{Now: at, Lease: lease, Limit: 100, Ordered: true}
		}
		got := e.claimIDs(spec(now, l1))
		require.Equal(t, []string{"a1", "b1", "user-a", "n1", "n2", "t1", "t2"}, got, "the oldest unsent row of each aggregate, and every row of none")
		others := []string{"b1", "user-a", "n1", "n2", "t1", "t2"}
		require.EqualValues(t, len(others), e.markSent(e.seqs(others...), now, l1))

		// Once an older row is sent, the next goes; while a1 is in flight,
		// retried or failed, a2 stays behind it.
		e.insert(now, agg("b2", "acct", "B"))
		assert.Equal(t, []string{"b2"}, e.claimIDs(spec(now, l1)), "b2 after b1 sent; a2 behind a1 in flight")
		require.EqualValues(t, 1, e.markSent(e.seqs("b2"), now, l1))
		require.EqualValues(t, 1, e.markFailed([]store.Outcome{e.outcome("a1", "pending", "retry", now.Add(time.Minute))}, now, l1))
		assert.Empty(t, e.claimIDs(spec(now.Add(10*time.Second), l1)), "a2 behind a1 waiting for its retry")
		l2 := now.Add(2 * time.Minute)
		assert.Equal(t, []string{"a1"}, e.claimIDs(spec(now.Add(time.Minute), l2)), "a1's retry, a2 still behind")
		require.EqualValues(t, 1, e.markFailed([]store.Outcome{e.outcome("a1", "failed", "gave up", now.Add(time.Minute))}, now.Add(time.Minute), l2))
		assert.Empty(t, e.claimIDs(spec(now.Add(time.Hour), now.Add(2*time.Hour))), "a failed older row holds back the later ones")
		require.EqualValues(t, 1, e.purge(store.Filter{IDs: []string{"a1"}, Statuses: []string{"failed"}}))
		assert.Equal(t, []string{"a2"}, e.claimIDs(spec(now.Add(time.Hour), now.Add(2*time.Hour))), "a2 once a1 is purged")
	})

	t.Run("MarkSent", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		e.insert(now, ev("s1"), ev("s2"))
		l1 := now.Add(30 * time.Second)
		require.Len(t, e.claim(store.ClaimSpec{Now: now, Lease: l1, Limit: 10}), 2)
		// s1 fails once and is claimed again under a new lease.
		require.EqualValues(t, 1, e.markFailed([]store.Outcome{e.outcome("s1", "pending", "boom", now)}, now, l1))
		l2 := now.Add(40 * time.Second)
		require.Equal(t, []string{"s1"}, e.claimIDs(store.ClaimSpec{Now: now.Add(time.Second), Lease: l2, Limit: 10}))

		at := now.Add(2 * time.Second)
		assert.EqualValues(t, 0, e.markSent(e.seqs("s1"), at, l1), "MarkSent under a stale lease")
		r := e.get("s1")
		assert.Equal(t, "pending", r.Status)
		sameTimePtr(t, l2, r.LockedUntil, "the live lease is kept")

		assert.EqualValues(t, 1, e.markSent(e.seqs("s1", "s2"), at, l2), "only the row under the given lease")
		r = e.get("s1")
		assert.Equal(t, "sent", r.Status)
		sameTimePtr(t, at, r.SentAt, "sent_at")
		sameTime(t, at, r.UpdatedAt, "updated_at")
		assert.Nil(t, r.LockedUntil, "the lease is released")
		assert.Nil(t, r.LastError, "the earlier attempt's error is cleared")
		assert.Equal(t, 2, r.Attempts)
		assert.Equal(t, "pending", e.get("s2").Status)
		assert.EqualValues(t, 0, e.markSent(e.seqs("s1"), at, l2), "MarkSent of a sent row")

		// Only pending rows: a row that is not, though its lease matches.
		e.raw("UPDATE " + e.qt + " SET status = 'failed'" + where("s2"))
		assert.EqualValues(t, 0, e.markSent(e.seqs("s2"), at, l1), "MarkSent of a failed row under its lease")
		assert.Equal(t, "failed", e.get("s2").Status)
	})

	t.Run("MarkFailed", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		e.insert(now, ev("m1"), ev("m2"), ev("m3"))
		l1 := now.Add(30 * time.Second)
		require.Len(t, e.claim(store.ClaimSpec{Now: now, Lease: l1, Limit: 10}), 3)
		at := now.Add(time.Second)
		retry, gaveUp := now.Add(5*time.Minute), now.Add(time.Hour)
		outs := []store.Outcome{
			e.outcome("m1", "pending", "retry: 503", retry),
			e.outcome("m2", "failed", "gave up: 400", gaveUp),
		}
		assert.EqualValues(t, 0, e.markFailed(outs, at, l1.Add(-µs)), "MarkFailed under a stale lease")
		assert.Equal(t, map[string]state{"m1": {"pending", 1}, "m2": {"pending", 1}, "m3": {"pending", 1}}, e.states())

		assert.EqualValues(t, 2, e.markFailed(outs, at, l1))
		for _, c := range []struct {
			id, status, err string
			due             time.Time
		}{{"m1", "pending", "retry: 503", retry}, {"m2", "failed", "gave up: 400", gaveUp}} {
			r := e.get(c.id)
			assert.Equal(t, c.status, r.Status, c.id)
			if assert.NotNil(t, r.LastError, c.id) {
				assert.Equal(t, c.err, *r.LastError, c.id)
			}
			sameTime(t, c.due, r.AvailableAt, "available_at of %s", c.id)
			sameTime(t, at, r.UpdatedAt, "updated_at of %s", c.id)
			assert.Nil(t, r.LockedUntil, "locked_until of %s", c.id)
			assert.Equal(t, 1, r.Attempts, "attempts of %s", c.id)
		}
		m3 := e.get("m3")
		assert.Nil(t, m3.LastError, "a row without an outcome")
		sameTimePtr(t, l1, m3.LockedUntil, "locked_until of a row without an outcome")
		assert.EqualValues(t, 0, e.markFailed(outs, at, l1), "MarkFailed again: the rows are no longer leased")

		// The retry is due at its time; the failed row never.
		both := e.seqs("m1", "m2")
		lease := now.Add(1000 * time.Hour)
		assert.Empty(t, e.claimIDs(store.ClaimSpec{Now: retry.Add(-µs), Lease: lease, Limit: 10, Seqs: both}), "a retry before its time")
		assert.Equal(t, []string{"m1"}, e.claimIDs(store.ClaimSpec{Now: retry, Lease: lease, Limit: 10, Seqs: both}))
		assert.Empty(t, e.claimIDs(store.ClaimSpec{Now: lease.Add(time.Hour), Lease: lease.Add(2 * time.Hour), Limit: 10, Seqs: e.seqs("m2")}), "a failed row is never due")

		// Only pending rows.
		e.raw("UPDATE " + e.qt + " SET status = 'sent'" + where("m3"))
		assert.EqualValues(t, 0, e.markFailed([]store.Outcome{e.outcome("m3", "pending", "x", now)}, at, l1),
			"MarkFailed of a sent row under its lease")
		assert.Equal(t, "sent", e.get("m3").Status)
	})

	t.Run("Release", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		e.insert(now, ev("r1"), ev("r2"))
		l1 := now.Add(30 * time.Second)
		require.Len(t, e.claim(store.ClaimSpec{Now: now, Lease: l1, Limit: 10}), 2)
		at := now.Add(time.Second)
		assert.EqualValues(t, 0, e.release(e.seqs("r1"), at, l1.Add(µs)), "Release under a stale lease")
		assert.Equal(t, 1, e.get("r1").Attempts)

		assert.EqualValues(t, 1, e.release(e.seqs("r1"), at, l1))
		r := e.get("r1")
		assert.Equal(t, "pending", r.Status)
		assert.Equal(t, 0, r.Attempts, "the claim's attempt is taken back")
		sameTime(t, at, r.AvailableAt, "due now")
		sameTime(t, at, r.UpdatedAt, "updated_at")
		assert.Nil(t, r.LockedUntil)
		got := e.claim(store.ClaimSpec{Now: at, Lease: now.Add(time.Hour), Limit: 10, Seqs: e.seqs("r1", "r2")})
		require.Len(t, got, 1, "the released row is due at once, the other still leased")
		assert.Equal(t, "r1", got[0].ID)
		assert.Equal(t, 1, got[0].Attempts)
		assert.EqualValues(t, 0, e.release(e.seqs("r1"), at, l1), "Release under the lease it had before")

		// Only pending rows.
		e.raw("UPDATE " + e.qt + " SET status = 'failed'" + where("r2"))
		assert.EqualValues(t, 0, e.release(e.seqs("r2"), at, l1), "Release of a failed row under its lease")
		assert.Equal(t, state{"failed", 1}, e.states()["r2"])
	})

	t.Run("DeleteSent", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		before := now.Add(-time.Hour)
		e.insert(now.Add(-3*time.Hour), ev("old-1"), ev("old-2"), ev("old-3"), ev("pending"), ev("failed"), ev("was-sent"))
		e.insert(now, ev("recent"), ev("edge"))
		e.sent(now.Add(-2*time.Hour), "old-1", "old-2", "old-3", "was-sent")
		e.sent(now.Add(-30*time.Minute), "recent")
		e.sent(before, "edge")
		e.failed(now.Add(-2*time.Hour), "x", "failed")
		// A row that is not sent is never deleted, whatever its sent_at.
		e.raw("UPDATE " + e.qt + " SET status = 'failed'" + where("was-sent"))

		var deleted []int64
		for range 4 {
			n, err := e.s.DeleteSent(e.ctx, e.db, before, 2)
			require.NoError(t, err)
			deleted = append(deleted, n)
		}
		assert.Equal(t, []int64{2, 1, 0, 0}, deleted, "at most limit rows a statement")
		left := e.states()
		for _, id := range []string{"old-1", "old-2", "old-3"} {
			assert.NotContains(t, left, id)
		}
		assert.Equal(t, map[string]state{
			"pending": {"pending", 0}, "failed": {"failed", 1}, "was-sent": {"failed", 1},
			"recent": {"sent", 1}, "edge": {"sent", 1},
		}, left, "sent after before, sent at before, and rows not sent stay")
	})
}
