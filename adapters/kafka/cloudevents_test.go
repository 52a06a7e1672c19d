package kafka_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"maps"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	cekafka "github.com/cloudevents/sdk-go/protocol/kafka_sarama/v2"
	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/event"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/adapters/kafka"
	"github.com/gorm-outbox/outbox/wire"
)

const (
	ceTraceParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	ceTraceState  = "vendor=abc"
)

// ceEvent is an event with every field set: an idempotency key that is not
// its ID, trace context and a plain header, a payload with non-ASCII text.
func ceEvent(id string) outbox.Event {
	return outbox.Event{
		ID:             id,
		Type:           "order.created",
		AggregateType:  "order",
		AggregateID:    "42",
		IdempotencyKey: "key-" + id,
		Payload:        json.RawMessage(`{"total":12.5,"note":"crème brûlée","items":[1,2]}`),
		Headers:        map[string]string{"traceparent": ceTraceParent, "tracestate": ceTraceState, "x-tenant": "acme"},
		OccurredAt:     time.Date(2026, 5, 4, 3, 2, 1, 123456000, time.UTC),
	}
}

// sdkMessage is r as the CloudEvents SDK's Kafka binding reads a record:
// its headers by name (as sent, not case-folded), the content type from
// the "content-type" header.
func sdkMessage(r *kgo.Record) *cekafka.Message {
	h := make(map[string][]byte, len(r.Headers))
	for _, x := range r.Headers {
		h[x.Key] = x.Value
	}
	return cekafka.NewMessage(r.Value, string(h["content-type"]), h)
}

// ceSchema is the CloudEvents JSON schema, its formats (date-time,
// uri-reference) asserted.
func ceSchema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	c := jsonschema.NewCompiler()
	c.AssertFormat()
	s, err := c.Compile("../../wire/testdata/cloudevents.json")
	require.NoError(t, err)
	return s
}

func validate(t *testing.T, s *jsonschema.Schema, doc []byte) {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(doc))
	require.NoError(t, err)
	require.NoError(t, s.Validate(v), "%s", doc)
}

// TestCloudEventsRecord produces an event in both CloudEvents formats and
// reads the records back with the CloudEvents SDK's Kafka binding: every
// attribute is the event's, in the content mode the format names.
func TestCloudEventsRecord(t *testing.T) {
	t.Parallel()
	schema := ceSchema(t)
	for _, tc := range []struct {
		format   wire.Format
		source   string
		encoding binding.Encoding
		headers  []kgo.RecordHeader
	}{
		{
			format: wire.CloudEvents, encoding: binding.EncodingBinary,
			headers: []kgo.RecordHeader{
				{Key: "traceparent", Value: []byte(ceTraceParent)},
				{Key: "tracestate", Value: []byte(ceTraceState)},
				{Key: "x-tenant", Value: []byte("acme")},
				{Key: "ce_specversion", Value: []byte("1.0")},
				{Key: "ce_id", Value: []byte("evt-ce")},
				{Key: "ce_source", Value: []byte(wire.DefaultSource)},
				{Key: "ce_type", Value: []byte("order.created")},
				{Key: "ce_subject", Value: []byte("order/42")},
				{Key: "ce_time", Value: []byte("2026-05-04T03:02:01.123456Z")},
				{Key: "ce_aggregatetype", Value: []byte("order")},
				{Key: "ce_aggregateid", Value: []byte("42")},
				{Key: "ce_idempotencykey", Value: []byte("key-evt-ce")},
				{Key: "ce_traceparent", Value: []byte(ceTraceParent)},
				{Key: "ce_tracestate", Value: []byte(ceTraceState)},
				{Key: "ce_partitionkey", Value: []byte("42")},
				{Key: "content-type", Value: []byte("application/json")},
			},
		},
		{
			format: wire.CloudEventsJSON, source: "/orders", encoding: binding.EncodingStructured,
			headers: []kgo.RecordHeader{
				{Key: "traceparent", Value: []byte(ceTraceParent)},
				{Key: "tracestate", Value: []byte(ceTraceState)},
				{Key: "x-tenant", Value: []byte("acme")},
				{Key: "content-type", Value: []byte("application/cloudevents+json")},
			},
		},
	} {
		t.Run(tc.format.String(), func(t *testing.T) {
			t.Parallel()
			c := newCluster(t)
			p := newProducer(t, c.ListenAddrs(), kafka.Config{Format: tc.format, Source: tc.source})
			e := ceEvent("evt-ce")
			e.Headers["Content-Type"] = "text/plain" // the adapter's own header
			e.Headers["ce_id"] = "spoofed"           // poses as an attribute
			require.NoError(t, p.Publish(t.Context(), e))
			r := consume(t, c.ListenAddrs(), kafka.DefaultTopic, 1)[0]
			assert.Equal(t, "42", string(r.Key))
			assert.Equal(t, tc.headers, r.Headers)

			m := sdkMessage(r)
			require.Equal(t, tc.encoding, m.ReadEncoding())
			ev, err := binding.ToEvent(t.Context(), m)
			require.NoError(t, err)
			require.NoError(t, ev.Validate())
			wantSource := tc.source
			if wantSource == "" {
				wantSource = wire.DefaultSource
			}
			assert.Equal(t, "1.0", ev.SpecVersion())
			assert.Equal(t, "evt-ce", ev.ID())
			assert.Equal(t, wantSource, ev.Source())
			assert.Equal(t, "order.created", ev.Type())
			assert.Equal(t, "order/42", ev.Subject())
			assert.True(t, ev.Time().Equal(e.OccurredAt), "time %v", ev.Time())
			assert.Equal(t, "application/json", ev.DataContentType())
			assert.JSONEq(t, string(e.Payload.(json.RawMessage)), string(ev.Data()))
			assert.Equal(t, map[string]any{
				"aggregatetype": "order", "aggregateid": "42", "idempotencykey": "key-evt-ce",
				"traceparent": ceTraceParent, "tracestate": ceTraceState, "partitionkey": "42",
			}, ev.Extensions())

			if tc.encoding == binding.EncodingStructured {
				validate(t, schema, r.Value)
				// The schema does check: a bad time fails it.
				bad := bytes.Replace(r.Value, []byte(`"2026-05-04T03:02:01.123456Z"`), []byte(`"yesterday"`), 1)
				v, err := jsonschema.UnmarshalJSON(bytes.NewReader(bad))
				require.NoError(t, err)
				require.Error(t, schema.Validate(v))
				var doc event.Event
				require.NoError(t, json.Unmarshal(r.Value, &doc))
				assert.Equal(t, ev.Context.AsV1(), doc.Context.AsV1())
				assert.JSONEq(t, string(ev.Data()), string(doc.Data()))
			}
		})
	}
}

