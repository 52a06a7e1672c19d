package rabbitmq

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/cloudevents/sdk-go/v2/binding"
	"github.com/cloudevents/sdk-go/v2/binding/format"
	"github.com/cloudevents/sdk-go/v2/binding/spec"
	"github.com/cloudevents/sdk-go/v2/event"
	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/wire"
)

// ceEvent is an event with every field set: an idempotency key that is not
// the ID, trace context and a plain header, a JSON payload.
func ceEvent(id string) outbox.Event {
	return outbox.Event{
		ID: id, Type: "order.created",
		AggregateType: "order", AggregateID: "42", IdempotencyKey: "order-42-created-" + id,
		OccurredAt: time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC),
		Headers: map[string]string{
			"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			"tracestate":  "congo=t61rcWkgMzE",
			"tenant":      "acme",
		},
		Payload: json.RawMessage(`{"total":"9.99 €","items":[1,2]}`),
	}
}

// amqpMessage is a CloudEvents SDK binding.Message over an AMQP 0-9-1
// delivery. The SDK's AMQP protocol module speaks AMQP 1.0 (and is not
// available in this workspace), so the test reads deliveries with the
// SDK's own binding machinery, as its protocol modules (nats_jetstream,
// kafka_sarama) are written: spec.WithPrefix maps the cloudEvents_*
// headers to attributes and binding.ToEvent builds the event. Nothing of
// package wire is used to read, so the SDK is the judge of what was sent.
type amqpMessage struct {
	d        amqp.Delivery
	encoding binding.Encoding
}

const amqpPrefix = "cloudEvents_"

var amqpSpecs = spec.WithPrefix(amqpPrefix)

var (
	_ binding.Message               = (*amqpMessage)(nil)
	_ binding.MessageMetadataReader = (*amqpMessage)(nil)
)

// newAMQPMessage tells the mode as the AMQP binding does: structured by the
// content type, binary by a specversion header.
func newAMQPMessage(d amqp.Delivery) *amqpMessage {
	m := &amqpMessage{d: d, encoding: binding.EncodingUnknown}
	switch {
	case format.Lookup(d.ContentType) != nil:
		m.encoding = binding.EncodingStructured
	case m.header(amqpSpecs.PrefixedSpecVersionName()) != nil:
		m.encoding = binding.EncodingBinary
	}
	return m
}

// header returns the string value of the header named name, in any case.
func (m *amqpMessage) header(name string) any {
	for k, v := range m.d.Headers {
		if strings.EqualFold(k, name) {
			if s, ok := v.(string); ok {
				return s
			}
		}
	}
	return nil
}

func (m *amqpMessage) ReadEncoding() binding.Encoding { return m.encoding }

func (m *amqpMessage) ReadStructured(ctx context.Context, w binding.StructuredWriter) error {
	if m.encoding != binding.EncodingStructured {
		return binding.ErrNotStructured
	}
	return w.SetStructuredEvent(ctx, format.Lookup(m.d.ContentType), bytes.NewReader(m.d.Body))
}

func (m *amqpMessage) ReadBinary(_ context.Context, w binding.BinaryWriter) error {
	v := m.version()
	if m.encoding != binding.EncodingBinary || v == nil {
		return binding.ErrNotBinary
	}
	for k, val := range m.d.Headers {
		if len(k) <= len(amqpPrefix) || !strings.EqualFold(k[:len(amqpPrefix)], amqpPrefix) {
			continue
		}
		s, ok := val.(string)
		if !ok {
			return fmt.Errorf("header %s: %T, not a string", k, val)
		}
		var err error
		if attr := v.Attribute(k); attr != nil {
			err = w.SetAttribute(attr, s)
		} else {
			err = w.SetExtension(strings.ToLower(k[len(amqpPrefix):]), s)
		}
		if err != nil {
			return err
		}
	}
	// The binding maps datacontenttype to the content-type property.
	if m.d.ContentType != "" {
		if err := w.SetAttribute(v.AttributeFromKind(spec.DataContentType), m.d.ContentType); err != nil {
			return err
		}
	}
	return w.SetData(bytes.NewReader(m.d.Body))
}

