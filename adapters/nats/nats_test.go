package nats_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync/atomic"
	"syscall"
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

func contextTimeout(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}

func newPublisher(t testing.TB, js outboxnats.JetStream, cfg outboxnats.Config) *outboxnats.Publisher {
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
			"outbox-event-type":    "spoofed",      // in any case: dropped
			"content-type":         "text/plain",   // the adapter's own header
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
	assert.Equal(t, "evt-1", hdr.Get(wire.EventID))
	assert.Equal(t, "order.created", hdr.Get(wire.EventType))
	assert.Equal(t, "order", hdr.Get(wire.AggregateType))
	assert.Equal(t, "42", hdr.Get(wire.AggregateID))
	assert.Equal(t, "order-42-created", hdr.Get(wire.IdempotencyKey))
	assert.Equal(t, "2025-03-04T05:06:07.123456Z", hdr.Get(wire.OccurredAt))
	assert.Equal(t, "application/json", hdr.Get(outboxnats.HeaderContentType))
	assert.Equal(t, e.Headers["traceparent"], hdr.Get("traceparent"), "trace context keeps its lower-case W3C name")
	assert.Empty(t, hdr.Get("Nats-Expected-Stream"))
	assert.Empty(t, hdr.Get("outbox-event-type"))
	assert.Empty(t, hdr.Get("content-type"))
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
	assert.False(t, outbox.IsUnavailable(err), "the server answered: it is up")
	assert.True(t, strings.HasPrefix(err.Error(), "nats: "), "the server's answer first: %v", err)
	assert.Contains(t, err.Error(), "expected stream does not match")
	assert.True(t, strings.HasSuffix(err.Error(), ": subject "+prefix+".x (outbox/nats)"), "then the subject and the adapter: %v", err)
	assert.NotContains(t, err.Error(), "evt-wrong", "the event ID is the relay's to log")
}

func TestErrorsPermanentOrRetryable(t *testing.T) {
	t.Parallel()
	_, js := connect(t)
	_, prefix := newStream(t, js)
	h := newPublisher(t, js, outboxnats.Config{SubjectPrefix: prefix + ".", Timeout: 2 * time.Second}).Handler()
	ctx := t.Context()

	for name, tc := range map[string]struct {
		e    outbox.Event
		want string // the error, with PREFIX for the subject prefix
	}{
		"space in subject":    {outbox.Event{ID: "evt-1", Type: "order created"}, `subject contains whitespace: subject "PREFIX.order created" (outbox/nats) (permanent)`},
		"wildcard in subject": {outbox.Event{ID: "evt-2", Type: "order.*"}, `subject has a wildcard token: subject "PREFIX.order.*" (outbox/nats) (permanent)`},
		"empty token":         {outbox.Event{ID: "evt-3", Type: "order..created"}, `subject has an empty token: subject "PREFIX.order..created" (outbox/nats) (permanent)`},
		"CRLF in header": {
			outbox.Event{ID: "evt-4", Type: "ok", Headers: map[string]string{"x-trace": "a\r\nNats-Msg-Id: forged"}},
			`header "x-trace": value contains CR or LF: subject PREFIX.ok (outbox/nats) (permanent)`,
		},
		"colon in name": {
			outbox.Event{ID: "evt-5", Type: "ok", Headers: map[string]string{"a:b": "v"}},
			`header name "a:b" is not a token (printable ASCII without spaces or colons): subject PREFIX.ok (outbox/nats) (permanent)`,
		},
	} {
		e := tc.e
		e.Payload = json.RawMessage(`{"secret":"do-not-log"}`)
		err := h(ctx, e)
		require.Error(t, err, name)
		assert.True(t, outbox.IsPermanent(err), "%s: %v", name, err)
		assert.Equal(t, strings.ReplaceAll(tc.want, "PREFIX", prefix), err.Error(), "%s: the cause first, then the subject and the adapter", name)
		assert.NotContains(t, err.Error(), e.ID, "%s: the event ID is the relay's to log", name)
		assert.NotContains(t, err.Error(), "do-not-log", name)
		assert.NotContains(t, err.Error(), "forged", "header values stay out of errors")
	}

	// No stream listens on this subject: the destination is missing, not
	// the event, and creating the stream fixes it.
	other := newPublisher(t, js, outboxnats.Config{SubjectPrefix: "outboxtest_unbound_" + randomName() + ".", Timeout: 2 * time.Second})
	err := other.Handler()(ctx, outbox.Event{ID: "e6", Type: "x", Payload: json.RawMessage(`1`)})
	require.Error(t, err)
	assert.False(t, outbox.IsPermanent(err), "%v", err)
	assert.True(t, outbox.IsUnavailable(err), "%v", err)
	assert.ErrorIs(t, err, jetstream.ErrNoStreamResponse)
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	_, err := outboxnats.New(nil, outboxnats.Config{})
	require.Error(t, err)
	_, err = outboxnats.New(&fakeJS{}, outboxnats.Config{Timeout: -time.Second})
	require.Error(t, err)
	_, err = outboxnats.New(&fakeJS{}, outboxnats.Config{MaxPending: -1})
	require.EqualError(t, err, "outbox/nats: negative MaxPending -1; use 0 for the default")
}

