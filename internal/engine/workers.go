package engine

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"time"
)

// Fanout delivers a batch's items with worker goroutines.
type Fanout struct {
	Workers int
	// Ordered: the items of one aggregate (same type, non-empty ID) go to
	// one worker, in batch order, and once one of them is not sent the
	// rest are deferred behind it.
	Ordered bool
	Policy  *Policy
	// Attempt runs the item's handlers (within the budget's context).
	Attempt func(ctx context.Context, it *Item) error
	// Wave, when set, replaces Workers and Attempt: it runs the handlers
	// of several items at once, a pipelined destination starting their
	// deliveries in the order given before it waits for any, and returns
	// one error per item. Deliver calls it once per wave: without
	// ordering, one wave of the whole batch; with it, wave k holds the
	// k-th item of every aggregate not held (and, in the first, every item
	// of no aggregate), so an aggregate's items are started one after the
	// other and none after one that was not sent.
	Wave func(ctx context.Context, items []*Item) []error
	// Report tells observers of an attempt's outcome.
	Report func(it *Item, r Result, err error, took time.Duration)
	// Gate, when set, holds every batch before its first delivery
	// (Standbys.Wait): an error hands the batch back undelivered.
	Gate func(ctx context.Context) error
}

// Deliver delivers items. A worker starts an item only while ctx is live,
// bctx (the lease budget) is not spent, no handler has reported its
// destination down, and stale (when set) returns nil; the items it does
// not start are Deferred. record gets every item's result once, from the
// worker that decided it, possibly concurrently. It returns the first
// Unavailable error a handler returned (down) and stale's error (gone),
// if any.
func (f *Fanout) Deliver(ctx, bctx context.Context, items []Item, stale func() error, record func(i int, r Result)) (down, gone error) {
	if f.Wave != nil {
		return f.waves(ctx, bctx, items, stale, record)
	}
	groups := f.groups(items) // nil without ordering: item g is group g
	n := len(items)
	if groups != nil {
		n = len(groups)
	}
	var (
		next     atomic.Int64
		downErr  atomic.Pointer[error]
		staleErr atomic.Pointer[error]
	)
	work := func() {
		for {
			g := int(next.Add(1)) - 1
			if g >= n {
				return
			}
			group := []int{g}
			if groups != nil {
				group = groups[g]
			}
			held := false
			for _, i := range group {
				if stale != nil && staleErr.Load() == nil {
					if err := stale(); err != nil {
						staleErr.CompareAndSwap(nil, &err)
					}
				}
				if held || ctx.Err() != nil || bctx.Err() != nil || downErr.Load() != nil || staleErr.Load() != nil {
					record(i, Result{Kind: Deferred})
					continue
				}
				r := f.one(bctx, &items[i])
				if r.Down != nil {
					downErr.CompareAndSwap(nil, &r.Down)
				}
				record(i, r)
				held = r.Kind != Sent
			}
		}
	}
	Run(min(f.Workers, n), work)
	if p := staleErr.Load(); p != nil {
		gone = *p
	}
	if p := downErr.Load(); p != nil {
		down = *p
	}
	return down, gone
}

// waves is Deliver through Wave: the same results and the same stops
// (ctx, the budget, a destination down, a stale hold), checked before
// each wave instead of before each item.
func (f *Fanout) waves(ctx, bctx context.Context, items []Item, stale func() error, record func(i int, r Result)) (down, gone error) {
	q := f.queue(items, record)
	for {
		wave, group := q.next()
		if len(wave) == 0 {
			return down, gone
		}
		if stale != nil && gone == nil {
			gone = stale()
		}
		if ctx.Err() != nil || bctx.Err() != nil || down != nil || gone != nil {
			q.holdAll()
			for _, i := range wave {
				record(i, Result{Kind: Deferred})
			}
			continue
		}
		rs := f.wave(bctx, items, wave)
		for k, i := range wave {
			if rs[k].Down != nil && down == nil {
				down = rs[k].Down
			}
			record(i, rs[k])
			if rs[k].Kind != Sent {
				q.held[group[k]] = true
			}
		}
	}
}

// waveQueue hands out a batch's waves. With ordering, a group is an
// aggregate: its k-th item goes in wave k, unless the group is held, when
// its items left are deferred. Without, the one group's items all go in
// the first wave.
type waveQueue struct {
	groups  [][]int
	pos     []int  // the next item of each group
	held    []bool // a group's items left are deferred
	ordered bool
	record  func(i int, r Result)
}

func (f *Fanout) queue(items []Item, record func(i int, r Result)) *waveQueue {
	groups := f.groups(items)
	if groups == nil {
		groups = [][]int{make([]int, len(items))}
		for i := range items {
			groups[0][i] = i
		}
	}
	return &waveQueue{groups: groups, pos: make([]int, len(groups)), held: make([]bool, len(groups)), ordered: f.Ordered, record: record}
}

