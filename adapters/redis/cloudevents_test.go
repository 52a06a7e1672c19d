package redis_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"maps"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	outboxredis "github.com/gorm-outbox/outbox/adapters/redis"
	"github.com/gorm-outbox/outbox/wire"
	goredis "github.com/redis/go-redis/v9"
)

// ceEvent has every field set: an idempotency key that is not the ID, the
// W3C trace context and one plain header.
func ceEvent(id string) outbox.Event {
	return outbox.Event{
		ID: id, Type: "order.created", AggregateType: "order", AggregateID: "42",
		IdempotencyKey: "order-42-created",
		OccurredAt:     time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC),
		Headers: map[string]string{
			"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			"tracestate":  "congo=t61rcWkgMzE",
			"tenant":      "acme",
		},
		Payload: json.RawMessage(`{"total":"9.99 €","lines":[1,2]}`),
	}
}

// structuredMessage is a Redis entry's document as a CloudEvents SDK
// binding.Message in structured mode, so that binding.ToEvent reads it
// with the SDK's format for application/cloudevents+json.
type structuredMessage struct {
	format format.Format
	doc    []byte
}

func (m structuredMessage) ReadEncoding() binding.Encoding { return binding.EncodingStructured }
func (m structuredMessage) ReadStructured(ctx context.Context, w binding.StructuredWriter) error {
	return w.SetStructuredEvent(ctx, m.format, bytes.NewReader(m.doc))
}
func (m structuredMessage) ReadBinary(context.Context, binding.BinaryWriter) error {
	return binding.ErrNotBinary
}
func (m structuredMessage) Finish(error) error { return nil }

// sdkEvent parses a document with the CloudEvents SDK, twice: as a JSON
// event (event.Event's unmarshal) and through binding.ToEvent on a
// structured message of the format the SDK names for the structured
// content type. Both must agree, and the SDK must find the event valid.
func sdkEvent(t *testing.T, doc []byte) event.Event {
	t.Helper()
	ev := event.New()
	require.NoError(t, json.Unmarshal(doc, &ev))
	require.NoError(t, ev.Validate())

	f := format.Lookup(wire.ContentTypeCloudEventsJSON)
	require.NotNil(t, f, "the SDK has a format for application/cloudevents+json")
	var msg binding.Message = structuredMessage{f, doc}
	require.Equal(t, binding.EncodingStructured, msg.ReadEncoding())
	viaBinding, err := binding.ToEvent(t.Context(), msg)
	require.NoError(t, err)
	assert.Equal(t, ev.String(), viaBinding.String(), "binding.ToEvent reads the same event")
	return ev
}

// schema is the CloudEvents JSON schema shipped with package wire.
var schema = sync.OnceValues(func() (*jsonschema.Schema, error) {
	return jsonschema.NewCompiler().Compile("../../wire/testdata/cloudevents.json")
})

func validateSchema(t *testing.T, doc []byte) {
	t.Helper()
	sch, err := schema()
	require.NoError(t, err)
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	require.NoError(t, err)
	assert.NoError(t, sch.Validate(inst), "the document validates against the CloudEvents JSON schema")
}

// assertAttributes compares every attribute of ev to e.
func assertAttributes(t *testing.T, e outbox.Event, source string, ev event.Event) {
	t.Helper()
	assert.Equal(t, "1.0", ev.SpecVersion())
	assert.Equal(t, e.ID, ev.ID())
	assert.Equal(t, source, ev.Source())
	assert.Equal(t, e.Type, ev.Type())
	assert.Equal(t, e.AggregateType+"/"+e.AggregateID, ev.Subject())
	assert.True(t, e.OccurredAt.Equal(ev.Time()), "time %v, want %v", ev.Time(), e.OccurredAt)
	assert.Equal(t, "application/json", ev.DataContentType())
	assert.Empty(t, ev.DataSchema())
	assert.JSONEq(t, string(e.Payload.(json.RawMessage)), string(ev.Data()))
	assert.Equal(t, map[string]any{
		"aggregatetype":  e.AggregateType,
		"aggregateid":    e.AggregateID,
		"idempotencykey": e.IdempotencyKey,
		"traceparent":    e.Headers["traceparent"],
		"tracestate":     e.Headers["tracestate"],
	}, ev.Extensions())
}

