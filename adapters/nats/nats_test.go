package nats_test

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	outboxnats "github.com/gorm-outbox/outbox/adapters/nats"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

func contextTimeout(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

func newPublisher(t *testing.T, js outboxnats.JetStream, cfg outboxnats.Config) *outboxnats.Publisher {
	t.Helper()
	p, err := outboxnats.New(js, cfg)
	require.NoError(t, err)
	return p
}

func TestPublishHeadersAndPayload(t *testing.T) {
	t.Parallel()
	_, js := connect(t)
	stream, prefix := newStream(t, js)
	h := newPublisher(t, js, outboxnats.Config{SubjectPrefix: prefix + "."}).Handler()

	occurred := time.Date(2025, 3, 4, 5, 6, 7, 123456000, time.UTC)
	e := outbox.Event{
		ID:             "evt-1",
		Type:           "order.created",
		AggregateType:  "order",
		AggregateID:    "42",
		IdempotencyKey: "order-42-created",
		Payload:        json.RawMessage(`{"total":1250}`),
		OccurredAt:     occurred,
		Headers: map[string]string{
			"traceparent":          "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			"Nats-Expected-Stream": "not-this-one", // must not reach JetStream
			"Outbox-Event-Id":      "spoofed",      // the event's own ID wins
		},
	}
	require.NoError(t, h(t.Context(), e))

	cons, err := stream.OrderedConsumer(t.Context(), jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	msg, err := cons.Next(jetstream.FetchMaxWait(5 * time.Second))
	require.NoError(t, err)

	assert.Equal(t, prefix+".order.created", msg.Subject())
	assert.JSONEq(t, `{"total":1250}`, string(msg.Data()))
	hdr := msg.Headers()
	assert.Equal(t, "evt-1", hdr.Get(jetstream.MsgIDHeader))
	assert.Equal(t, "evt-1", hdr.Get(outboxnats.HeaderEventID))
	assert.Equal(t, "order.created", hdr.Get(outboxnats.HeaderEventType))
	assert.Equal(t, "order", hdr.Get(outboxnats.HeaderAggregateType))
	assert.Equal(t, "42", hdr.Get(outboxnats.HeaderAggregateID))
	assert.Equal(t, "order-42-created", hdr.Get(outboxnats.HeaderIdempotencyKey))
	assert.Equal(t, "2025-03-04T05:06:07.123456Z", hdr.Get(outboxnats.HeaderOccurredAt))
	assert.Equal(t, "application/json", hdr.Get(outboxnats.HeaderContentType))
	assert.Equal(t, e.Headers["traceparent"], hdr.Get("traceparent"), "trace context keeps its lower-case W3C name")
	assert.Empty(t, hdr.Get("Nats-Expected-Stream"))
}

func TestSameEventTwiceIsStoredOnce(t *testing.T) {
	t.Parallel()
	_, js := connect(t)
	stream, prefix := newStream(t, js)
	h := newPublisher(t, js, outboxnats.Config{SubjectPrefix: prefix + "."}).Handler()

	e := outbox.Event{ID: "evt-dup", Type: "order.paid", IdempotencyKey: "evt-dup", Payload: json.RawMessage(`{}`)}
	require.NoError(t, h(t.Context(), e))
	require.NoError(t, h(t.Context(), e), "a re-send inside the duplicate window is a success, not an error")
	require.NoError(t, h(t.Context(), outbox.Event{ID: "evt-other", Type: "order.paid", Payload: json.RawMessage(`{}`)}))

	info, err := stream.Info(t.Context())
	require.NoError(t, err)
	assert.EqualValues(t, 2, info.State.Msgs, "the re-sent event must be dropped by the duplicate window")
}

func TestSubjectMappingAndExpectStream(t *testing.T) {
	t.Parallel()
	_, js := connect(t)
	stream, prefix := newStream(t, js)
	info, err := stream.Info(t.Context())
	require.NoError(t, err)

	p := newPublisher(t, js, outboxnats.Config{
		Subject: func(e outbox.Event) string {
			return fmt.Sprintf("%s.%s.%s", prefix, e.AggregateType, e.AggregateID)
		},
		ExpectStream: info.Config.Name,
	})
	e := outbox.Event{ID: "evt-map", Type: "order.created", AggregateType: "order", AggregateID: "7", Payload: json.RawMessage(`1`)}
	require.NoError(t, p.Handler()(t.Context(), e))
	raw, err := stream.GetLastMsgForSubject(t.Context(), prefix+".order.7")
	require.NoError(t, err)
	assert.Equal(t, "evt-map", raw.Header.Get(jetstream.MsgIDHeader))

	// Bound to this stream, but another one is expected: rejected, and
	// retryable (the stream may be fixed without touching the event).
	wrong := newPublisher(t, js, outboxnats.Config{SubjectPrefix: prefix + ".", ExpectStream: "SOME_OTHER_STREAM"})
	err = wrong.Handler()(t.Context(), outbox.Event{ID: "evt-wrong", Type: "x", Payload: json.RawMessage(`1`)})
	require.Error(t, err)
	assert.False(t, outbox.IsPermanent(err))
	assert.Contains(t, err.Error(), "outbox/nats: publish event evt-wrong")
}

func TestErrorsPermanentOrRetryable(t *testing.T) {
	t.Parallel()
	_, js := connect(t)
	_, prefix := newStream(t, js)
	h := newPublisher(t, js, outboxnats.Config{SubjectPrefix: prefix + ".", Timeout: 2 * time.Second}).Handler()
	ctx := t.Context()

	for name, e := range map[string]outbox.Event{
		"space in subject":    {ID: "e1", Type: "order created"},
		"wildcard in subject": {ID: "e2", Type: "order.*"},
		"empty token":         {ID: "e3", Type: "order..created"},
		"CRLF in header":      {ID: "e4", Type: "ok", Headers: map[string]string{"x-trace": "a\r\nNats-Msg-Id: forged"}},
		"colon in name":       {ID: "e5", Type: "ok", Headers: map[string]string{"a:b": "v"}},
	} {
		e.Payload = json.RawMessage(`{"secret":"do-not-log"}`)
		err := h(ctx, e)
		require.Error(t, err, name)
		assert.True(t, outbox.IsPermanent(err), "%s: %v", name, err)
		assert.Contains(t, err.Error(), "outbox/nats: publish event "+e.ID, name)
		assert.NotContains(t, err.Error(), "do-not-log", name)
		assert.NotContains(t, err.Error(), "forged", "header values stay out of errors")
	}

	// No stream listens on this subject: retryable, since creating the
	// stream fixes it.
	other := newPublisher(t, js, outboxnats.Config{SubjectPrefix: "outboxtest_unbound_" + randomName() + ".", Timeout: 2 * time.Second})
	err := other.Handler()(ctx, outbox.Event{ID: "e6", Type: "x", Payload: json.RawMessage(`1`)})
	require.Error(t, err)
	assert.False(t, outbox.IsPermanent(err), "%v", err)
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	_, err := outboxnats.New(nil, outboxnats.Config{})
	require.Error(t, err)
	_, err = outboxnats.New(fakeJS{}, outboxnats.Config{Timeout: -time.Second})
	require.Error(t, err)
}

type fakeJS struct{}

func (fakeJS) PublishMsg(context.Context, *natsgo.Msg, ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	return &jetstream.PubAck{Stream: "S", Sequence: 1}, nil
}

// TestEndToEnd wires the real outbox: publish in a transaction, one relay
// pass, the event is in the stream and its row is sent.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	_, js := connect(t)
	stream, prefix := newStream(t, js)
	db, ob := openDB(t)
	ob.Handle("order.created", newPublisher(t, js, outboxnats.Config{SubjectPrefix: prefix + "."}).Handler())

	require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
		return outbox.Publish(tx, outbox.Event{ID: "e2e-1", Type: "order.created", AggregateType: "order", AggregateID: "1",
			Payload: map[string]int{"total": 99}, Headers: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}})
	}))
	n, err := ob.Relay(db, outbox.RelayConfig{}).ProcessOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, n)

	raw, err := stream.GetLastMsgForSubject(t.Context(), prefix+".order.created")
	require.NoError(t, err)
	assert.Equal(t, "e2e-1", raw.Header.Get(jetstream.MsgIDHeader))
	assert.Equal(t, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", raw.Header.Get("traceparent"))
	assert.JSONEq(t, `{"total":99}`, string(raw.Data))
	assert.Equal(t, outbox.StatusSent, status(t, db, "e2e-1"))
}

