package webhook_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	cevent "github.com/cloudevents/sdk-go/v2/event"
	cehttp "github.com/cloudevents/sdk-go/v2/protocol/http"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/adapters/webhook"
	"github.com/gorm-outbox/outbox/outboxtest"
	"github.com/gorm-outbox/outbox/wire"
)

const (
	ceTraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ceTraceState  = "congo=t61rcWkgMzE"
	// Non-ASCII, a space, a quote and a percent sign: the HTTP binding
	// percent-encodes them in ce-* headers.
	cePayload = `{"total":"9.99 €","note":"50% \"off\"","items":[1,2]}`
)

// ceEvent has every field set, the idempotency key differing from the ID,
// and an aggregate ID the binding must percent-encode.
func ceEvent() outbox.Event {
	return outbox.Event{
		ID:             "0190d6c2-7d3a-7b1e-9f0a-5c2e4b6d8a10",
		Type:           "order.created",
		AggregateType:  "order",
		AggregateID:    "42 ü%",
		IdempotencyKey: "order-42-created",
		OccurredAt:     time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC),
		Headers: map[string]string{
			"traceparent": ceTraceParent,
			"tracestate":  ceTraceState,
			"tenant":      "acme",
		},
		Payload: json.RawMessage(cePayload),
	}
}

// ceRequest is one request a ceReceiver got, parsed by the CloudEvents SDK.
type ceRequest struct {
	header   http.Header
	body     []byte
	encoding binding.Encoding
	event    *cevent.Event
	err      error
}

// ceReceiver is a test server that parses every request with the SDK's
// HTTP binding (cehttp.NewMessageFromHttpRequest, binding.ToEvent).
type ceReceiver struct {
	*httptest.Server
	mu   sync.Mutex
	reqs []ceRequest
}

func newCEReceiver(t *testing.T) *ceReceiver {
	t.Helper()
	rc := &ceReceiver{}
	rc.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(r.Body)
		require.NoError(t, err)
		r.Body = io.NopCloser(bytes.NewReader(body))
		m := cehttp.NewMessageFromHttpRequest(r)
		got := ceRequest{header: r.Header.Clone(), body: body, encoding: m.ReadEncoding()}
		got.event, got.err = binding.ToEvent(r.Context(), m)
		rc.mu.Lock()
		rc.reqs = append(rc.reqs, got)
		rc.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	}))
	t.Cleanup(rc.Close)
	return rc
}

func (rc *ceReceiver) requests() []ceRequest {
	rc.mu.Lock()
	defer rc.mu.Unlock()
	return append([]ceRequest(nil), rc.reqs...)
}

// assertSDKEvent compares every attribute of ev to e's. The SDK read ev
// from binary mode when binary is set.
//
// sdk-go v2.16.2 does not percent-decode ce-* header values, which the HTTP
// binding (1.0.2, 3.1.3.2) requires of a receiver
// (github.com/cloudevents/sdk-go/issues/1331): in binary mode the string
// attributes are given the single round of percent-decoding the binding
// asks for here, which also checks that the Sender encoded them.
func assertSDKEvent(t *testing.T, e outbox.Event, source, traceparent string, ev *cevent.Event, binary bool) {
	t.Helper()
	require.NotNil(t, ev)
	require.NoError(t, ev.Validate())
	dec := func(s string) string {
		if !binary {
			return s
		}
		d, err := url.PathUnescape(s)
		require.NoError(t, err, s)
		return d
	}
	assert.Equal(t, "1.0", ev.SpecVersion())
	assert.Equal(t, e.ID, dec(ev.ID()))
	assert.Equal(t, source, dec(ev.Source()))
	assert.Equal(t, e.Type, dec(ev.Type()))
	assert.Equal(t, e.AggregateType+"/"+e.AggregateID, dec(ev.Subject()))
	assert.True(t, e.OccurredAt.Equal(ev.Time()), "time %v, want %v", ev.Time(), e.OccurredAt)
	assert.Equal(t, "application/json", ev.DataContentType())
	assert.JSONEq(t, string(e.Payload.(json.RawMessage)), string(ev.Data()))
	ext := map[string]string{}
	for k, v := range ev.Extensions() {
		ext[k] = dec(fmt.Sprint(v))
	}
	assert.Equal(t, map[string]string{
		"aggregatetype": e.AggregateType, "aggregateid": e.AggregateID, "idempotencykey": e.IdempotencyKey,
		"traceparent": traceparent, "tracestate": ceTraceState,
	}, ext)
}

