package nats_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	outboxnats "github.com/gorm-outbox/outbox/adapters/nats"
	"github.com/gorm-outbox/outbox/internal/outagetest"
	"github.com/gorm-outbox/outbox/outboxtest"
	"github.com/gorm-outbox/outbox/wire"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// streamOrder reads the stream named name from its first message and
// returns the event IDs in stream order.
func streamOrder(t *testing.T, js jetstream.JetStream, name string) []string {
	t.Helper()
	s, err := js.Stream(t.Context(), name)
	require.NoError(t, err)
	info, err := s.Info(t.Context())
	require.NoError(t, err)
	cons, err := s.OrderedConsumer(t.Context(), jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	var ids []string
	for left := int(info.State.Msgs); left > 0; {
		batch, err := cons.Fetch(min(left, 500), jetstream.FetchMaxWait(5*time.Second))
		require.NoError(t, err)
		got := 0
		for m := range batch.Messages() {
			ids = append(ids, m.Headers().Get(jetstream.MsgIDHeader))
			got++
		}
		require.NoError(t, batch.Error())
		require.NotZero(t, got, "the stream holds %d messages; %d unread", info.State.Msgs, left)
		left -= got
	}
	return ids
}

// publishEvents commits events in one transaction.
func publishEvents(t *testing.T, db *gorm.DB, events ...outbox.Event) {
	t.Helper()
	require.NoError(t, db.Transaction(func(tx *gorm.DB) error { return outbox.Publish(tx, events...) }))
}

// TestAsyncPipelinesTheBatch: a relay with AsyncHandler puts every event
// of a batch on the wire before the server has acked any: the server is
// frozen (SIGSTOP) while the relay delivers, so no ack can come, and all 50
// publishes of the batch (with Workers 4) start anyway, none of their waits
// returning. Once the server runs again, every event is acked and sent,
// and the stream holds them in batch order, the order of the starts.
func TestAsyncPipelinesTheBatch(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	_, js := connectWith(t, srv.url(), natsgo.MaxReconnects(-1))
	createStream(t, js, "PIPE", "pipe.>")
	db, ob := openDB(t)
	h := newPublisher(t, js, outboxnats.Config{SubjectPrefix: "pipe.", Timeout: time.Minute}).AsyncHandler()

	const n = 50
	var (
		mu      sync.Mutex
		started []string
		waited  atomic.Int64 // waits that returned
		all     = make(chan struct{})
	)
	ob.HandleAsync(outbox.AnyEvent, func(ctx context.Context, e outbox.Event) func() error {
		wait := h(ctx, e)
		mu.Lock()
		started = append(started, e.ID)
		if len(started) == n {
			close(all)
		}
		mu.Unlock()
		return func() error { defer waited.Add(1); return wait() }
	})
	var events []outbox.Event
	var ids []string
	for i := range n {
		id := fmt.Sprintf("pipe-%03d", i)
		events = append(events, outbox.Event{ID: id, Type: "order.created", Payload: json.RawMessage(`{}`)})
		ids = append(ids, id)
	}
	publishEvents(t, db, events...)
	relay := outboxtest.Relay(t, ob, db, outbox.RelayConfig{BatchSize: n, Workers: 4})

	srv.pause()
	t.Cleanup(srv.resume) // if the test fails while the server is frozen
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := relay.ProcessOnce(context.Background())
		done <- result{n, err}
	}()
	select {
	case <-all:
	case r := <-done:
		t.Fatalf("the relay returned (%d, %v) while the server could not ack", r.n, r.err)
	case <-time.After(30 * time.Second):
		mu.Lock()
		defer mu.Unlock()
		t.Fatalf("%d of the batch's %d publishes started while the server could not ack: a start waits for its ack", len(started), n)
	}
	assert.Zero(t, waited.Load(), "no wait returned: the server has acked nothing")
	srv.resume()

	r := <-done
	require.NoError(t, r.err)
	require.Equal(t, n, r.n)
	for _, id := range ids {
		assert.Equal(t, outbox.StatusSent, status(t, db, id), id)
	}
	assert.Equal(t, ids, started, "started in batch order")
	assert.Equal(t, ids, streamOrder(t, js, "PIPE"), "stored in the order of the starts")
}

