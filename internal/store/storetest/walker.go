package storetest

import (
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// walkRow is one row of Walk, without its lease's end.
type walkRow struct {
	Seq          int64
	Open, Leased bool
}

// walk runs Walk, each leased row checked to tell its lease's end.
func (e *env) walk(from int64, limit int, gaps []int64, at time.Time) []walkRow {
	e.t.Helper()
	got, err := e.walker().Walk(e.ctx, e.db, from, limit, gaps, at)
	require.NoError(e.t, err, "Walk(%d, %d, %d gaps)", from, limit, len(gaps))
	var out []walkRow
	for _, r := range got {
		if r.Leased {
			require.True(e.t, r.LeaseEnd.After(at), "a leased row's lease ends after the walk's now: seq %d, %s", r.Seq, r.LeaseEnd)
		}
		out = append(out, walkRow{r.Seq, r.Open, r.Leased})
	}
	return out
}

// lowOpen runs LowOpen from 0 at now: the lowest seq of an open row not
// leased and the highest seq (0 for none).
func (e *env) lowOpen() (low, high int64) {
	e.t.Helper()
	return e.lowOpenAt(0, now)
}

// lowOpenAt runs LowOpen.
func (e *env) lowOpenAt(from int64, at time.Time) (low, high int64) {
	e.t.Helper()
	low, high, err := e.walker().LowOpen(e.ctx, e.db, from, at)
	require.NoError(e.t, err, "LowOpen(%d, %s)", from, at)
	return low, high
}

// deferred runs Defer.
func (e *env) deferred(seqs []int64, at time.Time) int64 {
	e.t.Helper()
	n, err := e.walker().Defer(e.ctx, e.db, seqs, at)
	require.NoError(e.t, err, "Defer of %d seqs", len(seqs))
	return n
}

// testWalker checks store.Walker and the claim's watermark sources
// (ClaimSpec.From and Gaps), on the stores that find new events by seq.
func testWalker(t *testing.T, su *suite) {
	// Three sources: new rows from From on, new rows at the seqs in Gaps,
	// and the rows waiting for a retry that are due, wherever they are.
	t.Run("ClaimSources", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		e.insert(now, ev("f1"), ev("f2"), ev("f3"), ev("f4"), ev("f5"), ev("f6"))
		seq := e.seqOf("f1", "f2", "f3", "f4", "f5", "f6")
		high := seq["f6"] + 1
		lease := now.Add(time.Minute)
		spec := func(from int64, gaps ...int64) store.ClaimSpec {
			return store.ClaimSpec{Now: now, Lease: lease, Limit: 10, From: from, Gaps: gaps}
		}
		assert.Equal(t, []string{"f5", "f6"}, e.claimIDs(spec(seq["f5"])), "From excludes the new rows below it")
		assert.Equal(t, []string{"f2"}, e.claimIDs(spec(high, seq["f2"], high+50)), "Gaps: a new row below From")
		assert.Empty(t, e.claimIDs(spec(seq["f5"], seq["f2"])), "leased rows, in Gaps or from From, are not claimed again")

		// f5 fails with a due time past, f6 with one to come; f2 is handed
		// back (due now).
		require.EqualValues(t, 2, e.markFailed([]store.Outcome{
			e.outcome("f5", "pending", "retry", now.Add(-time.Minute)),
			e.outcome("f6", "pending", "retry", now.Add(time.Hour)),
		}, now, lease))
		require.EqualValues(t, 1, e.release(e.seqs("f2"), now, lease))
		for _, id := range []string{"f2", "f5", "f6"} {
			assert.False(t, e.nulls(seq[id])["available_at"], "%s waits in the retry index", id)
		}
		far := now.Add(100 * time.Hour)
		l2 := far.Add(µs)
		assert.Equal(t, []string{"f2", "f5"}, e.claimIDs(store.ClaimSpec{Now: now, Lease: l2, Limit: 10, From: seq["f5"], Gaps: []int64{seq["f6"]}}),
			"the due retries, whatever From; f6, above From and in Gaps, not before its time")
		assert.Empty(t, e.claimIDs(store.ClaimSpec{Now: now.Add(time.Hour - µs), Lease: far, Limit: 10, From: high}), "f6 before its time")
		assert.Equal(t, []string{"f6"}, e.claimIDs(store.ClaimSpec{Now: now.Add(time.Hour), Lease: far, Limit: 10, From: high}), "f6 at its time, whatever From")

		// The new rows no source offered were not touched.
		st := e.states()
		for _, id := range []string{"f1", "f3", "f4"} {
			assert.Equal(t, state{"pending", 0}, st[id], id)
		}
		assert.Equal(t, []string{"f1", "f3", "f4"}, e.claimIDs(store.ClaimSpec{Now: now, Lease: far, Limit: 10}), "From 0: every new row")

		// A row sent or failed is never claimed, through any source.
		require.EqualValues(t, 1, e.markSent(e.seqs("f1"), now, far))
		require.EqualValues(t, 1, e.markSent(e.seqs("f2"), now, l2))
		e.raw("UPDATE " + e.qt + " SET status = 'failed'" + where("f3"))
		e.raw("UPDATE " + e.qt + " SET status = 'failed'" + where("f5"))
		assert.Empty(t, e.claimIDs(store.ClaimSpec{Now: now.Add(50 * time.Hour), Lease: now.Add(2000 * time.Hour), Limit: 10, From: high,
			Gaps: e.seqs("f1", "f2", "f3", "f5")}))

		// Limit bounds the claim across the sources.
		e.insert(now, ev("n1"), ev("n2"), ev("n3"))
		n := e.seqOf("n1", "n2", "n3")
		l3 := now.Add(3000 * time.Hour)
		require.Len(t, e.claim(store.ClaimSpec{Now: now, Lease: l3, Limit: 1, Seqs: e.seqs("n2")}), 1)
		require.EqualValues(t, 1, e.release(e.seqs("n2"), now, l3))
		got := e.claimIDs(store.ClaimSpec{Now: now, Lease: l3, Limit: 2, From: n["n3"], Gaps: []int64{n["n1"]}})
		assert.Len(t, got, 2, "Limit 2 of the three rows the sources offer: %v", got)
		got = append(got, e.claimIDs(store.ClaimSpec{Now: now, Lease: l3, Limit: 2, From: n["n3"], Gaps: []int64{n["n1"]}})...)
		assert.ElementsMatch(t, []string{"n1", "n2", "n3"}, got, "the third row in the next claim")
	})

	t.Run("Walk", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		assert.Empty(t, e.walk(0, 10, nil, now), "an empty table")
		e.insert(now, ev("w1"), ev("w2"), ev("w3"), ev("w4"), ev("w5"), ev("w6"), ev("w7"), ev("w8"))
		seq := e.seqOf("w1", "w2", "w3", "w4", "w5", "w6", "w7", "w8")
		e.sent(now, "w1") // done
		e.settle("w2")    // new, leased
		// w3 new, not leased.
		l4 := e.settle("w4") // waits for a retry
		require.EqualValues(t, 1, e.markFailed([]store.Outcome{e.outcome("w4", "pending", "retry", now.Add(time.Hour))}, now, l4))
		e.failed(now, "boom", "w5")
		e.raw("DELETE FROM " + e.qt + where("w6")) // no row at its seq
		// w7 new, its lease ends at now: not leased at now.
		require.Len(t, e.claim(store.ClaimSpec{Now: now, Lease: now, Limit: 1, Seqs: e.seqs("w7")}), 1)
		// w8 a retry, due, and claimed again: leased, not new.
		l8 := e.settle("w8")
		require.EqualValues(t, 1, e.markFailed([]store.Outcome{e.outcome("w8", "pending", "retry", now.Add(-time.Minute))}, now, l8))
		require.Len(t, e.claim(store.ClaimSpec{Now: now, Lease: now.Add(time.Minute), Limit: 1, Seqs: e.seqs("w8")}), 1)

		all := []walkRow{
			{seq["w1"], false, false}, {seq["w2"], true, true}, {seq["w3"], true, false}, {seq["w4"], false, false},
			{seq["w5"], false, false}, {seq["w7"], true, false}, {seq["w8"], false, true},
		}
		assert.Equal(t, all, e.walk(0, 100, nil, now), "every row in seq order: open is new and pending, leased is a lease running at now")
		assert.Equal(t, all, e.walk(seq["w1"], 100, nil, now), "from is inclusive")
		assert.Equal(t, all[2:4], e.walk(seq["w3"], 2, nil, now), "limit")
		assert.Equal(t, all[5:], e.walk(seq["w6"], 10, nil, now), "from a seq that holds no row")
		assert.Empty(t, e.walk(seq["w8"]+1, 10, nil, now), "past the last row")
		assert.Equal(t, []walkRow{{seq["w2"], true, false}}, e.walk(seq["w2"], 1, nil, now.Add(2000*time.Hour)), "a lease that has passed")

		// The rows at the gaps (below from) first, read the same way.
		beyond := seq["w8"] + 200
		assert.ElementsMatch(t, []walkRow{all[1], all[2], all[6]},
			e.walk(beyond, 10, []int64{seq["w8"], seq["w6"], seq["w2"], seq["w3"], seq["w8"] + 100}, now),
			"the rows at the gaps; a gap that holds no row is left out")
		assert.Empty(t, e.walk(beyond, 10, []int64{seq["w6"]}, now), "a gap that holds no row")
		got := e.walk(seq["w5"], 10, []int64{seq["w3"], seq["w1"]}, now)
		if assert.Len(t, got, 5) {
			assert.ElementsMatch(t, []walkRow{all[0], all[2]}, got[:2], "the gaps' rows first")
			assert.Equal(t, all[4:], got[2:], "then the walk from from, in seq order")
		}
		got = e.walk(seq["w5"], 1, []int64{seq["w3"], seq["w1"], seq["w2"]}, now)
		assert.Len(t, got, 4, "limit bounds the walk, not the gaps: %v", got)
	})

	t.Run("Defer", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		e.insert(now, ev("d1"), ev("d2"), ev("d3"), ev("d4"), ev("d5"))
		seq := e.seqOf("d1", "d2", "d3", "d4", "d5")
		// d1 new; d2 new and leased; d3 waits for a retry; d4 sent; d5
		// new, its lease ended at now.
		e.settle("d2")
		l3 := e.settle("d3")
		require.EqualValues(t, 1, e.markFailed([]store.Outcome{e.outcome("d3", "pending", "retry", now.Add(time.Hour))}, now, l3))
		e.sent(now, "d4")
		require.Len(t, e.claim(store.ClaimSpec{Now: now, Lease: now, Limit: 1, Seqs: e.seqs("d5")}), 1)

		at := now.Add(time.Second)
		all := []int64{seq["d1"], seq["d2"], seq["d3"], seq["d4"], seq["d5"], seq["d5"] + 100}
		assert.EqualValues(t, 2, e.deferred(all, at), "only the open rows not leased: d1 and d5")
		assert.Equal(t, []walkRow{
			{seq["d1"], false, false}, {seq["d2"], true, true}, {seq["d3"], false, false}, {seq["d4"], false, false}, {seq["d5"], false, false},
		}, e.walk(0, 10, nil, at))
		for _, id := range []string{"d1", "d5"} {
			r := e.get(id)
			assert.Equal(t, "pending", r.Status, id)
			sameTime(t, at, r.AvailableAt, "a deferred row is due at the time given: %s", id)
		}
		assert.Equal(t, 0, e.get("d1").Attempts, "Defer counts no attempt")
		assert.True(t, e.nulls(seq["d2"])["available_at"], "a leased row is not deferred")
		sameTime(t, now.Add(time.Hour), e.get("d3").AvailableAt, "a retry keeps its due time")
		assert.Equal(t, "sent", e.get("d4").Status)
		assert.EqualValues(t, 0, e.deferred(all, at), "Defer again: nothing open and unleased is left")

		// A deferred row is claimed through the retry index, whatever From.
		assert.Empty(t, e.claimIDs(store.ClaimSpec{Now: at.Add(-µs), Lease: now.Add(time.Hour), Limit: 10, From: seq["d5"] + 1}), "before its time")
		assert.Equal(t, []string{"d1", "d5"}, e.claimIDs(store.ClaimSpec{Now: at, Lease: now.Add(time.Hour), Limit: 10, From: seq["d5"] + 1}))
	})

	t.Run("LowOpen", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		low, high := e.lowOpen()
		assert.Zero(t, low, "an empty table: no open row")
		assert.Zero(t, high, "an empty table: no seq")
		e.insert(now, ev("l1"), ev("l2"), ev("l3"), ev("l4"))
		seq := e.seqOf("l1", "l2", "l3", "l4")
		check := func(wantLow, wantHigh int64, what string) {
			t.Helper()
			low, high := e.lowOpen()
			assert.Equal(t, wantLow, low, "lowest open seq: %s", what)
			assert.Equal(t, wantHigh, high, "highest seq: %s", what)
		}
		check(seq["l1"], seq["l4"], "four new rows")
		low, high = e.lowOpenAt(seq["l2"], now)
		assert.Equal(t, seq["l2"], low, "from is inclusive")
		assert.Equal(t, seq["l4"], high, "the highest seq, whatever from")
		low, _ = e.lowOpenAt(seq["l4"]+1, now)
		assert.Zero(t, low, "no open row from past the last")
		e.sent(now, "l1")
		check(seq["l2"], seq["l4"], "l1 sent")
		l2 := e.settle("l2")
		check(seq["l3"], seq["l4"], "a leased new row is its relay's: not counted")
		low, _ = e.lowOpenAt(0, time.Time{})
		assert.Equal(t, seq["l2"], low, "with now zero, a leased new row counts as open (the overview's low mark)")
		low, _ = e.lowOpenAt(0, l2)
		assert.Equal(t, seq["l2"], low, "a lease that ends at now has passed")
		require.EqualValues(t, 1, e.markFailed([]store.Outcome{e.outcome("l2", "pending", "retry", now)}, now, l2))
		check(seq["l3"], seq["l4"], "a retry is not open")
		low, _ = e.lowOpenAt(0, time.Time{})
		assert.Equal(t, seq["l3"], low, "a retry is not open, with now zero either")
		require.EqualValues(t, 1, e.deferred(e.seqs("l3"), now))
		check(seq["l4"], seq["l4"], "a deferred row is not open")
		e.failed(now, "boom", "l4")
		check(0, seq["l4"], "no open row left")
		e.raw("DELETE FROM " + e.qt + where("l4"))
		check(0, seq["l3"], "the highest seq of the rows there are")
	})

	// OrderByAggregate holds a row behind an unsent older row of its
	// aggregate whichever source offers either.
	t.Run("OrderedAcrossSources", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		e.ensureOrdering()
		e.insert(now, agg("a1", "acct", "A"), agg("a2", "acct", "A"), agg("b1", "acct", "B"), agg("a3", "acct", "A"))
		seq := e.seqOf("a1", "a2", "b1", "a3")
		high := seq["a3"] + 1
		leases := map[string]time.Time{}
		claim := func(at time.Time, from int64, gaps ...int64) []string {
			t.Helper()
			lease := at.Add(100*time.Hour + time.Duration(len(leases))*µs)
			got := e.claimIDs(store.ClaimSpec{Now: at, Lease: lease, Limit: 10, Ordered: true, From: from, Gaps: gaps})
			for _, id := range got {
				leases[id] = lease
			}
			return got
		}
		assert.Equal(t, []string{"b1"}, claim(now, seq["a2"]), "a2 and a3 behind a1, which no source offers (below From)")
		assert.Equal(t, []string{"a1"}, claim(now, high, seq["a1"]), "a1 through Gaps")
		require.EqualValues(t, 1, e.markFailed([]store.Outcome{e.outcome("a1", "pending", "retry", now.Add(time.Minute))}, now, leases["a1"]))
		assert.Empty(t, claim(now.Add(10*time.Second), seq["a2"]), "a2 from From, behind a1 waiting for its retry")
		assert.Empty(t, claim(now.Add(10*time.Second), high, seq["a2"]), "a2 through Gaps, behind a1 waiting for its retry")
		require.EqualValues(t, 1, e.deferred(e.seqs("a2"), now.Add(10*time.Second)))
		assert.Empty(t, claim(now.Add(20*time.Second), high), "a2 due as a retry, behind a1 not due yet")
		assert.Equal(t, []string{"a1"}, claim(now.Add(time.Minute), seq["a3"]), "a1 due; a2 (retry) and a3 (From) behind it")
		require.EqualValues(t, 1, e.markSent(e.seqs("a1"), now, leases["a1"]))
		assert.Equal(t, []string{"a2"}, claim(now.Add(2*time.Minute), seq["a3"]), "a2 once a1 is sent; a3 behind a2")
		require.EqualValues(t, 1, e.markSent(e.seqs("a2"), now, leases["a2"]))
		assert.Equal(t, []string{"a3"}, claim(now.Add(3*time.Minute), seq["a3"]))
	})
}

// testNoWalker checks that a store that writes new events with their due
// time (no store.Walker) claims by it, ignoring the watermark.
func testNoWalker(t *testing.T, su *suite) {
	t.Run("ClaimIgnoresWatermark", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		e.insert(now, ev("m1"), ev("m2"))
		assert.False(t, e.nulls(e.get("m1").Seq)["available_at"], "a new row is written with its due time")
		const far = int64(1) << 40
		assert.Equal(t, []string{"m1", "m2"}, e.claimIDs(store.ClaimSpec{Now: now, Lease: now.Add(time.Minute), Limit: 10, From: far, Gaps: []int64{far + 1}}),
			"From and Gaps are ignored")
	})
}