// onlyEntry returns the fields of the stream's one entry.
func onlyEntry(t *testing.T, rdb *goredis.Client, stream string) goredis.XMessage {
	t.Helper()
	msgs, err := rdb.XRange(t.Context(), stream, "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	return msgs[0]
}

// TestCloudEventsEntry: in both CloudEvents formats the entry is the
// structured document in "cloudevent", which the SDK parses back into
// every attribute of the event and which validates against the schema,
// plus "headers" with the one plain header; an event whose only headers
// are the trace context has no headers field.
func TestCloudEventsEntry(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		format       wire.Format
		source, want string
	}{
		{wire.CloudEvents, "/orders", "/orders"},
		{wire.CloudEventsJSON, "", wire.DefaultSource},
	} {
		t.Run(tc.format.String(), func(t *testing.T) {
			t.Parallel()
			rdb := connect(t)
			stream := newKey(t, rdb)
			h := newPublisher(t, rdb, outboxredis.Config{Stream: stream, Format: tc.format, Source: tc.source}).Handler()
			e := ceEvent("0190d6c2-7d3a-7b1e-9f0a-5c2e4b6d8a10")
			require.NoError(t, h(t.Context(), e))

			msg := onlyEntry(t, rdb, stream)
			doc, ok := msg.Values[outboxredis.FieldCloudEvent].(string)
			require.True(t, ok, "field %s: %v", outboxredis.FieldCloudEvent, msg.Values)
			assert.Equal(t, map[string]any{
				outboxredis.FieldCloudEvent: doc,
				outboxredis.FieldHeaders:    `{"tenant":"acme"}`,
			}, msg.Values, "the document, and the header it does not hold")
			validateSchema(t, []byte(doc))
			assertAttributes(t, e, tc.want, sdkEvent(t, []byte(doc)))

			// Only trace context: all of it in the document.
			stream2 := newKey(t, rdb)
			h2 := newPublisher(t, rdb, outboxredis.Config{Stream: stream2, Format: tc.format, Source: tc.source}).Handler()
			e2 := ceEvent("evt-2")
			delete(e2.Headers, "tenant")
			require.NoError(t, h2(t.Context(), e2))
			msg = onlyEntry(t, rdb, stream2)
			assert.Equal(t, []string{outboxredis.FieldCloudEvent}, keys(msg.Values), "no headers field")
			doc = msg.Values[outboxredis.FieldCloudEvent].(string)
			assertAttributes(t, e2, tc.want, sdkEvent(t, []byte(doc)))
			validateSchema(t, []byte(doc))
		})
	}
}

func keys(m map[string]any) []string { return slices.Sorted(maps.Keys(m)) }

// TestCloudEventsTraceHeaderCase: a trace context header of another case
// is the document's extension and comes back under the lowercase name; a
// second spelling the document cannot hold stays in the headers field, so
// no header is lost.
func TestCloudEventsTraceHeaderCase(t *testing.T) {
	t.Parallel()
	rdb := connect(t)
	stream := newKey(t, rdb)
	h := newPublisher(t, rdb, outboxredis.Config{Stream: stream, Format: wire.CloudEventsJSON}).Handler()
	e := ceEvent("evt-case")
	e.Headers = map[string]string{
		"Traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
		"tracestate":  "a=1", "TraceState": "b=2",
	}
	require.NoError(t, h(t.Context(), e))
	msg := onlyEntry(t, rdb, stream)
	assert.Equal(t, `{"TraceState":"b=2"}`, msg.Values[outboxredis.FieldHeaders])
	ev := sdkEvent(t, []byte(msg.Values[outboxredis.FieldCloudEvent].(string)))
	assert.Equal(t, e.Headers["Traceparent"], ev.Extensions()["traceparent"])
	assert.Equal(t, "a=1", ev.Extensions()["tracestate"])

	db := consumerDB(t)
	got := make(chan outboxredis.Message, 1)
	runConsumer(t, db, rdb, outboxredis.ConsumerConfig{Stream: stream, Handle: func(_ context.Context, _ *gorm.DB, m outboxredis.Message) error {
		got <- m
		return nil
	}})
	m := receive(t, got)
	assert.Equal(t, map[string]string{
		"traceparent": e.Headers["Traceparent"], "tracestate": "a=1", "TraceState": "b=2",
	}, m.Event.Headers)
}