// next returns the next wave's item indexes and the group of each; none
// when the batch is done.
func (q *waveQueue) next() (wave, group []int) {
	for g, idx := range q.groups {
		if q.pos[g] >= len(idx) {
			continue
		}
		if q.held[g] {
			for _, i := range idx[q.pos[g]:] {
				q.record(i, Result{Kind: Deferred})
			}
			q.pos[g] = len(idx)
			continue
		}
		take := 1
		if !q.ordered {
			take = len(idx)
		}
		for _, i := range idx[q.pos[g] : q.pos[g]+take] {
			wave, group = append(wave, i), append(group, g)
		}
		q.pos[g] += take
	}
	return wave, group
}

func (q *waveQueue) holdAll() {
	for g := range q.held {
		q.held[g] = true
	}
}

// wave delivers the items at indexes idx through Wave and decides their
// results; an item the policy abandons is not handed to Wave.
func (f *Fanout) wave(bctx context.Context, items []Item, idx []int) []Result {
	began := time.Now()
	errs := make([]error, len(idx))
	var (
		run []*Item
		at  []int // run[j] is idx[at[j]]
	)
	for k, i := range idx {
		if err := f.Policy.Abandoned(&items[i]); err != nil {
			errs[k] = err
			continue
		}
		run, at = append(run, &items[i]), append(at, k)
	}
	if len(run) > 0 {
		got := f.Wave(bctx, run)
		for j, k := range at {
			if j < len(got) {
				errs[k] = got[j]
			} else {
				// Never counted as sent: retried.
				errs[k] = errNoOutcome
			}
		}
	}
	took := time.Since(began)
	rs := make([]Result, len(idx))
	for k, i := range idx {
		rs[k] = f.Policy.Decide(&items[i], errs[k])
		f.Report(&items[i], rs[k], errs[k], took)
	}
	return rs
}

var errNoOutcome = errors.New("outbox: the handler reported no outcome for the event")

// one delivers one item and decides its result.
func (f *Fanout) one(bctx context.Context, it *Item) Result {
	began := time.Now()
	err := f.Policy.Abandoned(it)
	if err == nil {
		err = f.Attempt(bctx, it)
	}
	took := time.Since(began)
	r := f.Policy.Decide(it, err)
	f.Report(it, r, err, took)
	return r
}

// groups are the item indexes each worker delivers one after the other:
// with ordering, an aggregate's items together, in batch order; nil
// without, when every item is a group of its own.
func (f *Fanout) groups(items []Item) [][]int {
	if !f.Ordered {
		return nil
	}
	groups := make([][]int, 0, len(items))
	type agg struct{ typ, id string }
	var byAgg map[agg]int
	for i := range items {
		e := &items[i].Event
		if e.AggregateID != "" {
			if byAgg == nil {
				byAgg = map[agg]int{}
			}
			k := agg{e.AggregateType, e.AggregateID}
			if g, ok := byAgg[k]; ok {
				groups[g] = append(groups[g], i)
				continue
			}
			byAgg[k] = len(groups)
		}
		groups = append(groups, []int{i})
	}
	return groups
}

// Run runs work on n goroutines (in the caller's when n <= 1) and waits
// for them.
func Run(n int, work func()) {
	if n <= 1 {
		work()
		return
	}
	var wg sync.WaitGroup
	for range n {
		wg.Add(1)
		go func() { defer wg.Done(); work() }()
	}
	wg.Wait()
}

// Batch is a batch of items from a source: the table's claim, or
// transactions from the WAL stream.
type Batch interface {
	Items() []Item
	// Deadline is when the batch's deliveries must have ended (the lease
	// budget).
	Deadline() time.Time
	// Stale reports, before each delivery, whether the source's hold on
	// the batch may be gone (nil while it holds).
	Stale() error
	// Record takes an item's result, as workers decide them.
	Record(i int, r Result)
	// Close makes the outcomes durable; gone is Stale's error, if the
	// batch stopped on it.
	Close(ctx context.Context, gone error) error
}

// HandBack records every item of b Deferred (for down, when not nil) and
// closes b: the batch goes back to its source undelivered, with no attempt
// counted.
func HandBack(ctx context.Context, b Batch, down error) error {
	for i := range b.Items() {
		b.Record(i, Result{Kind: Deferred, Down: down})
	}
	return b.Close(ctx, nil)
}

// Process delivers a batch and closes it. down is why the batch, or its
// rest, was handed back undelivered: the first Unavailable error a handler
// returned, or the gate's; err, that the outcomes are not (all) durable, or
// that the source's hold was gone.
func (f *Fanout) Process(ctx context.Context, b Batch) (down, err error) {
	if f.Gate != nil && len(b.Items()) > 0 {
		if gerr := f.Gate(ctx); gerr != nil {
			return gerr, HandBack(ctx, b, gerr)
		}
	}
	bctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), b.Deadline())
	defer cancel()
	down, gone := f.Deliver(ctx, bctx, b.Items(), b.Stale, b.Record)
	return down, b.Close(ctx, gone)
}
