package engine

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/errs"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func testPolicy() *Policy {
	return &Policy{
		MaxAttempts: 3, Backoff: func(n int) time.Duration { return time.Duration(n) * time.Minute },
		Now: func() time.Time { return t0 }, Logger: slog.New(slog.DiscardHandler),
		Attrs: func(*Event, error) []any { return nil },
	}
}

func TestPolicyDecide(t *testing.T) {
	p := testPolicy()
	it := func(attempts int) *Item { return &Item{Event: Event{ID: "e"}, Attempts: attempts} }
	boom := errors.New("boom")
	for _, c := range []struct {
		name   string
		it     *Item
		err    error
		kind   Kind
		status string
		due    time.Time
	}{
		{"Sent", it(1), nil, Sent, "sent", time.Time{}},
		{"RetryWithBackoff", it(2), boom, Failed, "pending", t0.Add(2 * time.Minute)},
		{"RetryAfter", it(1), errs.RetryAfter(boom, 7*time.Second), Failed, "pending", t0.Add(7 * time.Second)},
		{"LastAttempt", it(3), boom, Failed, "failed", t0},
		{"Permanent", it(1), errs.Permanent(boom), Failed, "failed", t0},
		{"UnavailableCountsNoAttempt", it(3), errs.Unavailable(boom), Deferred, "pending", time.Time{}},
		{"PermanentWinsOverUnavailable", it(1), errs.Permanent(errs.Unavailable(boom)), Failed, "failed", t0},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := p.Decide(c.it, c.err)
			assert.Equal(t, c.kind, r.Kind)
			assert.Equal(t, c.status, r.Status())
			if c.kind == Failed {
				assert.Equal(t, "e", r.Out.ID)
				assert.Equal(t, c.due, r.Out.Due)
				assert.NotEmpty(t, r.Out.Err)
			}
			if c.kind == Deferred {
				assert.Error(t, r.Down)
			}
		})
	}
	assert.NoError(t, p.Abandoned(it(3)))
	assert.True(t, errs.IsPermanent(p.Abandoned(it(4))), "claimed more often than allowed")
}

func TestLastErrorIsStorable(t *testing.T) {
	s := LastError(errors.New("a\x00b\xffc" + string(make([]byte, 5000))))
	assert.NotContains(t, s, "\x00")
	assert.LessOrEqual(t, len(s), maxLastError+len("…"))
	assert.Equal(t, "é…", Truncate("éé", 3), "cut on a rune boundary")
}

// fakeBatch is a batch of items held in memory: the engine's rules without
// any source.
type fakeBatch struct {
	items    []Item
	deadline time.Time
	stale    func() error
	mu       sync.Mutex
	results  map[int]Result
	closed   error
	closes   int
	shared   bool // another relay claimed among its rows
}

func (b *fakeBatch) Contiguous() bool { return !b.shared }

func newFake(ids ...string) *fakeBatch {
	b := &fakeBatch{deadline: time.Now().Add(time.Minute), results: map[int]Result{}}
	for _, id := range ids {
		b.items = append(b.items, Item{Event: Event{ID: id, AggregateType: "a", AggregateID: id[:1]}, Attempts: 1})
	}
	return b
}

func (b *fakeBatch) Items() []Item       { return b.items }
func (b *fakeBatch) Deadline() time.Time { return b.deadline }
func (b *fakeBatch) Stale() error {
	if b.stale == nil {
		return nil
	}
	return b.stale()
}
func (b *fakeBatch) Record(i int, r Result) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.results[i] = r
}
func (b *fakeBatch) Close(_ context.Context, gone error) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed, b.closes = gone, b.closes+1
	return gone
}

// kinds are the items' results by ID.
func (b *fakeBatch) kinds() map[string]Kind {
	out := map[string]Kind{}
	for i, r := range b.results {
		out[b.items[i].Event.ID] = r.Kind
	}
	return out
}

// fanout is a Fanout whose handlers are attempt, on the workers' path or
// (waves) the Wave path, which calls attempt for each item of a wave in
// order, as a pipelined destination starts them.
func fanout(waves, ordered bool, attempt func(*Item) error) (*Fanout, *[]string) {
	var (
		mu    sync.Mutex
		order []string
	)
	f := &Fanout{
		Workers: 4, Ordered: ordered, Policy: testPolicy(),
		Attempt: func(_ context.Context, it *Item) error {
			mu.Lock()
			order = append(order, it.Event.ID)
			mu.Unlock()
			return attempt(it)
		},
		Report: func(*Item, Result, error, time.Duration) {},
	}
	if waves {
		f.Workers, f.Attempt = 0, nil
		f.Wave = func(_ context.Context, items []*Item) []error {
			errs := make([]error, len(items))
			for i, it := range items {
				order = append(order, it.Event.ID)
				errs[i] = attempt(it)
			}
			return errs
		}
	}
	return f, &order
}