func receive[T any](t *testing.T, ch <-chan T) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(wait):
		t.Fatal("timed out waiting for the consumer")
		panic("unreachable")
	}
}

// TestConsumerCloudEvents: the consumer decodes an entry of each
// CloudEvents format into the event as published, applies it once under
// the event's ID (a second entry of the same event, as a retried XADD
// makes, is skipped), and acknowledges both.
func TestConsumerCloudEvents(t *testing.T) {
	t.Parallel()
	for _, f := range []wire.Format{wire.CloudEvents, wire.CloudEventsJSON} {
		t.Run(f.String(), func(t *testing.T) {
			t.Parallel()
			rdb := connect(t)
			stream := newKey(t, rdb)
			db := consumerDB(t)
			h := newPublisher(t, rdb, outboxredis.Config{Stream: stream, Format: f, Source: "/orders"}).Handler()
			e := ceEvent("evt-ce-" + f.String())
			require.NoError(t, h(t.Context(), e))
			require.NoError(t, h(t.Context(), e))
			var c calls
			runConsumer(t, db, rdb, outboxredis.ConsumerConfig{Stream: stream, Handle: func(_ context.Context, tx *gorm.DB, m outboxredis.Message) error {
				c.add(m, m.Event.ID)
				return tx.Create(&effect{MessageID: m.Event.ID}).Error
			}})
			ids := entryIDs(t, rdb, stream)
			require.Len(t, ids, 2)
			require.Eventually(t, func() bool {
				g := groupInfo(t, rdb, stream, "billing")
				return g.LastDeliveredID == ids[1] && g.Pending == 0
			}, wait, tick, "both entries delivered and acked")
			assert.Equal(t, 1, c.get(e.ID), "Handle ran once")
			assert.EqualValues(t, 1, effects(t, db))
			ms := c.messages()
			require.Len(t, ms, 1)
			assert.Equal(t, e, ms[0].Event, "the event as published")

			// The inbox holds the pair under the event's ID.
			ran := false
			require.NoError(t, outbox.Consume(db, "billing", e.ID, func(*gorm.DB) error { ran = true; return nil }))
			assert.False(t, ran, "consumed under the event ID")
		})
	}
}

func TestNewRefusesUnknownFormat(t *testing.T) {
	t.Parallel()
	rdb := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = rdb.Close() })
	_, err := outboxredis.New(rdb, outboxredis.Config{Format: wire.Format(9)})
	require.Error(t, err)
	assert.ErrorIs(t, err, wire.ErrFormat)
	for _, f := range []wire.Format{wire.Native, wire.CloudEvents, wire.CloudEventsJSON} {
		_, err := outboxredis.New(rdb, outboxredis.Config{Format: f})
		assert.NoError(t, err, f)
	}
}

// fakeTraceParent is the trace context the fake's send span has.
const fakeTraceParent = "00-11111111111111111111111111111111-2222222222222222-01"

type ctxMark struct{}

// fakeTelemetry records what the adapter reports. Its send span has
// fakeTraceParent; its receive span's context carries ctxMark.
type fakeTelemetry struct {
	mu       sync.Mutex
	sends    []telemetryCall
	receives []telemetryCall
	ended    chan struct{} // one value per end call
}

type telemetryCall struct {
	op    wire.Operation
	event outbox.Event
	err   error
	ended bool
}

func newFakeTelemetry() *fakeTelemetry { return &fakeTelemetry{ended: make(chan struct{}, 100)} }

