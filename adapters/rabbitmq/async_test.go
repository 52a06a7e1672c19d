package rabbitmq

import (
	"fmt"
	"net"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxtest"
)

// hold sits between a Publisher and the broker (its Config.AMQP.Dial) and
// can hold back everything the broker sends the Publisher (confirms,
// returns, a channel's close) while the Publisher's own frames still go
// out: with it shut, the messages a publisher sends all await their
// confirms at once, which the broker's queue shows, and the test decides
// when they arrive. It can also cut the connections, as a network failure
// would.
type hold struct {
	mu     sync.Mutex
	opened chan struct{} // closed while the broker's frames flow
	conns  []*heldConn
}

func newHold() *hold {
	h := &hold{opened: make(chan struct{})}
	close(h.opened)
	return h
}

// shut holds back what the broker sends from now on.
func (h *hold) shut() {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-h.opened:
		h.opened = make(chan struct{})
	default:
	}
}

// release lets what was held back, and what follows, through.
func (h *hold) release() {
	h.mu.Lock()
	defer h.mu.Unlock()
	select {
	case <-h.opened:
	default:
		close(h.opened)
	}
}

func (h *hold) gate() <-chan struct{} {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.opened
}

// cut closes every connection dialled so far, as a network failure
// would: the broker sees a dropped socket, the Publisher a read error.
func (h *hold) cut() {
	h.mu.Lock()
	conns := h.conns
	h.conns = nil
	h.mu.Unlock()
	for _, c := range conns {
		c.once.Do(func() { close(c.cut) })
		_ = c.Conn.Close()
	}
}

func (h *hold) dial(network, addr string) (net.Conn, error) {
	c, err := amqp.DefaultDial(3*time.Second)(network, addr)
	if err != nil {
		return nil, err
	}
	hc := &heldConn{Conn: c, h: h, cut: make(chan struct{})}
	h.mu.Lock()
	h.conns = append(h.conns, hc)
	h.mu.Unlock()
	return hc, nil
}

type heldConn struct {
	net.Conn
	h    *hold
	cut  chan struct{}
	once sync.Once
}

// Read hands over what it read only while the hold is open: a read that
// was already waiting when the hold shut keeps its bytes too.
func (c *heldConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	select {
	case <-c.h.gate():
	case <-c.cut:
		return 0, net.ErrClosed
	}
	return n, err
}

// heldPublisher returns a Publisher whose connections go through a hold,
// connected.
func (f *fixture) heldPublisher(cfg Config) (*Publisher, *hold) {
	f.t.Helper()
	h := newHold()
	cfg.AMQP.Dial = h.dial
	p := f.publisher(cfg)
	f.t.Cleanup(h.release) // before Close, which waits for the broker's reply
	require.NoError(f.t, p.Connect(f.t.Context()))
	return p, h
}

// depth is how many messages the queue holds.
func (f *fixture) depth(queue string) int {
	f.t.Helper()
	var n int
	f.admin(func(ch *amqp.Channel) error {
		q, err := ch.QueueDeclarePassive(queue, false, false, false, false, nil)
		n = q.Messages
		return err
	})
	return n
}

// queueOrder takes every message out of queue and returns their IDs in
// queue order.
func (f *fixture) queueOrder(queue string) []string {
	f.t.Helper()
	var ids []string
	f.admin(func(ch *amqp.Channel) error {
		for {
			m, ok, err := ch.Get(queue, true)
			if err != nil || !ok {
				return err
			}
			ids = append(ids, m.MessageId)
		}
	})
	return ids
}

func eventsOf(typ string, ids ...string) []outbox.Event {
	events := make([]outbox.Event, len(ids))
	for i, id := range ids {
		events[i] = outbox.Event{ID: id, Type: typ, Payload: map[string]int{"n": i}}
	}
	return events
}

func seqIDs(prefix string, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%03d", prefix, i)
	}
	return ids
}

