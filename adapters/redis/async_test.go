package redis_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	outboxredis "github.com/gorm-outbox/outbox/adapters/redis"
	"github.com/gorm-outbox/outbox/outboxtest"
	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// roundTrips is a go-redis hook that records the round trips of XADDs: a
// pipeline's command names, or a lone XADD's or WAIT's name.
type roundTrips struct {
	mu    sync.Mutex
	trips [][]string
	// hold, when set (before the client is used), runs before a pipeline
	// with an XADD is sent.
	hold func(cmds []goredis.Cmder)
}

func (r *roundTrips) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (r *roundTrips) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if n := cmd.Name(); n == "xadd" || n == "wait" {
			r.add([]string{n})
		}
		return next(ctx, cmd)
	}
}

func (r *roundTrips) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		names := make([]string, len(cmds))
		for i, c := range cmds {
			names[i] = c.Name()
		}
		if slices.Contains(names, "xadd") { // not the connection's handshake
			r.add(names)
			if r.hold != nil {
				r.hold(cmds)
			}
		}
		return next(ctx, cmds)
	}
}

func (r *roundTrips) add(names []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.trips = append(r.trips, names)
}

func (r *roundTrips) get() [][]string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.trips)
}

// hooked returns a client of rdb's server, closed with the test, that
// records its round trips.
func hooked(t *testing.T, rdb *goredis.Client) (*goredis.Client, *roundTrips) {
	t.Helper()
	c := goredis.NewClient(rdb.Options())
	t.Cleanup(func() { _ = c.Close() })
	r := &roundTrips{}
	c.AddHook(r)
	return c, r
}

// pipeline is the command names of a pipeline of n XADDs, then extra.
func pipeline(n int, extra ...string) []string {
	return append(slices.Repeat([]string{"xadd"}, n), extra...)
}

// streamIDs returns the event IDs of the stream's entries, oldest first.
func streamIDs(t *testing.T, rdb *goredis.Client, stream string) []string {
	t.Helper()
	msgs, err := rdb.XRange(context.Background(), stream, "-", "+").Result()
	require.NoError(t, err)
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i], _ = m.Values[outboxredis.FieldID].(string)
	}
	return ids
}

// numbered returns n events with IDs prefix-000 ... in order.
func numbered(prefix string, n int) ([]outbox.Event, []string) {
	events := make([]outbox.Event, n)
	ids := make([]string, n)
	for i := range n {
		ids[i] = fmt.Sprintf("%s-%03d", prefix, i)
		events[i] = outbox.Event{ID: ids[i], Type: "order.created", Payload: map[string]int{"n": i}}
	}
	return events, ids
}

// TestAsyncOneRoundTripPerBatch: a relay delivering a batch of 50 through
// the AsyncHandler sends its 50 XADDs in one pipeline, in batch order, and
// no XADD on its own; the stream holds them in batch order and every row
// is sent.
func TestAsyncOneRoundTripPerBatch(t *testing.T) {
	t.Parallel()
	rdb := connect(t)
	client, trips := hooked(t, rdb)
	key := newKey(t, rdb)
	db, ob := openDB(t)
	ob.HandleAsync(outbox.AnyEvent, newPublisher(t, client, outboxredis.Config{Stream: key}).AsyncHandler())

	const n = 50
	events, ids := numbered("batch", n)
	outboxtest.Publish(t, db, events...)
	got, err := outboxtest.Relay(t, ob, db, outbox.RelayConfig{BatchSize: n}).ProcessOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, n, got)

	assert.Equal(t, [][]string{pipeline(n)}, trips.get(), "one round trip for the batch")
	assert.Equal(t, ids, streamIDs(t, rdb, key), "batch order")
	for _, id := range ids {
		assert.Equal(t, outbox.StatusSent, record(t, db, id).Status, id)
	}
}