// fakeJS answers every publish with err, or an ack when err is nil. It is
// an AsyncJetStream too: PublishMsgAsync returns err itself, or, with
// viaAck, a future that fails with it as nats.go fails one (a stream's
// refusal as the bare *jetstream.APIError).
type fakeJS struct {
	err    error
	viaAck bool
	calls  atomic.Int64
}

func (f *fakeJS) PublishMsg(context.Context, *natsgo.Msg, ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	f.calls.Add(1)
	if f.err != nil {
		return nil, f.err
	}
	return &jetstream.PubAck{Stream: "S", Sequence: 1}, nil
}

func (f *fakeJS) PublishMsgAsync(msg *natsgo.Msg, _ ...jetstream.PublishOpt) (jetstream.PubAckFuture, error) {
	f.calls.Add(1)
	fut := newFuture(msg)
	switch {
	case f.err == nil:
		fut.ok <- &jetstream.PubAck{Stream: "S", Sequence: 1}
	case f.viaAck:
		err := f.err
		if apiErr, ok := errors.AsType[*jetstream.APIError](err); ok {
			err = apiErr // the synchronous publish wraps it as "nats: %w"; the future does not
		}
		fut.err <- err
	default:
		return nil, f.err
	}
	return fut, nil
}

// future is a jetstream.PubAckFuture a test resolves.
type future struct {
	ok  chan *jetstream.PubAck
	err chan error
	msg *natsgo.Msg
}

func newFuture(msg *natsgo.Msg) *future {
	return &future{ok: make(chan *jetstream.PubAck, 1), err: make(chan error, 1), msg: msg}
}

func (f *future) Ok() <-chan *jetstream.PubAck { return f.ok }
func (f *future) Err() <-chan error            { return f.err }
func (f *future) Msg() *natsgo.Msg             { return f.msg }

// registrations are the ways to publish an event through a Publisher,
// each returning what a relay would record: Handler, and AsyncHandler's
// start followed by its wait.
var registrations = map[string]func(p *outboxnats.Publisher) outbox.Handler{
	"Handler": (*outboxnats.Publisher).Handler,
	"AsyncHandler": func(p *outboxnats.Publisher) outbox.Handler {
		h := p.AsyncHandler()
		return func(ctx context.Context, e outbox.Event) error { return h(ctx, e)() }
	},
}