func (m *amqpMessage) GetAttribute(k spec.Kind) (spec.Attribute, any) {
	v := m.version()
	if v == nil {
		return nil, nil
	}
	attr := v.AttributeFromKind(k)
	if attr == nil {
		return nil, nil
	}
	if k == spec.DataContentType && m.d.ContentType != "" {
		return attr, m.d.ContentType
	}
	return attr, m.header(attr.PrefixedName())
}

func (m *amqpMessage) GetExtension(name string) any { return m.header(amqpPrefix + name) }

func (m *amqpMessage) version() spec.Version {
	s, _ := m.header(amqpSpecs.PrefixedSpecVersionName()).(string)
	if s == "" {
		return nil
	}
	return amqpSpecs.Version(s)
}

func (m *amqpMessage) Finish(error) error { return nil }

// schema is the CloudEvents JSON schema the wire package ships.
func schema(t *testing.T) *jsonschema.Schema {
	t.Helper()
	f, err := os.Open("../../wire/testdata/cloudevents.json")
	require.NoError(t, err)
	defer func() { _ = f.Close() }()
	doc, err := jsonschema.UnmarshalJSON(f)
	require.NoError(t, err)
	c := jsonschema.NewCompiler()
	require.NoError(t, c.AddResource("cloudevents.json", doc))
	s, err := c.Compile("cloudevents.json")
	require.NoError(t, err)
	return s
}

// validate checks a structured document against the schema.
func validate(t *testing.T, s *jsonschema.Schema, body []byte) {
	t.Helper()
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(body))
	require.NoError(t, err)
	require.NoError(t, s.Validate(inst), "%s", body)
}

// assertCloudEvent compares every attribute the SDK read to e's.
func assertCloudEvent(t *testing.T, e outbox.Event, source string, ce *event.Event) {
	t.Helper()
	require.NoError(t, ce.Validate())
	assert.Equal(t, "1.0", ce.SpecVersion())
	assert.Equal(t, e.ID, ce.ID())
	assert.Equal(t, source, ce.Source())
	assert.Equal(t, e.Type, ce.Type())
	assert.Equal(t, "order/42", ce.Subject())
	assert.True(t, e.OccurredAt.Equal(ce.Time()), "time %v, want %v", ce.Time(), e.OccurredAt)
	assert.Equal(t, "application/json", ce.DataContentType())
	assert.JSONEq(t, string(e.Payload.(json.RawMessage)), string(ce.Data()))
	assert.Equal(t, map[string]any{
		"aggregatetype":  e.AggregateType,
		"aggregateid":    e.AggregateID,
		"idempotencykey": e.IdempotencyKey,
		"traceparent":    e.Headers["traceparent"],
		"tracestate":     e.Headers["tracestate"],
	}, ce.Extensions())
}

