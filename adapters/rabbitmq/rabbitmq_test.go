package rabbitmq

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/wire"
)

func testEvent(id string) outbox.Event {
	return outbox.Event{
		ID:             id,
		Type:           "order.created",
		AggregateType:  "order",
		AggregateID:    "42",
		IdempotencyKey: "key-" + id,
		Payload:        json.RawMessage(`{"total":7}`),
		Headers:        map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		OccurredAt:     time.Date(2026, 5, 4, 3, 2, 1, 123456000, time.UTC),
	}
}

func TestMessageProperties(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.consume("order.*")
	p := f.publisher(Config{})

	e := testEvent("evt-1")
	// A reserved name among the event's headers must not override the
	// event's own field.
	e.Headers[wire.AggregateID] = "spoofed"
	e.Headers["outbox-event-type"] = "spoofed" // in any case
	require.NoError(t, p.Handler()(t.Context(), e))

	m := receive(t, d)
	assert.Equal(t, "evt-1", m.MessageId)
	assert.Equal(t, amqp.Persistent, m.DeliveryMode)
	assert.Equal(t, "application/json", m.ContentType)
	assert.Equal(t, "order.created", m.Type)
	assert.Equal(t, f.exchange, m.Exchange)
	assert.Equal(t, "order.created", m.RoutingKey, "the routing key defaults to the event type")
	assert.Equal(t, e.OccurredAt.Truncate(time.Second), m.Timestamp.UTC(), "AMQP timestamps have second precision")
	assert.JSONEq(t, `{"total":7}`, string(m.Body))
	assert.Equal(t, amqp.Table{
		"traceparent":       "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		wire.EventID:        "evt-1",
		wire.EventType:      "order.created",
		wire.AggregateType:  "order",
		wire.AggregateID:    "42",
		wire.IdempotencyKey: "key-evt-1",
		wire.OccurredAt:     "2026-05-04T03:02:01.123456Z",
	}, m.Headers)

	// An event without aggregate carries no aggregate headers, and a Go
	// payload (memory mode, direct calls) is encoded as Publish would.
	require.NoError(t, p.Publish(t.Context(), outbox.Event{ID: "evt-2", Type: "order.noted", Payload: map[string]int{"n": 1}}))
	m = receive(t, d)
	assert.Equal(t, "evt-2", m.MessageId)
	assert.JSONEq(t, `{"n":1}`, string(m.Body))
	assert.NotContains(t, m.Headers, wire.AggregateID)
	assert.NotContains(t, m.Headers, wire.AggregateType)
}

func TestRoutingKeyFunc(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.consume("order.42.#")
	p := f.publisher(Config{RoutingKey: func(e outbox.Event) string {
		return e.AggregateType + "." + e.AggregateID + "." + e.Type
	}})
	require.NoError(t, p.Publish(t.Context(), testEvent("evt-rk")))
	m := receive(t, d)
	assert.Equal(t, "order.42.order.created", m.RoutingKey)
}

func TestDeclareExchange(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	exchange := randomName("outbox-test-declared-")
	t.Cleanup(func() { f.admin(func(ch *amqp.Channel) error { return ch.ExchangeDelete(exchange, false, false) }) })
	p := f.publisher(Config{Exchange: exchange, DeclareExchange: true, AllowUnroutable: true})
	require.NoError(t, p.Connect(t.Context()))
	// A passive declare fails unless the exchange exists with these
	// settings: durable topic.
	f.admin(func(ch *amqp.Channel) error {
		return ch.ExchangeDeclarePassive(exchange, amqp.ExchangeTopic, true, false, false, false, nil)
	})
	require.NoError(t, p.Publish(t.Context(), testEvent("evt-decl")))
}

func TestUnroutableIsAnError(t *testing.T) {
	t.Parallel()
	f := newFixture(t) // no queue bound

	p := f.publisher(Config{})
	err := p.Publish(t.Context(), testEvent("evt-lost"))
	require.ErrorIs(t, err, ErrUnroutable)
	assert.False(t, outbox.IsPermanent(err), "binding a queue later must let a retry succeed")
	assert.False(t, outbox.IsUnavailable(err), "about this routing key, not the broker")
	assert.Equal(t, `message unroutable (returned by the broker): 312 NO_ROUTE: exchange "`+f.exchange+`", routing key "order.created" (outbox/rabbitmq)`, err.Error(),
		"the cause first, then the destination and the adapter; never the event ID")

	// The channel survives a return: the next routable publish works.
	d := f.consume("#")
	require.NoError(t, p.Publish(t.Context(), testEvent("evt-found")))
	assert.Equal(t, "evt-found", receive(t, d).MessageId)

	// Opting out of mandatory makes the same situation a success.
	f2 := newFixture(t)
	loose := f2.publisher(Config{AllowUnroutable: true})
	require.NoError(t, loose.Publish(t.Context(), testEvent("evt-dropped")))
}