// TestAsyncOrderByAggregate: with OrderByAggregate and AsyncHandler, each
// aggregate's events reach the stream in order, and none after one that
// was not sent: B's third event is refused by the stream (over its
// MaxMsgSize: permanent, failed), C's second fails in the handler (retried
// later), and the events behind them stay pending with no attempt, out of
// the stream. A's go through.
func TestAsyncOrderByAggregate(t *testing.T) {
	t.Parallel()
	_, js := connect(t)
	stream, prefix := newStream(t, js)
	cfg := stream.CachedInfo().Config
	cfg.MaxMsgSize = 2048
	_, err := js.UpdateStream(t.Context(), cfg)
	require.NoError(t, err)

	db, ob := openDB(t)
	h := newPublisher(t, js, outboxnats.Config{SubjectPrefix: prefix + "."}).AsyncHandler()
	ob.HandleAsync(outbox.AnyEvent, func(ctx context.Context, e outbox.Event) func() error {
		if e.ID == "C-2" && outbox.Attempt(ctx) == 1 {
			return func() error { return errors.New("injected failure") }
		}
		return h(ctx, e)
	})
	var events []outbox.Event
	for i := 1; i <= 5; i++ {
		for _, agg := range []string{"A", "B", "C"} {
			payload := json.RawMessage(`{}`)
			if agg == "B" && i == 3 {
				payload = json.RawMessage(`"` + strings.Repeat("x", 4096) + `"`)
			}
			events = append(events, outbox.Event{ID: fmt.Sprintf("%s-%d", agg, i), Type: "order.created",
				AggregateType: "order", AggregateID: agg, Payload: payload})
		}
	}
	publishEvents(t, db, events...)
	relay := outboxtest.Relay(t, ob, db, outbox.RelayConfig{OrderByAggregate: true, Backoff: func(int) time.Duration { return time.Hour }})
	for range 20 {
		n, err := relay.ProcessOnce(t.Context())
		require.NoError(t, err)
		if n == 0 {
			break
		}
	}

	perAgg := map[string][]string{}
	for _, id := range streamOrder(t, js, cfg.Name) {
		perAgg[id[:1]] = append(perAgg[id[:1]], id)
	}
	assert.Equal(t, map[string][]string{
		"A": {"A-1", "A-2", "A-3", "A-4", "A-5"},
		"B": {"B-1", "B-2"},
		"C": {"C-1"},
	}, perAgg, "each aggregate in order, none after one not sent")

	b3 := outboxtest.Row(t, db, "B-3")
	assert.Equal(t, outbox.StatusFailed, b3.Status, "refused by the stream: permanent")
	if assert.NotNil(t, b3.LastError) {
		assert.Equal(t, "nats: nats: API error: code=400 err_code=10054 description=message size exceeds maximum allowed: subject "+
			prefix+".order.created (outbox/nats) (permanent)", *b3.LastError, "as the synchronous publish reports it")
	}
	c2 := outboxtest.Row(t, db, "C-2")
	assert.Equal(t, outbox.StatusPending, c2.Status)
	assert.Equal(t, 1, c2.Attempts)
	for _, id := range []string{"B-4", "B-5", "C-3", "C-4", "C-5"} {
		row := outboxtest.Row(t, db, id)
		assert.Equal(t, outbox.StatusPending, row.Status, id)
		assert.Zero(t, row.Attempts, "%s: held behind its aggregate, no attempt", id)
	}
}

