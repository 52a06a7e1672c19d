package outboxotel_test

import (
	"context"
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxotel"
	"github.com/gorm-outbox/outbox/wire"
)

func attrsOf(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// counterSum sums a counter's points whose attributes include all of want.
func counterSum(t *testing.T, rm metricdata.ResourceMetrics, name string, want ...attribute.KeyValue) int64 {
	t.Helper()
	m, ok := findMetric(rm, name)
	require.True(t, ok, "metric %s", name)
	var n int64
	for _, p := range m.Data.(metricdata.Sum[int64]).DataPoints {
		match := true
		for _, kv := range want {
			if v, ok := p.Attributes.Value(kv.Key); !ok || v != kv.Value {
				match = false
			}
		}
		if match {
			n += p.Value
		}
	}
	return n
}

// A send span is a PRODUCER child of the caller's span whose context the
// returned event carries; a receive span is a CONSUMER child of that
// context, linked to it; both counters count, failures with error.type.
func TestMessagingSendReceive(t *testing.T) {
	tel := newTelemetry(t)
	m, err := outboxotel.Messaging(tel.options()...)
	require.NoError(t, err)

	ctx, parent := tel.tp.Tracer("test").Start(context.Background(), "process order.created")
	e := outbox.Event{ID: "e1", Type: "order.created", Headers: map[string]string{"traceparent": "00-11111111111111111111111111111111-2222222222222222-01", "tenant": "acme"}}
	op := wire.Operation{System: "nats", Destination: "outbox.order.created", ServerAddress: "127.0.0.1", ServerPort: 4222}
	sendCtx, sent, end := m.StartSend(ctx, op, e)
	assert.Equal(t, "acme", sent.Headers["tenant"])
	assert.Equal(t, "00-11111111111111111111111111111111-2222222222222222-01", e.Headers["traceparent"], "the caller's event is not changed")
	end(nil)
	parent.End()

	send := tel.span(t, "send outbox.order.created")
	assert.Equal(t, trace.SpanKindProducer, send.SpanKind())
	assert.Equal(t, parent.SpanContext().SpanID(), send.Parent().SpanID())
	assert.True(t, send.SpanContext().Equal(parentOf(sent.Headers).WithRemote(false)), "the message carries the send span")
	assert.Equal(t, send.SpanContext(), trace.SpanContextFromContext(sendCtx))
	a := attrsOf(send)
	assert.Equal(t, "nats", a["messaging.system"].AsString())
	assert.Equal(t, "send", a["messaging.operation.type"].AsString())
	assert.Equal(t, "send", a["messaging.operation.name"].AsString())
	assert.Equal(t, "outbox.order.created", a["messaging.destination.name"].AsString())
	assert.Equal(t, "e1", a["messaging.message.id"].AsString())
	assert.Equal(t, "127.0.0.1", a["server.address"].AsString())
	assert.Equal(t, int64(4222), a["server.port"].AsInt64())

	// The consumer side, in another process: only the message's headers.
	recvOp := wire.Operation{System: "nats", Destination: "outbox.order.created", ConsumerGroup: "billing", MessageID: "seq-7"}
	_, endOK := m.StartReceive(context.Background(), recvOp, sent)
	endOK(nil)
	_, endFail := m.StartReceive(context.Background(), recvOp, sent)
	endFail(outbox.Permanent(errors.New("bad")))

	procs := tel.spansNamed("process outbox.order.created")
	require.Len(t, procs, 2)
	for _, p := range procs {
		assert.Equal(t, trace.SpanKindConsumer, p.SpanKind())
		assert.Equal(t, send.SpanContext().TraceID(), p.SpanContext().TraceID(), "one trace across the broker")
		assert.Equal(t, send.SpanContext().SpanID(), p.Parent().SpanID())
		require.Len(t, p.Links(), 1)
		assert.Equal(t, send.SpanContext().SpanID(), p.Links()[0].SpanContext.SpanID())
		a := attrsOf(p)
		assert.Equal(t, "process", a["messaging.operation.type"].AsString())
		assert.Equal(t, "billing", a["messaging.consumer.group.name"].AsString())
		assert.Equal(t, "seq-7", a["messaging.message.id"].AsString(), "the broker's ID when given")
	}
	assert.Equal(t, codes.Unset, procs[0].Status().Code)
	assert.Equal(t, codes.Error, procs[1].Status().Code)
	assert.Equal(t, "permanent", attrsOf(procs[1])["error.type"].AsString())

	rm := tel.collect(t)
	sys := attribute.String("messaging.system", "nats")
	assert.Equal(t, int64(1), counterSum(t, rm, "messaging.client.sent.messages", sys, attribute.String("messaging.operation.name", "send")))
	assert.Equal(t, int64(2), counterSum(t, rm, "messaging.client.consumed.messages", sys, attribute.String("messaging.consumer.group.name", "billing")))
	assert.Equal(t, int64(1), counterSum(t, rm, "messaging.client.consumed.messages", attribute.String("error.type", "permanent")))
	_, ok := findMetric(rm, "messaging.client.operation.duration")
	assert.True(t, ok)
}

// A consumer inside a server span (an HTTP handler's) is that span's
// child, still linked to the message's context.
func TestMessagingReceiveUnderAmbientSpan(t *testing.T) {
	tel := newTelemetry(t)
	m, err := outboxotel.Messaging(tel.options()...)
	require.NoError(t, err)
	msg := outbox.Event{ID: "e1", Headers: map[string]string{"traceparent": "00-11111111111111111111111111111111-2222222222222222-01"}}
	ctx, server := tel.tp.Tracer("test").Start(context.Background(), "POST /hooks")
	_, end := m.StartReceive(ctx, wire.Operation{System: "http", Destination: "example.com/hooks"}, msg)
	end(nil)
	server.End()
	p := tel.span(t, "process example.com/hooks")
	assert.Equal(t, server.SpanContext().SpanID(), p.Parent().SpanID())
	require.Len(t, p.Links(), 1)
	assert.Equal(t, "2222222222222222", p.Links()[0].SpanContext.SpanID().String())
}

// The relay's handlers find the instrumentation in their ctx, so an
// adapter needs no setting; the published counter counts stored events.
func TestInstrumentHandsTelemetryToHandlers(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			tel := newTelemetry(t)
			db := b.open(t)
			ob := tel.install(t, db, outbox.Config{Mode: outbox.Memory})
			got := make(chan wire.Telemetry, 1)
			ob.Handle("order.created", func(ctx context.Context, e outbox.Event) error {
				got <- wire.TelemetryFrom(ctx)
				return nil
			})
			require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
				return outbox.Publish(tx, outbox.Event{Type: "order.created", Payload: map[string]int{"n": 1}})
			}))
			assert.NotNil(t, <-got)
			assert.Equal(t, int64(1), counterSum(t, tel.collect(t), "outbox.events.published",
				attribute.String("messaging.destination.name", "order.created")))
		})
	}
}