// TestAsyncWaitReplicasOncePerPipeline: with WaitReplicas a batch is its
// XADDs and one WAIT in one round trip, and the replica has every entry
// once the relay marked them sent. When the WAIT reports fewer replicas
// than asked, every event of the pipeline gets the error Handler gives,
// naming its own entry, and a relay hands the batch back without counting
// attempts.
func TestAsyncWaitReplicasOncePerPipeline(t *testing.T) {
	t.Parallel()
	primary, replica := primaryWithReplica(t)
	client, trips := hooked(t, primary)

	t.Run("Replicated", func(t *testing.T) {
		const key, n = "wait-async", 20
		db, ob := openDB(t)
		ob.HandleAsync(outbox.AnyEvent, newPublisher(t, client, outboxredis.Config{Stream: key, WaitReplicas: 1}).AsyncHandler())
		events, ids := numbered("repl", n)
		outboxtest.Publish(t, db, events...)
		got, err := outboxtest.Relay(t, ob, db, outbox.RelayConfig{BatchSize: n}).ProcessOnce(t.Context())
		require.NoError(t, err)
		require.Equal(t, n, got)
		assert.Equal(t, [][]string{pipeline(n, "wait")}, trips.get(), "the XADDs and one WAIT in one round trip")
		assert.Equal(t, ids, streamIDs(t, replica, key), "the replica has every entry, in batch order")
		for _, id := range ids {
			assert.Equal(t, outbox.StatusSent, record(t, db, id).Status, id)
		}
	})

	t.Run("UnderReplicated", func(t *testing.T) {
		const key = "wait-async-under"
		pub := newPublisher(t, client, outboxredis.Config{Stream: key, WaitReplicas: 2, WaitTimeout: 100 * time.Millisecond})
		h := pub.AsyncHandler()
		before := len(trips.get())
		events, _ := numbered("under", 3)
		var waits []func() error
		for _, e := range events {
			waits = append(waits, h(t.Context(), e))
		}
		var errs []error
		for _, w := range waits {
			errs = append(errs, w())
		}
		assert.Equal(t, [][]string{pipeline(3, "wait")}, trips.get()[before:], "one WAIT for the pipeline")
		entries := entryIDs(t, primary, key)
		require.Len(t, entries, 3, "the entries are appended: a retry adds second ones")
		for i, err := range errs {
			require.Error(t, err)
			assert.ErrorIs(t, err, outboxredis.ErrUnderReplicated)
			assert.True(t, outbox.IsUnavailable(err), "%v", err)
			assert.Equal(t, "fewer replicas than Config.WaitReplicas acknowledged the entry: 1 of 2 within 100ms: entry "+entries[i]+
				" appended to stream "+key+" (outbox/redis) (destination unavailable)", err.Error(), "Handler's error, with the event's own entry")
		}

		db, ob := openDB(t)
		ob.HandleAsync(outbox.AnyEvent, h)
		events, ids := numbered("under-relay", 5)
		outboxtest.Publish(t, db, events...)
		_, err := outboxtest.Relay(t, ob, db, outbox.RelayConfig{BatchSize: 5}).ProcessOnce(t.Context())
		require.Error(t, err)
		assert.True(t, outbox.IsUnavailable(err), "%v", err)
		for _, id := range ids {
			row := record(t, db, id)
			assert.Equal(t, outbox.StatusPending, row.Status, id)
			assert.Zero(t, row.Attempts, "%s: handed back, no attempt counted", id)
		}
	})
}