// TestAsyncPipelinesABatch: a relay with the AsyncHandler publishes a
// whole batch before the first confirm arrives. The broker's confirms are
// held back, yet all 40 messages of the batch reach the queue (with
// Handler, or an AsyncHandler whose start waited for its confirm, no more
// than Workers would): 40 publishes await their confirms at once, on one
// channel, and the queue holds them in batch order. Released, the confirms
// mark every event sent at its first attempt.
func TestAsyncPipelinesABatch(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	q := f.queue("#", nil)
	p, h := f.heldPublisher(Config{})
	db, ob := openOutbox(t)
	ob.HandleAsync(outbox.AnyEvent, p.AsyncHandler())
	const batch, workers = 40, 2
	ids := seqIDs("pipe", batch)
	publishEvents(t, db, eventsOf("order.created", ids...)...)
	relay := outboxtest.Relay(t, ob, db, outbox.RelayConfig{BatchSize: batch, Workers: workers})

	h.shut()
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := relay.ProcessOnce(t.Context())
		done <- result{n, err}
	}()
	waitFor(t, 10*time.Second, fmt.Sprintf("all %d messages in the queue before any confirm", batch), func() bool { return f.depth(q) == batch })
	select {
	case r := <-done:
		t.Fatalf("the relay finished its batch without confirms: %d, %v", r.n, r.err)
	default:
	}
	assert.Equal(t, outbox.StatusPending, record(t, db, ids[0]).Status, "nothing is sent before its confirm")
	h.release()
	r := <-done
	require.NoError(t, r.err)
	require.Equal(t, batch, r.n)
	for _, id := range ids {
		row := record(t, db, id)
		assert.Equal(t, outbox.StatusSent, row.Status, id)
		assert.Equal(t, 1, row.Attempts, id)
	}
	assert.Equal(t, ids, f.queueOrder(q), "published in batch order on one channel")
}

// TestAsyncOrderByAggregate: with OrderByAggregate, four aggregates'
// events, interleaved, go through the AsyncHandler; b's third event is
// unroutable (its type has no binding, so the mandatory message is
// returned). Read back from the queue, every aggregate's events are in
// order, and none of b's after the returned one went out: b-3 failed with
// ErrUnroutable at each attempt, b-4 and later were never attempted. Once
// a binding takes b-3, the rest of b follows in order.
func TestAsyncOrderByAggregate(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	q := f.queue("order.*", nil)
	p := f.publisher(Config{})
	db, ob := openOutbox(t)
	ob.HandleAsync(outbox.AnyEvent, p.AsyncHandler())

	aggs := []string{"a", "b", "c", "d"}
	const each = 6
	var events []outbox.Event
	for i := 1; i <= each; i++ {
		for _, agg := range aggs {
			e := outbox.Event{ID: fmt.Sprintf("%s-%d", agg, i), Type: "order.changed", AggregateType: "order", AggregateID: agg, Payload: map[string]int{"i": i}}
			if e.ID == "b-3" {
				e.Type = "nowhere.changed"
			}
			events = append(events, e)
		}
	}
	require.NoError(t, db.Transaction(func(tx *gorm.DB) error { return outbox.Publish(tx, events...) }))
	relay := outboxtest.Relay(t, ob, db, outbox.RelayConfig{
		OrderByAggregate: true, MaxAttempts: 1000,
		Backoff: func(int) time.Duration { return 0 },
	})

	sent := func() int64 {
		var n int64
		require.NoError(t, db.Table(ob.Table()).Where("status = ?", outbox.StatusSent).Count(&n).Error)
		return n
	}
	// Deliver until a, c and d are through, and b up to b-3, which is
	// tried at each pass from the third on.
	for pass := 0; sent() < 3*each+2; pass++ {
		require.Less(t, pass, 50, "the relay does not get a, c and d through")
		_, err := relay.ProcessOnce(t.Context())
		require.NoError(t, err)
	}
	byAgg := func(ids []string) map[string][]string {
		out := map[string][]string{}
		for _, id := range ids {
			agg, _, _ := strings.Cut(id, "-")
			out[agg] = append(out[agg], id)
		}
		return out
	}
	want := func(agg string, n int) []string {
		var ids []string
		for i := 1; i <= n; i++ {
			ids = append(ids, fmt.Sprintf("%s-%d", agg, i))
		}
		return ids
	}
	got := byAgg(f.queueOrder(q))
	assert.Equal(t, map[string][]string{"a": want("a", each), "b": want("b", 2), "c": want("c", each), "d": want("d", each)}, got,
		"each aggregate in order; none of b after its returned event")
	b3 := record(t, db, "b-3")
	assert.Equal(t, outbox.StatusPending, b3.Status)
	assert.GreaterOrEqual(t, b3.Attempts, 2, "b-3 is retried")
	require.NotNil(t, b3.LastError)
	assert.Contains(t, *b3.LastError, ErrUnroutable.Error())
	for i := 4; i <= each; i++ {
		row := record(t, db, fmt.Sprintf("b-%d", i))
		assert.Equal(t, outbox.StatusPending, row.Status)
		assert.Zero(t, row.Attempts, "held behind b-3: never attempted")
	}

	// A binding for b-3's type: the rest of b follows, in order.
	f.admin(func(ch *amqp.Channel) error { return ch.QueueBind(q, "nowhere.*", f.exchange, false, nil) })
	outboxtest.Drain(t, relay)
	assert.Equal(t, map[string][]string{"b": want("b", each)[2:]}, byAgg(f.queueOrder(q)))
}