// TestAsyncSameMessageAndErrorsAsHandler: AsyncHandler sends the message
// Handler sends (subject, body, every header: Nats-Msg-Id, Outbox-*,
// trace context), and a stream's refusal is the same error on both.
func TestAsyncSameMessageAndErrorsAsHandler(t *testing.T) {
	t.Parallel()
	_, js := connect(t)
	e := outbox.Event{ID: "same-1", Type: "order.created", AggregateType: "order", AggregateID: "9", IdempotencyKey: "k-9",
		OccurredAt: time.Date(2025, 3, 4, 5, 6, 7, 0, time.UTC), Payload: json.RawMessage(`{"total":3}`),
		Headers: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", "Nats-Expected-Stream": "no"}}
	msgs := map[string]*jetstream.RawStreamMsg{}
	errs := map[string]string{}
	for reg, handler := range registrations {
		stream, prefix := newStream(t, js)
		p := newPublisher(t, js, outboxnats.Config{SubjectPrefix: prefix + "."})
		require.NoError(t, handler(p)(t.Context(), e), reg)
		raw, err := stream.GetLastMsgForSubject(t.Context(), prefix+".order.created")
		require.NoError(t, err, reg)
		raw.Subject = strings.TrimPrefix(raw.Subject, prefix)
		raw.Time, raw.Sequence = time.Time{}, 0
		msgs[reg] = raw

		wrong := newPublisher(t, js, outboxnats.Config{SubjectPrefix: prefix + ".", ExpectStream: "SOME_OTHER_STREAM"})
		err = handler(wrong)(t.Context(), outbox.Event{ID: "same-2", Type: "x", Payload: json.RawMessage(`1`)})
		require.Error(t, err, reg)
		assert.False(t, outbox.IsPermanent(err) || outbox.IsUnavailable(err), "%s: retried: %v", reg, err)
		errs[reg] = strings.ReplaceAll(err.Error(), prefix, "PREFIX")
	}
	assert.Equal(t, msgs["Handler"], msgs["AsyncHandler"])
	assert.Equal(t, "same-1", msgs["AsyncHandler"].Header.Get(jetstream.MsgIDHeader))
	assert.Equal(t, "order", msgs["AsyncHandler"].Header.Get(wire.AggregateType))
	assert.Empty(t, msgs["AsyncHandler"].Header.Get("Nats-Expected-Stream"))
	assert.Equal(t, errs["Handler"], errs["AsyncHandler"])
	assert.Contains(t, errs["AsyncHandler"], "expected stream does not match")
}

// TestAsyncTelemetry: AsyncHandler's send span starts with the publish
// (the message carries its trace context) and ends when wait returns, with
// wait's outcome.
func TestAsyncTelemetry(t *testing.T) {
	t.Parallel()
	e := ceEvent("async-traced")
	for name, tc := range map[string]struct {
		js    *fakeJS
		check func(error) bool
	}{
		"acked":        {&fakeJS{}, func(err error) bool { return err == nil }},
		"refused":      {&fakeJS{err: natsgo.ErrMaxPayload}, outbox.IsPermanent},
		"ack timedout": {&fakeJS{err: jetstream.ErrAsyncPublishTimeout, viaAck: true}, outbox.IsUnavailable},
	} {
		tel := &recordingTelemetry{traceparent: sendTraceParent}
		p := newPublisher(t, tc.js, outboxnats.Config{Format: wire.CloudEvents, Telemetry: tel})
		wait := p.AsyncHandler()(t.Context(), e)
		sends, ends, _, _ := tel.snapshot()
		require.Len(t, sends, 1, name)
		assert.Equal(t, wire.Operation{System: "nats", Destination: "outbox.order.created"}, sends[0].op, name)
		assert.Empty(t, ends, "%s: the span is open until wait", name)
		err := wait()
		require.True(t, tc.check(err), "%s: %v", name, err)
		assert.Equal(t, err, wait(), "%s: a second wait returns the same", name)
		_, ends, _, _ = tel.snapshot()
		assert.Equal(t, []error{err}, ends, "%s: ended once, with wait's outcome", name)
	}

	// The message carries the span's trace context.
	_, js := connect(t)
	stream, prefix := newStream(t, js)
	tel := &recordingTelemetry{traceparent: sendTraceParent}
	p := newPublisher(t, js, outboxnats.Config{SubjectPrefix: prefix + ".", Format: wire.CloudEvents, Telemetry: tel})
	require.NoError(t, p.AsyncHandler()(t.Context(), e)())
	msg := storedMsg(t, stream, prefix+".order.created")
	assert.Equal(t, sendTraceParent, msg.Header.Get("traceparent"))
	assert.Equal(t, sendTraceParent, msg.Header.Get("ce-traceparent"))
}

// stallingJS is an AsyncJetStream whose pipeline is full for its first
// stalls publishes (forever when stalls < 0): PublishMsgAsync then fails
// with ErrTooManyStalledMsgs after a while, as nats.go's does once its
// stall wait has passed.
type stallingJS struct {
	fakeJS
	stalls int64
	tries  atomic.Int64
}

func (s *stallingJS) PublishMsgAsync(msg *natsgo.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	if n := s.tries.Add(1); s.stalls < 0 || n <= s.stalls {
		time.Sleep(5 * time.Millisecond) // the stall wait, shortened
		return nil, jetstream.ErrTooManyStalledMsgs
	}
	return s.fakeJS.PublishMsgAsync(msg, opts...)
}

// TestAsyncWaitsForRoom: a start that finds MaxPending publishes awaiting
// their ack waits for room (nats.go gives up after its stall wait; the
// adapter tries again) and publishes; when no room comes within Timeout,
// the event is reported as the server not keeping up, Unavailable, not
// as a failed event.
func TestAsyncWaitsForRoom(t *testing.T) {
	t.Parallel()
	js := &stallingJS{stalls: 3}
	p := newPublisher(t, js, outboxnats.Config{})
	require.NoError(t, p.AsyncHandler()(t.Context(), outbox.Event{ID: "r1", Type: "t", Payload: json.RawMessage(`1`)})())
	assert.EqualValues(t, 4, js.tries.Load(), "tried again after each stall")
	assert.EqualValues(t, 1, js.calls.Load(), "published once")

	full := &stallingJS{stalls: -1}
	p = newPublisher(t, full, outboxnats.Config{Timeout: 200 * time.Millisecond})
	began := time.Now()
	err := p.AsyncHandler()(t.Context(), outbox.Event{ID: "r2", Type: "t", Payload: json.RawMessage(`1`)})()
	took := time.Since(began)
	require.Error(t, err)
	assert.True(t, outbox.IsUnavailable(err), "%v", err)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.Equal(t, "context deadline exceeded waiting for one of the publishes awaiting their ack to end (Config.MaxPending): subject outbox.t (outbox/nats) (destination unavailable)", err.Error())
	assert.GreaterOrEqual(t, took, 200*time.Millisecond, "bounded by Timeout")
	assert.Zero(t, full.calls.Load())
}

// silentJS is an AsyncJetStream whose acks never come: neither its ack
// nor its error channel is ever written.
type silentJS struct{ fakeJS }

func (s *silentJS) PublishMsgAsync(msg *natsgo.Msg, _ ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	s.calls.Add(1)
	return newFuture(msg), nil
}

// TestAsyncAckNeverComes: AsyncHandler's wait keeps to Timeout itself,
// whatever the AsyncJetStream given to New does about acks that do not
// come (nats.go's own publisher times them out; another may not), and to
// the context's end: the event is reported unavailable, not failed, and
// the relay is not held.
func TestAsyncAckNeverComes(t *testing.T) {
	t.Parallel()
	e := outbox.Event{ID: "s1", Type: "t", Payload: json.RawMessage(`1`)}
	p := newPublisher(t, &silentJS{}, outboxnats.Config{Timeout: 200 * time.Millisecond})
	began := time.Now()
	err := p.AsyncHandler()(t.Context(), e)()
	took := time.Since(began)
	require.Error(t, err)
	assert.True(t, outbox.IsUnavailable(err), "%v", err)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.GreaterOrEqual(t, took, 200*time.Millisecond, "bounded by Timeout")

	// The context's end comes first: wait returns with it.
	p = newPublisher(t, &silentJS{}, outboxnats.Config{Timeout: time.Hour})
	ctx, cancel := context.WithCancel(t.Context())
	wait := p.AsyncHandler()(ctx, e)
	cancel()
	err = wait()
	require.Error(t, err)
	assert.ErrorIs(t, err, context.Canceled)

	// A context deadline before Timeout bounds the wait as well.
	ctx, cancel = context.WithTimeout(t.Context(), 100*time.Millisecond)
	defer cancel()
	err = p.AsyncHandler()(ctx, e)()
	require.Error(t, err)
	assert.True(t, outbox.IsUnavailable(err), "%v", err)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
}

// TestAsyncMaxPending: with MaxPending 1 on a real server, every start of
// a batch but the first finds the pipeline full and waits for room: the
// relay still delivers the whole batch, in order, none failed.
func TestAsyncMaxPending(t *testing.T) {
	t.Parallel()
	_, js := connect(t)
	stream, prefix := newStream(t, js)
	db, ob := openDB(t)
	ob.HandleAsync(outbox.AnyEvent, newPublisher(t, js, outboxnats.Config{SubjectPrefix: prefix + ".", MaxPending: 1}).AsyncHandler())
	var events []outbox.Event
	var ids []string
	for i := range 40 {
		id := fmt.Sprintf("mp-%03d", i)
		events = append(events, outbox.Event{ID: id, Type: "t", Payload: json.RawMessage(`1`)})
		ids = append(ids, id)
	}
	publishEvents(t, db, events...)
	n, err := outboxtest.Relay(t, ob, db, outbox.RelayConfig{BatchSize: 40}).ProcessOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 40, n)
	for _, id := range ids {
		assert.Equal(t, outbox.StatusSent, status(t, db, id), id)
	}
	assert.Equal(t, ids, streamOrder(t, js, stream.CachedInfo().Config.Name))
}