// TestCloudEventsSDK publishes an event in both CloudEvents formats and
// reads the deliveries with the CloudEvents SDK.
func TestCloudEventsSDK(t *testing.T) {
	t.Parallel()
	s := schema(t)
	for _, tc := range []struct {
		format   wire.Format
		source   string // Config.Source
		want     string // the source attribute
		encoding binding.Encoding
		ctype    string
	}{
		{wire.CloudEvents, "/orders", "/orders", binding.EncodingBinary, "application/json"},
		{wire.CloudEventsJSON, "", wire.DefaultSource, binding.EncodingStructured, "application/cloudevents+json"},
	} {
		t.Run(tc.format.String(), func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			d := f.consume("#")
			p := f.publisher(Config{Format: tc.format, Source: tc.source})
			e := ceEvent("evt-ce-" + tc.format.String())
			require.NoError(t, p.Publish(t.Context(), e))
			m := receive(t, d)

			assert.Equal(t, tc.ctype, m.ContentType)
			assert.Equal(t, e.ID, m.MessageId, "the AMQP properties stay as in Native")
			assert.Equal(t, e.Type, m.Type)
			assert.Equal(t, amqp.Persistent, m.DeliveryMode)
			assert.Equal(t, "acme", m.Headers["tenant"], "a plain event header is an AMQP header")
			assert.Equal(t, e.Headers["traceparent"], m.Headers["traceparent"], "the trace context is an AMQP header too")
			assert.Equal(t, e.Headers["tracestate"], m.Headers["tracestate"])
			for k := range m.Headers {
				assert.False(t, strings.HasPrefix(strings.ToLower(k), "outbox-"), "no Native header in CloudEvents: %s", k)
			}

			msg := newAMQPMessage(m)
			require.Equal(t, tc.encoding, msg.ReadEncoding())
			ce, err := binding.ToEvent(t.Context(), msg)
			require.NoError(t, err)
			assertCloudEvent(t, e, tc.want, ce)

			if tc.encoding == binding.EncodingStructured {
				validate(t, s, m.Body)
				var direct event.Event
				require.NoError(t, json.Unmarshal(m.Body, &direct))
				assertCloudEvent(t, e, tc.want, &direct)
				assert.NotContains(t, m.Headers, "cloudEvents_id", "structured mode has no attribute headers")
			} else {
				assert.JSONEq(t, string(e.Payload.(json.RawMessage)), string(m.Body), "binary mode: the body is the payload")
				assert.Equal(t, e.ID, m.Headers["cloudEvents_id"])
			}
		})
	}
}

// TestCloudEventsJSONMinimal: an event with only the required fields is a
// valid structured document too.
func TestCloudEventsJSONMinimal(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.consume("#")
	p := f.publisher(Config{Format: wire.CloudEventsJSON})
	e := outbox.Event{ID: "evt-min", Type: "order.noted", IdempotencyKey: "evt-min", Payload: map[string]int{"n": 1}}
	require.NoError(t, p.Publish(t.Context(), e))
	m := receive(t, d)
	validate(t, schema(t), m.Body)
	ce, err := binding.ToEvent(t.Context(), newAMQPMessage(m))
	require.NoError(t, err)
	require.NoError(t, ce.Validate())
	assert.Equal(t, "evt-min", ce.ID())
	assert.Empty(t, ce.Subject())
	assert.Empty(t, ce.Extensions(), "an idempotency key equal to the ID is left out")
	assert.JSONEq(t, `{"n":1}`, string(ce.Data()))
}

func TestUnknownFormat(t *testing.T) {
	t.Parallel()
	for _, f := range []wire.Format{9, -1} {
		p, err := New(Config{Format: f})
		require.ErrorIs(t, err, wire.ErrFormat)
		assert.Nil(t, p)
	}
}

// inboxIDs returns the message IDs the inbox recorded for consumer.
func inboxIDs(t *testing.T, db *gorm.DB, consumer string) []string {
	t.Helper()
	var ids []string
	require.NoError(t, db.Raw("SELECT message_id FROM outbox_inbox WHERE consumer = ? ORDER BY message_id", consumer).Scan(&ids).Error)
	return ids
}