// TestAsyncOutcomesMapToTheirMessages starts 60 publishes without waiting,
// with the broker's replies held back so that all of them await their
// confirm at once: every third is unroutable (returned), and the queue
// takes the first 10 routable ones and nacks the others
// (x-overflow=reject-publish). Each wait then reports its own message's
// fate, returns and confirms interleaved on one channel.
func TestAsyncOutcomesMapToTheirMessages(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	q := f.queue("order.*", amqp.Table{"x-max-length": int32(10), "x-overflow": "reject-publish"})
	p, h := f.heldPublisher(Config{})
	start := p.AsyncHandler()

	h.shut()
	const n = 60
	waits := make([]func() error, n)
	for i := range n {
		typ := "order.created"
		if i%3 == 2 {
			typ = "nowhere.created"
		}
		waits[i] = start(t.Context(), eventsOf(typ, fmt.Sprintf("mix-%02d", i))[0])
	}
	waitFor(t, 10*time.Second, "the queue to fill", func() bool { return f.depth(q) == 10 })
	h.release()
	var stored []string
	routable := 0
	for i, wait := range waits {
		err := wait()
		id := fmt.Sprintf("mix-%02d", i)
		switch {
		case i%3 == 2:
			assert.ErrorIs(t, err, ErrUnroutable, id)
		case routable < 10:
			routable++
			assert.NoError(t, err, id)
			stored = append(stored, id)
		default:
			assert.ErrorIs(t, err, ErrNacked, id)
		}
		assert.False(t, outbox.IsUnavailable(err), "%s: %v", id, err)
	}
	assert.Equal(t, stored, f.queueOrder(q))
}

// TestAsyncSharedPublisherKeepsEachCallersOrder: several goroutines share
// one Publisher (as relays of one process do) and each starts 40
// publishes before it waits for any. The queue holds each goroutine's
// messages in the order of its calls, and each wait reports its own
// message: every seventh one is unroutable and only those fail.
func TestAsyncSharedPublisherKeepsEachCallersOrder(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	q := f.queue("order.*", nil)
	p := f.publisher(Config{})
	start := p.AsyncHandler()

	const callers, each = 4, 40
	var wg sync.WaitGroup
	for c := range callers {
		wg.Go(func() {
			waits := make([]func() error, each)
			for i := range each {
				typ := "order.created"
				if i%7 == 6 {
					typ = "nowhere.created"
				}
				waits[i] = start(t.Context(), eventsOf(typ, fmt.Sprintf("c%d-%02d", c, i))[0])
			}
			for i, wait := range waits {
				if err := wait(); i%7 == 6 {
					assert.ErrorIs(t, err, ErrUnroutable, "c%d-%02d", c, i)
				} else {
					assert.NoError(t, err, "c%d-%02d", c, i)
				}
			}
		})
	}
	wg.Wait()
	got := map[string][]string{}
	for _, id := range f.queueOrder(q) {
		got[id[:2]] = append(got[id[:2]], id)
	}
	for c := range callers {
		var want []string
		for i := range each {
			if i%7 != 6 {
				want = append(want, fmt.Sprintf("c%d-%02d", c, i))
			}
		}
		assert.Equal(t, want, got[fmt.Sprintf("c%d", c)], "caller %d's messages in the order of its calls", c)
	}
}