// paths runs test on the workers' path and on the Wave path: the same
// rules hold on both.
func paths(t *testing.T, test func(t *testing.T, waves bool)) {
	for _, waves := range []bool{false, true} {
		name := "Workers"
		if waves {
			name = "Waves"
		}
		t.Run(name, func(t *testing.T) { test(t, waves) })
	}
}

func TestFanoutOrderedHoldsTheAggregate(t *testing.T) {
	paths(t, func(t *testing.T, waves bool) {
		f, order := fanout(waves, true, func(it *Item) error {
			if it.Event.ID == "a1" {
				return errors.New("a1 fails")
			}
			return nil
		})
		b := newFake("a1", "b1", "a2", "b2", "a3")
		down, err := f.Process(t.Context(), b)
		require.NoError(t, down)
		require.NoError(t, err)
		assert.Equal(t, map[string]Kind{"a1": Failed, "a2": Deferred, "a3": Deferred, "b1": Sent, "b2": Sent}, b.kinds())
		assert.NotContains(t, *order, "a2", "held behind a1")
		assert.Len(t, b.results, 5, "every item recorded once")
	})
}

func TestFanoutUnorderedDeliversEveryItem(t *testing.T) {
	paths(t, func(t *testing.T, waves bool) {
		f, order := fanout(waves, false, func(it *Item) error {
			if it.Event.ID == "a1" {
				return errors.New("a1 fails")
			}
			return nil
		})
		b := newFake("a1", "a2", "a3")
		_, err := f.Process(t.Context(), b)
		require.NoError(t, err)
		assert.Equal(t, map[string]Kind{"a1": Failed, "a2": Sent, "a3": Sent}, b.kinds())
		assert.Len(t, *order, 3)
	})
}

func TestFanoutStopsWhenTheDestinationIsDown(t *testing.T) {
	paths(t, func(t *testing.T, waves bool) {
		if waves {
			// A wave's items start together: each is handed back by the
			// handler; the next wave never starts.
			f, order := fanout(waves, true, func(*Item) error { return errs.Unavailable(errors.New("down")) })
			b := newFake("a1", "b1", "a2", "b2")
			down, err := f.Process(t.Context(), b)
			require.NoError(t, err)
			assert.True(t, errs.IsUnavailable(down))
			assert.Equal(t, map[string]Kind{"a1": Deferred, "b1": Deferred, "a2": Deferred, "b2": Deferred}, b.kinds())
			assert.Equal(t, []string{"a1", "b1"}, *order)
			assert.Error(t, b.results[1].Down, "handed back by the handler")
			assert.NoError(t, b.results[2].Down, "never started")
			return
		}
		f, _ := fanout(waves, false, func(*Item) error { return errs.Unavailable(errors.New("down")) })
		f.Workers = 1
		b := newFake("a1", "b1", "c1")
		down, err := f.Process(t.Context(), b)
		require.NoError(t, err)
		assert.True(t, errs.IsUnavailable(down))
		assert.Equal(t, map[string]Kind{"a1": Deferred, "b1": Deferred, "c1": Deferred}, b.kinds())
		assert.ErrorIs(t, b.results[0].Down, down, "the first one handed back by the handler")
		assert.NoError(t, b.results[1].Down, "the others never started")
	})
}

func TestFanoutStopsWhenTheHoldIsGone(t *testing.T) {
	paths(t, func(t *testing.T, waves bool) {
		// Looked at before each delivery; on the Wave path, before each
		// wave (here, one an event: a single aggregate).
		f, order := fanout(waves, waves, func(*Item) error { return nil })
		f.Workers = 1
		b := newFake("a1", "b1", "c1")
		if waves {
			b = newFake("a1", "a2", "a3")
		}
		gone := errors.New("the session may be over")
		calls := 0
		b.stale = func() error {
			if calls++; calls > 1 {
				return gone
			}
			return nil
		}
		_, err := f.Process(t.Context(), b)
		require.ErrorIs(t, err, gone, "Close hears why the batch stopped")
		assert.Equal(t, []string{"a1"}, *order)
		want := map[string]Kind{"a1": Sent, "b1": Deferred, "c1": Deferred}
		if waves {
			want = map[string]Kind{"a1": Sent, "a2": Deferred, "a3": Deferred}
		}
		assert.Equal(t, want, b.kinds())
	})
}

func TestFanoutStartsNothingPastTheBudget(t *testing.T) {
	paths(t, func(t *testing.T, waves bool) {
		f, order := fanout(waves, false, func(*Item) error { return nil })
		b := newFake("a1", "b1")
		b.deadline = time.Now().Add(-time.Second)
		_, err := f.Process(t.Context(), b)
		require.NoError(t, err)
		assert.Empty(t, *order)
		assert.Equal(t, map[string]Kind{"a1": Deferred, "b1": Deferred}, b.kinds())
	})
}