// ceSchema is the CloudEvents JSON schema (draft-07) shipped in wire's
// testdata, with format assertions (date-time, uri-reference) on.
func ceSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	path, err := filepath.Abs("../../wire/testdata/cloudevents.json")
	require.NoError(t, err)
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft7)
	c.AssertFormat()
	sch, err := c.Compile(path)
	require.NoError(t, err)
	return sch
}

func validate(sch *jsonschema.Schema, doc []byte) error {
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	if err != nil {
		return err
	}
	return sch.Validate(inst)
}

// TestCloudEventsSDKReadsWhatIsSent: binary and structured mode as the HTTP
// binding and the SDK define them, every attribute as the event has it,
// signed as in Native.
func TestCloudEventsSDKReadsWhatIsSent(t *testing.T) {
	t.Parallel()
	sch := ceSchema(t)
	for _, tc := range []struct {
		format      wire.Format
		source      string // Config.Source
		wantSource  string
		encoding    binding.Encoding
		contentType string
	}{
		{wire.CloudEvents, "https://orders.example.com/outbox", "https://orders.example.com/outbox", binding.EncodingBinary, "application/json"},
		{wire.CloudEventsJSON, "", wire.DefaultSource, binding.EncodingStructured, "application/cloudevents+json"},
	} {
		t.Run(tc.format.String(), func(t *testing.T) {
			t.Parallel()
			rc := newCEReceiver(t)
			e := ceEvent()
			h := newHandler(t, rc.URL+"/hooks/orders?token=s3cret", webhook.Config{Format: tc.format, Source: tc.source})
			require.NoError(t, h(t.Context(), e))
			reqs := rc.requests()
			require.Len(t, reqs, 1)
			r := reqs[0]
			require.NoError(t, r.err)
			assert.Equal(t, tc.encoding, r.encoding, "content mode as the SDK sees it")
			assertSDKEvent(t, e, tc.wantSource, ceTraceParent, r.event, tc.format == wire.CloudEvents)

			assert.Equal(t, tc.contentType, r.header.Get("Content-Type"))
			for k := range r.header {
				assert.NotContains(t, []string{"Outbox-Event-Id", "Outbox-Event-Type", "Outbox-Aggregate-Type", "Outbox-Aggregate-Id",
					"Outbox-Idempotency-Key", "Outbox-Occurred-At"}, k, "no Outbox-* header outside Native")
			}
			assert.Equal(t, ceTraceParent, r.header.Get("traceparent"), "forwarded, as in Native")
			assert.Equal(t, ceTraceState, r.header.Get("tracestate"))
			assert.Empty(t, r.header.Get("tenant"), "not forwarded")
			assert.Equal(t, "order-42-created", r.header.Get("Idempotency-Key"))
			assert.Equal(t, e.ID, r.header.Get(webhook.HeaderWebhookID))
			require.NoError(t, webhook.Verify(secret, r.header, r.body, time.Minute))

			if tc.format == wire.CloudEvents {
				assert.Equal(t, cePayload, string(r.body), "the body is the payload, byte for byte")
				assert.Equal(t, "order/42%20%C3%BC%25", r.header.Get("ce-subject"), "percent-encoded")
				assert.Empty(t, r.header.Get("ce-datacontenttype"), "HTTP carries it as Content-Type")
				return
			}
			assert.Empty(t, r.header.Get("ce-specversion"), "structured mode has no ce-* headers")
			require.NoError(t, validate(sch, r.body), "%s", r.body)
			var doc cevent.Event
			require.NoError(t, json.Unmarshal(r.body, &doc))
			assertSDKEvent(t, e, tc.wantSource, ceTraceParent, &doc, false)
		})
	}
}