// TestAsyncConnectionLostWithConfirmsPending: a relay's pipelined batch is
// in the broker's queue, its confirms held back, when the connection drops
// (cut as by a network failure). Every wait fails as Unavailable (never a
// silent success), the relay hands the batch back without counting an
// attempt, and once the broker can be reached the next pass delivers every
// event at its first counted attempt. The broker had stored the first
// copies: RabbitMQ keeps no record of message IDs, so each event is in the
// queue twice, and consumers deduplicate by the message ID. (A broker that
// closes the connection itself, rabbitmqctl close_connection, sends the
// confirms it owes first: TestBrokerRestart restarts a node under a relay.)
func TestAsyncConnectionLostWithConfirmsPending(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	q := f.queue("#", nil)
	p, h := f.heldPublisher(Config{})
	db, ob := openOutbox(t)
	ob.HandleAsync(outbox.AnyEvent, p.AsyncHandler())
	const batch = 30
	ids := seqIDs("lost", batch)
	publishEvents(t, db, eventsOf("order.created", ids...)...)
	relay := outboxtest.Relay(t, ob, db, outbox.RelayConfig{BatchSize: batch})

	h.shut()
	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	go func() {
		n, err := relay.ProcessOnce(t.Context())
		done <- result{n, err}
	}()
	waitFor(t, 10*time.Second, "the batch in the queue, unconfirmed", func() bool { return f.depth(q) == batch })
	h.cut()
	h.release()
	r := <-done
	require.Equal(t, batch, r.n)
	require.Error(t, r.err)
	assert.True(t, outbox.IsUnavailable(r.err), "the relay sees the broker down: %v", r.err)
	assert.ErrorIs(t, r.err, ErrConnectionLost)
	for _, id := range ids {
		row := record(t, db, id)
		assert.Equal(t, outbox.StatusPending, row.Status, id)
		assert.Zero(t, row.Attempts, "%s: handed back, no attempt counted", id)
	}

	n, err := relay.ProcessOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, batch, n)
	for _, id := range ids {
		row := record(t, db, id)
		assert.Equal(t, outbox.StatusSent, row.Status, id)
		assert.Equal(t, 1, row.Attempts, id)
	}
	got := f.queueOrder(q)
	assert.Equal(t, append(slices.Clone(ids), ids...), got, "the lost batch, then its redelivery: one duplicate per event")
	t.Logf("%d events, %d messages in the queue: %d duplicates from the lost confirms (%v)", batch, len(got), len(got)-batch, r.err)
}

// TestAsyncChannelClosedForOneMessage: the broker closes the channel for
// one message (406, here an invalid expiration) while 20 others await
// their confirms on it. The broker does not say which message it refused,
// so none of the others may count an attempt for it: each gets either its
// confirm or an Unavailable error naming the close. Alone on a channel,
// the same message gets the 406 as its own error, which counts.
func TestAsyncChannelClosedForOneMessage(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.queue("#", nil)
	p, h := f.heldPublisher(Config{})
	start := p.AsyncHandler()
	bad := amqp.Publishing{MessageId: "bad", Expiration: "not-a-number", Body: []byte("{}")}

	h.shut()
	var waits []func() error
	for i := range 10 {
		waits = append(waits, start(t.Context(), eventsOf("order.created", fmt.Sprintf("before-%d", i))[0]))
	}
	s, err := p.session(t.Context())
	require.NoError(t, err)
	culprit, err := s.publish(t.Context(), p.exchange, "order.bad", true, bad)
	require.NoError(t, err)
	for i := range 10 {
		waits = append(waits, start(t.Context(), eventsOf("order.created", fmt.Sprintf("after-%d", i))[0]))
	}
	h.release()
	for i, wait := range waits {
		err := wait()
		if err == nil {
			continue
		}
		assert.True(t, outbox.IsUnavailable(err), "publish %d: not an attempt of its own: %v", i, err)
		var amqpErr *amqp.Error
		if assert.ErrorAs(t, err, &amqpErr) {
			assert.Equal(t, amqp.PreconditionFailed, amqpErr.Code)
		}
		assert.Contains(t, err.Error(), "others awaiting a confirm")
	}
	err = p.confirmed(t.Context(), culprit, "order.bad")
	assert.True(t, outbox.IsUnavailable(err), "the message at fault is not known: %v", err)

	// Alone on a fresh channel, the message at fault is known.
	s, err = p.session(t.Context())
	require.NoError(t, err)
	culprit, err = s.publish(t.Context(), p.exchange, "order.bad", true, bad)
	require.NoError(t, err)
	err = p.confirmed(t.Context(), culprit, "order.bad")
	var amqpErr *amqp.Error
	require.ErrorAs(t, err, &amqpErr)
	assert.Equal(t, amqp.PreconditionFailed, amqpErr.Code)
	assert.False(t, outbox.IsUnavailable(err), "about this message: %v", err)
	assert.NotContains(t, err.Error(), "others")

	// And the Publisher goes on.
	require.NoError(t, start(t.Context(), eventsOf("order.created", "next")[0])())
}