// TestErrorClassification checks, without a server, which publish errors
// say the destination is down (the relay pauses and counts no attempt),
// which are about the event (never Unavailable) and which are permanent:
// the same for Handler and for AsyncHandler, whether the error comes from
// the asynchronous publish's start or through its future.
func TestErrorClassification(t *testing.T) {
	t.Parallel()
	type class int
	const (
		retry class = iota
		unavailable
		permanent
	)
	for name, tc := range map[string]struct {
		err  error
		want class
	}{
		"connection closed":        {natsgo.ErrConnectionClosed, unavailable},
		"no servers":               {natsgo.ErrNoServers, unavailable},
		"disconnected":             {natsgo.ErrDisconnected, unavailable},
		"draining":                 {natsgo.ErrConnectionDraining, unavailable},
		"reconnect buffer full":    {natsgo.ErrReconnectBufExceeded, unavailable},
		"stale connection":         {natsgo.ErrStaleConnection, unavailable},
		"request timeout":          {natsgo.ErrTimeout, unavailable},
		"ack deadline":             {context.DeadlineExceeded, unavailable},
		"no responders":            {natsgo.ErrNoResponders, unavailable},
		"no stream response":       {jetstream.ErrNoStreamResponse, unavailable},
		"jetstream not enabled":    {jetstream.ErrJetStreamNotEnabled, unavailable},
		"jetstream 503":            {fmt.Errorf("nats: %w", &jetstream.APIError{Code: 503, ErrorCode: 10008, Description: "JetStream system temporarily unavailable"}), unavailable},
		"connection refused":       {&net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, unavailable},
		"DNS failure":              {&net.DNSError{Err: "no such host", Name: "nats.invalid", IsNotFound: true}, unavailable},
		"max payload":              {natsgo.ErrMaxPayload, permanent},
		"stream message too large": {jetstream.ErrStreamMessageExceedsMaximum, permanent},
		"bad subject":              {natsgo.ErrBadSubject, permanent},
		"wrong expected stream":    {fmt.Errorf("nats: %w", &jetstream.APIError{Code: 400, ErrorCode: 10060, Description: "expected stream does not match"}), retry},
		"stream store failed":      {fmt.Errorf("nats: %w", &jetstream.APIError{Code: 500, ErrorCode: 10077, Description: "maximum messages exceeded"}), retry},
		"invalid ack":              {jetstream.ErrInvalidJSAck, retry},
		"cancelled by the caller":  {context.Canceled, retry},
		"async ack timed out":      {jetstream.ErrAsyncPublishTimeout, unavailable},
		"disconnected, ack lost":   {natsgo.ErrDisconnected, unavailable},
	} {
		for _, path := range []struct {
			name   string
			viaAck bool
			reg    string
		}{{"Handler", false, "Handler"}, {"AsyncHandler start", false, "AsyncHandler"}, {"AsyncHandler ack", true, "AsyncHandler"}} {
			name := name + " (" + path.name + ")"
			js := &fakeJS{err: tc.err, viaAck: path.viaAck}
			p, err := outboxnats.New(js, outboxnats.Config{Logger: slog.New(slog.DiscardHandler)})
			require.NoError(t, err)
			err = registrations[path.reg](p)(t.Context(), outbox.Event{ID: "evt-classified", Type: "order.created", Payload: json.RawMessage(`{"secret":"do-not-log"}`)})
			require.Error(t, err, name)
			assert.ErrorIs(t, err, tc.err, name)
			assert.Equal(t, tc.want == unavailable, outbox.IsUnavailable(err), "%s: Unavailable: %v", name, err)
			assert.Equal(t, tc.want == permanent, outbox.IsPermanent(err), "%s: Permanent: %v", name, err)
			want := tc.err.Error() + ": subject outbox.order.created (outbox/nats)"
			if apiErr, ok := errors.AsType[*jetstream.APIError](tc.err); ok && path.viaAck && apiErr.Error() == tc.err.Error() {
				// A stream's answer, which the future gives bare: reported
				// as the synchronous publish reports it, "nats: " first.
				want = "nats: " + want
			}
			switch tc.want {
			case unavailable:
				want += " (destination unavailable)"
			case permanent:
				want += " (permanent)"
			}
			assert.Equal(t, want, err.Error(), "%s: the cause first, then the subject and the adapter", name)
			assert.NotContains(t, err.Error(), "evt-classified", name)
			assert.NotContains(t, err.Error(), "do-not-log", name)
			assert.EqualValues(t, 1, js.calls.Load(), "%s: one publish", name)
		}
	}
}

