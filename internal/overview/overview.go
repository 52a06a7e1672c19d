// Package overview is the overview's arithmetic, without a database: the
// window's intervals and the rollup span they read (Plan), and the fold of
// what the store read into counts, intervals, backlog and delay
// percentiles (Fold).
//
// It is internal: the root package's Outbox.Overview reads the store and
// converts the result to its public types, field for field.
package overview

import (
	"cmp"
	"slices"
	"time"

	"github.com/gorm-outbox/outbox/internal/store"
)

// Defaults and bounds of the window.
const (
	DefaultWindow = time.Hour
	// Retention is the longest window: how long the rollup keeps its
	// coarsest rows.
	Retention    = 8 * 24 * time.Hour
	maxIntervals = 1000
)

// Overview mirrors outbox.Overview, but for the fields the store adds.
type Overview struct {
	Now, Since                           time.Time
	Step                                 time.Duration
	Pending, Failed                      int64
	OldestPending                        time.Duration
	Published, Delivered, FailedInWindow int64
	Delay                                Delay
	Types                                []TypeCount
	Intervals                            []Interval
	RolledUntil                          time.Time
}

// TypeCount mirrors outbox.TypeCount.
type TypeCount struct {
	Type                                  string
	Pending, Failed, Published, Delivered int64
}

// Interval mirrors outbox.Interval.
type Interval struct {
	Start                        time.Time
	Published, Delivered, Failed int64
	Backlog                      int64
	Delay                        Delay
}

// Delay mirrors outbox.Delay.
type Delay struct {
	N             int64
	P50, P90, P99 time.Duration
}

// Window is an overview's window: its intervals, and what it reads.
type Window struct {
	Now, Since time.Time
	Step       time.Duration
	// stepMin and span are the step and the rollup span it reads, in
	// minutes; sinceMin is Since's; n the number of intervals.
	stepMin, span, sinceMin int64
	n                       int
}

func minuteOf(t time.Time) int64 { return t.Unix() / 60 }

// Plan is the window that reaches back window (DefaultWindow when zero, at
// most Retention) from now, in intervals of step (about window/60 when
// zero). Intervals start at multiples of the step since the epoch, so that
// each of the rollup's spans falls in one; the first may start before
// now-window.
func Plan(now time.Time, window, step time.Duration) Window {
	window = min(cmp.Or(window, DefaultWindow), Retention)
	stepMin, span := Step(window, step)
	nowMin := minuteOf(now)
	sinceMin := (minuteOf(now.Add(-window)) / stepMin) * stepMin
	w := Window{Now: now, Since: time.Unix(sinceMin*60, 0).UTC(), Step: time.Duration(stepMin) * time.Minute,
		stepMin: stepMin, span: span, sinceMin: sinceMin, n: int((nowMin-sinceMin)/stepMin) + 1}
	return w
}

// Step is the step of a window, in minutes, and the rollup span it reads:
// by default about 60 intervals, of whole minutes up to 10, of tens of
// minutes up to an hour, of whole hours beyond; never more than 1000
// intervals; a window longer than the minute rows are kept (a day) reads
// at least 10-minute rows.
func Step(window, asked time.Duration) (step, span int64) {
	min1 := func(d time.Duration) int64 { return int64((d + time.Minute - 1) / time.Minute) }
	step = max(min1(cmp.Or(asked, window/60)), min1(window/maxIntervals), 1)
	roundUp := func(n, m int64) int64 { return (n + m - 1) / m * m }
	if asked == 0 {
		switch {
		case step > 60:
			step = roundUp(step, 60)
		case step > 10:
			step = roundUp(step, 10)
		}
	}
	if window > store.RollSpans[0].Keep-time.Hour {
		step = roundUp(step, 10)
	}
	span = 1
	for _, s := range store.RollSpans {
		if step%s.Minutes == 0 {
			span = s.Minutes
		}
	}
	return step, span
}

// Query is what the store reads for the window, given the rollup's state:
// the rollup up to its end, the table's sent rows after it.
func (w Window) Query(st store.RollState) store.OverviewQuery {
	return store.OverviewQuery{
		Span: w.span, SinceMinute: w.sinceMin, Step: w.stepMin,
		SentFrom: st.Until, SentTo: w.Now.Add(time.Minute), Low: st.Low,
	}
}

// interval is the interval of a minute, -1 before the window.
func (w Window) interval(minute int64) int {
	if minute < w.sinceMin {
		return -1
	}
	return min(int((minute-w.sinceMin)/w.stepMin), w.n-1)
}

// fold is an overview being summed.
type fold struct {
	w     Window
	ov    Overview
	types map[string]*TypeCount
	hists [][]int64
}

