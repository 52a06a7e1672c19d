package outbox

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// asyncTests are the AsyncHandler's semantics, on every backend (run by
// runSuite): the relay delivers a batch in waves.
var asyncTests = map[string]func(*testing.T, backend){
	"AsyncPipelinesTheBatch":    testAsyncPipelines,
	"AsyncOrderByAggregate":     testAsyncOrderByAggregate,
	"AsyncOutcomes":             testAsyncOutcomes,
	"AsyncHooksAndMixedRoutes":  testAsyncHooks,
	"AsyncInMemoryModeWaitsNow": testAsyncMemory,
}

// starts is an AsyncHandler that records the order its deliveries start
// in; wait returns what fail says for the event once every event of the
// batch (want) has started, and fails it if they do not start within
// the timeout: deliveries waited for one at a time never all start.
type starts struct {
	mu      sync.Mutex
	ids     []string
	want    int
	all     chan struct{}
	timeout time.Duration
	fail    func(e Event) error
}

func newStarts(want int) *starts {
	return &starts{want: want, all: make(chan struct{}), timeout: 10 * time.Second, fail: func(Event) error { return nil }}
}

func (s *starts) handler(ctx context.Context, e Event) func() error {
	s.mu.Lock()
	s.ids = append(s.ids, e.ID)
	if len(s.ids) == s.want {
		close(s.all)
	}
	s.mu.Unlock()
	return func() error {
		select {
		case <-s.all:
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(s.timeout):
			return errors.New("the batch's other deliveries never started: not pipelined")
		}
		return s.fail(e)
	}
}

func (s *starts) started() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.ids...)
}

func testAsyncPipelines(t *testing.T, b backend) {
	e := b.setup(t)
	s := newStarts(12)
	e.ob.HandleAsync("x", s.handler)
	ids := publishN(t, e.db, "x", 12) // one transaction: one streamed batch too
	n, err := e.relay(RelayConfig{BatchSize: 12, Workers: 1}).ProcessOnce(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 12, n)
	assert.Equal(t, ids, s.started(), "started in batch order, all before any wait returned")
	assert.EqualValues(t, 12, e.count("status = ?", StatusSent))
}

func testAsyncOrderByAggregate(t *testing.T, b backend) {
	e := b.setup(t)
	// Two aggregates, interleaved; a2's first attempt fails.
	var events []Event
	for _, id := range []string{"a1", "b1", "a2", "b2", "a3", "b3"} {
		events = append(events, Event{ID: id, Type: "x", AggregateType: "acct", AggregateID: id[:1], Payload: id})
	}
	var (
		mu    sync.Mutex
		waves [][]string
		open  bool // a wave is being started
	)
	e.ob.HandleAsync("x", func(_ context.Context, ev Event) func() error {
		mu.Lock()
		if !open {
			waves = append(waves, nil)
			open = true
		}
		waves[len(waves)-1] = append(waves[len(waves)-1], ev.ID)
		mu.Unlock()
		return func() error {
			mu.Lock()
			open = false
			mu.Unlock()
			if ev.ID == "a2" {
				return errors.New("a2 fails")
			}
			return nil
		}
	})
	require.NoError(t, e.db.Transaction(func(tx *gorm.DB) error { return Publish(tx, events...) }))
	// The table's ordered claim takes an aggregate's first unsent event
	// only; a streamed batch holds them all. The waves are the same.
	r := e.relay(RelayConfig{OrderByAggregate: true, Workers: 1, Backoff: func(int) time.Duration { return time.Hour }})
	for range 10 {
		n, err := r.ProcessOnce(t.Context())
		require.NoError(t, err)
		if n == 0 {
			break
		}
	}
	assert.Equal(t, [][]string{{"a1", "b1"}, {"a2", "b2"}, {"b3"}}, waves,
		"an aggregate's next event starts after the previous one's wait; none after one that failed")
	for id, want := range map[string]Status{"a1": StatusSent, "b1": StatusSent, "b2": StatusSent, "b3": StatusSent, "a2": StatusPending, "a3": StatusPending} {
		assert.Equal(t, want, e.record(id).Status, id)
	}
	assert.Equal(t, 1, e.record("a2").Attempts)
	assert.Equal(t, 0, e.record("a3").Attempts, "held behind a2: no attempt counted")
}