// TestAsyncOrderByAggregate: with OrderByAggregate, three aggregates'
// events interleaved, b2's XADD failing in Redis (its stream is a string
// key: WRONGTYPE) in a pipeline with a2's and c2's, which succeed: the
// stream holds each aggregate's events in order, b's none after b1, and
// b2 waits for its retry, b3 behind it untried.
func TestAsyncOrderByAggregate(t *testing.T) {
	t.Parallel()
	rdb := connect(t)
	client, trips := hooked(t, rdb)
	key, bad := newKey(t, rdb), newKey(t, rdb)
	require.NoError(t, rdb.Set(t.Context(), bad, "not a stream", 0).Err())
	db, ob := openDB(t)
	ob.HandleAsync(outbox.AnyEvent, newPublisher(t, client, outboxredis.Config{StreamFor: func(e outbox.Event) string {
		if e.ID == "b2" {
			return bad
		}
		return key
	}}).AsyncHandler())

	var events []outbox.Event
	for _, id := range []string{"a1", "b1", "c1", "a2", "b2", "c2", "a3", "b3", "c3"} {
		events = append(events, outbox.Event{ID: id, Type: "acct.changed", AggregateType: "acct", AggregateID: id[:1], Payload: id})
	}
	outboxtest.Publish(t, db, events...)
	relay := outboxtest.Relay(t, ob, db, outbox.RelayConfig{OrderByAggregate: true, Backoff: func(int) time.Duration { return time.Hour }})
	assert.Equal(t, 8, outboxtest.Drain(t, relay), "b3 is never claimed")

	got := streamIDs(t, rdb, key)
	assert.Equal(t, []string{"a1", "b1", "c1", "a2", "c2", "a3", "c3"}, got, "each aggregate in order; none of b after b2")
	assert.Equal(t, [][]string{pipeline(3), pipeline(3), pipeline(2)}, trips.get(), "a round trip per batch")
	b2 := record(t, db, "b2")
	assert.Equal(t, outbox.StatusPending, b2.Status)
	assert.Equal(t, 1, b2.Attempts)
	require.NotNil(t, b2.LastError)
	assert.Equal(t, "WRONGTYPE Operation against a key holding the wrong kind of value: stream "+bad+" (outbox/redis)", *b2.LastError, "its own command's error")
	b3 := record(t, db, "b3")
	assert.Equal(t, outbox.StatusPending, b3.Status)
	assert.Zero(t, b3.Attempts, "held behind b2")
	for _, id := range got {
		assert.Equal(t, outbox.StatusSent, record(t, db, id).Status, id)
	}
}

// TestAsyncUnavailableHandsBatchBack: with Redis stopped, a batch's
// pipeline fails to connect: the relay returns an Unavailable error and
// hands the batch back without counting attempts; once Redis is back the
// batch is delivered at its first counted attempt, in order.
func TestAsyncUnavailableHandsBatchBack(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	rdb := goredis.NewClient(&goredis.Options{Addr: srv.addr(), ContextTimeoutEnabled: true, DialTimeout: 500 * time.Millisecond, MaxRetries: -1})
	t.Cleanup(func() { _ = rdb.Close() })
	const key = "handed-back"
	db, ob := openDB(t)
	ob.HandleAsync(outbox.AnyEvent, newPublisher(t, rdb, outboxredis.Config{Stream: key}).AsyncHandler())
	relay := outboxtest.Relay(t, ob, db, outbox.RelayConfig{BatchSize: 20})
	events, ids := numbered("down", 20)
	outboxtest.Publish(t, db, events...)

	srv.stop()
	_, err := relay.ProcessOnce(t.Context())
	require.Error(t, err)
	assert.True(t, outbox.IsUnavailable(err), "%v", err)
	assert.Contains(t, err.Error(), "batch handed back undelivered")
	for _, id := range ids {
		row := record(t, db, id)
		assert.Equal(t, outbox.StatusPending, row.Status, id)
		assert.Zero(t, row.Attempts, "%s: no attempt counted", id)
	}

	srv.start()
	assert.Equal(t, 20, outboxtest.Drain(t, relay))
	assert.Equal(t, ids, streamIDs(t, rdb, key))
	for _, id := range ids {
		row := record(t, db, id)
		assert.Equal(t, outbox.StatusSent, row.Status, id)
		assert.Equal(t, 1, row.Attempts, id)
	}
}