// TestStructuredDocumentsMatchTheSchema: every structured document the
// Sender posts is valid against the CloudEvents JSON schema, for events
// with and without the optional fields, and payloads of every JSON kind.
func TestStructuredDocumentsMatchTheSchema(t *testing.T) {
	t.Parallel()
	sch := ceSchema(t)
	rc := newCEReceiver(t)
	h := newHandler(t, rc.URL, webhook.Config{Format: wire.CloudEventsJSON, Source: "/orders"})
	minimal := outbox.Event{ID: "m", Type: "t", IdempotencyKey: "m", Payload: json.RawMessage(`null`)}
	noType := ceEvent()
	noType.ID, noType.AggregateType = "no-type", ""
	events := []outbox.Event{ceEvent(), minimal, noType}
	for i, p := range []string{`[1,"two",{"3":true}]`, `"text"`, `12.5`, `false`, `{}`} {
		e := ceEvent()
		e.ID, e.Payload = strconv.Itoa(i), json.RawMessage(p)
		events = append(events, e)
	}
	for _, e := range events {
		require.NoError(t, h(t.Context(), e))
	}
	reqs := rc.requests()
	require.Len(t, reqs, len(events))
	for i, r := range reqs {
		require.NoError(t, validate(sch, r.body), "%s", r.body)
		require.NoError(t, r.err, "%s", r.body)
		assert.Equal(t, binding.EncodingStructured, r.encoding)
		assert.Equal(t, events[i].ID, r.event.ID())
		assert.JSONEq(t, string(events[i].Payload.(json.RawMessage)), string(r.body[bytes.LastIndex(r.body, []byte(`"data":`))+7:len(r.body)-1]))
	}
	// A schema that accepts everything would prove nothing.
	require.Error(t, validate(sch, []byte(`{"specversion":"1.0","id":"","source":"/s","type":"t"}`)), "empty id")
	require.Error(t, validate(sch, []byte(`{"specversion":"1.0","id":"x","source":"/s","type":"t","time":"yesterday"}`)), "time")
}

// TestConsumerAppliesCloudEventsOnce: the Consumer decodes both CloudEvents
// formats, records them in the inbox under the event ID (a second delivery
// is acknowledged without Handle) and hands Handle the event as published.
func TestConsumerAppliesCloudEventsOnce(t *testing.T) {
	t.Parallel()
	for _, format := range []wire.Format{wire.CloudEvents, wire.CloudEventsJSON} {
		t.Run(format.String(), func(t *testing.T) {
			t.Parallel()
			var mu sync.Mutex
			var got []webhook.Message
			cs := newConsumerSide(t, webhook.ConsumerConfig{}, func(ctx context.Context, tx *gorm.DB, m webhook.Message) error {
				mu.Lock()
				got = append(got, m)
				mu.Unlock()
				return recordEffect(ctx, tx, m)
			})
			e := ceEvent()
			send := newHandler(t, cs.srv.URL+"/hooks", webhook.Config{Format: format, Source: "/orders"})
			require.NoError(t, send(t.Context(), e))
			require.NoError(t, send(t.Context(), e), "a duplicate is acknowledged")
			assert.EqualValues(t, 1, cs.calls.Load(), "Handle runs once")
			require.Len(t, got, 1)
			m := got[0].Event
			assert.Equal(t, e.ID, m.ID)
			assert.Equal(t, e.Type, m.Type)
			assert.Equal(t, e.AggregateType, m.AggregateType)
			assert.Equal(t, e.AggregateID, m.AggregateID)
			assert.Equal(t, e.IdempotencyKey, m.IdempotencyKey)
			assert.True(t, e.OccurredAt.Equal(m.OccurredAt), "%v", m.OccurredAt)
			assert.JSONEq(t, cePayload, string(m.Payload.(json.RawMessage)))
			if format == wire.CloudEvents {
				assert.Equal(t, cePayload, string(m.Payload.(json.RawMessage)), "byte for byte")
			}
			// The trace context travels as extensions; the plain event header
			// is not forwarded, and the HTTP headers are not the event's.
			assert.Equal(t, map[string]string{"traceparent": ceTraceParent, "tracestate": ceTraceState}, m.Headers)
			assert.Equal(t, []effect{{EventID: e.ID, Type: e.Type, Payload: string(m.Payload.(json.RawMessage))}}, cs.effects(t))

			// The inbox holds (consumer, event ID): the default message ID is
			// the CloudEvents id.
			called := false
			require.NoError(t, outbox.Consume(cs.db, "billing", e.ID, func(*gorm.DB) error { called = true; return nil }))
			assert.False(t, called, "the message was recorded under the event ID")
		})
	}
}