// TestCloudEventsNoKey: without a record key there is no partitionkey; the
// structured document still validates.
func TestCloudEventsNoKey(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	p := newProducer(t, c.ListenAddrs(), kafka.Config{Format: wire.CloudEventsJSON})
	require.NoError(t, p.Publish(t.Context(), outbox.Event{ID: "evt-bare", Type: "x", Payload: map[string]int{"n": 1}}))
	r := consume(t, c.ListenAddrs(), kafka.DefaultTopic, 1)[0]
	assert.Nil(t, r.Key)
	validate(t, ceSchema(t), r.Value)
	ev, err := binding.ToEvent(t.Context(), sdkMessage(r))
	require.NoError(t, err)
	assert.Equal(t, "evt-bare", ev.ID())
	assert.Empty(t, ev.Extensions())
}

func TestUnknownFormat(t *testing.T) {
	t.Parallel()
	_, err := kafka.New(kafka.Config{Format: wire.Format(9)})
	require.ErrorIs(t, err, wire.ErrFormat)
}

// TestConsumerCloudEvents: the Consumer applies records of both
// CloudEvents formats once each (a re-sent copy is skipped), under the
// event's ID, with the event decoded as it was published.
func TestConsumerCloudEvents(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	db := consumerDB(t)
	events := map[string]outbox.Event{}
	for _, f := range []wire.Format{wire.CloudEvents, wire.CloudEventsJSON} {
		p := newProducer(t, c.ListenAddrs(), kafka.Config{Format: f, Source: "/orders"})
		e := ceEvent("evt-" + f.String())
		events[e.ID] = e
		publish(t, p, e, e) // the relay's re-send: a second record
	}
	var mu sync.Mutex
	got := map[string][]outbox.Event{}
	cons := newConsumer(t, db, c, kafka.ConsumerConfig{Handle: func(_ context.Context, tx *gorm.DB, m kafka.Message) error {
		mu.Lock()
		got[m.Event.ID] = append(got[m.Event.ID], m.Event)
		mu.Unlock()
		return writeEffect(tx, m)
	}})
	start(t, cons)
	require.Eventually(t, func() bool { return allCommitted(t, c, "g", kafka.DefaultTopic) }, 15*time.Second, 20*time.Millisecond)

	assert.Equal(t, map[string]int{"evt-cloudevents": 1, "evt-cloudevents-json": 1}, effects(t, db))
	var ids []string
	require.NoError(t, db.Raw(`SELECT message_id FROM outbox_inbox WHERE consumer = ? ORDER BY message_id`, "billing").Scan(&ids).Error)
	assert.Equal(t, []string{"evt-cloudevents", "evt-cloudevents-json"}, ids, "the message ID is the event ID")
	mu.Lock()
	defer mu.Unlock()
	for id, want := range events {
		require.Len(t, got[id], 1, id)
		e := got[id][0]
		assert.Equal(t, want.ID, e.ID)
		assert.Equal(t, want.Type, e.Type)
		assert.Equal(t, want.AggregateType, e.AggregateType)
		assert.Equal(t, want.AggregateID, e.AggregateID)
		assert.Equal(t, want.IdempotencyKey, e.IdempotencyKey)
		assert.True(t, want.OccurredAt.Equal(e.OccurredAt), "%s: %v", id, e.OccurredAt)
		assert.Equal(t, want.Headers, e.Headers, id)
		payload, ok := e.Payload.(json.RawMessage)
		require.True(t, ok, "%T", e.Payload)
		assert.JSONEq(t, string(want.Payload.(json.RawMessage)), string(payload))
	}
}