// TestConsumerCloudEvents: the Consumer applies a message of either
// CloudEvents format once, recorded under the event ID, and hands Handle
// the event as it was published.
func TestConsumerCloudEvents(t *testing.T) {
	t.Parallel()
	for _, format := range []wire.Format{wire.CloudEvents, wire.CloudEventsJSON} {
		t.Run(format.String(), func(t *testing.T) {
			t.Parallel()
			r := newConsumerRig(t)
			p := r.publisher(Config{Format: format, Source: "/orders"})
			var (
				mu   sync.Mutex
				seen []outbox.Event
			)
			c := r.consumer(Config{}, ConsumerConfig{Handle: func(_ context.Context, tx *gorm.DB, m Message) error {
				mu.Lock()
				seen = append(seen, m.Event)
				mu.Unlock()
				return applyEffect(tx, m)
			}})
			var a acks
			c.beforeAck = a.hook
			rn := run(t, c)

			e := ceEvent("evt-consumed-" + format.String())
			// Twice, as a relay that lost a confirm publishes it.
			require.NoError(t, p.Publish(t.Context(), e))
			require.NoError(t, p.Publish(t.Context(), e))
			a.waitFor(t, 2)
			rn.stop(t)

			assert.Equal(t, []string{e.ID}, effects(t, r.db), "applied once")
			assert.Equal(t, []string{e.ID}, inboxIDs(t, r.db, r.name), "the message ID is the event ID")
			assert.Zero(t, r.settled(r.queue), "both messages acknowledged")
			require.Len(t, seen, 1)
			got := seen[0]
			assert.Equal(t, e.ID, got.ID)
			assert.Equal(t, e.Type, got.Type)
			assert.Equal(t, e.AggregateType, got.AggregateType)
			assert.Equal(t, e.AggregateID, got.AggregateID)
			assert.Equal(t, e.IdempotencyKey, got.IdempotencyKey)
			assert.True(t, e.OccurredAt.Equal(got.OccurredAt))
			assert.Equal(t, e.Headers, got.Headers)
			raw, ok := got.Payload.(json.RawMessage)
			require.True(t, ok, "%T", got.Payload)
			assert.JSONEq(t, string(e.Payload.(json.RawMessage)), string(raw))
		})
	}
}

// TestConsumerForeignCloudEvent: a structured event another producer built
// with the CloudEvents SDK is applied under its id.
func TestConsumerForeignCloudEvent(t *testing.T) {
	t.Parallel()
	r := newConsumerRig(t)
	got := make(chan outbox.Event, 1)
	c := r.consumer(Config{}, ConsumerConfig{Handle: func(_ context.Context, tx *gorm.DB, m Message) error {
		got <- m.Event
		return applyEffect(tx, m)
	}})
	run(t, c)

	ce := event.New()
	ce.SetID("sdk-1")
	ce.SetSource("/billing")
	ce.SetType("invoice.paid")
	require.NoError(t, ce.SetData(event.ApplicationJSON, map[string]int{"cents": 999}))
	body, err := json.Marshal(ce)
	require.NoError(t, err)
	r.publishRaw(amqp.Publishing{ContentType: event.ApplicationCloudEventsJSON, Body: body})

	select {
	case e := <-got:
		assert.Equal(t, "sdk-1", e.ID)
		assert.Equal(t, "invoice.paid", e.Type)
		assert.JSONEq(t, `{"cents":999}`, string(e.Payload.(json.RawMessage)))
	case <-time.After(10 * time.Second):
		t.Fatal("the SDK's event was not handled")
	}
}

// fakeTraceParent is what the fake Telemetry puts on every message it
// sees sent.
const fakeTraceParent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"

type spanKey struct{}

// span is one StartSend or StartReceive the fake saw, and its end.
type span struct {
	op    wire.Operation
	event outbox.Event
	ended chan error // receives end's error, once
}

// fakeTelemetry records what the adapter tells a wire.Telemetry.
type fakeTelemetry struct {
	mu       sync.Mutex
	sends    []*span
	receives []*span
}

func (f *fakeTelemetry) StartSend(ctx context.Context, op wire.Operation, e outbox.Event) (context.Context, outbox.Event, func(error)) {
	s := &span{op: op, event: e, ended: make(chan error, 1)}
	f.mu.Lock()
	f.sends = append(f.sends, s)
	f.mu.Unlock()
	e.Headers = maps.Clone(e.Headers)
	if e.Headers == nil {
		e.Headers = map[string]string{}
	}
	e.Headers["traceparent"] = fakeTraceParent
	return context.WithValue(ctx, spanKey{}, s), e, func(err error) { s.ended <- err }
}