// TestConsumerCloudEventsOverRelay: the outbox relay, a CloudEvents Sender
// and the Consumer, end to end: the event ends sent, applied once.
func TestConsumerCloudEventsOverRelay(t *testing.T) {
	t.Parallel()
	cs := newConsumerSide(t, webhook.ConsumerConfig{}, nil)
	db, ob := openDB(t)
	ob.Handle(outbox.AnyEvent, newHandler(t, cs.srv.URL, webhook.Config{Format: wire.CloudEvents}))
	outboxtest.Publish(t, db, ceEvent())
	require.Equal(t, 1, outboxtest.Drain(t, outboxtest.Relay(t, ob, db, outbox.RelayConfig{})))
	assert.Equal(t, outbox.StatusSent, outboxtest.Row(t, db, ceEvent().ID).Status)
	assert.Len(t, cs.effects(t), 1)
}

// TestConsumerRefusesAnUnsignedEventID: in binary mode the ce-id header is
// not under the signature; the signed webhook-id is, and a request whose
// ce-id differs from it (a replay with another id, which the inbox would
// apply again) is refused. A custom MessageID is not checked.
func TestConsumerRefusesAnUnsignedEventID(t *testing.T) {
	t.Parallel()
	var captured http.Header
	var body []byte
	capture := newReceiver(t, func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNoContent) })
	require.NoError(t, newHandler(t, capture.URL, webhook.Config{Format: wire.CloudEvents})(t.Context(), ceEvent()))
	captured, body = capture.requests()[0].header, capture.requests()[0].body

	replay := func(url, ceID string) int {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, bytes.NewReader(body))
		require.NoError(t, err)
		req.Header = captured.Clone()
		req.Header.Set("ce-id", ceID)
		return do(t, req).StatusCode
	}
	cs := newConsumerSide(t, webhook.ConsumerConfig{}, nil)
	assert.Equal(t, http.StatusBadRequest, replay(cs.srv.URL, "another-id"))
	assert.Zero(t, cs.calls.Load())
	assert.Equal(t, http.StatusNoContent, replay(cs.srv.URL, ceEvent().ID))
	assert.EqualValues(t, 1, cs.calls.Load())

	custom := newConsumerSide(t, webhook.ConsumerConfig{MessageID: func(m webhook.Message) string { return m.Event.ID }}, nil)
	assert.Equal(t, http.StatusNoContent, replay(custom.srv.URL, "another-id"), "the application chose its ID")
}

// recordingTelemetry is a wire.Telemetry that records what the adapter
// tells it and rewrites the trace context to its own span's.
type recordingTelemetry struct {
	traceparent string

	mu          sync.Mutex
	sends       []telemetryCall
	sendEnds    []error
	receives    []telemetryCall
	receiveEnds []error
	handleSpan  []any // the span key Handle's ctx carried
}

type telemetryCall struct {
	op wire.Operation
	e  outbox.Event
}

type spanKey struct{}

func (f *recordingTelemetry) StartSend(ctx context.Context, op wire.Operation, e outbox.Event) (context.Context, outbox.Event, func(error)) {
	f.mu.Lock()
	f.sends = append(f.sends, telemetryCall{op, e})
	f.mu.Unlock()
	h := maps.Clone(e.Headers)
	if h == nil {
		h = map[string]string{}
	}
	h["traceparent"] = f.traceparent
	h["tracestate"] = ceTraceState
	e.Headers = h
	return context.WithValue(ctx, spanKey{}, "send"), e, func(err error) {
		f.mu.Lock()
		f.sendEnds = append(f.sendEnds, err)
		f.mu.Unlock()
	}
}

func (f *recordingTelemetry) StartReceive(ctx context.Context, op wire.Operation, e outbox.Event) (context.Context, func(error)) {
	f.mu.Lock()
	f.receives = append(f.receives, telemetryCall{op, e})
	f.mu.Unlock()
	return context.WithValue(ctx, spanKey{}, "receive"), func(err error) {
		f.mu.Lock()
		f.receiveEnds = append(f.receiveEnds, err)
		f.mu.Unlock()
	}
}

func (f *recordingTelemetry) snapshot() (sends []telemetryCall, sendEnds []error, receives []telemetryCall, receiveEnds []error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]telemetryCall(nil), f.sends...), append([]error(nil), f.sendEnds...),
		append([]telemetryCall(nil), f.receives...), append([]error(nil), f.receiveEnds...)
}

const sendTraceParent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