// TestClosedConnectionLoggedOnce: a connection closed for good is
// Unavailable on every publish, and logged once, as an error that says what
// to do, without payloads.
func TestClosedConnectionLoggedOnce(t *testing.T) {
	t.Parallel()
	logs := outagetest.NewLogRecorder()
	js := &fakeJS{err: natsgo.ErrConnectionClosed}
	p, err := outboxnats.New(js, outboxnats.Config{Logger: slog.New(logs)})
	require.NoError(t, err)
	for i := range 6 {
		reg := "Handler"
		if i%2 == 1 {
			reg = "AsyncHandler"
		}
		err := registrations[reg](p)(t.Context(), outbox.Event{ID: fmt.Sprint("e", i), Type: "t", Payload: json.RawMessage(`{"secret":"do-not-log"}`)})
		require.True(t, outbox.IsUnavailable(err), "%s: %v", reg, err)
	}
	recs := logs.Records()
	require.Len(t, recs, 1, "logged once, not per event: %v", recs)
	assert.Equal(t, slog.LevelError, recs[0].Level)
	assert.Contains(t, recs[0].Msg, "closed for good")
	assert.Contains(t, recs[0].Msg, "nats.MaxReconnects(-1)")
	assert.Contains(t, recs[0].Text, "nats: connection closed")
	assert.NotContains(t, recs[0].Text, "do-not-log")
}

// TestNewWarnsAboutBoundedReconnects: New warns when the connection would
// give up reconnecting, and stays quiet with nats.MaxReconnects(-1).
func TestNewWarnsAboutBoundedReconnects(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	for name, tc := range map[string]struct {
		opts []natsgo.Option
		warn string
	}{
		"nats.go defaults":  {nil, "gives up reconnecting"},
		"MaxReconnects(5)":  {[]natsgo.Option{natsgo.MaxReconnects(5)}, "gives up reconnecting"},
		"NoReconnect":       {[]natsgo.Option{natsgo.NoReconnect()}, "does not reconnect"},
		"MaxReconnects(-1)": {[]natsgo.Option{natsgo.MaxReconnects(-1)}, ""},
	} {
		nc, err := natsgo.Connect(srv.url(), tc.opts...)
		require.NoError(t, err)
		js, err := jetstream.New(nc)
		require.NoError(t, err)
		logs := outagetest.NewLogRecorder()
		_, err = outboxnats.New(js, outboxnats.Config{Logger: slog.New(logs)})
		require.NoError(t, err)
		nc.Close()
		recs := logs.Records()
		if tc.warn == "" {
			assert.Empty(t, recs, name)
			continue
		}
		require.Len(t, recs, 1, name)
		assert.Equal(t, slog.LevelWarn, recs[0].Level, name)
		assert.Contains(t, recs[0].Msg, tc.warn, name)
		assert.Contains(t, recs[0].Msg, "nats.MaxReconnects(-1)", name)
	}
}

// TestEndToEnd wires the real outbox: publish in a transaction, one relay
// pass, the event is in the stream and its row is sent; with Handler and
// with AsyncHandler.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	for _, async := range []bool{false, true} {
		t.Run(map[bool]string{false: "Handler", true: "AsyncHandler"}[async], func(t *testing.T) {
			t.Parallel()
			testEndToEnd(t, async)
		})
	}
}

func testEndToEnd(t *testing.T, async bool) {
	_, js := connect(t)
	stream, prefix := newStream(t, js)
	db, ob := openDB(t)
	pub := newPublisher(t, js, outboxnats.Config{SubjectPrefix: prefix + "."})
	if async {
		ob.HandleAsync("order.created", pub.AsyncHandler())
	} else {
		ob.Handle("order.created", pub.Handler())
	}

	require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
		return outbox.Publish(tx, outbox.Event{ID: "e2e-1", Type: "order.created", AggregateType: "order", AggregateID: "1",
			Payload: map[string]int{"total": 99}, Headers: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"}})
	}))
	n, err := outboxtest.Relay(t, ob, db, outbox.RelayConfig{}).ProcessOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, n)

	raw, err := stream.GetLastMsgForSubject(t.Context(), prefix+".order.created")
	require.NoError(t, err)
	assert.Equal(t, "e2e-1", raw.Header.Get(jetstream.MsgIDHeader))
	assert.Equal(t, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", raw.Header.Get("traceparent"))
	assert.JSONEq(t, `{"total":99}`, string(raw.Data))
	assert.Equal(t, outbox.StatusSent, status(t, db, "e2e-1"))
}