// TestAsyncConcurrentStarts: goroutines starting and waiting at once each
// get their own event's outcome. First all 24 start before any waits: one
// pipeline holds all 24, and each wait returns its own result (the
// goroutines whose stream is a string key get WRONGTYPE naming that key,
// the others nil). Then they run freely, some waiting for their events in
// reverse order: every outcome is still its own, and each stream holds
// its goroutine's events in the order they were started, whichever
// pipelines they went in.
func TestAsyncConcurrentStarts(t *testing.T) {
	t.Parallel()
	rdb := connect(t)
	client, trips := hooked(t, rdb)
	const goroutines, each = 8, 3
	keys := make([]string, goroutines)
	for g := range keys {
		keys[g] = newKey(t, rdb)
		if g%3 == 2 {
			require.NoError(t, rdb.Set(t.Context(), keys[g], "not a stream", 0).Err())
		}
	}
	streamOf := func(e outbox.Event) string { return e.AggregateID }
	h := newPublisher(t, client, outboxredis.Config{StreamFor: streamOf}).AsyncHandler()
	event := func(g, i int, phase string) outbox.Event {
		return outbox.Event{ID: fmt.Sprintf("%s-%d-%d", phase, g, i), Type: "t", AggregateID: keys[g], Payload: json.RawMessage(`{}`)}
	}
	check := func(g int, e outbox.Event, err error) {
		if g%3 != 2 {
			assert.NoError(t, err, e.ID)
			return
		}
		assert.EqualError(t, err, "WRONGTYPE Operation against a key holding the wrong kind of value: stream "+keys[g]+" (outbox/redis)", e.ID)
	}

	// All start, then all wait.
	var started, done sync.WaitGroup
	started.Add(goroutines)
	for g := range goroutines {
		done.Go(func() {
			var waits []func() error
			var evs []outbox.Event
			for i := range each {
				e := event(g, i, "barrier")
				evs, waits = append(evs, e), append(waits, h(t.Context(), e))
			}
			started.Done()
			started.Wait()
			for i, w := range waits {
				check(g, evs[i], w())
			}
		})
	}
	done.Wait()
	assert.Equal(t, [][]string{pipeline(goroutines * each)}, trips.get(), "every start before the first wait: one pipeline")

	// Free running: 30 rounds each, waiting in reverse order every other
	// round.
	const rounds = 30
	for g := range goroutines {
		done.Go(func() {
			for r := range rounds {
				var waits []func() error
				var evs []outbox.Event
				for i := range each {
					e := event(g, r*each+i, "free")
					evs, waits = append(evs, e), append(waits, h(t.Context(), e))
				}
				order := []int{0, 1, 2}
				if r%2 == 1 {
					order = []int{2, 1, 0}
				}
				for _, i := range order {
					check(g, evs[i], waits[i]())
				}
			}
		})
	}
	done.Wait()
	total := 0
	for _, trip := range trips.get() {
		total += len(trip)
	}
	assert.Equal(t, goroutines*each*(rounds+1), total, "every XADD sent once")
	for g := range goroutines {
		if g%3 == 2 {
			continue
		}
		var want []string
		for i := range each {
			want = append(want, event(g, i, "barrier").ID)
		}
		for i := range rounds * each {
			want = append(want, event(g, i, "free").ID)
		}
		assert.Equal(t, want, streamIDs(t, rdb, keys[g]), "goroutine %d's events in the order it started them", g)
	}
}

