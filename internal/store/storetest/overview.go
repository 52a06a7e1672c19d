package storetest

import (
	"database/sql"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// minute is whole minutes since the Unix epoch, as the overview counts.
func minute(t time.Time) int64 { return t.Unix() / 60 }

// bins is a rollup row's delay bins, with n in bin i.
func bins(i int, n int64) []int64 {
	d := make([]int64, len(store.DelayBounds)+1)
	d[i] = n
	return d
}

// rollState runs RollState on the pool.
func (e *env) rollState() (store.RollState, bool) {
	e.t.Helper()
	st, ok, err := e.overview().RollState(e.ctx, e.db)
	require.NoError(e.t, err, "RollState")
	return st, ok
}

// rollPass runs one pass of the rollup as a relay does, in a transaction
// of its own: RollBegin from the time from, then RollCommit at now of the
// rows and state next returns given the state RollBegin returned. It
// returns that state.
func (e *env) rollPass(now time.Time, next func(tx *sql.Tx, st store.RollState) ([]store.RollRow, store.RollState)) store.RollState {
	e.t.Helper()
	ov := e.overview()
	tx, err := e.db.BeginTx(e.ctx, nil)
	require.NoError(e.t, err)
	defer func() { _ = tx.Rollback() }()
	st, err := ov.RollBegin(e.ctx, tx, now)
	require.NoError(e.t, err, "RollBegin")
	rows, st2 := next(tx, st)
	require.NoError(e.t, ov.RollCommit(e.ctx, tx, rows, now, st2), "RollCommit of %d rows", len(rows))
	require.NoError(e.t, tx.Commit())
	return st
}

// readOverview runs ReadOverview.
func (e *env) readOverview(q store.OverviewQuery) store.OverviewRows {
	e.t.Helper()
	got, err := e.overview().ReadOverview(e.ctx, e.db, q)
	require.NoError(e.t, err, "ReadOverview(%+v)", q)
	return got
}

// sentBins runs SentBins on the pool.
func (e *env) sentBins(from, to time.Time) []store.SentBin {
	e.t.Helper()
	got, err := e.overview().SentBins(e.ctx, e.db, from, to)
	require.NoError(e.t, err, "SentBins")
	return got
}

// sameState asserts two rollup states are equal.
func sameState(t *testing.T, want, got store.RollState, what string) {
	t.Helper()
	sameTime(t, want.Until, got.Until, "%s: Until", what)
	sameTime(t, want.Checked, got.Checked, "%s: Checked", what)
	assert.Equal(t, want.Low, got.Low, "%s: Low", what)
}

func testOverview(t *testing.T, su *suite) {
	t.Run("RollState", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		ov := e.overview()
		_, ok := e.rollState()
		assert.False(t, ok, "no state before the first pass")

		// The first pass with nothing sent starts from the time given.
		from := now.Add(-time.Hour)
		e.rolledBack(func(tx *sql.Tx) {
			st, err := ov.RollBegin(e.ctx, tx, from)
			require.NoError(t, err)
			sameState(t, store.RollState{Until: from, Checked: time.Unix(0, 0)}, st, "RollBegin with nothing sent")
			st, ok, err := ov.RollState(e.ctx, tx)
			require.NoError(t, err)
			assert.True(t, ok, "RollBegin creates the state in its transaction")
			sameState(t, store.RollState{Until: from, Checked: time.Unix(0, 0)}, st, "RollState in RollBegin's transaction")
		})
		_, ok = e.rollState()
		assert.False(t, ok, "a pass rolled back leaves no state")

		// With rows sent, from the oldest sent row.
		e.insert(now.Add(-10*time.Minute), ev("s1"), ev("s2"), ev("p1"))
		s1 := now.Add(-5 * time.Minute)
		e.sent(now.Add(-3*time.Minute), "s2")
		e.sent(s1, "s1")
		e.failed(now.Add(-8*time.Minute), "x", "p1")
		st1 := store.RollState{Until: now.Add(-time.Minute), Low: 42, Checked: now}
		began := e.rollPass(now, func(_ *sql.Tx, st store.RollState) ([]store.RollRow, store.RollState) { return nil, st1 })
		sameState(t, store.RollState{Until: s1, Checked: time.Unix(0, 0)}, began, "RollBegin from the oldest sent row")
		st, ok := e.rollState()
		require.True(t, ok, "RollState after a pass")
		sameState(t, st1, st, "RollCommit writes the state")

		// The next pass begins from the state, whatever is sent.
		e.insert(now.Add(-time.Hour), ev("s0"))
		e.sent(now.Add(-time.Hour), "s0")
		st2 := store.RollState{Until: now, Low: 43, Checked: now.Add(time.Second)}
		began = e.rollPass(now.Add(time.Minute), func(_ *sql.Tx, st store.RollState) ([]store.RollRow, store.RollState) { return nil, st2 })
		sameState(t, st1, began, "RollBegin of a later pass returns the state")
		st, _ = e.rollState()
		sameState(t, st2, st, "the later pass's state")
	})

	// The rows sent in a time range, by type, minute sent, minute created
	// and delay bin (delays away from the bins' bounds by more than a
	// millisecond: SQLite's julianday keeps milliseconds).
	t.Run("SentBins", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		base := now.Truncate(time.Minute).Add(-time.Hour)
		c0 := base.Add(10 * time.Second)
		m := minute(base)
		typed := func(id, typ string) store.Event { x := ev(id); x.Type = typ; return x }
		e.insert(c0, typed("a1", "A"), typed("a2", "A"), typed("b1", "B"), typed("a3", "A"), typed("a4", "A"), typed("p", "A"), typed("f", "A"))
		e.sent(c0.Add(7*time.Millisecond), "a1", "a2") // bin 3: [5, 10) ms
		e.sent(c0.Add(40*time.Millisecond), "b1")      // bin 5: [25, 50) ms
		e.sent(c0.Add(2*time.Second), "a3")            // bin 10: [1000, 2500) ms
		e.sent(c0.Add(time.Hour), "a4")                // the last bin, past 30 min; sent an hour later
		e.failed(c0.Add(time.Second), "x", "f")
		assert.ElementsMatch(t, []store.SentBin{
			{Type: "A", Sent: m, Created: m, Bin: 3, N: 2},
			{Type: "B", Sent: m, Created: m, Bin: 5, N: 1},
			{Type: "A", Sent: m, Created: m, Bin: 10, N: 1},
			{Type: "A", Sent: m + 60, Created: m, Bin: len(store.DelayBounds), N: 1},
		}, e.sentBins(base, base.Add(2*time.Hour)), "the sent rows, neither pending nor failed")
		assert.ElementsMatch(t, []store.SentBin{{Type: "A", Sent: m, Created: m, Bin: 3, N: 2}},
			e.sentBins(c0.Add(7*time.Millisecond), c0.Add(40*time.Millisecond)), "from inclusive, to exclusive")
		assert.Empty(t, e.sentBins(base.Add(-time.Hour), base), "a range with nothing sent")
	})

	t.Run("RollCommit", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		m := minute(now)
		m10, m60 := m-m%10, minute(now.Add(-48*time.Hour))
		m60 -= m60 % 60
		st := store.RollState{Until: now, Checked: now}
		pass := func(at time.Time, rows ...store.RollRow) {
			t.Helper()
			e.rollPass(at, func(*sql.Tx, store.RollState) ([]store.RollRow, store.RollState) { return rows, st })
		}
		pass(now,
			store.RollRow{Span: 1, Minute: m, Type: "A", Published: 1, Delivered: 2, Delay: bins(3, 2)},
			store.RollRow{Span: 1, Minute: minute(now.Add(-24 * time.Hour)), Type: "A", Published: 5, Delivered: 5, Delay: bins(0, 5)},
			store.RollRow{Span: 1, Minute: minute(now.Add(-26 * time.Hour)), Type: "A", Published: 9, Delivered: 9, Delay: bins(0, 9)},
			store.RollRow{Span: 10, Minute: m10, Type: "A", Published: 1, Delivered: 2, Delay: bins(3, 2)},
			store.RollRow{Span: 60, Minute: m60, Type: "A", Published: 3, Delivered: 3, Delay: bins(1, 3)},
		)
		span := func(span, since, step int64) []store.RollupSum {
			t.Helper()
			return e.readOverview(store.OverviewQuery{Span: span, SinceMinute: since, Step: step, SentFrom: now, SentTo: now}).Rollup
		}
		since := minute(now.Add(-30 * time.Hour))
		assert.ElementsMatch(t, []store.RollupSum{
			{Interval: int(minute(now.Add(-24*time.Hour)) - since), Type: "A", Published: 5, Delivered: 5, Delay: bins(0, 5)},
			{Interval: int(m - since), Type: "A", Published: 1, Delivered: 2, Delay: bins(3, 2)},
		}, span(1, since, 1), "span 1: a minute older than its keep (25 h) is trimmed at once")
		assert.ElementsMatch(t, []store.RollupSum{{Interval: 0, Type: "A", Published: 1, Delivered: 2, Delay: bins(3, 2)}}, span(10, m10, 10))

		// A second pass adds to the rows there.
		pass(now.Add(time.Second),
			store.RollRow{Span: 1, Minute: m, Type: "A", Published: 1, Delivered: 3, Delay: bins(3, 3)},
			store.RollRow{Span: 1, Minute: m, Type: "B", Published: 4, Delivered: 4, Delay: bins(2, 4)},
		)
		assert.ElementsMatch(t, []store.RollupSum{
			{Interval: 0, Type: "A", Published: 2, Delivered: 5, Delay: bins(3, 5)},
			{Interval: 0, Type: "B", Published: 4, Delivered: 4, Delay: bins(2, 4)},
		}, span(1, m, 1), "RollCommit adds each column to the row there")

		// A pass two hours on trims the minutes its now leaves behind.
		pass(now.Add(2 * time.Hour))
		assert.ElementsMatch(t, []store.RollupSum{
			{Interval: int(m - since), Type: "A", Published: 2, Delivered: 5, Delay: bins(3, 5)},
			{Interval: int(m - since), Type: "B", Published: 4, Delivered: 4, Delay: bins(2, 4)},
		}, span(1, since, 1), "span 1 keeps 25 hours from the pass's now")
		assert.ElementsMatch(t, []store.RollupSum{{Interval: 0, Type: "A", Published: 3, Delivered: 3, Delay: bins(1, 3)}}, span(60, m60, 60),
			"span 60 keeps 8 days")
		got, _ := e.rollState()
		sameState(t, st, got, "RollCommit writes the state")
	})

	t.Run("ReadOverview", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		s := minute(now) - 100
		// The rollup, summed per interval of 10 minutes from s.
		e.rollPass(now, func(_ *sql.Tx, st store.RollState) ([]store.RollRow, store.RollState) {
			return []store.RollRow{
				{Span: 1, Minute: s - 1, Type: "A", Published: 100, Delivered: 100, Delay: bins(0, 100)}, // before s
				{Span: 1, Minute: s + 1, Type: "A", Published: 1, Delivered: 1, Delay: bins(0, 1)},
				{Span: 1, Minute: s + 3, Type: "A", Published: 2, Delivered: 2, Delay: bins(4, 2)},
				{Span: 1, Minute: s + 12, Type: "A", Published: 4, Delivered: 4, Delay: bins(4, 4)},
				{Span: 1, Minute: s + 3, Type: "B", Published: 8, Delivered: 8, Delay: bins(1, 8)},
				{Span: 10, Minute: s - s%10, Type: "A", Published: 50, Delivered: 50, Delay: bins(0, 50)}, // another span
			}, st
		})

		// Rows sent before and after the rollup's end, pending (new and
		// waiting for a retry) and failed.
		cA, cB := now.Add(-50*time.Minute), now.Add(-40*time.Minute)
		typed := func(id, typ string) store.Event { x := ev(id); x.Type = typ; return x }
		e.insert(cA, typed("pA1", "A"), typed("pA2", "A"), typed("pA3", "A"), typed("fA1", "A"), typed("fA2", "A"), typed("sA1", "A"), typed("sA2", "A"))
		e.insert(cB, typed("pB1", "B"), typed("fB1", "B"))
		end := now.Add(-10 * time.Minute)
		e.sent(end.Add(-time.Second), "sA1")
		e.sent(end.Add(7*time.Millisecond), "sA2")
		lease := e.settle("pA3")
		require.EqualValues(t, 1, e.markFailed([]store.Outcome{e.outcome("pA3", "pending", "retry", now.Add(time.Hour))}, now.Add(-5*time.Minute), lease))
		fail1, fail2 := now.Add(-20*time.Minute), now.Add(-15*time.Minute)
		e.failed(fail1, "x", "fA1", "fA2")
		e.failed(fail2, "x", "fB1")

		q := store.OverviewQuery{Span: 1, SinceMinute: s, Step: 10, SentFrom: end, SentTo: now}
		got := e.readOverview(q)
		a0 := bins(0, 1)
		a0[4] = 2
		assert.ElementsMatch(t, []store.RollupSum{
			{Interval: 0, Type: "A", Published: 3, Delivered: 3, Delay: a0},
			{Interval: 1, Type: "A", Published: 4, Delivered: 4, Delay: bins(4, 4)},
			{Interval: 0, Type: "B", Published: 8, Delivered: 8, Delay: bins(1, 8)},
		}, got.Rollup, "the rollup's span from SinceMinute, summed per Step")
		assert.ElementsMatch(t, []store.SentBin{{Type: "A", Sent: minute(end.Add(7 * time.Millisecond)), Created: minute(cA), Bin: len(store.DelayBounds), N: 1}},
			got.Sent, "the rows sent from SentFrom on (40 minutes after they were created: the last bin)")
		assert.Equal(t, e.sentBins(end, now), got.Sent, "Sent is SentBins of [SentFrom, SentTo)")
		pending := func(got []store.PendingGroup) map[[2]any]int64 {
			out := map[[2]any]int64{}
			for _, g := range got {
				out[[2]any{g.Type, g.Created}] = g.N
				want := cA
				if g.Type == "B" {
					want = cB
				}
				sameTime(t, want, g.Oldest, "the oldest creation of %s's pending rows", g.Type)
			}
			return out
		}
		assert.Equal(t, map[[2]any]int64{{"A", minute(cA)}: 3, {"B", minute(cB)}: 1}, pending(got.Pending), "the pending rows, new and waiting for a retry")
		assert.ElementsMatch(t, []store.FailedGroup{
			{Type: "A", Failed: minute(fail1), Created: minute(cA), N: 2},
			{Type: "B", Failed: minute(fail2), Created: minute(cB), N: 1},
		}, got.Failed, "the failed rows by the minute they failed and were created")

		if e.walker() != nil {
			// Low is where new pending rows start: below it only the retry
			// index holds pending rows.
			q.Low = e.get("pA2").Seq
			got = e.readOverview(q)
			assert.Equal(t, map[[2]any]int64{{"A", minute(cA)}: 2, {"B", minute(cB)}: 1}, pending(got.Pending),
				"a new row below Low is not counted; the retry is, whatever Low")
		}
	})
}
