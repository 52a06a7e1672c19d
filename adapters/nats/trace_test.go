package nats_test

import (
	"context"
	"testing"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	outboxnats "github.com/gorm-outbox/outbox/adapters/nats"
	"github.com/gorm-outbox/outbox/outboxtest"
)

// TestDeliverHookHeadersReachTheMessage: tracing (package outboxotel)
// rewrites an event's traceparent and tracestate to the delivery's own span
// in a Deliver hook, before the handlers run. The message the adapter sends
// must carry the rewritten values, not the stored ones, so that consumers
// continue from the delivery: with Handler, and with AsyncHandler, whose
// start the relay calls once the hooks of the wave's events have run.
func TestDeliverHookHeadersReachTheMessage(t *testing.T) {
	t.Parallel()
	for _, async := range []bool{false, true} {
		t.Run(map[bool]string{false: "Handler", true: "AsyncHandler"}[async], func(t *testing.T) {
			t.Parallel()
			testDeliverHookHeaders(t, async)
		})
	}
}

func testDeliverHookHeaders(t *testing.T, async bool) {
	_, js := connect(t)
	stream, prefix := newStream(t, js)
	db, ob := openDB(t)
	const (
		stored    = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
		delivery  = "00-0af7651916cd43dd8448eb211c80319c-00f067aa0ba902b7-01"
		state     = "vendor=delivery"
		eventID   = "traced-1"
		eventType = "order.created"
	)
	ob.AddHooks(outbox.Hooks{Deliver: func(next outbox.Handler) outbox.Handler {
		return func(ctx context.Context, e outbox.Event) error {
			h := map[string]string{}
			for k, v := range e.Headers {
				h[k] = v
			}
			h["traceparent"], h["tracestate"] = delivery, state
			e.Headers = h
			return next(ctx, e)
		}
	}})
	pub := newPublisher(t, js, outboxnats.Config{SubjectPrefix: prefix + "."})
	if async {
		ob.HandleAsync(eventType, pub.AsyncHandler())
	} else {
		ob.Handle(eventType, pub.Handler())
	}

	require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
		return outbox.Publish(tx, outbox.Event{ID: eventID, Type: eventType, Headers: map[string]string{"traceparent": stored}})
	}))
	n, err := outboxtest.Relay(t, ob, db, outbox.RelayConfig{}).ProcessOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, n)

	raw, err := stream.GetLastMsgForSubject(t.Context(), prefix+"."+eventType)
	require.NoError(t, err)
	assert.Equal(t, eventID, raw.Header.Get(jetstream.MsgIDHeader))
	assert.Equal(t, delivery, raw.Header.Get("traceparent"))
	assert.Equal(t, state, raw.Header.Get("tracestate"))
}