// TestAsyncPipelinesInOrder: a pipeline is sent only once the one sealed
// before it has its replies, so entries land in the order they were
// started even when a later event is waited for first; and a wait returns
// once its context is done, its XADD left out of a pipeline not yet sent.
// The first pipeline is held in the hook until the second event's wait
// has returned: sent after the first, the second event has missed its
// deadline and is not appended; sent beside it, it would be appended
// first.
func TestAsyncPipelinesInOrder(t *testing.T) {
	t.Parallel()
	rdb := connect(t)
	key := newKey(t, rdb)
	client, trips := hooked(t, rdb)
	held, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	trips.hold = func([]goredis.Cmder) {
		once.Do(func() {
			close(held)
			<-release
		})
	}
	h := newPublisher(t, client, outboxredis.Config{Stream: key}).AsyncHandler()

	wait1 := h(t.Context(), outbox.Event{ID: "first", Type: "t", Payload: json.RawMessage(`1`)})
	err1 := make(chan error, 1)
	go func() { err1 <- wait1() }()
	<-held // the first pipeline is being sent

	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	wait2 := h(ctx, outbox.Event{ID: "second", Type: "t", Payload: json.RawMessage(`2`)})
	err2 := wait2() // returns at its deadline: its pipeline waits for the first
	close(release)
	require.NoError(t, <-err1)
	require.Error(t, err2)
	assert.ErrorIs(t, err2, context.DeadlineExceeded)
	assert.True(t, outbox.IsUnavailable(err2), "%v", err2)
	assert.Equal(t, []string{"first"}, streamIDs(t, rdb, key), "the second, past its deadline before its turn, is not sent")

	// A cancelled delivery does not fail the others of its pipeline.
	cctx, ccancel := context.WithCancel(t.Context())
	wa := h(t.Context(), outbox.Event{ID: "a", Type: "t", Payload: json.RawMessage(`1`)})
	wb := h(cctx, outbox.Event{ID: "b", Type: "t", Payload: json.RawMessage(`1`)})
	wc := h(t.Context(), outbox.Event{ID: "c", Type: "t", Payload: json.RawMessage(`1`)})
	ccancel()
	require.NoError(t, wc())
	errB := wb()
	assert.ErrorIs(t, errB, context.Canceled)
	assert.False(t, outbox.IsUnavailable(errB), "a cancelled delivery is not an outage: %v", errB)
	require.NoError(t, wa())
	assert.Equal(t, []string{"first", "a", "c"}, streamIDs(t, rdb, key))
	assert.Equal(t, [][]string{pipeline(1), pipeline(2)}, trips.get())
}

// TestAsyncCancelledInFlight: a delivery cancelled while its pipeline is
// on its way returns at once with its context's error, and the others of
// the pipeline get their replies: the pipeline does not run on the
// context of one of its deliveries. The cancelled XADD was sent already,
// so it lands (as a lost reply's does).
func TestAsyncCancelledInFlight(t *testing.T) {
	t.Parallel()
	rdb := connect(t)
	key := newKey(t, rdb)
	client, trips := hooked(t, rdb)
	held, release := make(chan struct{}), make(chan struct{})
	trips.hold = func([]goredis.Cmder) {
		close(held)
		<-release
	}
	h := newPublisher(t, client, outboxredis.Config{Stream: key}).AsyncHandler()

	ctx, cancel := context.WithCancel(t.Context())
	wb := h(ctx, outbox.Event{ID: "b", Type: "t", Payload: json.RawMessage(`1`)})
	wa := h(t.Context(), outbox.Event{ID: "a", Type: "t", Payload: json.RawMessage(`1`)})
	errA := make(chan error, 1)
	go func() { errA <- wa() }()
	<-held // the pipeline of b and a is on its way
	cancel()
	err := wb()
	assert.ErrorIs(t, err, context.Canceled, "returns once its context is done")
	close(release)
	require.NoError(t, <-errA)
	assert.Equal(t, []string{"b", "a"}, streamIDs(t, rdb, key))
	assert.Equal(t, [][]string{pipeline(2)}, trips.get())
}

// TestAsyncErrorClassification: the AsyncHandler classifies every error
// as Handler does, with the same text: a client whose hook answers each
// command of a pipeline (or a lone command) with the error, and the
// permanent failures found before anything is sent.
func TestAsyncErrorClassification(t *testing.T) {
	t.Parallel()
	payload := json.RawMessage(`{"secret":"do-not-log"}`)
	for name, tc := range errorCases() {
		rdb := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
		t.Cleanup(func() { _ = rdb.Close() })
		rdb.AddHook(failing{tc.err})
		p := newPublisher(t, rdb, outboxredis.Config{Stream: "s"})
		e := outbox.Event{ID: "e1", Type: "t", Payload: payload}
		want := p.Handler()(t.Context(), e)
		w1, w2 := p.AsyncHandler()(t.Context(), e), p.AsyncHandler()(t.Context(), e)
		for _, err := range []error{w1(), w2()} {
			require.Error(t, err, name)
			assert.ErrorIs(t, err, tc.err, name)
			assert.Equal(t, tc.unavailable, outbox.IsUnavailable(err), "%s: %v", name, err)
			assert.False(t, outbox.IsPermanent(err), name)
			assert.Equal(t, want.Error(), err.Error(), name)
		}
	}

	for name, tc := range map[string]struct {
		cfg outboxredis.Config
		e   outbox.Event
	}{
		"empty stream key": {outboxredis.Config{StreamFor: func(outbox.Event) string { return "" }}, outbox.Event{ID: "e", Type: "t", Payload: payload}},
		"not JSON":         {outboxredis.Config{Stream: "s"}, outbox.Event{ID: "e", Type: "t", Payload: json.RawMessage(`{`)}},
	} {
		p := newPublisher(t, fakeClient{}, tc.cfg)
		want := p.Handler()(t.Context(), tc.e)
		err := p.AsyncHandler()(t.Context(), tc.e)()
		require.Error(t, err, name)
		assert.True(t, outbox.IsPermanent(err), name)
		assert.Equal(t, want.Error(), err.Error(), name)
	}
}