// TestAsyncAcksLostOnDisconnect: publishes whose acks are pending when the
// connection drops (the server is frozen, then killed) are reported
// Unavailable at once (nats.go fails them as it starts reconnecting), not
// as sent and not after Timeout; sent again once the server is back, they
// are stored once each.
func TestAsyncAcksLostOnDisconnect(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	_, js := connectWith(t, srv.url(), natsgo.MaxReconnects(-1), natsgo.ReconnectWait(50*time.Millisecond))
	createStream(t, js, "LOST", "lost.>")
	h := newPublisher(t, js, outboxnats.Config{SubjectPrefix: "lost.", Timeout: time.Minute}).AsyncHandler()

	var events []outbox.Event
	for i := range 10 {
		events = append(events, outbox.Event{ID: fmt.Sprint("lost-", i), Type: "t", Payload: json.RawMessage(`1`)})
	}
	srv.pause()
	t.Cleanup(srv.resume)
	var waits []func() error
	for _, e := range events {
		waits = append(waits, h(t.Context(), e))
	}
	began := time.Now()
	srv.kill()
	for i, wait := range waits {
		err := wait()
		require.Error(t, err, i)
		assert.True(t, outbox.IsUnavailable(err), "%v", err)
		assert.ErrorIs(t, err, natsgo.ErrDisconnected)
	}
	assert.Less(t, time.Since(began), 30*time.Second, "failed by the disconnect, not by Timeout")

	srv.start()
	for _, e := range events {
		require.NoError(t, h(t.Context(), e)())
	}
	for _, e := range events { // again: the duplicate window drops them
		require.NoError(t, h(t.Context(), e)())
	}
	seen := streamIDs(t, js, "LOST")
	for _, e := range events {
		assert.Equal(t, 1, seen[e.ID], e.ID)
	}
}