// TestSendTelemetry: each request starts a send span named by the URL's
// host (not its path or query, where tokens live), with the server; the request carries the
// span's trace context (the traceparent header, and the CloudEvents
// extension or the envelope's headers) and the span ends with the
// handler's outcome.
func TestSendTelemetry(t *testing.T) {
	t.Parallel()
	for _, p := range handlerPaths {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			for _, format := range []wire.Format{wire.Native, wire.CloudEvents, wire.CloudEventsJSON} {
				t.Run(format.String(), func(t *testing.T) {
					t.Parallel()
					rc := newCEReceiver(t)
					u, err := url.Parse(rc.URL)
					require.NoError(t, err)
					port, err := strconv.Atoi(u.Port())
					require.NoError(t, err)
					tel := &recordingTelemetry{traceparent: sendTraceParent}
					h := pathHandler(t, p, rc.URL+"/hooks/orders?token=s3cret", webhook.Config{Format: format, Telemetry: tel})
					e := ceEvent()
					require.NoError(t, h(t.Context(), e))

					sends, ends, _, _ := tel.snapshot()
					require.Len(t, sends, 1)
					assert.Equal(t, wire.Operation{System: "http", Destination: u.Host, ServerAddress: "127.0.0.1", ServerPort: port}, sends[0].op)
					assert.Equal(t, e, sends[0].e)
					assert.Equal(t, []error{nil}, ends)

					r := rc.requests()[0]
					assert.Equal(t, sendTraceParent, r.header.Get("traceparent"), "the send span's, as a protocol header")
					switch format {
					case wire.Native:
						var env webhook.Envelope
						require.NoError(t, json.Unmarshal(r.body, &env))
						assert.Equal(t, sendTraceParent, env.Headers["traceparent"], "and in the envelope")
					default:
						require.NoError(t, r.err)
						assertSDKEvent(t, e, wire.DefaultSource, sendTraceParent, r.event, format == wire.CloudEvents)
					}
				})
			}
		})
	}
}

// TestSendTelemetryFromContextAndErrors: without Config.Telemetry the one
// in ctx is used; the span ends with the error the handler returns,
// classified (a 400 is Permanent).
func TestSendTelemetryFromContextAndErrors(t *testing.T) {
	t.Parallel()
	for _, p := range handlerPaths {
		t.Run(p.name, func(t *testing.T) {
			t.Parallel()
			rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request) {
				if r.Header.Get("ce-type") == "refused" {
					w.WriteHeader(http.StatusBadRequest)
					return
				}
				w.WriteHeader(http.StatusNoContent)
			})
			tel := &recordingTelemetry{traceparent: sendTraceParent}
			h := pathHandler(t, p, rc.URL, webhook.Config{Format: wire.CloudEvents})
			ctx := wire.ContextWithTelemetry(t.Context(), tel)

			require.NoError(t, h(ctx, ceEvent()))
			bad := ceEvent()
			bad.Type = "refused"
			herr := h(ctx, bad)
			require.Error(t, herr)
			require.True(t, outbox.IsPermanent(herr))
			invalid := ceEvent()
			invalid.Payload = json.RawMessage(`{"not json"`)
			ierr := h(ctx, invalid)
			require.True(t, outbox.IsPermanent(ierr))

			sends, ends, _, _ := tel.snapshot()
			require.Len(t, sends, 3, "the ctx's Telemetry is used")
			require.Len(t, ends, 3)
			assert.NoError(t, ends[0])
			assert.Same(t, herr, ends[1], "end gets the handler's error")
			assert.True(t, outbox.IsPermanent(ends[1]))
			var se *webhook.StatusError
			assert.ErrorAs(t, ends[1], &se)
			assert.Same(t, ierr, ends[2], "an event that cannot be encoded ends its span too")

			reqs := rc.requests()
			require.Len(t, reqs, 2)
			assert.Equal(t, sendTraceParent, reqs[0].header.Get("traceparent"))
			assert.Equal(t, sendTraceParent, reqs[0].header.Get("ce-traceparent"))

			// Without any Telemetry the event's own trace context is sent.
			require.NoError(t, h(t.Context(), ceEvent()))
			assert.Equal(t, ceTraceParent, rc.requests()[2].header.Get("ce-traceparent"))
		})
	}
}

