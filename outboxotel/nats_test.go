package outboxotel_test

import (
	"context"
	"os"
	"strings"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxtest"
	"github.com/gorm-outbox/outbox/wire"
)

// natsCarrier reads and writes trace context in NATS message headers, as
// a consumer's instrumentation does.
type natsCarrier natsgo.Header

func (c natsCarrier) Get(k string) string { return natsgo.Header(c).Get(k) }
func (c natsCarrier) Set(k, v string)     { natsgo.Header(c).Set(k, v) }
func (c natsCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// natsHandler publishes an event to JetStream as the NATS adapter does: the
// payload as the body, the headers wire.Headers gives, names kept as they
// are. (A workspace module cannot require the adapter's unpublished
// version, so the adapter is not imported here; its own tests check that
// it sends the event's traceparent as wire.Headers gives it.)
func natsHandler(js jetstream.JetStream, prefix string) outbox.Handler {
	return func(ctx context.Context, e outbox.Event) error {
		body, err := e.PayloadJSON()
		if err != nil {
			return outbox.Permanent(err)
		}
		msg := natsgo.NewMsg(prefix + "." + e.Type)
		msg.Data = body
		wire.Headers(e, func(k, v string) { msg.Header[k] = []string{v} })
		_, err = js.PublishMsg(ctx, msg)
		return err
	}
}

// TestNATSEndToEnd publishes in a request's trace, lets a relay deliver
// to a real JetStream stream, and has a consumer
// extract the trace context from the message it reads: the same trace,
// continued from the relay's process span.
func TestNATSEndToEnd(t *testing.T) {
	t.Parallel()
	url := os.Getenv("OUTBOX_TEST_NATS_URL")
	if url == "" {
		url = "nats://127.0.0.1:4222"
	}
	nc, err := natsgo.Connect(url, natsgo.Timeout(2*time.Second), natsgo.Name(t.Name()))
	if err != nil {
		if os.Getenv("OUTBOX_SKIP_BROKERS") == "1" {
			t.Skipf("NATS is unreachable at %s: %v (OUTBOX_SKIP_BROKERS=1)", url, err)
		}
		t.Fatalf("NATS is unreachable at %s: %v; start nats-server -js, or set OUTBOX_SKIP_BROKERS=1", url, err)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	id := randomName()
	stream, prefix := "OUTBOX_OTEL_"+strings.ToUpper(id), "outboxotel_"+id
	s, err := js.CreateStream(t.Context(), jetstream.StreamConfig{Name: stream, Subjects: []string{prefix + ".>"}, Storage: jetstream.MemoryStorage})
	require.NoError(t, err, "JetStream must be enabled (nats-server -js)")
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = js.DeleteStream(ctx, stream)
	})

	tel := newTelemetry(t)
	db := backends(t)[0].open(t)
	ob := tel.install(t, db, outbox.Config{})
	ob.Handle("*", natsHandler(js, prefix))

	ctx, req := tel.tp.Tracer("app").Start(t.Context(), "POST /orders")
	require.NoError(t, db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		return outbox.Publish(tx, outbox.Event{Type: "order.created", Payload: map[string]int{"total": 3}})
	}))
	req.End()
	require.Equal(t, 1, outboxtest.Drain(t, outboxtest.Relay(t, ob, db, outbox.RelayConfig{})))

	cons, err := s.CreateOrUpdateConsumer(t.Context(), jetstream.ConsumerConfig{AckPolicy: jetstream.AckExplicitPolicy})
	require.NoError(t, err)
	batch, err := cons.Fetch(1, jetstream.FetchMaxWait(5*time.Second))
	require.NoError(t, err)
	var msgs []jetstream.Msg
	for m := range batch.Messages() {
		msgs = append(msgs, m)
	}
	require.NoError(t, batch.Error())
	require.Len(t, msgs, 1)
	require.NoError(t, msgs[0].Ack())

	// The consumer's side: extract, then process in a child span.
	cctx := propagation.TraceContext{}.Extract(context.Background(), natsCarrier(msgs[0].Headers()))
	_, consumerSpan := tel.tp.Tracer("consumer").Start(cctx, "consume order.created", trace.WithSpanKind(trace.SpanKindConsumer))
	consumerSpan.End()

	process := tel.span(t, "process order.created")
	got := tel.span(t, "consume order.created")
	assert.Equal(t, req.SpanContext().TraceID(), got.SpanContext().TraceID(), "the consumer sees the request's trace ID")
	assert.Equal(t, process.SpanContext().SpanID(), got.Parent().SpanID(), "and continues from the relay's process span")
	assert.Equal(t, tel.span(t, "create order.created").SpanContext().SpanID(), process.Parent().SpanID())
}