// TestAsyncTelemetry: the send span starts with the publish and ends in
// the wait, with the wait's error; the message carries its trace context.
func TestAsyncTelemetry(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.consume("order.*")
	tel := &fakeTelemetry{}
	p, h := f.heldPublisher(Config{Telemetry: tel})
	start := p.AsyncHandler()

	h.shut()
	ok := start(t.Context(), eventsOf("order.created", "tel-ok")[0])
	lost := start(t.Context(), eventsOf("nowhere.created", "tel-lost")[0])
	spans := tel.spans(false)
	require.Len(t, spans, 2, "a span per publish, started by the start")
	for _, s := range spans {
		select {
		case err := <-s.ended:
			t.Fatalf("span of %s ended before its wait: %v", s.event.ID, err)
		default:
		}
	}
	h.release()
	require.NoError(t, ok())
	assert.NoError(t, spans[0].end(t))
	err := lost()
	require.ErrorIs(t, err, ErrUnroutable)
	assert.Equal(t, err, spans[1].end(t), "the span ends with the wait's error")
	assert.Equal(t, fakeTraceParent, receive(t, d).Headers["traceparent"])
}

// TestAsyncClosedPublisher: after Close the start fails and its wait says
// so, as Publish does: Unavailable, the event kept for a later process.
func TestAsyncClosedPublisher(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	p := f.publisher(Config{})
	require.NoError(t, p.Close())
	err := p.AsyncHandler()(t.Context(), testEvent("evt-closed"))()
	require.ErrorIs(t, err, ErrClosed)
	assert.True(t, outbox.IsUnavailable(err))
	assert.ErrorIs(t, p.Publish(t.Context(), testEvent("evt-closed")), ErrClosed)
}

// TestAsyncNacksAreNeverConfirms interleaves publishes to two queues, one
// that takes everything and one that is full and refuses publishes
// (x-max-length 0, reject-publish), all awaiting their confirms at once.
// The two queues confirm at their own pace, so the broker acks and nacks
// out of order and coalesces them (multiple=true): every message of the
// full queue must fail with ErrNacked, never succeed, and every other
// must succeed.
func TestAsyncNacksAreNeverConfirms(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	q := f.queue("order.*", nil)
	f.queue("full.*", amqp.Table{"x-max-length": int32(0), "x-overflow": "reject-publish"})
	p, h := f.heldPublisher(Config{})
	start := p.AsyncHandler()

	for round := range 5 {
		h.shut()
		const n = 200
		waits := make([]func() error, n)
		for i := range n {
			typ := "order.created"
			if i%2 == 1 {
				typ = "full.created"
			}
			waits[i] = start(t.Context(), eventsOf(typ, fmt.Sprintf("r%d-%03d", round, i))[0])
		}
		h.release()
		var stored []string
		for i, wait := range waits {
			err := wait()
			id := fmt.Sprintf("r%d-%03d", round, i)
			if i%2 == 1 {
				assert.ErrorIs(t, err, ErrNacked, id)
			} else {
				assert.NoError(t, err, id)
				stored = append(stored, id)
			}
		}
		assert.Equal(t, stored, f.queueOrder(q))
	}
}