// TestAsyncClosedConnection: on a connection closed for good, an
// AsyncHandler's publish is Unavailable, both when the connection closes
// while acks are pending (nats.go leaves them pending: they end at
// Timeout) and when it was closed before the first asynchronous publish
// (nats.go reports that as text only); the closed connection is logged
// once, as for Handler.
func TestAsyncClosedConnection(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	nc, js := connectWith(t, srv.url(), natsgo.MaxReconnects(-1))
	createStream(t, js, "CLOSED", "closed.>")
	logs := outagetest.NewLogRecorder()
	h := newPublisher(t, js, outboxnats.Config{SubjectPrefix: "closed.", Timeout: 300 * time.Millisecond, Logger: slog.New(logs)}).AsyncHandler()

	srv.pause()
	t.Cleanup(srv.resume)
	var waits []func() error
	for i := range 3 {
		waits = append(waits, h(t.Context(), outbox.Event{ID: fmt.Sprint("c-", i), Type: "t", Payload: json.RawMessage(`1`)}))
	}
	nc.Close()
	for _, wait := range waits {
		err := wait()
		require.Error(t, err)
		assert.True(t, outbox.IsUnavailable(err), "%v", err)
		assert.ErrorIs(t, err, natsgo.ErrConnectionClosed)
	}
	err := h(t.Context(), outbox.Event{ID: "c-after", Type: "t", Payload: json.RawMessage(`1`)})()
	assert.True(t, outbox.IsUnavailable(err), "%v", err)
	assert.ErrorIs(t, err, natsgo.ErrConnectionClosed)

	// A Publisher whose first asynchronous publish meets a closed
	// connection.
	srv.resume()
	nc2, js2 := connectWith(t, srv.url())
	h2 := newPublisher(t, js2, outboxnats.Config{SubjectPrefix: "closed.", Logger: slog.New(logs)}).AsyncHandler()
	nc2.Close()
	err = h2(t.Context(), outbox.Event{ID: "c-first", Type: "t", Payload: json.RawMessage(`1`)})()
	assert.True(t, outbox.IsUnavailable(err), "%v", err)
	assert.ErrorIs(t, err, natsgo.ErrConnectionClosed)

	assert.Equal(t, 2, logs.Count(logClosed), "logged once per Publisher: %v", logs.Records())
}

