package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// maxParams is each database's limit on a statement's parameters.
var maxParams = map[string]int{
	"sqlite":   32766, // SQLITE_MAX_VARIABLE_NUMBER since 3.32
	"postgres": 65535,
	"mysql":    65535,
}

// maxGaps is how many seqs a relay's watermark passes to Walk and Claim at
// most (engine.MaxGaps), and walkRows how many rows one walk reads
// (engine.WalkBatches claims of up to InsertRows rows, at most 10000).
const (
	maxGaps  = 10000
	walkRows = 1000
)

// Parameters per row: an INSERT row has 11, an outcome row 4.
const (
	insertParams  = 11
	outcomeParams = 4
)

func testLimits(t *testing.T, open Open) {
	e := setup(t, open)
	lim := e.s.Limits()
	for name, v := range map[string]int{
		"InsertRows": lim.InsertRows, "OutcomeRows": lim.OutcomeRows, "AdminBatch": lim.AdminBatch,
		"AdminScan": lim.AdminScan, "RetentionBatch": lim.RetentionBatch,
	} {
		assert.Positive(t, v, "Limits().%s", name)
	}
	maxP, ok := maxParams[e.s.Name()]
	require.True(t, ok, "the suite does not know the parameter limit of %s: add it to maxParams", e.s.Name())
	assert.LessOrEqual(t, lim.InsertRows*insertParams, maxP, "InsertRows*%d within %s's %d parameters", insertParams, e.s.Name(), maxP)
	assert.LessOrEqual(t, lim.OutcomeRows*outcomeParams, maxP, "OutcomeRows*%d within %s's %d parameters", outcomeParams, e.s.Name(), maxP)

	// And the database takes statements of that size (one INSERT: the
	// pure-Go SQLite under -race takes seconds for one).
	n := lim.InsertRows
	rows := make([]store.Event, n)
	names := ids("n", n)
	for i, id := range names {
		// Generated events and events the publisher named, alternately:
		// the statement has its conflict clause.
		if i%2 == 0 {
			rows[i] = generated()
			names[i] = rows[i].ID
		} else {
			rows[i] = ev(id)
		}
	}
	require.EqualValues(t, n, e.insert(now, rows...), "one INSERT of InsertRows rows")
	assert.Len(t, e.keysOf(names...), n/2, "Held of InsertRows IDs finds the named ones")

	m := min(lim.OutcomeRows, n)
	at := now.Add(time.Second)
	claimAll := func(lease time.Time) []store.Claimed {
		t.Helper()
		got := e.claim(store.ClaimSpec{Now: at, Lease: lease, Limit: m})
		require.Len(t, got, m)
		return got
	}
	seqsOf := func(batch []store.Claimed) []int64 {
		out := make([]int64, len(batch))
		for i := range batch {
			out[i] = batch[i].Seq
		}
		return out
	}
	l1 := now.Add(time.Hour)
	batch := claimAll(l1)
	outs := make([]store.Outcome, m)
	for i, c := range batch {
		outs[i] = store.Outcome{Seq: c.Seq, ID: c.ID, Status: "pending", Err: fmt.Sprintf("error %d", i), Due: at}
	}
	assert.EqualValues(t, m, e.exec(e.s.MarkFailed(outs, at, l1)), "one MarkFailed of OutcomeRows rows")
	l2 := l1.Add(time.Second)
	batch = claimAll(l2)
	assert.EqualValues(t, m, e.exec(e.s.Release(seqsOf(batch), at, l2)), "one Release of OutcomeRows rows")
	l3 := l2.Add(time.Second)
	batch = claimAll(l3)
	assert.EqualValues(t, m, e.exec(e.s.MarkSent(seqsOf(batch), at, l3)), "one MarkSent of OutcomeRows rows")

	// The operating functions' batches, with every filter field set (IDs
	// of every kind).
	f := store.Filter{
		IDs: []string{"a", "b", names[0], "0190f0c4-8a6e-7b3c-9d2e-5f1a2b3c4d5e"}, Statuses: []string{"sent", "failed"}, Types: []string{"x", "y"},
		AggregateType: "t", AggregateID: "i", CreatedSince: now.Add(-time.Hour), CreatedUntil: now.Add(time.Hour),
		ErrorContains: "e",
	}
	scan := make([]int64, lim.AdminBatch)
	for i := range scan {
		scan[i] = int64(i + 1)
	}
	e.exec(e.s.ReplayUpdate(f, scan, at))
	e.exec(e.s.PurgeDelete(f, scan))
	e.seqList(e.s.ReplaySelect(f, 0, lim.AdminScan))
	e.seqList(e.s.PurgeSelect(f, lim.AdminScan))
	if w := e.walker(); w != nil {
		// The watermark's statements, with as many seqs as a relay passes
		// them, one new row among them.
		require.EqualValues(t, 1, e.insert(at, ev("late")))
		late := e.get("late").Seq
		gaps := make([]int64, maxGaps)
		for i := range gaps {
			gaps[i] = late - int64(i) // every row's seq among them
		}
		assert.Len(t, e.walk(w.Walk(0, maxGaps, nil, at)), n+1, "one Walk of every row")
		assert.Len(t, e.walk(w.Walk(late+1, walkRows, gaps, at)), n+1, "one Walk with %d gaps", maxGaps)
		claimed := e.claimIDs(store.ClaimSpec{Now: at, Lease: l3.Add(time.Second), Limit: m, From: late + 1, Gaps: gaps})
		assert.Equal(t, []string{"late"}, claimed, "a claim with %d gaps", maxGaps)
		assert.EqualValues(t, 0, e.exec(w.Defer(gaps, at)), "one Defer of %d seqs: the one open row is leased", maxGaps)
	}
	assert.EqualValues(t, min(m, lim.RetentionBatch), e.exec(e.s.DeleteSent(now.Add(time.Hour), lim.RetentionBatch)), "one DeleteSent of RetentionBatch rows")
}