func (f *fakeTelemetry) StartSend(ctx context.Context, op wire.Operation, e outbox.Event) (context.Context, outbox.Event, func(error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := len(f.sends)
	f.sends = append(f.sends, telemetryCall{op: op, event: e})
	e.Headers = maps.Clone(e.Headers)
	if e.Headers == nil {
		e.Headers = map[string]string{}
	}
	e.Headers["traceparent"] = fakeTraceParent
	delete(e.Headers, "tracestate")
	return ctx, e, func(err error) { f.end(&f.sends, i, err) }
}

func (f *fakeTelemetry) StartReceive(ctx context.Context, op wire.Operation, e outbox.Event) (context.Context, func(error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	i := len(f.receives)
	f.receives = append(f.receives, telemetryCall{op: op, event: e})
	return context.WithValue(ctx, ctxMark{}, i), func(err error) { f.end(&f.receives, i, err) }
}

func (f *fakeTelemetry) end(calls *[]telemetryCall, i int, err error) {
	f.mu.Lock()
	c := &(*calls)[i]
	if c.ended {
		f.mu.Unlock()
		panic("end called twice")
	}
	c.err, c.ended = err, true
	f.mu.Unlock()
	f.ended <- struct{}{}
}

func (f *fakeTelemetry) sent() []telemetryCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]telemetryCall(nil), f.sends...)
}

func (f *fakeTelemetry) received() []telemetryCall {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]telemetryCall(nil), f.receives...)
}

// serverOf is the address and port the test's Redis client uses.
func serverOf(t *testing.T, rdb *goredis.Client) (string, int) {
	t.Helper()
	host, port, err := net.SplitHostPort(rdb.Options().Addr)
	require.NoError(t, err)
	n, err := strconv.Atoi(port)
	require.NoError(t, err)
	return host, n
}

// TestPublisherTelemetry: each send starts a span with the stream as
// destination and the server's address, the entry carries the span's
// trace context (Native: the headers field; CloudEvents: the document's
// traceparent extension), and end gets the handler's outcome.
func TestPublisherTelemetry(t *testing.T) {
	t.Parallel()
	rdb := connect(t)
	host, port := serverOf(t, rdb)
	for _, f := range []wire.Format{wire.Native, wire.CloudEvents, wire.CloudEventsJSON} {
		t.Run(f.String(), func(t *testing.T) {
			t.Parallel()
			stream := newKey(t, rdb)
			tel := newFakeTelemetry()
			h := newPublisher(t, rdb, outboxredis.Config{Stream: stream, Format: f, Telemetry: tel}).Handler()
			e := ceEvent("evt-tel")
			require.NoError(t, h(t.Context(), e))

			sends := tel.sent()
			require.Len(t, sends, 1)
			assert.Equal(t, wire.Operation{System: "redis", Destination: stream, ServerAddress: host, ServerPort: port}, sends[0].op)
			assert.Equal(t, e, sends[0].event, "StartSend gets the event")
			assert.True(t, sends[0].ended)
			assert.NoError(t, sends[0].err)

			msg := onlyEntry(t, rdb, stream)
			if f == wire.Native {
				var hs map[string]string
				require.NoError(t, json.Unmarshal([]byte(msg.Values[outboxredis.FieldHeaders].(string)), &hs))
				assert.Equal(t, map[string]string{"traceparent": fakeTraceParent, "tenant": "acme"}, hs)
				return
			}
			ev := sdkEvent(t, []byte(msg.Values[outboxredis.FieldCloudEvent].(string)))
			assert.Equal(t, fakeTraceParent, ev.Extensions()["traceparent"], "the send span's context")
			assert.NotContains(t, ev.Extensions(), "tracestate")
		})
	}
}