// TestAsyncBrokerOutage is TestBrokerOutage with AsyncHandler and
// OrderByAggregate: a test-owned server stopped twice under a steady
// writer (5 aggregates in turn) and a running relay. The publishes in
// flight when the server goes are handed back (Unavailable: the
// connection drops, or the ack does not come within Timeout), no attempt
// is counted, the relay logs "destination unavailable" once per outage,
// and after the restarts every event is in the stream once, each
// aggregate's in commit order.
func TestAsyncBrokerOutage(t *testing.T) {
	long(t, "a nats-server of its own, stopped twice under load")
	t.Parallel()
	srv := newServer(t)
	_, js := connectWith(t, srv.url(), natsgo.MaxReconnects(-1), natsgo.ReconnectWait(50*time.Millisecond))
	createStream(t, js, "AOUTAGE", "aoutage.>")

	logs := outagetest.NewLogRecorder()
	log := slog.New(logs)
	db, ob := outboxtest.SQLite(t, outbox.Config{Logger: log})
	h := newPublisher(t, js, outboxnats.Config{SubjectPrefix: "aoutage.", Timeout: 500 * time.Millisecond, Logger: log}).AsyncHandler()
	var calls, down atomic.Int64
	ob.HandleAsync(outbox.AnyEvent, func(ctx context.Context, e outbox.Event) func() error {
		wait := h(ctx, e)
		return func() error {
			err := wait()
			calls.Add(1)
			if outbox.IsUnavailable(err) {
				down.Add(1)
			}
			return err
		}
	})
	relay, err := ob.Relay(db, outbox.RelayConfig{PollInterval: 50 * time.Millisecond, OrderByAggregate: true})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	relayDone := make(chan struct{})
	go func() { defer close(relayDone); _ = relay.Run(ctx) }()
	stopRelay := sync.OnceFunc(func() { cancel(); <-relayDone })
	t.Cleanup(stopRelay)

	var (
		mu      sync.Mutex
		ids     []string // committed, in order
		stopW   = make(chan struct{})
		writerW sync.WaitGroup
	)
	writerW.Go(func() {
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for n := 0; ; n++ {
			select {
			case <-stopW:
				return
			case <-tick.C:
			}
			id := fmt.Sprintf("ao-%06d", n)
			err := db.Transaction(func(tx *gorm.DB) error {
				return outbox.Publish(tx, outbox.Event{ID: id, Type: "order.created", AggregateType: "order", AggregateID: fmt.Sprint("agg-", n%5),
					Payload: map[string]any{"n": n, "marker": outagetest.PayloadMarker}})
			})
			if err != nil {
				t.Errorf("publish %s: %v", id, err)
				return
			}
			mu.Lock()
			ids = append(ids, id)
			mu.Unlock()
		}
	})
	stopWriting := sync.OnceFunc(func() { close(stopW); writerW.Wait() })
	t.Cleanup(stopWriting)
	count := func(where string, args ...any) int {
		var n int64
		require.NoError(t, db.Table(outbox.DefaultTable).Where(where, args...).Count(&n).Error)
		return int(n)
	}

	const outages, downFor = 2, 2 * time.Second
	for i := range outages {
		waitFor(t, 30*time.Second, "deliveries before the outage", func() bool { return count("status = ?", outbox.StatusSent) >= 100*(i+1) })
		srv.stop()
		time.Sleep(downFor) // the outage itself
		srv.start()
		waitFor(t, 60*time.Second, "the relay to resume", func() bool { return logs.Count(outagetest.LogResumed) == i+1 })
	}
	stopWriting()
	mu.Lock()
	committed := slices.Clone(ids)
	mu.Unlock()
	waitFor(t, 60*time.Second, "every event sent", func() bool { return count("status = ?", outbox.StatusSent) == len(committed) })
	stopRelay()

	order := streamOrder(t, js, "AOUTAGE")
	seen := map[string]int{}
	perAgg := map[string][]string{}
	for _, id := range order {
		seen[id]++
		n, err := strconv.Atoi(strings.TrimPrefix(id, "ao-"))
		require.NoError(t, err)
		perAgg[fmt.Sprint("agg-", n%5)] = append(perAgg[fmt.Sprint("agg-", n%5)], id)
	}
	var lost, dups int
	for _, id := range committed {
		switch seen[id] {
		case 0:
			lost++
		case 1:
		default:
			dups += seen[id] - 1
		}
	}
	for agg, got := range perAgg {
		assert.True(t, slices.IsSorted(got), "%s's events stored in commit order", agg)
	}
	assert.Zero(t, lost)
	assert.Zero(t, dups, "the duplicate window drops re-sends")
	assert.Zero(t, count("status = ?", outbox.StatusFailed))
	assert.Equal(t, len(committed), count("status = ? AND attempts = 1", outbox.StatusSent), "no attempt is counted for the outages")
	assert.Positive(t, down.Load(), "the handler saw the outages")
	assert.Equal(t, outages, logs.Count(outagetest.LogPaused), "one \"destination unavailable\" per outage")
	assert.Equal(t, outages, logs.Count(outagetest.LogResumed))
	assert.Zero(t, logs.Count(outagetest.LogRetry), "no per-event warnings")
	assert.Zero(t, logs.Count(outagetest.LogFailed))
	for _, rec := range logs.Records() {
		assert.NotContains(t, rec.Text, outagetest.PayloadMarker, "a log record carries a payload")
	}
	t.Logf("RESULT async: events %d, lost %d, duplicates %d; waits %d, %d of them Unavailable; paused %d, resumed %d",
		len(committed), lost, dups, calls.Load(), down.Load(), logs.Count(outagetest.LogPaused), logs.Count(outagetest.LogResumed))
}