func TestFanoutAbandonsAnItemClaimedTooOften(t *testing.T) {
	paths(t, func(t *testing.T, waves bool) {
		f, order := fanout(waves, false, func(*Item) error { return nil })
		b := newFake("a1")
		b.items[0].Attempts = 4
		_, err := f.Process(t.Context(), b)
		require.NoError(t, err)
		assert.Empty(t, *order, "not attempted")
		assert.Equal(t, "failed", b.results[0].Status())
	})
}

func TestFanoutWaves(t *testing.T) {
	var waves [][]string
	f := &Fanout{Ordered: true, Policy: testPolicy(), Report: func(*Item, Result, error, time.Duration) {}}
	f.Wave = func(_ context.Context, items []*Item) []error {
		var ids []string
		errs := make([]error, len(items))
		for i, it := range items {
			ids = append(ids, it.Event.ID)
			if it.Event.ID == "b2" {
				errs[i] = errors.New("b2 fails")
			}
		}
		waves = append(waves, ids)
		return errs
	}
	b := newFake("a1", "b1", "a2", "b2", "c1", "a3", "b3", "a4")
	b.items = append(b.items, Item{Event: Event{ID: "n1"}, Attempts: 1}, Item{Event: Event{ID: "n2"}, Attempts: 1}) // no aggregate
	_, err := f.Process(t.Context(), b)
	require.NoError(t, err)
	assert.Equal(t, [][]string{{"a1", "b1", "c1", "n1", "n2"}, {"a2", "b2"}, {"a3"}, {"a4"}}, waves,
		"an aggregate's k-th event in wave k, in batch order; none after one that failed (b3)")
	assert.Equal(t, Deferred, b.kinds()["b3"])
	assert.Equal(t, Failed, b.kinds()["b2"])
	assert.Len(t, b.results, 10)

	// Unordered: one wave, in batch order. A handler that reports fewer
	// outcomes than events never has the rest counted as sent.
	waves = nil
	f.Ordered = false
	f.Wave = func(_ context.Context, items []*Item) []error {
		var ids []string
		for _, it := range items {
			ids = append(ids, it.Event.ID)
		}
		waves = append(waves, ids)
		return make([]error, len(items)-1)
	}
	b = newFake("a1", "a2", "b1")
	_, err = f.Process(t.Context(), b)
	require.NoError(t, err)
	assert.Equal(t, [][]string{{"a1", "a2", "b1"}}, waves)
	assert.Equal(t, map[string]Kind{"a1": Sent, "a2": Sent, "b1": Failed}, b.kinds())
}

func TestBudget(t *testing.T) {
	assert.Equal(t, 48*time.Second, Budget(time.Minute)-7*time.Second)
	assert.Equal(t, 800*time.Millisecond, Budget(time.Second))
}

func TestProbeAndBackoff(t *testing.T) {
	var p Probe
	down := errors.New("down")
	var got []time.Duration
	for range 6 {
		got = append(got, p.Pause(down))
	}
	assert.Equal(t, []time.Duration{ProbeMin, 2 * ProbeMin, 4 * ProbeMin, 8 * ProbeMin, ProbeMax, ProbeMax}, got)
	assert.Equal(t, 3*time.Second, p.Pause(errs.RetryAfter(down, 3*time.Second)), "the destination said when")
	assert.Equal(t, MaxProbePause, p.Pause(errs.RetryAfter(down, time.Hour)), "bounded")
	p.Reset()
	assert.Equal(t, ProbeMin, p.Pause(down))

	b := Backoff{Min: time.Second, Max: 3 * time.Second}
	assert.Equal(t, time.Second, b.Peek())
	assert.Equal(t, []time.Duration{time.Second, 2 * time.Second, 3 * time.Second}, []time.Duration{b.Next(), b.Next(), b.Next()})

	var e Episode
	assert.True(t, e.Begin())
	assert.False(t, e.Begin(), "said once")
	was, _ := e.End()
	assert.True(t, was)
	was, _ = e.End()
	assert.False(t, was)
}

func TestRetry(t *testing.T) {
	tries := 0
	err := Retry(t.Context(), time.Now().Add(time.Second), time.Second, func(context.Context) error {
		if tries++; tries < 3 {
			return errors.New("dropped")
		}
		return nil
	})
	require.NoError(t, err)
	assert.Equal(t, 3, tries)

	tries = 0
	start := time.Now()
	err = Retry(t.Context(), time.Now().Add(120*time.Millisecond), time.Second, func(context.Context) error { tries++; return errors.New("down") })
	require.Error(t, err)
	assert.Equal(t, 2, tries, "tries at 0 and 50 ms; the next, at 150 ms, would pass the window")
	assert.Less(t, time.Since(start), time.Second)
}