// TestPublisherTelemetryErrors: end gets the error the handler returns,
// with its classification (permanent for an event that cannot be encoded,
// unavailable for a connection error, plain otherwise).
func TestPublisherTelemetryErrors(t *testing.T) {
	t.Parallel()
	for name, tc := range map[string]struct {
		client outboxredis.Client
		event  outbox.Event
		check  func(error) bool
	}{
		"not JSON":  {fakeClient{}, outbox.Event{ID: "x", Type: "t", Payload: json.RawMessage(`{`)}, outbox.IsPermanent},
		"EOF":       {fakeClient{err: io.EOF}, ceEvent("y"), outbox.IsUnavailable},
		"WRONGTYPE": {fakeClient{err: errors.New("WRONGTYPE Operation against a key holding the wrong kind of value")}, ceEvent("z"), func(err error) bool { return !outbox.IsPermanent(err) && !outbox.IsUnavailable(err) }},
	} {
		for _, f := range []wire.Format{wire.Native, wire.CloudEventsJSON} {
			t.Run(name+"/"+f.String(), func(t *testing.T) {
				t.Parallel()
				tel := newFakeTelemetry()
				h := newPublisher(t, tc.client, outboxredis.Config{Stream: "s", Format: f, Telemetry: tel}).Handler()
				err := h(t.Context(), tc.event)
				require.Error(t, err)
				assert.True(t, tc.check(err), "%v", err)
				sends := tel.sent()
				require.Len(t, sends, 1)
				assert.True(t, sends[0].ended)
				assert.Equal(t, err, sends[0].err, "end gets the handler's error")
				assert.Equal(t, "s", sends[0].op.Destination)
				assert.Empty(t, sends[0].op.ServerAddress, "a client without Options has no known address")
			})
		}
	}
}

// TestPublisherTelemetryFromContext: with Config.Telemetry nil, the one in
// the handler's context is used.
func TestPublisherTelemetryFromContext(t *testing.T) {
	t.Parallel()
	rdb := connect(t)
	stream := newKey(t, rdb)
	tel := newFakeTelemetry()
	h := newPublisher(t, rdb, outboxredis.Config{Stream: stream, Format: wire.CloudEvents}).Handler()
	require.NoError(t, h(wire.ContextWithTelemetry(t.Context(), tel), ceEvent("evt-ctx")))
	sends := tel.sent()
	require.Len(t, sends, 1)
	assert.Equal(t, stream, sends[0].op.Destination)
	ev := sdkEvent(t, []byte(onlyEntry(t, rdb, stream).Values[outboxredis.FieldCloudEvent].(string)))
	assert.Equal(t, fakeTraceParent, ev.Extensions()["traceparent"])
}

// TestConsumerTelemetry: the consumer starts a receive span per decoded
// entry with the stream, group and entry ID, given the decoded event (the
// producer's trace context in it); Handle runs in the span's context; end
// gets Consume's outcome. Config's Telemetry and, when nil, Run's
// context's are used.
func TestConsumerTelemetry(t *testing.T) {
	t.Parallel()
	for _, fromCtx := range []bool{false, true} {
		for _, f := range []wire.Format{wire.Native, wire.CloudEvents} {
			t.Run(f.String()+"/fromCtx="+strconv.FormatBool(fromCtx), func(t *testing.T) {
				t.Parallel()
				rdb := connect(t)
				host, port := serverOf(t, rdb)
				stream := newKey(t, rdb)
				db := consumerDB(t)
				sendTel := newFakeTelemetry()
				h := newPublisher(t, rdb, outboxredis.Config{Stream: stream, Format: f, Telemetry: sendTel}).Handler()
				ok, bad := ceEvent("evt-ok"), ceEvent("evt-bad")
				require.NoError(t, h(t.Context(), ok))
				require.NoError(t, h(t.Context(), bad))
				entries := entryIDs(t, rdb, stream)
				require.Len(t, entries, 2)

				tel := newFakeTelemetry()
				errBad := errors.New("refused")
				marks := make(chan any, 2)
				cfg := outboxredis.ConsumerConfig{Stream: stream, Handle: func(ctx context.Context, tx *gorm.DB, m outboxredis.Message) error {
					marks <- ctx.Value(ctxMark{})
					if m.Event.ID == bad.ID {
						return outbox.Permanent(errBad)
					}
					return tx.Create(&effect{MessageID: m.Event.ID}).Error
				}}
				ctx := context.Background()
				if fromCtx {
					ctx = wire.ContextWithTelemetry(ctx, tel)
				} else {
					cfg.Telemetry = tel
				}
				runConsumerIn(t, ctx, db, rdb, cfg)
				receive(t, tel.ended)
				receive(t, tel.ended)

				assert.Equal(t, 0, receive(t, marks), "Handle runs in the receive span's context")
				assert.Equal(t, 1, receive(t, marks))
				got := tel.received()
				require.Len(t, got, 2)
				for i, want := range []outbox.Event{ok, bad} {
					assert.Equal(t, wire.Operation{
						System: "redis", Destination: stream, ConsumerGroup: "billing", MessageID: entries[i],
						ServerAddress: host, ServerPort: port,
					}, got[i].op)
					want.Headers = map[string]string{"traceparent": fakeTraceParent, "tenant": "acme"}
					assert.Equal(t, want, got[i].event, "the decoded event, with the send span's trace context")
					assert.True(t, got[i].ended)
				}
				assert.NoError(t, got[0].err)
				assert.ErrorIs(t, got[1].err, errBad)
				assert.True(t, outbox.IsPermanent(got[1].err))
			})
		}
	}
}