func (f *fakeTelemetry) StartReceive(ctx context.Context, op wire.Operation, e outbox.Event) (context.Context, func(error)) {
	s := &span{op: op, event: e, ended: make(chan error, 1)}
	f.mu.Lock()
	f.receives = append(f.receives, s)
	f.mu.Unlock()
	return context.WithValue(ctx, spanKey{}, s), func(err error) { s.ended <- err }
}

// spans returns the sends or receives seen so far.
func (f *fakeTelemetry) spans(receives bool) []*span {
	f.mu.Lock()
	defer f.mu.Unlock()
	if receives {
		return append([]*span(nil), f.receives...)
	}
	return append([]*span(nil), f.sends...)
}

// only returns the single span seen, failing unless there is exactly one.
func (f *fakeTelemetry) only(t *testing.T, receives bool) *span {
	t.Helper()
	s := f.spans(receives)
	require.Len(t, s, 1)
	return s[0]
}

// end returns the error s was ended with, failing if it is not ended
// within 10 s or ended twice.
func (s *span) end(t *testing.T) error {
	t.Helper()
	select {
	case err := <-s.ended:
		select {
		case <-s.ended:
			t.Error("span ended twice")
		default:
		}
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("span not ended")
		return nil
	}
}

// TestPublisherTelemetry: every format carries the send span's trace
// context; the span gets the Operation and ends with Publish's error.
func TestPublisherTelemetry(t *testing.T) {
	t.Parallel()
	uri, err := amqp.ParseURI(testURL(t))
	require.NoError(t, err)

	for _, format := range []wire.Format{wire.Native, wire.CloudEvents, wire.CloudEventsJSON} {
		t.Run(format.String(), func(t *testing.T) {
			t.Parallel()
			f := newFixture(t)
			d := f.consume("#")
			tel := &fakeTelemetry{}
			p := f.publisher(Config{Format: format, Telemetry: tel})
			e := ceEvent("evt-tel-" + format.String())
			require.NoError(t, p.Publish(t.Context(), e))
			s := tel.only(t, false)
			assert.NoError(t, s.end(t))
			assert.Equal(t, wire.Operation{System: "rabbitmq", Destination: f.exchange, ServerAddress: uri.Host, ServerPort: uri.Port}, s.op)
			assert.Equal(t, e.ID, s.event.ID)
			assert.Equal(t, e.Headers["traceparent"], s.event.Headers["traceparent"], "StartSend sees the event's own trace context")

			m := receive(t, d)
			assert.Equal(t, fakeTraceParent, m.Headers["traceparent"], "the protocol header is the send span's")
			switch format {
			case wire.CloudEvents:
				assert.Equal(t, fakeTraceParent, m.Headers["cloudEvents_traceparent"])
			case wire.CloudEventsJSON:
				var doc map[string]any
				require.NoError(t, json.Unmarshal(m.Body, &doc))
				assert.Equal(t, fakeTraceParent, doc["traceparent"])
			}
			assert.Equal(t, "congo=t61rcWkgMzE", m.Headers["tracestate"])
		})
	}

	t.Run("failure", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t) // no queue bound: the message is returned
		tel := &fakeTelemetry{}
		p := f.publisher(Config{Format: wire.CloudEvents, Telemetry: tel})
		err := p.Publish(t.Context(), ceEvent("evt-tel-lost"))
		require.ErrorIs(t, err, ErrUnroutable)
		assert.Equal(t, err, tel.only(t, false).end(t), "end gets the error Publish returns")

		// A payload that is not JSON: permanent, and the span says so.
		err = p.Publish(t.Context(), outbox.Event{ID: "evt-tel-bad", Type: "x", Payload: json.RawMessage(`{`)})
		require.True(t, outbox.IsPermanent(err))
		sends := tel.spans(false)
		require.Len(t, sends, 2)
		ended := sends[1].end(t)
		assert.True(t, outbox.IsPermanent(ended))
		assert.Equal(t, err, ended)
	})

	t.Run("from context", func(t *testing.T) {
		t.Parallel()
		f := newFixture(t)
		d := f.consume("#")
		tel := &fakeTelemetry{}
		p := f.publisher(Config{Format: wire.CloudEvents}) // no Telemetry in Config
		require.NoError(t, p.Publish(wire.ContextWithTelemetry(t.Context(), tel), ceEvent("evt-tel-ctx")))
		assert.NoError(t, tel.only(t, false).end(t))
		m := receive(t, d)
		assert.Equal(t, fakeTraceParent, m.Headers["traceparent"])
		assert.Equal(t, fakeTraceParent, m.Headers["cloudEvents_traceparent"])

		// Config's Telemetry wins over the context's.
		own := &fakeTelemetry{}
		p2 := f.publisher(Config{Telemetry: own})
		require.NoError(t, p2.Publish(wire.ContextWithTelemetry(t.Context(), tel), ceEvent("evt-tel-own")))
		assert.Len(t, own.spans(false), 1)
		assert.Len(t, tel.spans(false), 1)
		receive(t, d)
	})
}