func TestNackIsAnError(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	// A full queue that rejects publishes makes the broker nack.
	f.queue("#", amqp.Table{"x-max-length": int32(1), "x-overflow": "reject-publish"})
	p := f.publisher(Config{})

	require.NoError(t, p.Publish(t.Context(), testEvent("evt-fits")))
	err := p.Publish(t.Context(), testEvent("evt-rejected"))
	require.ErrorIs(t, err, ErrNacked)
	assert.False(t, outbox.IsPermanent(err))
	assert.False(t, outbox.IsUnavailable(err), "a nack is about this message")
	assert.Equal(t, `broker nacked the message: exchange "`+f.exchange+`", routing key "order.created" (outbox/rabbitmq)`, err.Error(),
		"the cause first, then the destination and the adapter; never the event ID")
}

func TestConcurrentPublishes(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.consume("#")
	p := f.publisher(Config{})

	const workers, each = 8, 25
	var wg sync.WaitGroup
	errs := make(chan error, workers*each)
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				errs <- p.Publish(t.Context(), testEvent(fmt.Sprintf("evt-%d-%d", w, i)))
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	var ids []string
	for w := range workers {
		for i := range each {
			ids = append(ids, fmt.Sprintf("evt-%d-%d", w, i))
		}
	}
	seen := receiveIDs(t, d, ids...)
	assert.Len(t, seen, workers*each, "nothing but these events")
}

func TestPublishIsBoundByContext(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	// A broker that accepts TCP but never answers: dialing hangs.
	release := make(chan struct{})
	t.Cleanup(func() { close(release) })
	hang := amqp.Config{Dial: func(network, addr string) (net.Conn, error) {
		<-release
		return nil, errors.New("released")
	}}
	p := f.publisher(Config{AMQP: hang})

	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := p.Publish(ctx, testEvent("evt-hang"))
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.True(t, outbox.IsUnavailable(err), "no connection in time: the broker is unavailable")
	assert.Less(t, time.Since(start), 5*time.Second)

	// An already cancelled context fails at once too; that says nothing
	// about the broker.
	done, cancel2 := context.WithCancel(t.Context())
	cancel2()
	err = p.Publish(done, testEvent("evt-cancelled"))
	require.ErrorIs(t, err, context.Canceled)
	assert.False(t, outbox.IsUnavailable(err))
}

func TestClosedPublisher(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	f.consume("#")
	p := f.publisher(Config{})
	require.NoError(t, p.Publish(t.Context(), testEvent("evt-open")))
	require.NoError(t, p.Close())
	err := p.Publish(t.Context(), testEvent("evt-after-close"))
	require.ErrorIs(t, err, ErrClosed)
	assert.False(t, outbox.IsPermanent(err), "events must stay pending for a later process")
	assert.True(t, outbox.IsUnavailable(err), "no attempt is spent while the application shuts down")
	require.NoError(t, p.Close(), "Close is idempotent")
}

func TestConfigValidation(t *testing.T) {
	t.Parallel()
	_, err := New(Config{URL: "http://example.com"})
	require.ErrorContains(t, err, "outbox/rabbitmq: invalid URL")
	_, err = New(Config{AMQP: amqp.Config{Recovery: &amqp.Recovery{}}})
	require.ErrorContains(t, err, "Recovery must be nil")

	props := amqp.Table{"product": "test"}
	p, err := New(Config{AMQP: amqp.Config{Properties: props}})
	require.NoError(t, err)
	assert.Equal(t, DefaultConnectionName, p.amqpCfg.Properties["connection_name"])
	assert.NotContains(t, props, "connection_name", "the caller's table is not modified")
	assert.Equal(t, DefaultExchange, p.exchange)
	assert.True(t, p.mandatory)
}

func TestInvalidPayloadIsPermanent(t *testing.T) {
	t.Parallel()
	p, err := New(Config{})
	require.NoError(t, err)
	err = p.Publish(t.Context(), outbox.Event{ID: "evt-bad", Type: "x", Payload: json.RawMessage(`{"secret":`)})
	require.True(t, outbox.IsPermanent(err))
	assert.NotContains(t, err.Error(), "secret", "payloads never appear in errors")
}
