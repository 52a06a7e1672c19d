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
		rows[i] = generated(id)
	}
	rows[n-1].Generated = false // the statement with its conflict clause
	require.EqualValues(t, n, e.insert(now, rows...), "one INSERT of InsertRows rows")
	assert.Len(t, e.keysOf(names...), n, "KeysOf of InsertRows IDs")

	m := min(lim.OutcomeRows, n)
	at := now.Add(time.Second)
	claimAll := func(lease time.Time) []string {
		t.Helper()
		got := e.claimIDs(store.ClaimSpec{Now: at, Lease: lease, Limit: m})
		require.Len(t, got, m)
		return got
	}
	l1 := now.Add(time.Hour)
	batch := claimAll(l1)
	outs := make([]store.Outcome, m)
	for i, id := range batch {
		outs[i] = store.Outcome{ID: id, Status: "pending", Err: fmt.Sprintf("error %d", i), Due: at}
	}
	assert.EqualValues(t, m, e.exec(e.s.MarkFailed(outs, at, l1)), "one MarkFailed of OutcomeRows rows")
	l2 := l1.Add(time.Second)
	batch = claimAll(l2)
	assert.EqualValues(t, m, e.exec(e.s.Release(batch, at, l2)), "one Release of OutcomeRows rows")
	l3 := l2.Add(time.Second)
	batch = claimAll(l3)
	assert.EqualValues(t, m, e.exec(e.s.MarkSent(batch, at, l3)), "one MarkSent of OutcomeRows rows")

	// The operating functions' batches, with every filter field set.
	f := store.Filter{
		IDs: []string{"a", "b"}, Statuses: []string{"sent", "failed"}, Types: []string{"x", "y"},
		AggregateType: "t", AggregateID: "i", CreatedSince: now.Add(-time.Hour), CreatedUntil: now.Add(time.Hour),
		ErrorContains: "e",
	}
	scan := ids("x", lim.AdminBatch)
	e.exec(e.s.ReplayUpdate(f, scan, at))
	e.exec(e.s.PurgeDelete(f, scan))
	e.seqIDs(e.s.ReplaySelect(f, 0, lim.AdminScan))
	e.seqIDs(e.s.PurgeSelect(f, lim.AdminScan))
	assert.EqualValues(t, min(m, lim.RetentionBatch), e.exec(e.s.DeleteSent(now.Add(time.Hour), lim.RetentionBatch)), "one DeleteSent of RetentionBatch rows")
}