// fakeTraceParent is the trace context the fake Telemetry's send span has.
const (
	fakeTraceParent = "00-11111111111111111111111111111111-2222222222222222-01"
	fakeTraceState  = "fake=1"
)

type spanKey struct{}

type telCall struct {
	op wire.Operation
	e  outbox.Event
}

// fakeTelemetry records the spans an adapter starts and how they end.
type fakeTelemetry struct {
	mu                 sync.Mutex
	sends, receives    []telCall
	sendEnds, recvEnds []error
}

func (f *fakeTelemetry) StartSend(ctx context.Context, op wire.Operation, e outbox.Event) (context.Context, outbox.Event, func(error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.sends = append(f.sends, telCall{op, e})
	e.Headers = maps.Clone(e.Headers)
	if e.Headers == nil {
		e.Headers = map[string]string{}
	}
	e.Headers["traceparent"], e.Headers["tracestate"] = fakeTraceParent, fakeTraceState
	var once sync.Once
	return ctx, e, func(err error) {
		once.Do(func() {
			f.mu.Lock()
			defer f.mu.Unlock()
			f.sendEnds = append(f.sendEnds, err)
		})
	}
}

func (f *fakeTelemetry) StartReceive(ctx context.Context, op wire.Operation, e outbox.Event) (context.Context, func(error)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.receives = append(f.receives, telCall{op, e})
	n := len(f.receives)
	return context.WithValue(ctx, spanKey{}, n), func(err error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		f.recvEnds = append(f.recvEnds, err)
	}
}

func (f *fakeTelemetry) snapshot() (sends, receives []telCall, sendEnds, recvEnds []error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]telCall(nil), f.sends...), append([]telCall(nil), f.receives...),
		append([]error(nil), f.sendEnds...), append([]error(nil), f.recvEnds...)
}

// TestTelemetrySend: each produce starts a send span with the topic and
// the broker, the record carries the span's trace context (as a header,
// and as the CloudEvents extension), and the span ends with Publish's
// error. A Telemetry in ctx is used when Config has none.
func TestTelemetrySend(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	seeds := c.ListenAddrs()
	host, portText, err := net.SplitHostPort(seeds[0])
	require.NoError(t, err)
	port, err := strconv.Atoi(portText)
	require.NoError(t, err)
	wantOp := wire.Operation{System: "kafka", Destination: kafka.DefaultTopic, ServerAddress: host, ServerPort: port}

	for i, f := range []wire.Format{wire.Native, wire.CloudEvents, wire.CloudEventsJSON} {
		tel := &fakeTelemetry{}
		p := newProducer(t, seeds, kafka.Config{Format: f, Telemetry: tel})
		e := ceEvent("evt-tel-" + f.String())
		require.NoError(t, p.Publish(t.Context(), e))
		assert.Equal(t, ceTraceParent, e.Headers["traceparent"], "the caller's event is left as it was")

		// A send that fails: its span ends with the error.
		bad := ceEvent("evt-bad-" + f.String())
		bad.Payload = json.RawMessage(`{"broken":`)
		badErr := p.Publish(t.Context(), bad)
		require.True(t, outbox.IsPermanent(badErr))

		sends, _, ends, _ := tel.snapshot()
		require.Len(t, sends, 2)
		assert.Equal(t, wantOp, sends[0].op)
		assert.Equal(t, e.ID, sends[0].e.ID)
		assert.Equal(t, ceTraceParent, sends[0].e.Headers["traceparent"], "StartSend gets the event's own trace context")
		require.Len(t, ends, 2)
		assert.NoError(t, ends[0])
		assert.Equal(t, badErr, ends[1], "the span ends with Publish's error")
		assert.True(t, outbox.IsPermanent(ends[1]))

		r := consume(t, seeds, kafka.DefaultTopic, i+1)[i]
		assert.Equal(t, fakeTraceParent, header(r, "traceparent"), f)
		assert.Equal(t, fakeTraceState, header(r, "tracestate"), f)
		switch f {
		case wire.CloudEvents:
			assert.Equal(t, fakeTraceParent, header(r, "ce_traceparent"))
			assert.Equal(t, fakeTraceState, header(r, "ce_tracestate"))
		case wire.CloudEventsJSON:
			var doc map[string]any
			require.NoError(t, json.Unmarshal(r.Value, &doc))
			assert.Equal(t, fakeTraceParent, doc["traceparent"])
			assert.Equal(t, fakeTraceState, doc["tracestate"])
		}
		if f != wire.Native {
			ev, err := binding.ToEvent(t.Context(), sdkMessage(r))
			require.NoError(t, err)
			assert.Equal(t, fakeTraceParent, ev.Extensions()["traceparent"])
		}
	}

	// No Telemetry in Config: the one in ctx.
	tel := &fakeTelemetry{}
	p := newProducer(t, seeds, kafka.Config{Format: wire.CloudEvents})
	require.NoError(t, p.Publish(wire.ContextWithTelemetry(t.Context(), tel), ceEvent("evt-tel-ctx")))
	sends, _, ends, _ := tel.snapshot()
	require.Len(t, sends, 1)
	assert.Equal(t, wantOp, sends[0].op)
	assert.Equal(t, []error{nil}, ends)
	r := consume(t, seeds, kafka.DefaultTopic, 4)[3]
	assert.Equal(t, "evt-tel-ctx", header(r, "ce_id"))
	assert.Equal(t, fakeTraceParent, header(r, "ce_traceparent"))
}

