package nats_test

// The CloudEvents formats, checked with implementations that are not ours:
// the CloudEvents Go SDK's NATS JetStream binding parses what the Publisher
// stores in the stream, and the CloudEvents JSON schema validates the
// structured documents.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/url"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	cejs "github.com/cloudevents/sdk-go/protocol/nats_jetstream/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	cevent "github.com/cloudevents/sdk-go/v2/event"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	outboxnats "github.com/gorm-outbox/outbox/adapters/nats"
	"github.com/gorm-outbox/outbox/wire"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

const (
	ceTraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ceTraceState  = "congo=t61rcWkgMzE"
	cePayload     = `{"total":"9.99 €","items":[1,2],"note":null}`
)

// ceEvent is an event with every field set, the idempotency key not its ID.
func ceEvent(id string) outbox.Event {
	return outbox.Event{
		ID: id, Type: "order.created", AggregateType: "order", AggregateID: "42",
		IdempotencyKey: "order-42-created",
		OccurredAt:     time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC),
		Headers:        map[string]string{"traceparent": ceTraceParent, "tracestate": ceTraceState, "tenant": "acme"},
		Payload:        json.RawMessage(cePayload),
	}
}

// storedMsg returns the last message the stream stored on subject, as the
// *nats.Msg a subscriber would get.
func storedMsg(t *testing.T, stream jetstream.Stream, subject string) *natsgo.Msg {
	t.Helper()
	raw, err := stream.GetLastMsgForSubject(t.Context(), subject)
	require.NoError(t, err)
	return &natsgo.Msg{Subject: raw.Subject, Header: raw.Header, Data: raw.Data}
}

// sdkEvent parses msg with the CloudEvents SDK's NATS JetStream binding,
// checking that the SDK sees the content mode we meant.
func sdkEvent(t *testing.T, msg *natsgo.Msg, want binding.Encoding) *cevent.Event {
	t.Helper()
	m := cejs.NewMessage(msg)
	require.Equal(t, want, m.ReadEncoding(), "content mode as the SDK sees it")
	ev, err := binding.ToEvent(t.Context(), m)
	require.NoError(t, err)
	require.NoError(t, ev.Validate())
	return ev
}

