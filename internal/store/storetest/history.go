package storetest

import (
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// attempts runs Attempts.
func (e *env) attempts(id string) []store.Attempt {
	e.t.Helper()
	got, err := e.history().Attempts(e.ctx, e.db, id)
	require.NoError(e.t, err, "Attempts(%q)", id)
	return got
}

// recordAttempts runs RecordAttempts.
func (e *env) recordAttempts(seqs []int64, at time.Time) int64 {
	e.t.Helper()
	n, err := e.history().RecordAttempts(e.ctx, e.db, seqs, at)
	require.NoError(e.t, err, "RecordAttempts of %d seqs", len(seqs))
	return n
}

// failAndRecord fails the row with the ID at the time at (status pending
// for a retry, or failed), as a relay does: MarkFailed, then
// RecordAttempts of what it marked.
func (e *env) failAndRecord(id, status, msg string, at time.Time) {
	e.t.Helper()
	lease := e.settle(id)
	require.EqualValues(e.t, 1, e.markFailed([]store.Outcome{e.outcome(id, status, msg, at)}, at, lease))
	require.EqualValues(e.t, 1, e.recordAttempts(e.seqs(id), at))
}

// sameAttempts asserts an event's history is want, oldest first.
func sameAttempts(t *testing.T, want, got []store.Attempt, what string) {
	t.Helper()
	if !assert.Len(t, got, len(want), "%s: %+v", what, got) {
		return
	}
	for i := range want {
		sameTime(t, want[i].At, got[i].At, "%s: entry %d's time", what, i)
		w, g := want[i], got[i]
		w.At, g.At = time.Time{}, time.Time{}
		assert.Equal(t, w, g, "%s: entry %d", what, i)
	}
}

func testHistory(t *testing.T, su *suite) {
	t.Run("RecordAttempts", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		e.insert(now, ev("h1"), ev("h2"), ev("h3"))
		l1 := now.Add(time.Minute)
		require.Len(t, e.claim(store.ClaimSpec{Now: now, Lease: l1, Limit: 10}), 3)
		at1 := now.Add(time.Second)
		require.EqualValues(t, 2, e.markFailed([]store.Outcome{
			e.outcome("h1", "pending", "e1", at1.Add(time.Minute)),
			e.outcome("h2", "failed", "e2", at1),
		}, at1, l1))
		// h3's lease did not match: MarkFailed changed nothing, and there
		// is no attempt to record.
		require.EqualValues(t, 0, e.markFailed([]store.Outcome{e.outcome("h3", "pending", "e3", at1)}, at1, l1.Add(µs)))
		assert.EqualValues(t, 2, e.recordAttempts(e.seqs("h1", "h2", "h3"), at1), "one entry a row MarkFailed at that time wrote")
		sameAttempts(t, []store.Attempt{{At: at1, Attempt: 1, Outcome: store.AttemptRetry, Error: "e1"}}, e.attempts("h1"), "h1 to retry")
		sameAttempts(t, []store.Attempt{{At: at1, Attempt: 1, Outcome: store.AttemptFailed, Error: "e2"}}, e.attempts("h2"), "h2 failed")
		assert.Empty(t, e.attempts("h3"), "a row whose lease did not match is not recorded")
		assert.Empty(t, e.attempts("missing"))

		// The retry fails for good: its history, oldest first.
		at2 := at1.Add(2 * time.Minute)
		l2 := at2.Add(time.Minute)
		require.Len(t, e.claim(store.ClaimSpec{Now: at1.Add(time.Minute), Lease: l2, Limit: 10, Seqs: e.seqs("h1")}), 1)
		require.EqualValues(t, 1, e.markFailed([]store.Outcome{e.outcome("h1", "failed", "e4", at2)}, at2, l2))
		assert.EqualValues(t, 1, e.recordAttempts(e.seqs("h1", "h2"), at2), "h2 was not marked at at2")
		sameAttempts(t, []store.Attempt{
			{At: at1, Attempt: 1, Outcome: store.AttemptRetry, Error: "e1"},
			{At: at2, Attempt: 2, Outcome: store.AttemptFailed, Error: "e4"},
		}, e.attempts("h1"), "h1's two attempts")
		assert.EqualValues(t, 0, e.recordAttempts(e.seqs("h1", "h2", "h3"), at2.Add(time.Second)), "nothing marked then")

		// Replay records a replayed entry, with the error it had and who
		// replayed it (NULL for nobody).
		at3 := at2.Add(time.Minute)
		assert.EqualValues(t, 1, e.replay(store.Filter{IDs: []string{"h1"}}, at3, "ops@example.com"))
		at4 := at3.Add(time.Minute)
		assert.EqualValues(t, 1, e.replay(store.Filter{IDs: []string{"h2", "h3"}}, at4, ""))
		sameAttempts(t, []store.Attempt{
			{At: at1, Attempt: 1, Outcome: store.AttemptRetry, Error: "e1"},
			{At: at2, Attempt: 2, Outcome: store.AttemptFailed, Error: "e4"},
			{At: at3, Attempt: 0, Outcome: store.AttemptReplayed, Error: "e4", Actor: "ops@example.com"},
		}, e.attempts("h1"), "h1 replayed")
		sameAttempts(t, []store.Attempt{
			{At: at1, Attempt: 1, Outcome: store.AttemptFailed, Error: "e2"},
			{At: at4, Attempt: 0, Outcome: store.AttemptReplayed, Error: "e2"},
		}, e.attempts("h2"), "h2 replayed by nobody named")
		assert.Empty(t, e.attempts("h3"), "a pending row is not replayed")
	})

	// Attempts finds an event by its ID whatever kind it is.
	t.Run("IDsOfEveryKind", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		const named = "0190f0c4-8a6e-7b3c-9d2e-5f1a2b3c4d5e"
		g := generated()
		e.insert(now, ev("order-42"), ev(named), g)
		at := now.Add(time.Second)
		for _, id := range []string{"order-42", named, g.ID} {
			e.failAndRecord(id, "failed", "boom "+id, at)
			sameAttempts(t, []store.Attempt{{At: at, Attempt: 1, Outcome: store.AttemptFailed, Error: "boom " + id}}, e.attempts(id), id)
		}
	})

	t.Run("ForgetAttempts", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		h := e.history()
		e.insert(now, ev("x1"), ev("x2"), ev("x3"), ev("x4"))
		cut := now.Add(time.Hour)
		times := []time.Time{cut.Add(-3 * time.Minute), cut.Add(-2 * time.Minute), cut.Add(-time.Minute), cut}
		for i, id := range []string{"x1", "x2", "x3", "x4"} {
			e.failAndRecord(id, "failed", "x", times[i])
		}
		var deleted []int64
		for range 3 {
			n, err := h.ForgetAttempts(e.ctx, e.db, cut, 2)
			require.NoError(t, err)
			deleted = append(deleted, n)
		}
		assert.Equal(t, []int64{2, 1, 0}, deleted, "at most limit entries a call, only those before the cutoff")
		for _, id := range []string{"x1", "x2", "x3"} {
			assert.Empty(t, e.attempts(id), "%s forgotten", id)
		}
		assert.Len(t, e.attempts("x4"), 1, "an entry at the cutoff stays")
		assert.Equal(t, "failed", e.get("x1").Status, "ForgetAttempts leaves the events")
	})

	t.Run("Purge", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		e.insert(now, ev("p1"), ev("p2"))
		at := now.Add(time.Second)
		e.failAndRecord("p1", "failed", "x", at)
		e.failAndRecord("p2", "failed", "x", at)
		p1 := e.get("p1").Seq
		countOf := func(seq int64) int64 {
			t.Helper()
			return e.count("SELECT COUNT(*) FROM "+e.attemptsTable()+" WHERE seq = "+e.ph(1), seq)
		}
		require.EqualValues(t, 1, countOf(p1))
		assert.EqualValues(t, 1, e.purge(store.Filter{IDs: []string{"p1"}, Statuses: []string{"failed"}}))
		assert.EqualValues(t, 0, countOf(p1), "Purge deletes the purged row's history")
		assert.Len(t, e.attempts("p2"), 1, "and leaves the others'")
	})
}