// TestTelemetryReceive: the Consumer starts a process span for each attempt
// at a record, with the decoded event (its trace context), runs Handle in
// the span's context and ends the span with Consume's outcome; its
// Telemetry is ConsumerConfig's or else the one in Run's context.
func TestTelemetryReceive(t *testing.T) {
	t.Parallel()
	for _, fromCtx := range []bool{false, true} {
		t.Run(map[bool]string{false: "config", true: "context"}[fromCtx], func(t *testing.T) {
			t.Parallel()
			c := newCluster(t)
			db := consumerDB(t)
			p := newProducer(t, c.ListenAddrs(), kafka.Config{Format: wire.CloudEventsJSON})
			e := ceEvent("evt-recv")
			publish(t, p, e)

			tel := &fakeTelemetry{}
			boom := errors.New("boom")
			var mu sync.Mutex
			var spans []any
			handle := func(ctx context.Context, tx *gorm.DB, m kafka.Message) error {
				mu.Lock()
				defer mu.Unlock()
				spans = append(spans, ctx.Value(spanKey{}))
				if len(spans) == 1 {
					return boom
				}
				return writeEffect(tx, m)
			}
			cfg := kafka.ConsumerConfig{Handle: handle, RetryDelay: 10 * time.Millisecond}
			ctx := context.Background()
			if fromCtx {
				ctx = wire.ContextWithTelemetry(ctx, tel)
			} else {
				cfg.Telemetry = tel
			}
			cons := newConsumer(t, db, c, cfg)
			ctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() { done <- cons.Run(ctx) }()
			t.Cleanup(func() {
				cancel()
				select {
				case err := <-done:
					assert.NoError(t, err)
				case <-time.After(20 * time.Second):
					t.Error("the consumer did not stop")
				}
			})
			require.Eventually(t, func() bool {
				_, _, _, ends := tel.snapshot()
				return len(ends) == 2
			}, 15*time.Second, 10*time.Millisecond)

			_, recvs, sendEnds, ends := tel.snapshot()
			assert.Empty(t, sendEnds)
			require.Len(t, recvs, 2, "one span per attempt")
			for _, r := range recvs {
				assert.Equal(t, wire.Operation{System: "kafka", Destination: kafka.DefaultTopic, ConsumerGroup: "g"}, r.op)
				assert.Equal(t, e.ID, r.e.ID)
				assert.Equal(t, ceTraceParent, r.e.Headers["traceparent"])
				assert.Equal(t, ceTraceState, r.e.Headers["tracestate"])
			}
			require.ErrorIs(t, ends[0], boom, "the first attempt's span ends with Handle's error")
			assert.NoError(t, ends[1])
			mu.Lock()
			assert.Equal(t, []any{1, 2}, spans, "Handle runs in the span's context")
			mu.Unlock()
			assert.Equal(t, map[string]int{"evt-recv": 1}, effects(t, db))
		})
	}
}

func TestBadSource(t *testing.T) {
	t.Parallel()
	_, err := kafka.New(kafka.Config{Source: "/my orders"})
	require.ErrorIs(t, err, wire.ErrSource)
}