// assertSDKEvent compares every attribute of ev to e's.
func assertSDKEvent(t *testing.T, e outbox.Event, source, traceparent string, ev *cevent.Event) {
	t.Helper()
	assert.Equal(t, "1.0", ev.SpecVersion())
	assert.Equal(t, e.ID, ev.ID())
	assert.Equal(t, source, ev.Source())
	assert.Equal(t, e.Type, ev.Type())
	assert.Equal(t, e.AggregateType+"/"+e.AggregateID, ev.Subject())
	assert.True(t, e.OccurredAt.Equal(ev.Time()), "time %v, want %v", ev.Time(), e.OccurredAt)
	assert.Equal(t, "application/json", ev.DataContentType())
	assert.JSONEq(t, string(e.Payload.(json.RawMessage)), string(ev.Data()))
	ext := map[string]string{}
	for k, v := range ev.Extensions() {
		ext[k] = fmt.Sprint(v)
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

// TestCloudEventsSDKReadsWhatIsSent: binary and structured mode as the NATS
// binding and the SDK define them, every attribute as the event has it.
func TestCloudEventsSDKReadsWhatIsSent(t *testing.T) {
	t.Parallel()
	_, js := connect(t)
	sch := ceSchema(t)
	for _, tc := range []struct {
		format     wire.Format
		source     string // Config.Source
		wantSource string
		encoding   binding.Encoding
	}{
		{wire.CloudEvents, "/orders", "/orders", binding.EncodingBinary},
		{wire.CloudEventsJSON, "", wire.DefaultSource, binding.EncodingStructured},
	} {
		t.Run(tc.format.String(), func(t *testing.T) {
			t.Parallel()
			stream, prefix := newStream(t, js)
			h := newPublisher(t, js, outboxnats.Config{SubjectPrefix: prefix + ".", Format: tc.format, Source: tc.source}).Handler()
			e := ceEvent("ce-" + tc.format.String())
			require.NoError(t, h(t.Context(), e))

			msg := storedMsg(t, stream, prefix+".order.created")
			assertSDKEvent(t, e, tc.wantSource, ceTraceParent, sdkEvent(t, msg, tc.encoding))

			// The protocol's own headers, the same in both modes.
			assert.Equal(t, e.ID, msg.Header.Get(jetstream.MsgIDHeader), "JetStream still deduplicates by the event ID")
			assert.Equal(t, ceTraceParent, msg.Header.Get("traceparent"))
			assert.Equal(t, ceTraceState, msg.Header.Get("tracestate"))
			assert.Equal(t, "acme", msg.Header.Get("tenant"), "a plain event header stays a protocol header")
			for _, name := range []string{wire.EventID, wire.EventType, wire.IdempotencyKey, wire.OccurredAt} {
				assert.Empty(t, msg.Header.Values(name), "no %s in CloudEvents formats", name)
			}

			switch tc.format {
			case wire.CloudEvents:
				assert.Equal(t, "application/json", msg.Header.Get(outboxnats.HeaderContentType))
				assert.Equal(t, "application/json", msg.Header.Get("ce-datacontenttype"), "the NATS binding sends it as an attribute")
				assert.JSONEq(t, cePayload, string(msg.Data), "binary mode: the body is the payload")
			case wire.CloudEventsJSON:
				assert.Equal(t, "application/cloudevents+json", msg.Header.Get(outboxnats.HeaderContentType))
				for k := range msg.Header {
					assert.NotContains(t, k, "ce-", "structured mode has no attribute headers")
				}
				require.NoError(t, validate(sch, msg.Data))
				// The SDK's own JSON unmarshalling agrees with its binding.
				var doc cevent.Event
				require.NoError(t, json.Unmarshal(msg.Data, &doc))
				assertSDKEvent(t, e, tc.wantSource, ceTraceParent, &doc)
			}
		})
	}
}

// TestStructuredDocumentsMatchTheSchema: every kind of structured document
// the Publisher sends validates against the CloudEvents JSON schema, and
// the schema does reject a broken one.
func TestStructuredDocumentsMatchTheSchema(t *testing.T) {
	t.Parallel()
	_, js := connect(t)
	stream, prefix := newStream(t, js)
	sch := ceSchema(t)
	p := newPublisher(t, js, outboxnats.Config{
		Subject: func(e outbox.Event) string { return prefix + "." + e.ID },
		Format:  wire.CloudEventsJSON, Source: "https://orders.example.com/outbox",
	})
	events := []outbox.Event{
		ceEvent("full"),
		{ID: "minimal", Type: "t", Payload: json.RawMessage(`{}`)}, // no time, subject, extensions
		{ID: "idonly", Type: "order.created", AggregateID: "Euro € 😀", Payload: json.RawMessage(`"text"`)},
		{ID: "array", Type: "t", Payload: json.RawMessage(`[1,"two",{"three":3}]`), OccurredAt: time.Now()},
		{ID: "number", Type: "t", Payload: json.RawMessage(`12.5`), Headers: map[string]string{"traceparent": ceTraceParent}},
	}
	for _, e := range events {
		require.NoError(t, p.Handler()(t.Context(), e))
		doc := storedMsg(t, stream, prefix+"."+e.ID).Data
		assert.NoError(t, validate(sch, doc), "%s: %s", e.ID, doc)
	}

	// The schema has teeth: a document without id, or with a time that is
	// not one, fails.
	var doc map[string]any
	require.NoError(t, json.Unmarshal(storedMsg(t, stream, prefix+".full").Data, &doc))
	for name, broken := range map[string]func(map[string]any){
		"no id":    func(d map[string]any) { delete(d, "id") },
		"bad time": func(d map[string]any) { d["time"] = "yesterday" },
	} {
		d := maps.Clone(doc)
		broken(d)
		b, err := json.Marshal(d)
		require.NoError(t, err)
		assert.Error(t, validate(sch, b), name)
	}
}

// TestConsumerAppliesCloudEventsOnce: the Consumer decodes both CloudEvents
// formats, records them in the inbox under the event ID and applies a
// redelivered copy once.
func TestConsumerAppliesCloudEventsOnce(t *testing.T) {
	t.Parallel()
	for _, format := range []wire.Format{wire.CloudEvents, wire.CloudEventsJSON} {
		t.Run(format.String(), func(t *testing.T) {
			t.Parallel()
			env := newConsumerEnv(t)
			got := make(chan outboxnats.Message, 10)
			cfg := env.config(func(ctx context.Context, tx *gorm.DB, m outboxnats.Message) error {
				got <- m
				return effect(tx, m, "")
			})
			e := ceEvent("consumed-" + format.String())
			h := newPublisher(t, env.js, outboxnats.Config{SubjectPrefix: env.prefix + ".", Format: format}).Handler()
			require.NoError(t, h(t.Context(), e))
			// A second copy, without Nats-Msg-Id so that the stream keeps it:
			// a redelivery as the consumer sees it.
			msg := storedMsg(t, env.stream, env.prefix+".order.created")
			dup := natsgo.NewMsg(msg.Subject)
			for k, v := range msg.Header {
				if k != jetstream.MsgIDHeader {
					dup.Header[k] = v
				}
			}
			dup.Data = msg.Data
			_, err := env.js.PublishMsg(t.Context(), dup)
			require.NoError(t, err)

			env.run(env.newConsumer(cfg))
			env.waitSettled(cfg.Consumer, 2)
			require.Len(t, got, 1, "applied once")
			assert.EqualValues(t, 1, env.effects())
			m := <-got
			assert.Equal(t, e.ID, m.Event.ID)
			assert.Equal(t, e.Type, m.Event.Type)
			assert.Equal(t, e.AggregateType, m.Event.AggregateType)
			assert.Equal(t, e.AggregateID, m.Event.AggregateID)
			assert.Equal(t, e.IdempotencyKey, m.Event.IdempotencyKey)
			assert.True(t, e.OccurredAt.Equal(m.Event.OccurredAt), "occurred at %v", m.Event.OccurredAt)
			assert.JSONEq(t, cePayload, string(m.Event.Payload.(json.RawMessage)))
			want := maps.Clone(e.Headers)
			want[jetstream.MsgIDHeader] = e.ID // the protocol's headers come along, as in Native
			assert.Equal(t, want, m.Event.Headers)

			// The inbox holds (consumer, event ID): the default message ID is
			// the CloudEvents id.
			called := false
			require.NoError(t, outbox.Consume(env.db, cfg.Consumer, e.ID, func(*gorm.DB) error { called = true; return nil }))
			assert.False(t, called, "the message was recorded under the event ID")
		})
	}
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

// TestPublishTelemetry: each publish starts a send span with the subject and
// the server, the message carries the span's trace context (header and
// CloudEvents extension) and the span ends with the outcome.
func TestPublishTelemetry(t *testing.T) {
	t.Parallel()
	nc, js := connect(t)
	u, err := url.Parse(nc.ConnectedUrl())
	require.NoError(t, err)
	port, err := strconv.Atoi(u.Port())
	require.NoError(t, err)
	for _, format := range []wire.Format{wire.Native, wire.CloudEvents, wire.CloudEventsJSON} {
		t.Run(format.String(), func(t *testing.T) {
			t.Parallel()
			stream, prefix := newStream(t, js)
			tel := &recordingTelemetry{traceparent: sendTraceParent}
			h := newPublisher(t, js, outboxnats.Config{SubjectPrefix: prefix + ".", Format: format, Telemetry: tel}).Handler()
			e := ceEvent("traced-" + format.String())
			require.NoError(t, h(t.Context(), e))

			sends, ends, _, _ := tel.snapshot()
			require.Len(t, sends, 1)
			assert.Equal(t, wire.Operation{System: "nats", Destination: prefix + ".order.created",
				ServerAddress: u.Hostname(), ServerPort: port}, sends[0].op)
			assert.Equal(t, e, sends[0].e, "StartSend gets the event as the relay gave it")
			assert.Equal(t, []error{nil}, ends)

			msg := storedMsg(t, stream, prefix+".order.created")
			assert.Equal(t, sendTraceParent, msg.Header.Get("traceparent"), "the protocol header carries the send span")
			switch format {
			case wire.CloudEvents:
				assert.Equal(t, sendTraceParent, msg.Header.Get("ce-traceparent"))
				assertSDKEvent(t, e, wire.DefaultSource, sendTraceParent, sdkEvent(t, msg, binding.EncodingBinary))
			case wire.CloudEventsJSON:
				var doc map[string]any
				require.NoError(t, json.Unmarshal(msg.Data, &doc))
				assert.Equal(t, sendTraceParent, doc["traceparent"])
				assertSDKEvent(t, e, wire.DefaultSource, sendTraceParent, sdkEvent(t, msg, binding.EncodingStructured))
			}
		})
	}
}

// captureJS is a JetStream that keeps the messages it is given and answers
// with err, or an ack.
type captureJS struct {
	err  error
	mu   sync.Mutex
	msgs []*natsgo.Msg
}

func (c *captureJS) PublishMsg(_ context.Context, msg *natsgo.Msg, _ ...jetstream.PublishOpt) (*jetstream.PubAck, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.msgs = append(c.msgs, msg)
	if c.err != nil {
		return nil, c.err
	}
	return &jetstream.PubAck{Stream: "S", Sequence: uint64(len(c.msgs))}, nil
}

// TestPublishTelemetryFromContextAndErrors, without a server: the
// context's Telemetry is used when Config names none (and Config's wins
// over it), and the span ends with the error the handler returns.
func TestPublishTelemetryFromContextAndErrors(t *testing.T) {
	t.Parallel()
	e := ceEvent("ctx-1")

	inCtx := &recordingTelemetry{traceparent: sendTraceParent}
	cjs := &captureJS{}
	p := newPublisher(t, cjs, outboxnats.Config{Format: wire.CloudEvents})
	require.NoError(t, p.Handler()(wire.ContextWithTelemetry(t.Context(), inCtx), e))
	sends, ends, _, _ := inCtx.snapshot()
	require.Len(t, sends, 1, "the context's Telemetry is used")
	assert.Equal(t, wire.Operation{System: "nats", Destination: "outbox.order.created"}, sends[0].op)
	assert.Equal(t, []error{nil}, ends)
	require.Len(t, cjs.msgs, 1)
	assert.Equal(t, sendTraceParent, cjs.msgs[0].Header.Get("traceparent"))
	assert.Equal(t, sendTraceParent, cjs.msgs[0].Header.Get("ce-traceparent"))

	// Config's Telemetry overrides the context's.
	own := &recordingTelemetry{traceparent: sendTraceParent}
	other := &recordingTelemetry{traceparent: "00-11111111111111111111111111111111-2222222222222222-01"}
	p = newPublisher(t, &captureJS{}, outboxnats.Config{Telemetry: own})
	require.NoError(t, p.Handler()(wire.ContextWithTelemetry(t.Context(), other), e))
	sends, _, _, _ = own.snapshot()
	assert.Len(t, sends, 1)
	sends, _, _, _ = other.snapshot()
	assert.Empty(t, sends)

	// The span ends with the handler's error, classified.
	for name, tc := range map[string]struct {
		js      *captureJS
		subject string
		check   func(error) bool
	}{
		"over-size message": {&captureJS{err: natsgo.ErrMaxPayload}, "", outbox.IsPermanent},
		"invalid subject":   {&captureJS{}, "not a subject", outbox.IsPermanent},
		"no servers":        {&captureJS{err: natsgo.ErrNoServers}, "", outbox.IsUnavailable},
	} {
		tel := &recordingTelemetry{traceparent: sendTraceParent}
		cfg := outboxnats.Config{Format: wire.CloudEventsJSON, Telemetry: tel}
		if tc.subject != "" {
			cfg.Subject = func(outbox.Event) string { return tc.subject }
		}
		err := newPublisher(t, tc.js, cfg).Handler()(t.Context(), e)
		require.Error(t, err, name)
		require.True(t, tc.check(err), "%s: %v", name, err)
		_, ends, _, _ := tel.snapshot()
		assert.Equal(t, []error{err}, ends, "%s: end gets the handler's error", name)
	}
}

// TestConsumerTelemetry: the Consumer starts a receive span per message
// with the decoded event, Handle and the inbox transaction run in its
// context, and it ends with Consume's outcome. Config's Telemetry, or Run's
// context's.
func TestConsumerTelemetry(t *testing.T) {
	t.Parallel()
	t.Run("config", func(t *testing.T) {
		t.Parallel()
		env := newConsumerEnv(t)
		tel := &recordingTelemetry{}
		var calls atomic.Int32
		boom := errors.New("boom")
		cfg := env.config(func(ctx context.Context, tx *gorm.DB, m outboxnats.Message) error {
			if ctx.Value(spanKey{}) != "receive" || tx.Statement.Context.Value(spanKey{}) != "receive" {
				return outbox.Permanent(errors.New("Handle or its transaction is not in the receive span's context"))
			}
			if calls.Add(1) == 1 {
				return boom
			}
			return effect(tx, m, "")
		})
		cfg.Telemetry = tel
		e := ceEvent("received-1")
		h := newPublisher(t, env.js, outboxnats.Config{SubjectPrefix: env.prefix + ".", Format: wire.CloudEvents}).Handler()
		require.NoError(t, h(t.Context(), e))
		env.run(env.newConsumer(cfg))
		env.waitSettled(cfg.Consumer, 1)

		_, _, receives, ends := tel.snapshot()
		require.Len(t, receives, 2, "one span per delivery")
		for _, r := range receives {
			assert.Equal(t, wire.Operation{System: "nats", Destination: env.prefix + ".order.created", ConsumerGroup: cfg.Consumer}, r.op)
			assert.Equal(t, e.ID, r.e.ID)
			assert.Equal(t, ceTraceParent, r.e.Headers["traceparent"], "the decoded event carries the producer's context")
		}
		require.Len(t, ends, 2)
		assert.ErrorIs(t, ends[0], boom)
		assert.NoError(t, ends[1])
		assert.EqualValues(t, 1, env.effects())
	})
	t.Run("context", func(t *testing.T) {
		t.Parallel()
		env := newConsumerEnv(t)
		tel := &recordingTelemetry{}
		durable := "d_" + randomName()
		jc, err := env.js.CreateConsumer(t.Context(), env.name, jetstream.ConsumerConfig{Durable: durable, AckPolicy: jetstream.AckExplicitPolicy})
		require.NoError(t, err)
		cfg := env.config(func(ctx context.Context, tx *gorm.DB, m outboxnats.Message) error {
			return outbox.Permanent(errors.New("refused"))
		})
		cfg.Stream, cfg.JetStreamConsumer = "", jc
		e := ceEvent("received-2")
		h := newPublisher(t, env.js, outboxnats.Config{SubjectPrefix: env.prefix + ".", Format: wire.CloudEventsJSON}).Handler()
		require.NoError(t, h(t.Context(), e))

		c := env.newConsumer(cfg)
		ctx, cancel := context.WithCancel(wire.ContextWithTelemetry(context.Background(), tel))
		done := make(chan error, 1)
		go func() { done <- c.Run(ctx) }()
		env.waitSettled(durable, 1)
		cancel()
		require.NoError(t, <-done)

		_, _, receives, ends := tel.snapshot()
		require.Len(t, receives, 1)
		assert.Equal(t, wire.Operation{System: "nats", Destination: env.prefix + ".order.created", ConsumerGroup: durable}, receives[0].op)
		assert.Equal(t, ceTraceParent, receives[0].e.Headers["traceparent"])
		require.Len(t, ends, 1)
		assert.True(t, outbox.IsPermanent(ends[0]), "ends with Consume's outcome: %v", ends[0])
	})
}

func TestNewRefusesUnknownFormat(t *testing.T) {
	t.Parallel()
	for _, f := range []wire.Format{9, -1} {
		_, err := outboxnats.New(&captureJS{}, outboxnats.Config{Format: f})
		assert.ErrorIs(t, err, wire.ErrFormat, "Format %d", f)
	}
	for _, f := range []wire.Format{wire.Native, wire.CloudEvents, wire.CloudEventsJSON} {
		_, err := outboxnats.New(&captureJS{}, outboxnats.Config{Format: f})
		assert.NoError(t, err, f.String())
	}
}

func TestNewRefusesBadSource(t *testing.T) {
	t.Parallel()
	_, err := outboxnats.New(&captureJS{}, outboxnats.Config{Source: "/my orders"})
	assert.ErrorIs(t, err, wire.ErrSource)
}
