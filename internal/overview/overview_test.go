package overview

import (
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPercentiles(t *testing.T) {
	bins := make([]int64, len(store.DelayBounds)+1)
	assert.Equal(t, Delay{}, Percentiles(bins))
	bins[3] = 100 // 5 to 10 ms
	d := Percentiles(bins)
	assert.Equal(t, int64(100), d.N)
	assert.Equal(t, 7500*time.Microsecond, d.P50)
	assert.Equal(t, 9950*time.Microsecond, d.P99)
	bins[len(bins)-1] = 100 // past the last bound
	d = Percentiles(bins)
	assert.Equal(t, 10*time.Millisecond, d.P50, "the median at the first bin's top")
	assert.Equal(t, 30*time.Minute, d.P99, "past the last bound reads as the last bound")
}

func TestStep(t *testing.T) {
	for _, c := range []struct {
		window, asked time.Duration
		step, span    int64
	}{
		{time.Hour, 0, 1, 1},
		{6 * time.Hour, 0, 6, 1},
		{24 * time.Hour, 0, 30, 10},
		{7 * 24 * time.Hour, 0, 180, 60},
		{time.Hour, 90 * time.Second, 2, 1},
		{24 * time.Hour, time.Hour, 60, 60},
		{2 * 24 * time.Hour, 7 * time.Minute, 10, 10}, // minute rows are kept a day
		{7 * 24 * time.Hour, time.Minute, 20, 10},     // at most 1000 intervals
	} {
		step, span := Step(c.window, c.asked)
		assert.Equal(t, []int64{c.step, c.span}, []int64{step, span}, "%v by %v", c.window, c.asked)
	}
}

// now is 10:30:30 on a fixed day: minute m of the day is minute0+m.
var (
	now     = time.Date(2031, 3, 14, 10, 30, 30, 0, time.UTC)
	minute0 = time.Date(2031, 3, 14, 0, 0, 0, 0, time.UTC).Unix() / 60
)

func TestPlan(t *testing.T) {
	w := Plan(now, 0, 0)
	assert.Equal(t, time.Minute, w.Step, "an hour by the minute")
	assert.Equal(t, time.Date(2031, 3, 14, 9, 30, 0, 0, time.UTC), w.Since, "whole minutes, an hour back")
	assert.Equal(t, 61, w.n, "from 9:30 to 10:30, both included")
	q := w.Query(store.RollState{Until: now.Add(-time.Minute), Low: 42})
	assert.Equal(t, store.OverviewQuery{Span: 1, SinceMinute: minute0 + 9*60 + 30, Step: 1,
		SentFrom: now.Add(-time.Minute), SentTo: now.Add(time.Minute), Low: 42}, q)

	long := Plan(now, 30*24*time.Hour, 0)
	assert.Equal(t, 4*time.Hour, long.Step, "about 60 intervals of whole hours")
	assert.Equal(t, now.Add(-Retention).Truncate(4*time.Hour), long.Since, "a window past the rollup's retention is cut to it")
}

// TestFold sums a window of an hour by 10 minutes, without a database:
// what the rollup holds, the sent rows after it, the pending and failed
// rows now.
func TestFold(t *testing.T) {
	w := Plan(now, time.Hour, 10*time.Minute)
	require.Equal(t, 10*time.Minute, w.Step)
	require.Equal(t, time.Date(2031, 3, 14, 9, 30, 0, 0, time.UTC), w.Since)
	require.Equal(t, 7, w.n, "9:30, 9:40, ..., 10:30")
	at := func(h, m int) int64 { return minute0 + int64(h*60+m) }
	bins := func(bin int, n int64) []int64 {
		d := make([]int64, len(store.DelayBounds)+1)
		d[bin] = n
		return d
	}
	rows := store.OverviewRows{
		Rollup: []store.RollupSum{
			{Interval: 0, Type: "a", Published: 4, Delivered: 3, Delay: bins(2, 3)},
			{Interval: 1, Type: "b", Published: 1, Delivered: 1, Delay: bins(6, 1)},
		},
		Sent: []store.SentBin{
			{Type: "a", Sent: at(10, 29), Created: at(10, 21), Bin: 16, N: 2}, // delivered in the last interval, published in the one before
			{Type: "c", Sent: at(10, 25), Created: at(8, 0), Bin: 17, N: 1},   // published before the window
		},
		Pending: []store.PendingGroup{
			{Type: "a", Created: at(10, 28), N: 5, Oldest: time.Date(2031, 3, 14, 10, 28, 10, 0, time.UTC)},
			{Type: "b", Created: at(9, 0), N: 1, Oldest: time.Date(2031, 3, 14, 9, 0, 0, 0, time.UTC)},
		},
		Failed: []store.FailedGroup{
			{Type: "b", Failed: at(10, 10), Created: at(10, 5), N: 2},
		},
	}
	ov := Fold(w, rows, now.Add(-time.Minute))

	assert.Equal(t, int64(6), ov.Pending)
	assert.Equal(t, int64(2), ov.Failed)
	assert.Equal(t, 90*time.Minute+30*time.Second, ov.OldestPending, "the oldest pending, b's at 9:00")
	assert.Equal(t, []TypeCount{
		{Type: "a", Pending: 5, Published: 4 + 2 + 5, Delivered: 3 + 2},
		{Type: "b", Pending: 1, Failed: 2, Published: 1 + 2, Delivered: 1},
		{Type: "c", Delivered: 1},
	}, ov.Types, "by type, sorted; what was created before the window is not published in it")

	type counts struct{ pub, del, fail, backlog int64 }
	got := make([]counts, len(ov.Intervals))
	for i, iv := range ov.Intervals {
		got[i] = counts{iv.Published, iv.Delivered, iv.Failed, iv.Backlog}
		assert.Equal(t, w.Since.Add(time.Duration(i)*10*time.Minute), iv.Start)
	}
	// Intervals 9:30, 9:40, ..., 10:20, and 10:30, which holds now. The
	// backlog at each one's end is worked back from the 6 pending now:
	// before 10:20's (7 published, 3 delivered) it was 6-7+3 = 2; before
	// 10:10's (2 failed) 2+2 = 4; before 10:00's (2 published) 4-2 = 2.
	assert.Equal(t, []counts{
		{pub: 4, del: 3, backlog: 2},
		{pub: 1, del: 1, backlog: 2},
		{backlog: 2},
		{pub: 2, backlog: 4},
		{fail: 2, backlog: 2},
		{pub: 2 + 5, del: 2 + 1, backlog: 6},
		{backlog: 6},
	}, got)
	assert.Equal(t, int64(14), ov.Published)
	assert.Equal(t, int64(7), ov.Delivered)
	assert.Equal(t, int64(2), ov.FailedInWindow)
	assert.Equal(t, int64(7), ov.Delay.N)
	assert.Equal(t, int64(3), ov.Intervals[5].Delay.N, "10:20's delays: the three sent rows from the table")
	assert.Equal(t, 30*time.Minute, ov.Intervals[5].Delay.P99, "c's past the last bound")
	assert.Equal(t, now.Add(-time.Minute), ov.RolledUntil)
}