// runConsumerIn is runConsumer with Run's context derived from parent.
func runConsumerIn(t *testing.T, parent context.Context, db *gorm.DB, rdb outboxredis.ConsumerClient, cfg outboxredis.ConsumerConfig) {
	t.Helper()
	cfg.Consumer, cfg.Group = "billing", "billing"
	cfg.Block = 100 * time.Millisecond
	cfg.Logger = (&logBuf{}).logger()
	c, err := outboxredis.NewConsumer(db, rdb, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(parent)
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case err := <-done:
			assert.NoError(t, err, "Run")
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after its context was cancelled")
		}
	})
}

// TestConsumerCloudEventsUndecodable: a cloudevent field that is no
// CloudEvents document, or a headers field beside it that is no JSON
// object, terminates the entry without calling Handle; the entry after
// them is consumed.
func TestConsumerCloudEventsUndecodable(t *testing.T) {
	t.Parallel()
	rdb := connect(t)
	stream := newKey(t, rdb)
	db := consumerDB(t)
	var logs logBuf
	var bad []string
	for _, values := range [][]any{
		{outboxredis.FieldCloudEvent, `{"id":"evt-x","type":"t"}`}, // no specversion
		{outboxredis.FieldCloudEvent, `{"specversion":"1.0","id":"evt-y","type":"t","source":"/s"}`, outboxredis.FieldHeaders, "[]"},
	} {
		id, err := rdb.XAdd(t.Context(), &goredis.XAddArgs{Stream: stream, Values: values}).Result()
		require.NoError(t, err)
		bad = append(bad, id)
	}
	good := ceEvent("evt-good")
	require.NoError(t, newPublisher(t, rdb, outboxredis.Config{Stream: stream, Format: wire.CloudEvents}).Handler()(t.Context(), good))
	var c calls
	runConsumer(t, db, rdb, outboxredis.ConsumerConfig{Stream: stream, Logger: logs.logger(), Handle: func(_ context.Context, _ *gorm.DB, m outboxredis.Message) error {
		c.add(m, m.Event.ID)
		return nil
	}})
	require.Eventually(t, func() bool { return c.get(good.ID) == 1 && pending(t, rdb, stream, "billing") == 0 }, wait, tick)
	assert.Len(t, c.messages(), 1, "Handle ran only for the good entry")
	out := logs.String()
	for _, id := range bad {
		assert.Regexp(t, `"entry_id":"`+id+`",("event_type":"t",)?"reason":"undecodable"`, out)
	}
}

func TestNewRefusesBadSource(t *testing.T) {
	t.Parallel()
	rdb := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = rdb.Close() })
	_, err := outboxredis.New(rdb, outboxredis.Config{Source: "/my orders"})
	assert.ErrorIs(t, err, wire.ErrSource)
}
