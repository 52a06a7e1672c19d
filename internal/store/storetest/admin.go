package storetest

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// statRow is one line of Stats.
type statRow struct {
	N      int64
	Oldest time.Time
}

func (e *env) stats() map[string]statRow {
	e.t.Helper()
	got, err := e.s.Stats(e.ctx, e.db)
	require.NoError(e.t, err, "Stats")
	out := map[string]statRow{}
	for _, c := range got {
		_, dup := out[c.Status]
		assert.False(e.t, dup, "Stats has one line per status: %s twice", c.Status)
		out[c.Status] = statRow{c.N, c.Oldest}
	}
	return out
}

// failedSince runs FailedSince.
func (e *env) failedSince(since time.Time) int64 {
	e.t.Helper()
	n, err := e.s.FailedSince(e.ctx, e.db, since)
	require.NoError(e.t, err, "FailedSince")
	return n
}

func testAdmin(t *testing.T, su *suite) {
	t.Run("Filters", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		with := func(ev store.Event, typ string) store.Event { ev.Type = typ; return ev }
		e.insert(now.Add(-3*time.Hour), with(agg("r1", "order", "1"), "order.created"))
		e.insert(now.Add(-2*time.Hour), with(agg("r2", "order", "1"), "order.paid"))
		e.insert(now.Add(-2*time.Hour), with(agg("r3", "order", "2"), "order.paid"))
		e.insert(now.Add(-1*time.Hour), with(agg("r4", "user", "1"), "user.created"))
		e.insert(now, with(agg("r5", "user", "1"), "order.created"), with(ev("r6"), "order.created"))
		e.failed(now, "Timeout: 50% of the_time", "r2")
		e.failed(now, "timeout 50 percent of theXtime", "r3")
		e.failed(now, `disk full! [x] at C:\tmp`, "r6")
		e.sent(now, "r4")
		failed := []string{"r2", "r3", "r6"}

		for _, c := range []struct {
			name string
			f    store.Filter
			want []string
		}{
			{"None", store.Filter{}, []string{"r1", "r2", "r3", "r4", "r5", "r6"}},
			{"IDs", store.Filter{IDs: []string{"r4", "r1", "missing"}}, []string{"r1", "r4"}},
			{"Keys", store.Filter{Keys: []string{"r5", "r2", "missing"}}, []string{"r2", "r5"}},
			{"IDsAndKeys", store.Filter{IDs: []string{"r1", "r2"}, Keys: []string{"r2", "r3"}}, []string{"r2"}},
			{"StatusFailed", store.Filter{Statuses: []string{"failed"}}, []string{"r2", "r3", "r6"}},
			{"StatusesPendingSent", store.Filter{Statuses: []string{"pending", "sent"}}, []string{"r1", "r4", "r5"}},
			{"Type", store.Filter{Types: []string{"order.paid"}}, []string{"r2", "r3"}},
			{"Types", store.Filter{Types: []string{"order.created", "user.created"}}, []string{"r1", "r4", "r5", "r6"}},
			{"AggregateType", store.Filter{AggregateType: "order"}, []string{"r1", "r2", "r3"}},
			{"Aggregate", store.Filter{AggregateType: "order", AggregateID: "1"}, []string{"r1", "r2"}},
			{"AggregateID", store.Filter{AggregateID: "1"}, []string{"r1", "r2", "r4", "r5"}},
			{"CreatedSinceInclusive", store.Filter{CreatedSince: now.Add(-2 * time.Hour)}, []string{"r2", "r3", "r4", "r5", "r6"}},
			{"CreatedUntilExclusive", store.Filter{CreatedUntil: now.Add(-2 * time.Hour)}, []string{"r1"}},
			{"CreatedBetween", store.Filter{CreatedSince: now.Add(-2 * time.Hour), CreatedUntil: now.Add(-time.Hour)}, []string{"r2", "r3"}},
			{"ErrorPercentLiteral", store.Filter{ErrorContains: "50%"}, []string{"r2"}},
			{"ErrorPercentAlone", store.Filter{ErrorContains: "%"}, []string{"r2"}},
			{"ErrorUnderscoreLiteral", store.Filter{ErrorContains: "the_time"}, []string{"r2"}},
			{"ErrorUnderscoreAlone", store.Filter{ErrorContains: "_"}, []string{"r2"}},
			{"ErrorIgnoresCase", store.Filter{ErrorContains: "TIMEOUT"}, []string{"r2", "r3"}},
			{"ErrorEscapeCharLiteral", store.Filter{ErrorContains: "full!"}, []string{"r6"}},
			{"ErrorBrackets", store.Filter{ErrorContains: "[x]"}, []string{"r6"}},
			{"ErrorBackslash", store.Filter{ErrorContains: `\`}, []string{"r6"}},
			{"ErrorBackslashLiteral", store.Filter{ErrorContains: `:\t`}, []string{"r6"}},
			{"ErrorNone", store.Filter{ErrorContains: "nothing like it"}, nil},
			{"Combined", store.Filter{Statuses: []string{"failed"}, Types: []string{"order.paid"}, AggregateID: "2", ErrorContains: "timeout"}, []string{"r3"}},
		} {
			t.Run(c.name, func(t *testing.T) {
				e := *e
				e.t = t
				assert.Equal(t, c.want, nilIfEmpty(e.list(store.Page{Filter: c.f, Limit: 100})), "List")
				assert.EqualValues(t, len(c.want), e.countOf(c.f), "Count")
				assert.ElementsMatch(t, c.want, e.purged(c.f), "Purge")
				// Replay's filter: the root narrows it to failed rows (and
				// refuses one whose statuses leave them out).
				if len(c.f.Statuses) > 0 && !slices.Contains(c.f.Statuses, "failed") {
					return
				}
				rf := c.f
				rf.Statuses = []string{"failed"}
				var wantFailed []string
				for _, id := range c.want {
					if slices.Contains(failed, id) {
						wantFailed = append(wantFailed, id)
					}
				}
				assert.Equal(t, wantFailed, nilIfEmpty(e.replayed(rf, now.Add(time.Hour))), "Replay with Statuses failed")
			})
		}
	})

	// Filter.IDs and Get find an event by its ID whatever kind it is: a
	// named ID (named_id), a named UUID, a generated UUID (the id column).
	t.Run("IDsOfEveryKind", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		const named = "0190f0c4-8a6e-7b3c-9d2e-5f1a2b3c4d5e"
		g1, g2 := generated(), generated()
		k := generated()
		k.Generated, k.Key = false, "k-1"
		require.EqualValues(t, 5, e.insert(now, ev("order-42"), ev(named), g1, g2, k))
		for _, id := range []string{"order-42", named, g1.ID, g2.ID, k.ID} {
			assert.Equal(t, id, e.get(id).ID, "Get(%q)", id)
		}
		_, ok := e.find(strings.ToUpper(g1.ID))
		assert.False(t, ok, "IDs compare as text: a generated ID in capitals is another ID")
		f := store.Filter{IDs: []string{"order-42", named, g1.ID, k.ID, "missing", strings.ToUpper(g2.ID), "6f9619ff-8b86-4011-b42d-00c04fc964ff"}}
		want := []string{"order-42", named, g1.ID, k.ID}
		assert.Equal(t, want, e.list(store.Page{Filter: f, Limit: 10}), "List")
		assert.EqualValues(t, len(want), e.countOf(f), "Count")
		assert.ElementsMatch(t, want, e.purged(f), "Purge")

		// Filter.Keys finds a key the publisher chose, and a key that is
		// the ID (stored as NULL) whatever kind the ID is.
		kf := store.Filter{Keys: []string{"k-1", "order-42", g1.ID, named, "missing", k.ID}}
		wantKeys := []string{"order-42", named, g1.ID, k.ID}
		assert.Equal(t, wantKeys, e.list(store.Page{Filter: kf, Limit: 10}), "List by keys")
		assert.EqualValues(t, len(wantKeys), e.countOf(kf), "Count by keys")
		assert.ElementsMatch(t, wantKeys, e.purged(kf), "Purge by keys")

		// IDColumn reads the ID of every kind, in SQL of the user's own.
		var read []string
		rs, err := e.db.QueryContext(e.ctx, "SELECT "+e.s.IDColumn()+" FROM "+e.qt+" ORDER BY seq")
		require.NoError(t, err)
		for rs.Next() {
			var id string
			require.NoError(t, rs.Scan(&id))
			read = append(read, id)
		}
		require.NoError(t, rs.Err())
		require.NoError(t, rs.Close())
		assert.Equal(t, []string{"order-42", named, g1.ID, g2.ID, k.ID}, read, "IDColumn")

		e.failed(now, "boom", "order-42", g1.ID, g2.ID)
		rf := f
		rf.Statuses = []string{"failed"}
		at := now.Add(time.Hour)
		assert.Equal(t, []string{"order-42", g1.ID}, e.replayed(rf, at), "Replay of the IDs")
		assert.EqualValues(t, 2, e.replay(rf, at, ""), "Replay: g2 does not match the filter")
		pf := store.Filter{IDs: []string{named, g1.ID, k.ID, "missing", strings.ToUpper(g2.ID)}}
		assert.EqualValues(t, 3, e.purge(pf), "Purge: g2 does not match the filter")
		assert.Equal(t, []string{"order-42", g2.ID}, idsOf(e.all()))
	})

	t.Run("Paging", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		e.insert(now, ev("p1"), ev("p2"), ev("p3"), ev("p4"), ev("p5"))
		q1 := agg("q1", "other", "1")
		q1.Type = "other.created"
		e.insert(now, q1)
		seq := e.seqOf("p1", "p2", "p4", "p5")
		page := func(p store.Page) []string { p.Limit = max(p.Limit, 2); return e.list(p) }
		assert.Equal(t, []string{"p1", "p2"}, page(store.Page{}), "the first page")
		assert.Equal(t, []string{"p3", "p4"}, page(store.Page{AfterSeq: seq["p2"]}))
		assert.Equal(t, []string{"p5", "q1"}, page(store.Page{AfterSeq: seq["p4"]}))
		assert.Equal(t, []string{"q1", "p5"}, page(store.Page{Newest: true}), "newest first")
		assert.Equal(t, []string{"p3", "p2"}, page(store.Page{Newest: true, BeforeSeq: seq["p4"]}))
		assert.Equal(t, []string{"p2", "p3", "p4"}, page(store.Page{AfterSeq: seq["p1"], BeforeSeq: seq["p5"], Limit: 10}))
		assert.Equal(t, []string{"p5"}, page(store.Page{AfterSeq: seq["p4"], Filter: store.Filter{Types: []string{"order.created"}}, Limit: 10}),
			"paging and a filter")
		assert.Equal(t, []string{"p1", "p2", "p3", "p4", "p5", "q1"}, page(store.Page{Limit: 100}))
	})

	t.Run("Get", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		e.insert(now, ev("g1"), ev("g2"))
		_, ok := e.find("missing")
		assert.False(t, ok)
		e.failed(now.Add(time.Minute), "it broke", "g1")
		e.sent(now.Add(2*time.Minute), "g2")
		g1 := e.get("g1")
		assert.Equal(t, "failed", g1.Status)
		if assert.NotNil(t, g1.LastError) {
			assert.Equal(t, "it broke", *g1.LastError)
		}
		assert.Nil(t, g1.SentAt)
		assert.Nil(t, g1.LockedUntil)
		g2 := e.get("g2")
		assert.Equal(t, "sent", g2.Status)
		sameTimePtr(t, now.Add(2*time.Minute), g2.SentAt, "sent_at")
	})

	t.Run("Replay", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		e.insert(now, ev("f1"), ev("p1"), ev("s1"))
		e.failed(now, "boom", "f1")
		e.sent(now, "s1")
		at := now.Add(time.Hour)
		named := []string{"f1", "p1", "s1", "missing"}
		assert.EqualValues(t, 1, e.replay(store.Filter{IDs: named, Statuses: []string{"failed"}}, at, ""), "only failed rows")
		f := e.get("f1")
		assert.Equal(t, "pending", f.Status)
		assert.Equal(t, 0, f.Attempts)
		sameTime(t, at, f.AvailableAt, "due at once")
		sameTime(t, at, f.UpdatedAt, "updated_at")
		assert.Nil(t, f.LockedUntil)
		assert.Equal(t, map[string]state{"f1": {"pending", 0}, "p1": {"pending", 0}, "s1": {"sent", 1}}, e.states())
		sameTime(t, now, e.get("p1").UpdatedAt, "a pending row is not touched")
		assert.Equal(t, []string{"f1"}, e.claimIDs(store.ClaimSpec{Now: at, Lease: at.Add(time.Minute), Limit: 10, Seqs: e.seqs("f1")}))
		if e.walker() != nil {
			// A replayed row waits in the retry index, due at once: the
			// watermark (From) does not hide it.
			_, high := e.lowOpen()
			assert.Equal(t, []string{"f1"}, e.claimIDs(store.ClaimSpec{Now: at.Add(2 * time.Minute), Lease: at.Add(time.Hour), Limit: 10, From: high + 1}),
				"a replayed row is claimed whatever the watermark")
		}
	})

	t.Run("ReplayByFilter", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		with := func(ev store.Event, typ string) store.Event { ev.Type = typ; return ev }
		e.insert(now, with(ev("f1"), "a"), with(ev("f2"), "b"), with(ev("f3"), "a"), with(ev("f4"), "a"), with(ev("p1"), "a"))
		e.failed(now, "boom", "f4", "f3", "f2", "f1")
		f := store.Filter{Statuses: []string{"failed"}, Types: []string{"a"}}

		at := now.Add(time.Hour)
		assert.Equal(t, []string{"f1", "f3", "f4"}, e.replayed(f, at), "the failed rows that match, by seq")
		assert.EqualValues(t, 3, e.replay(f, at, ""))
		for _, id := range []string{"f1", "f3", "f4"} {
			r := e.get(id)
			assert.Equal(t, "pending", r.Status, id)
			assert.Equal(t, 0, r.Attempts, id)
			sameTime(t, at, r.AvailableAt, "available_at of %s", id)
			sameTime(t, at, r.UpdatedAt, "updated_at of %s", id)
			assert.Nil(t, r.LockedUntil, id)
		}
		assert.Equal(t, map[string]state{"f1": {"pending", 0}, "f2": {"failed", 1}, "f3": {"pending", 0}, "f4": {"pending", 0}, "p1": {"pending", 0}}, e.states())
		sameTime(t, now, e.get("p1").UpdatedAt, "a pending row that matches the type is not touched")
		assert.EqualValues(t, 0, e.replay(f, at.Add(time.Minute), ""), "a row replayed meanwhile no longer matches")
	})

	// Store's doc: Replay turns the failed rows matching f back to
	// pending, never another status, whatever f's Statuses.
	t.Run("ReplayByFilterFailedOnly", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		e.insert(now, ev("p1"), ev("f1"), ev("s1"))
		e.failed(now, "boom", "f1")
		e.sent(now, "s1")
		assert.Equal(t, []string{"f1"}, e.replayed(store.Filter{}, now.Add(time.Hour)), "Replay without Statuses")
		assert.Equal(t, []string{"f1"}, e.replayed(store.Filter{Statuses: []string{"pending", "sent", "failed"}}, now.Add(time.Hour)), "Replay with every status")
		assert.Empty(t, e.replayed(store.Filter{Statuses: []string{"pending", "sent"}}, now.Add(time.Hour)), "Replay of statuses without failed")
		assert.EqualValues(t, 1, e.replay(store.Filter{}, now.Add(time.Hour), ""), "Replay without Statuses")
		assert.Equal(t, map[string]state{"p1": {"pending", 0}, "f1": {"pending", 0}, "s1": {"sent", 1}}, e.states(), "a sent row stays sent")
	})

	// RetryNow makes the pending rows that wait for a retry due now, their
	// attempts kept; a row a lease holds, a new row (already due), rows of
	// another status and rows the filter leaves out are not touched.
	t.Run("RetryNow", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		e.insert(now, ev("w1"), ev("w2"), ev("leased"), ev("failed"), ev("sent"), ev("other"), ev("new"))
		waiting := []string{"w1", "w2", "leased", "other"}
		at, later := now.Add(time.Second), now.Add(time.Hour)
		lease := e.settle(append(waiting, "failed")...)
		outs := []store.Outcome{e.outcome("failed", "failed", "e-failed", later)}
		for _, id := range waiting {
			outs = append(outs, e.outcome(id, "pending", "e-"+id, later))
		}
		require.EqualValues(t, len(outs), e.markFailed(outs, at, lease))
		if e.history() != nil {
			require.EqualValues(t, len(outs), e.recordAttempts(e.seqs(append(waiting, "failed")...), at))
		}
		e.sent(now, "sent")
		// A relay holds "leased", due later, under a lease that lives.
		held := later.Add(time.Hour)
		require.Len(t, e.claim(store.ClaimSpec{Now: later, Lease: held, Limit: 1, Seqs: e.seqs("leased")}), 1)

		at2 := at.Add(time.Minute)
		f := store.Filter{IDs: []string{"w1", "w2", "leased", "failed", "sent", "new", "missing"}, Statuses: []string{"pending"}}
		assert.EqualValues(t, 2, e.retryNow(f, at2, "ops@example.com"), "the rows that wait for a retry")
		for _, id := range []string{"w1", "w2"} {
			r := e.get(id)
			assert.Equal(t, "pending", r.Status, id)
			assert.Equal(t, 1, r.Attempts, "%s: the attempts are kept", id)
			sameTime(t, at2, r.AvailableAt, "%s is due now", id)
			sameTime(t, at2, r.UpdatedAt, "updated_at of %s", id)
			assert.Nil(t, r.LockedUntil, id)
			if assert.NotNil(t, r.LastError, id) {
				assert.Equal(t, "e-"+id, *r.LastError, "%s: the error is kept", id)
			}
		}
		l := e.get("leased")
		sameTime(t, later, l.AvailableAt, "a row a lease holds is not touched")
		sameTimePtr(t, held, l.LockedUntil, "its lease")
		sameTime(t, later, e.get("other").AvailableAt, "a row the filter leaves out is not touched")
		assert.Equal(t, map[string]state{"w1": {"pending", 1}, "w2": {"pending", 1}, "leased": {"pending", 2}, "failed": {"failed", 1},
			"sent": {"sent", 1}, "other": {"pending", 1}, "new": {"pending", 0}}, e.states())
		sameTime(t, now, e.get("new").UpdatedAt, "a new row is not touched")
		assert.EqualValues(t, 0, e.retryNow(f, at2, ""), "nothing waits any more")
		assert.ElementsMatch(t, []string{"w1", "w2", "new"}, e.claimIDs(store.ClaimSpec{Now: at2, Lease: at2.Add(time.Minute), Limit: 10}),
			"the rows retried now are claimed with the new one")

		if e.history() != nil {
			sameAttempts(t, []store.Attempt{
				{At: at, Attempt: 1, Outcome: store.AttemptRetry, Error: "e-w1"},
				{At: at2, Attempt: 1, Outcome: store.AttemptRetried, Error: "e-w1", Actor: "ops@example.com"},
			}, e.attempts("w1"), "w1 retried now")
			sameAttempts(t, []store.Attempt{{At: at, Attempt: 1, Outcome: store.AttemptRetry, Error: "e-leased"}}, e.attempts("leased"), "a row not retried")
		}

		// Without a filter, every row that waits, by nobody named: the
		// leased row is still held.
		at3 := at2.Add(time.Minute)
		assert.EqualValues(t, 1, e.retryNow(store.Filter{}, at3, ""), "the other row that waits")
		sameTime(t, at3, e.get("other").AvailableAt, "other is due now")
		if e.history() != nil {
			sameAttempts(t, []store.Attempt{
				{At: at, Attempt: 1, Outcome: store.AttemptRetry, Error: "e-other"},
				{At: at3, Attempt: 1, Outcome: store.AttemptRetried, Error: "e-other"},
			}, e.attempts("other"), "other retried now by nobody named")
		}
	})

	t.Run("Purge", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		with := func(ev store.Event, typ string) store.Event { ev.Type = typ; return ev }
		e.insert(now, with(ev("s1"), "a"), with(ev("s2"), "b"), with(ev("f1"), "a"), with(ev("p1"), "a"))
		e.sent(now, "s1", "s2")
		e.failed(now, "boom", "f1")
		f := store.Filter{Statuses: []string{"sent", "failed"}, Types: []string{"a"}}
		assert.ElementsMatch(t, []string{"s1", "f1"}, e.purged(f))
		assert.EqualValues(t, 2, e.purge(f), "the rows that match")
		assert.Equal(t, map[string]state{"s2": {"sent", 1}, "p1": {"pending", 0}}, e.states())
		assert.EqualValues(t, 0, e.purge(f), "nothing matches any more")
		assert.EqualValues(t, 1, e.purge(store.Filter{Statuses: []string{"sent"}}), "the caller says which statuses")
		assert.Equal(t, map[string]state{"p1": {"pending", 0}}, e.states())
	})

	t.Run("Stats", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		assert.Empty(t, e.stats(), "an empty table")
		e.insert(now.Add(-3*time.Hour), ev("s1"))
		e.insert(now.Add(-2*time.Hour), ev("p1"), ev("f1"))
		e.insert(now.Add(-1*time.Hour), ev("p2"), ev("f2"))
		e.insert(now, ev("f3"))
		e.sent(now, "s1")
		e.failed(now.Add(-2*time.Hour), "x", "f1")
		e.failed(now.Add(-1*time.Hour), "x", "f2")
		e.failed(now, "x", "f3")
		got := e.stats()
		want := map[string]statRow{
			"pending": {2, now.Add(-2 * time.Hour)},
			"sent":    {1, now.Add(-3 * time.Hour)},
			"failed":  {3, now.Add(-2 * time.Hour)},
		}
		require.Len(t, got, len(want))
		for status, w := range want {
			assert.Equal(t, w.N, got[status].N, "count of %s", status)
			sameTime(t, w.Oldest, got[status].Oldest, "oldest creation of %s", status)
		}

		// FailedSince: rows failed at or after the time (updated_at is when).
		e.insert(now, ev("p3"))
		lease := e.settle("p3")
		require.EqualValues(t, 1, e.markFailed([]store.Outcome{e.outcome("p3", "pending", "retry", now)}, now, lease))
		assert.EqualValues(t, 2, e.failedSince(now.Add(-time.Hour)), "failed since an hour, inclusive; a retry is not failed")
		assert.EqualValues(t, 3, e.failedSince(now.Add(-3*time.Hour)))
		assert.EqualValues(t, 0, e.failedSince(now.Add(µs)))
	})
}

func nilIfEmpty(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return s
}
