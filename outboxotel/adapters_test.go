package outboxotel_test

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	outboxnats "github.com/gorm-outbox/outbox/adapters/nats"
	"github.com/gorm-outbox/outbox/adapters/webhook"
	"github.com/gorm-outbox/outbox/outboxotel"
	"github.com/gorm-outbox/outbox/outboxtest"
	"github.com/gorm-outbox/outbox/wire"
)

// hop is one span of the trace TestAdaptersOneTrace expects, from the
// request to what the consumer publishes onward: each span the child of
// the one before it (the webhook receiver's HTTP server span sits between
// send and the consumer's process).
type hop struct {
	name string
	kind trace.SpanKind
	// attrs are attributes the semantic conventions require (or
	// recommend, where we set them) with their values.
	attrs map[string]string
}

// TestAdaptersOneTrace follows one event from a request through the
// relay, a real adapter and the adapter's consumer on another database,
// which publishes an event onward: one trace, every span of the messaging
// conventions in it with its kind and attributes, and the adapters'
// counters. On NATS (CloudEvents binary mode) and webhooks (structured).
func TestAdaptersOneTrace(t *testing.T) {
	for _, tc := range []struct {
		name string
		run  func(t *testing.T, tel *telemetry, ob *outbox.Outbox, consumerDB *gorm.DB, onward func(ctx context.Context, tx *gorm.DB) error) (destination string, wait func())
		// system and server are what the send and consumer spans say.
		system, group string
		ambient       bool // the consumer runs inside an HTTP server span
	}{
		{name: "NATS", run: natsChain, system: "nats", group: "billing"},
		{name: "webhook", run: webhookChain, system: "http", ambient: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tel := newTelemetry(t)
			db := backends(t)[0].open(t)
			ob := tel.install(t, db, outbox.Config{})
			consumerDB := backends(t)[0].open(t)
			tel.install(t, consumerDB, outbox.Config{})

			onwardDone := make(chan struct{}, 1)
			onward := func(ctx context.Context, tx *gorm.DB) error {
				if err := outbox.Publish(tx.WithContext(ctx), outbox.Event{Type: "invoice.created", Payload: map[string]int{"total": 3}}); err != nil {
					return err
				}
				select {
				case onwardDone <- struct{}{}:
				default:
				}
				return nil
			}
			dest, wait := tc.run(t, tel, ob, consumerDB, onward)

			ctx, req := tel.tp.Tracer("app").Start(t.Context(), "POST /orders", trace.WithSpanKind(trace.SpanKindServer))
			require.NoError(t, db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
				return outbox.Publish(tx, outbox.Event{Type: "order.created", AggregateType: "order", AggregateID: "42", Payload: map[string]int{"total": 3}})
			}))
			req.End()
			require.Equal(t, 1, outboxtest.Drain(t, outboxtest.Relay(t, ob, db, outbox.RelayConfig{})))
			select {
			case <-onwardDone:
			case <-time.After(10 * time.Second):
				t.Fatal("the consumer did not apply the message")
			}
			wait()

			chain := []hop{
				{"POST /orders", trace.SpanKindServer, nil},
				{"create order.created", trace.SpanKindProducer, map[string]string{
					"messaging.system": "outbox", "messaging.operation.type": "create", "messaging.operation.name": "create",
					"messaging.destination.name": "order.created"}},
				{"process order.created", trace.SpanKindConsumer, map[string]string{
					"messaging.system": "outbox", "messaging.operation.type": "process", "messaging.operation.name": "process",
					"messaging.destination.name": "order.created"}},
				{"send " + dest, trace.SpanKindProducer, map[string]string{
					"messaging.system": tc.system, "messaging.operation.type": "send", "messaging.operation.name": "send",
					"messaging.destination.name": dest}},
			}
			if tc.ambient {
				chain = append(chain, hop{"POST /hooks", trace.SpanKindServer, nil})
			}
			consumerAttrs := map[string]string{
				"messaging.system": tc.system, "messaging.operation.type": "process", "messaging.operation.name": "process",
				"messaging.destination.name": dest}
			if tc.group != "" {
				consumerAttrs["messaging.consumer.group.name"] = tc.group
			}
			chain = append(chain,
				hop{"process " + dest, trace.SpanKindConsumer, consumerAttrs},
				hop{"create invoice.created", trace.SpanKindProducer, map[string]string{"messaging.system": "outbox"}})

			var prev sdktrace.ReadOnlySpan
			for _, h := range chain {
				s := tel.span(t, h.name)
				assert.Equal(t, h.kind, s.SpanKind(), h.name)
				a := attrsOf(s)
				for k, v := range h.attrs {
					assert.Equal(t, v, a[attribute.Key(k)].String(), "%s: %s", h.name, k)
				}
				if h.kind == trace.SpanKindProducer || h.kind == trace.SpanKindConsumer {
					assert.NotEmpty(t, a["messaging.message.id"].String(), "%s: messaging.message.id", h.name)
				}
				if prev != nil {
					assert.Equal(t, prev.SpanContext().TraceID(), s.SpanContext().TraceID(), "%s: one trace", h.name)
					assert.Equal(t, prev.SpanContext().SpanID(), s.Parent().SpanID(), "%s is the child of %s", h.name, prev.Name())
				}
				prev = s
			}
			// The consumer's process span links to the send span it received.
			send := tel.span(t, "send "+dest)
			links := tel.span(t, "process "+dest).Links()
			require.Len(t, links, 1)
			assert.Equal(t, send.SpanContext().SpanID(), links[0].SpanContext.SpanID())

			rm := tel.collect(t)
			sys := attribute.String("messaging.system", tc.system)
			assert.Equal(t, int64(1), counterSum(t, rm, "messaging.client.sent.messages", sys))
			assert.Equal(t, int64(1), counterSum(t, rm, "messaging.client.consumed.messages", sys))
			assert.Equal(t, int64(1), counterSum(t, rm, "outbox.events.published", attribute.String("messaging.destination.name", "order.created")))
			assert.Equal(t, int64(1), counterSum(t, rm, "outbox.events.published", attribute.String("messaging.destination.name", "invoice.created")))
		})
	}
}