// TestConsumerTelemetry: the Consumer starts a receive span per message
// with the decoded event (its trace context), the path and the consumer
// name; Handle and the inbox transaction run in its context, and it ends
// with Consume's outcome. A Telemetry in the request's context is used when
// the config has none.
func TestConsumerTelemetry(t *testing.T) {
	t.Parallel()
	for _, format := range []wire.Format{wire.Native, wire.CloudEvents, wire.CloudEventsJSON} {
		t.Run(format.String(), func(t *testing.T) {
			t.Parallel()
			tel := &recordingTelemetry{}
			boom := errors.New("ledger locked")
			cs := newConsumerSide(t, webhook.ConsumerConfig{Telemetry: tel}, func(ctx context.Context, tx *gorm.DB, m webhook.Message) error {
				tel.mu.Lock()
				tel.handleSpan = append(tel.handleSpan, ctx.Value(spanKey{}), tx.Statement.Context.Value(spanKey{}))
				tel.mu.Unlock()
				if m.Event.Type == "fail" {
					return boom
				}
				return recordEffect(ctx, tx, m)
			})
			send := newHandler(t, cs.srv.URL+"/hooks/billing", webhook.Config{Format: format})
			e := ceEvent()
			require.NoError(t, send(t.Context(), e))
			failing := ceEvent()
			failing.ID, failing.Type = "f-1", "fail"
			require.Error(t, send(t.Context(), failing))

			_, _, receives, ends := tel.snapshot()
			require.Len(t, receives, 2)
			u, err := url.Parse(cs.srv.URL)
			require.NoError(t, err)
			assert.Equal(t, wire.Operation{System: "http", Destination: u.Host, MessageID: e.ID, ConsumerGroup: "billing"}, receives[0].op)
			assert.Equal(t, e.ID, receives[0].e.ID)
			assert.Equal(t, ceTraceParent, receives[0].e.Headers["traceparent"], "the decoded event, with the message's trace context")
			assert.Equal(t, "f-1", receives[1].e.ID)
			require.Len(t, ends, 2)
			assert.NoError(t, ends[0])
			assert.ErrorIs(t, ends[1], boom, "ends with Consume's outcome")
			tel.mu.Lock()
			assert.Equal(t, []any{"receive", "receive", "receive", "receive"}, tel.handleSpan, "Handle and the transaction run in the span's context")
			tel.mu.Unlock()
		})
	}

	// No Config.Telemetry: the one in the request's context.
	tel := &recordingTelemetry{}
	db, _ := outboxtest.SQLite(t, outbox.Config{})
	c, err := webhook.NewConsumer(db, secret, webhook.ConsumerConfig{
		Consumer: "billing",
		Handle:   func(context.Context, *gorm.DB, webhook.Message) error { return nil },
	})
	require.NoError(t, err)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c.ServeHTTP(w, r.WithContext(wire.ContextWithTelemetry(r.Context(), tel)))
	}))
	t.Cleanup(srv.Close)
	require.NoError(t, newHandler(t, srv.URL, webhook.Config{Format: wire.CloudEvents})(t.Context(), ceEvent()))
	_, _, receives, ends := tel.snapshot()
	require.Len(t, receives, 1)
	assert.Equal(t, ceEvent().ID, receives[0].e.ID)
	assert.Equal(t, []error{nil}, ends)
}

// TestNewRefusesFormatMisuse: an unknown Format wraps wire.ErrFormat;
// PayloadOnly has no meaning outside Native.
func TestNewRefusesFormatMisuse(t *testing.T) {
	t.Parallel()
	_, err := webhook.New("https://example.com/h", secret, webhook.Config{Format: wire.Format(9)})
	require.ErrorIs(t, err, wire.ErrFormat)
	for _, f := range []wire.Format{wire.CloudEvents, wire.CloudEventsJSON} {
		_, err := webhook.New("https://example.com/h", secret, webhook.Config{Format: f, PayloadOnly: true})
		require.Error(t, err, f)
		assert.Contains(t, err.Error(), "PayloadOnly")
	}
	_, err = webhook.New("https://example.com/h", secret, webhook.Config{Format: wire.Native, PayloadOnly: true})
	require.NoError(t, err)
}

func TestNewRefusesBadSource(t *testing.T) {
	t.Parallel()
	_, err := webhook.New("https://example.com/h", secret, webhook.Config{Source: "/my orders"})
	require.ErrorIs(t, err, wire.ErrSource)
}