func testAsyncOutcomes(t *testing.T, b backend) {
	e := b.setup(t)
	e.ob.HandleAsync("x", func(_ context.Context, ev Event) func() error {
		switch ev.ID {
		case "x-00000":
			return func() error { return Permanent(errors.New("422 unprocessable")) }
		case "x-00001":
			return func() error { return errors.New("timeout") }
		case "x-00002":
			panic("start blew up")
		case "x-00003":
			return func() error { panic("wait blew up") }
		case "x-00004":
			return nil
		}
		return func() error { return nil }
	})
	publishN(t, e.db, "x", 6)
	_, err := e.relay(RelayConfig{MaxAttempts: 5, Backoff: func(int) time.Duration { return time.Hour }}).ProcessOnce(t.Context())
	require.NoError(t, err)
	for id, want := range map[string]struct {
		status Status
		err    string
	}{
		"x-00000": {StatusFailed, "422 unprocessable"},
		"x-00001": {StatusPending, "timeout"},
		"x-00002": {StatusPending, "handler panicked: start blew up"},
		"x-00003": {StatusPending, "handler panicked: wait blew up"},
		"x-00004": {StatusPending, "returned no wait function"},
		"x-00005": {StatusSent, ""},
	} {
		r := e.record(id)
		assert.Equal(t, want.status, r.Status, id)
		if want.err != "" && assert.NotNil(t, r.LastError, id) {
			assert.Contains(t, *r.LastError, want.err, id)
		}
	}

	// A destination down hands the batch back without counting attempts.
	e2 := b.setup(t)
	e2.ob.HandleAsync("y", func(context.Context, Event) func() error {
		return func() error { return Unavailable(errors.New("broker unreachable")) }
	})
	publishN(t, e2.db, "y", 3)
	_, err = e2.relay(RelayConfig{}).ProcessOnce(t.Context())
	require.Error(t, err)
	assert.True(t, IsUnavailable(err), "%v", err)
	for i := range 3 {
		r := e2.record(fmt.Sprintf("y-%05d", i))
		assert.Equal(t, StatusPending, r.Status)
		assert.Equal(t, 0, r.Attempts, "handed back: no attempt counted")
	}
}

func testAsyncHooks(t *testing.T, b backend) {
	e := b.setup(t)
	var (
		mu       sync.Mutex
		headers  = map[string]string{}
		attempts = map[string]int{}
		plain    []string
		outcomes = map[string]error{}
	)
	e.ob.AddHooks(Hooks{Deliver: func(next Handler) Handler {
		return func(ctx context.Context, ev Event) error {
			if ev.ID == "x-00002" {
				return nil // the hook decides: no handler runs
			}
			h := map[string]string{"traceparent": "delivery-of-" + ev.ID}
			ev.Headers = h
			err := next(ctx, ev)
			mu.Lock()
			outcomes[ev.ID] = err
			mu.Unlock()
			return err
		}
	}})
	s := newStarts(2) // x-00000 and x-00001: the hook holds x-00002 back
	s.fail = func(ev Event) error {
		if ev.ID == "x-00001" {
			return errors.New("nack")
		}
		return nil
	}
	e.ob.HandleAsync("x", func(ctx context.Context, ev Event) func() error {
		mu.Lock()
		headers[ev.ID] = ev.Headers["traceparent"]
		attempts[ev.ID] = Attempt(ctx)
		mu.Unlock()
		return s.handler(ctx, ev)
	})
	e.ob.Handle(AnyEvent, func(_ context.Context, ev Event) error {
		mu.Lock()
		plain = append(plain, ev.ID)
		mu.Unlock()
		return nil
	})
	publishN(t, e.db, "x", 3)
	_, err := e.relay(RelayConfig{Workers: 2, Backoff: func(int) time.Duration { return time.Hour }}).ProcessOnce(t.Context())
	require.NoError(t, err)
	assert.Equal(t, []string{"x-00000", "x-00001"}, s.started(), "pipelined under the hooks")
	assert.Equal(t, map[string]string{"x-00000": "delivery-of-x-00000", "x-00001": "delivery-of-x-00001"}, headers, "the hooks' headers reach the handler")
	assert.Equal(t, map[string]int{"x-00000": 1, "x-00001": 1}, attempts)
	assert.ElementsMatch(t, []string{"x-00000", "x-00001"}, plain, "a Handler matching the same events runs too")
	require.Len(t, outcomes, 2)
	assert.NoError(t, outcomes["x-00000"])
	assert.ErrorContains(t, outcomes["x-00001"], "nack", "the hook sees the wait's outcome")
	assert.Equal(t, StatusSent, e.record("x-00000").Status)
	assert.Equal(t, StatusPending, e.record("x-00001").Status)
	assert.Equal(t, StatusSent, e.record("x-00002").Status, "what the hook returned")
}

func testAsyncMemory(t *testing.T, b backend) {
	e := b.setup(t, withConfig(Config{Mode: Memory}))
	var got []string
	e.ob.HandleAsync("x", func(_ context.Context, ev Event) func() error {
		got = append(got, "start:"+ev.ID)
		return func() error { got = append(got, "wait:"+ev.ID); return nil }
	})
	require.NoError(t, e.db.Transaction(func(tx *gorm.DB) error {
		return Publish(tx, Event{ID: "m1", Type: "x"}, Event{ID: "m2", Type: "x"})
	}))
	assert.Equal(t, []string{"start:m1", "wait:m1", "start:m2", "wait:m2"}, got, "one at a time, after the commit")
}