// TestBrokerOutage stops a test-owned server while the relay runs: the
// handler fails (the relay keeps the events pending), and after a restart the
// events published during the outage arrive, each event ID once, even though
// the client may have flushed a timed-out publish on reconnect.
func TestBrokerOutage(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	reconnected := make(chan struct{}, 1)
	nc, err := natsgo.Connect(srv.url(),
		natsgo.MaxReconnects(-1),
		natsgo.ReconnectWait(50*time.Millisecond),
		natsgo.ReconnectHandler(func(*natsgo.Conn) {
			select {
			case reconnected <- struct{}{}:
			default:
			}
		}),
	)
	require.NoError(t, err)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	stream, err := js.CreateStream(t.Context(), jetstream.StreamConfig{
		Name: "OUTAGE", Subjects: []string{"outage.>"}, Storage: jetstream.FileStorage, Duplicates: 5 * time.Minute,
	})
	require.NoError(t, err)

	db, ob := openDB(t)
	ob.Handle(outbox.AnyEvent, newPublisher(t, js, outboxnats.Config{SubjectPrefix: "outage.", Timeout: 500 * time.Millisecond}).Handler())
	relay := ob.Relay(db, outbox.RelayConfig{MaxAttempts: 1000, Backoff: func(int) time.Duration { return 0 }})
	publish := func(ids ...string) {
		t.Helper()
		require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
			for _, id := range ids {
				if err := outbox.Publish(tx, outbox.Event{ID: id, Type: "order.created", Payload: map[string]string{"id": id}}); err != nil {
					return err
				}
			}
			return nil
		}))
	}

	publish("before")
	_, err = relay.ProcessOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, outbox.StatusSent, status(t, db, "before"))

	srv.stop()
	require.Eventually(t, func() bool { return nc.Status() != natsgo.CONNECTED }, 10*time.Second, 10*time.Millisecond)
	publish("during-1", "during-2")
	for range 2 {
		n, err := relay.ProcessOnce(t.Context())
		require.NoError(t, err, "handler errors are recorded, not returned")
		require.Equal(t, 2, n)
	}
	var rec outbox.Record
	require.NoError(t, db.Table(outbox.DefaultTable).Where("id = ?", "during-1").Take(&rec).Error)
	assert.Equal(t, outbox.StatusPending, rec.Status, "a broker outage is retried, never a permanent failure")
	assert.Equal(t, 2, rec.Attempts)
	require.NotNil(t, rec.LastError)
	assert.Contains(t, *rec.LastError, "outbox/nats: publish event during-1")

	srv.start()
	select {
	case <-reconnected:
	case <-time.After(20 * time.Second):
		t.Fatal("client did not reconnect to the restarted server")
	}
	publish("after")
	require.Eventually(t, func() bool {
		_, err := relay.ProcessOnce(t.Context())
		require.NoError(t, err)
		var pending int64
		require.NoError(t, db.Table(outbox.DefaultTable).Where("status <> ?", outbox.StatusSent).Count(&pending).Error)
		return pending == 0
	}, 30*time.Second, 50*time.Millisecond, "events published during the outage must be delivered after it")

	// Read the whole stream as a consumer would; anything the duplicate
	// window failed to drop would show up here.
	info, err := stream.Info(t.Context())
	require.NoError(t, err)
	cons, err := stream.OrderedConsumer(t.Context(), jetstream.OrderedConsumerConfig{})
	require.NoError(t, err)
	batch, err := cons.Fetch(int(info.State.Msgs), jetstream.FetchMaxWait(5*time.Second))
	require.NoError(t, err)
	seen := map[string]int{}
	for m := range batch.Messages() {
		seen[m.Headers().Get(outboxnats.HeaderEventID)]++
	}
	require.NoError(t, batch.Error())
	assert.Equal(t, map[string]int{"before": 1, "during-1": 1, "during-2": 1, "after": 1}, seen,
		"the consumer must see each event ID exactly once")
}