func natsChain(t *testing.T, tel *telemetry, ob *outbox.Outbox, consumerDB *gorm.DB, onward func(ctx context.Context, tx *gorm.DB) error) (string, func()) {
	url := natsURL(t)
	nc, err := natsgo.Connect(url, natsgo.Timeout(2*time.Second), natsgo.Name(t.Name()), natsgo.MaxReconnects(-1))
	if err != nil {
		t.Fatalf("NATS is unreachable at %s: %v\nstart it with:\n  %s", url, err, natsStartCmd)
	}
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	id := randomName()
	stream, prefix := "OUTBOX_OTEL_"+strings.ToUpper(id), "outboxotel_"+id+"."
	_, err = js.CreateStream(t.Context(), jetstream.StreamConfig{Name: stream, Subjects: []string{prefix + ">"}, Storage: jetstream.MemoryStorage})
	require.NoError(t, err)
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), stream) })

	pub, err := outboxnats.New(js, outboxnats.Config{SubjectPrefix: prefix, Format: wire.CloudEvents})
	require.NoError(t, err)
	ob.Handle("order.created", pub.Handler())

	msgTel, err := outboxotel.Messaging(tel.options()...)
	require.NoError(t, err)
	c, err := outboxnats.NewConsumer(consumerDB, js, outboxnats.ConsumerConfig{
		Consumer: "billing", Stream: stream, Telemetry: msgTel,
		Handle: func(ctx context.Context, tx *gorm.DB, _ outboxnats.Message) error { return onward(ctx, tx) },
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	return prefix + "order.created", func() {
		cancel()
		<-done
	}
}

func webhookChain(t *testing.T, tel *telemetry, ob *outbox.Outbox, consumerDB *gorm.DB, onward func(ctx context.Context, tx *gorm.DB) error) (string, func()) {
	secret := []byte("0123456789abcdef0123456789abcdef")
	msgTel, err := outboxotel.Messaging(tel.options()...)
	require.NoError(t, err)
	recv, err := webhook.NewConsumer(consumerDB, secret, webhook.ConsumerConfig{
		Consumer: "billing", Telemetry: msgTel,
		Handle: func(ctx context.Context, tx *gorm.DB, _ webhook.Message) error { return onward(ctx, tx) },
	})
	require.NoError(t, err)
	// What otelhttp's handler does: continue the request's trace in a
	// SERVER span.
	server := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := propagation.TraceContext{}.Extract(r.Context(), propagation.HeaderCarrier(r.Header))
		ctx, span := tel.tp.Tracer("receiver").Start(ctx, "POST /hooks", trace.WithSpanKind(trace.SpanKindServer))
		defer span.End()
		recv.ServeHTTP(w, r.WithContext(ctx))
	})
	srv := httptest.NewServer(server)
	t.Cleanup(srv.Close)

	sender, err := webhook.New(srv.URL+"/hooks", secret, webhook.Config{Format: wire.CloudEventsJSON})
	require.NoError(t, err)
	ob.Handle("order.created", sender.Handler())
	return strings.TrimPrefix(srv.URL, "http://"), func() {}
}