// TestConsumerTelemetry: the Consumer starts a receive span with the
// decoded event, runs Handle in its context and ends it with Consume's
// outcome; a Telemetry in Run's context serves when the config has none.
func TestConsumerTelemetry(t *testing.T) {
	t.Parallel()
	for _, fromCtx := range []bool{false, true} {
		t.Run(fmt.Sprintf("from context %v", fromCtx), func(t *testing.T) {
			t.Parallel()
			r := newConsumerRig(t)
			p := r.publisher(Config{Format: wire.CloudEvents})
			tel := &fakeTelemetry{}
			errBad := errors.New("bad order")
			inSpan := make(chan *span, 2)
			cfg := ConsumerConfig{Handle: func(ctx context.Context, tx *gorm.DB, m Message) error {
				s, _ := ctx.Value(spanKey{}).(*span)
				inSpan <- s
				if m.Event.ID == "evt-recv-bad" {
					return outbox.Permanent(errBad)
				}
				return applyEffect(tx, m)
			}}
			ctx := context.Background()
			if fromCtx {
				ctx = wire.ContextWithTelemetry(ctx, tel)
			} else {
				cfg.Telemetry = tel
			}
			runCtx(t, ctx, r.consumer(Config{}, cfg))

			e := ceEvent("evt-recv-ok")
			require.NoError(t, p.Publish(t.Context(), e))
			var s *span
			select {
			case s = <-inSpan:
			case <-time.After(10 * time.Second):
				t.Fatal("not handled")
			}
			require.NotNil(t, s, "Handle runs in the receive span's context")
			assert.NoError(t, s.end(t))
			assert.Equal(t, wire.Operation{
				System: "rabbitmq", Destination: r.exchange, ConsumerGroup: r.queue, MessageID: e.ID,
				ServerAddress: s.op.ServerAddress, ServerPort: s.op.ServerPort,
			}, s.op)
			assert.NotEmpty(t, s.op.ServerAddress)
			assert.Equal(t, e.ID, s.event.ID)
			assert.Equal(t, e.Headers["traceparent"], s.event.Headers["traceparent"], "the decoded event's trace context")
			assert.Equal(t, e.Type, s.event.Type)

			require.NoError(t, p.Publish(t.Context(), ceEvent("evt-recv-bad")))
			select {
			case s = <-inSpan:
			case <-time.After(10 * time.Second):
				t.Fatal("not handled")
			}
			require.NotNil(t, s)
			err := s.end(t)
			assert.ErrorIs(t, err, errBad, "end gets Consume's outcome")
			assert.True(t, outbox.IsPermanent(err))
			assert.Len(t, tel.spans(true), 2)
		})
	}
}

func TestBadSource(t *testing.T) {
	t.Parallel()
	p, err := New(Config{Source: "/my orders"})
	require.ErrorIs(t, err, wire.ErrSource)
	assert.Nil(t, p)
}