// failing is a go-redis hook that answers every command with err, without
// a server.
type failing struct{ err error }

func (f failing) DialHook(next goredis.DialHook) goredis.DialHook { return next }

func (f failing) ProcessHook(goredis.ProcessHook) goredis.ProcessHook {
	return func(_ context.Context, cmd goredis.Cmder) error {
		cmd.SetErr(f.err)
		return f.err
	}
}

func (f failing) ProcessPipelineHook(goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(_ context.Context, cmds []goredis.Cmder) error {
		for _, c := range cmds {
			c.SetErr(f.err)
		}
		return f.err
	}
}

// TestAsyncTelemetry: the send span starts when the delivery starts, the
// entry carries its trace context, and it ends in wait with the outcome.
func TestAsyncTelemetry(t *testing.T) {
	t.Parallel()
	rdb := connect(t)
	key, bad := newKey(t, rdb), newKey(t, rdb)
	require.NoError(t, rdb.Set(t.Context(), bad, "not a stream", 0).Err())
	tel := newFakeTelemetry()
	h := newPublisher(t, rdb, outboxredis.Config{Telemetry: tel, StreamFor: func(e outbox.Event) string {
		if e.Type == "bad" {
			return bad
		}
		return key
	}}).AsyncHandler()
	good := h(t.Context(), ceEvent("tel-1"))
	failed := h(t.Context(), outbox.Event{ID: "tel-2", Type: "bad", Payload: json.RawMessage(`1`)})
	sends := tel.sent()
	require.Len(t, sends, 2, "started with the delivery")
	assert.False(t, sends[0].ended || sends[1].ended, "not ended before wait")
	assert.Equal(t, key, sends[0].op.Destination)

	require.NoError(t, good())
	err := failed()
	require.Error(t, err)
	sends = tel.sent()
	assert.True(t, sends[0].ended)
	assert.NoError(t, sends[0].err)
	assert.True(t, sends[1].ended)
	assert.Equal(t, err, sends[1].err, "end gets the wait's error")
	var hs map[string]string
	require.NoError(t, json.Unmarshal([]byte(onlyEntry(t, rdb, key).Values[outboxredis.FieldHeaders].(string)), &hs))
	assert.Equal(t, fakeTraceParent, hs["traceparent"], "the entry carries the send span's context")
}

// TestAsyncWithoutPipeline: a client with only XAdd (the Client
// interface) has each event sent when it is started.
func TestAsyncWithoutPipeline(t *testing.T) {
	t.Parallel()
	var c countingClient
	h := newPublisher(t, &c, outboxredis.Config{Stream: "s"}).AsyncHandler()
	w := h(t.Context(), outbox.Event{ID: "e", Type: "t", Payload: json.RawMessage(`1`)})
	assert.Equal(t, 1, c.n, "sent at start")
	require.NoError(t, w())
	assert.Equal(t, 1, c.n)
}

// countingClient counts XADDs and answers each with an entry ID.
type countingClient struct{ n int }

func (c *countingClient) XAdd(ctx context.Context, _ *goredis.XAddArgs) *goredis.StringCmd {
	c.n++
	cmd := goredis.NewStringCmd(ctx, "xadd")
	cmd.SetVal(fmt.Sprintf("1-%d", c.n))
	return cmd
}