func (f *fold) typ(name string) *TypeCount {
	t := f.types[name]
	if t == nil {
		t = &TypeCount{Type: name}
		f.types[name] = t
	}
	return t
}

// published counts n events of type name created in minute.
func (f *fold) published(name string, minute, n int64) {
	if i := f.w.interval(minute); i >= 0 {
		f.typ(name).Published += n
		f.ov.Intervals[i].Published += n
	}
}

// Fold sums what the store read into the window's overview. Counting
// rules (outbox.Overview's): a sent event counts as published in the
// minute it was created and as delivered in the minute it was sent;
// pending and failed events count as they are now; the backlog at each
// interval's end is worked back from the pending count now.
func Fold(w Window, rows store.OverviewRows, rolledUntil time.Time) Overview {
	f := &fold{w: w, types: map[string]*TypeCount{}, hists: make([][]int64, w.n)}
	f.ov = Overview{Now: w.Now, Since: w.Since, Step: w.Step, RolledUntil: rolledUntil, Intervals: make([]Interval, w.n)}
	for i := range f.ov.Intervals {
		f.ov.Intervals[i].Start = w.Since.Add(time.Duration(i) * w.Step)
		f.hists[i] = make([]int64, len(store.DelayBounds)+1)
	}
	for _, r := range rows.Rollup {
		i := min(r.Interval, w.n-1)
		t := f.typ(r.Type)
		t.Published += r.Published
		t.Delivered += r.Delivered
		f.ov.Intervals[i].Published += r.Published
		f.ov.Intervals[i].Delivered += r.Delivered
		for j, c := range r.Delay {
			f.hists[i][j] += c
		}
	}
	for _, b := range rows.Sent {
		if i := w.interval(b.Sent); i >= 0 {
			f.typ(b.Type).Delivered += b.N
			f.ov.Intervals[i].Delivered += b.N
			f.hists[i][b.Bin] += b.N
		}
		f.published(b.Type, b.Created, b.N)
	}
	var oldest time.Time
	for _, g := range rows.Pending {
		f.ov.Pending += g.N
		f.typ(g.Type).Pending += g.N
		f.published(g.Type, g.Created, g.N)
		if oldest.IsZero() || g.Oldest.Before(oldest) {
			oldest = g.Oldest
		}
	}
	if !oldest.IsZero() {
		f.ov.OldestPending = max(w.Now.Sub(oldest), 0)
	}
	for _, g := range rows.Failed {
		f.ov.Failed += g.N
		f.typ(g.Type).Failed += g.N
		if i := w.interval(g.Failed); i >= 0 {
			f.ov.Intervals[i].Failed += g.N
		}
		f.published(g.Type, g.Created, g.N)
	}
	return f.finish()
}

// finish works the backlog back from the pending count, and sums the
// intervals and the types.
func (f *fold) finish() Overview {
	ov := &f.ov
	total := make([]int64, len(store.DelayBounds)+1)
	backlog := ov.Pending
	for i := len(ov.Intervals) - 1; i >= 0; i-- {
		iv := &ov.Intervals[i]
		iv.Backlog = max(backlog, 0)
		backlog += -iv.Published + iv.Delivered + iv.Failed
		iv.Delay = Percentiles(f.hists[i])
		for j, c := range f.hists[i] {
			total[j] += c
		}
		ov.Published += iv.Published
		ov.Delivered += iv.Delivered
		ov.FailedInWindow += iv.Failed
	}
	ov.Delay = Percentiles(total)
	for _, t := range f.types {
		ov.Types = append(ov.Types, *t)
	}
	slices.SortFunc(ov.Types, func(a, b TypeCount) int { return cmp.Compare(a.Type, b.Type) })
	return *ov
}

// Percentiles reads the percentiles off a histogram of store.DelayBounds'
// bins, each interpolated within its bin.
func Percentiles(bins []int64) Delay {
	var d Delay
	for _, c := range bins {
		d.N += c
	}
	if d.N == 0 {
		return d
	}
	pct := func(q float64) time.Duration {
		rank := q * float64(d.N)
		var seen float64
		for j, c := range bins {
			if c == 0 || seen+float64(c) < rank {
				seen += float64(c)
				continue
			}
			lo, hi := 0.0, 0.0
			if j > 0 {
				lo = store.DelayBounds[j-1]
			}
			if j < len(store.DelayBounds) {
				hi = store.DelayBounds[j]
			} else {
				hi = lo
			}
			ms := lo + (hi-lo)*(rank-seen)/float64(c)
			return time.Duration(ms * float64(time.Millisecond))
		}
		return time.Duration(store.DelayBounds[len(store.DelayBounds)-1] * float64(time.Millisecond))
	}
	d.P50, d.P90, d.P99 = pct(0.50), pct(0.90), pct(0.99)
	return d
}
