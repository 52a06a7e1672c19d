package wire_test

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/wire"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func fullEvent() outbox.Event {
	return outbox.Event{
		ID: "0190d6c2-7d3a-7b1e-9f0a-5c2e4b6d8a10", Type: "order.created",
		AggregateType: "order", AggregateID: "42", IdempotencyKey: "order-42-created",
		OccurredAt: time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC),
		Headers: map[string]string{
			"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			"tracestate":  "congo=t61rcWkgMzE",
			"tenant":      "acme",
			"CE-Id":       "spoofed", // poses as an attribute in binary mode: dropped there
		},
		Payload: json.RawMessage(`{"total":"9.99 €"}`),
	}
}

func headerMap(m wire.Message) map[string]string {
	h := map[string]string{"Content-Type": m.ContentType}
	for _, a := range m.Header {
		h[a.Name] = a.Value
	}
	return h
}

func TestFormatString(t *testing.T) {
	assert.Equal(t, "native", wire.Native.String())
	assert.Equal(t, "cloudevents", wire.CloudEvents.String())
	assert.Equal(t, "cloudevents-json", wire.CloudEventsJSON.String())
	assert.NoError(t, wire.CloudEventsJSON.Check())
	assert.ErrorIs(t, wire.Format(7).Check(), wire.ErrFormat)
	_, err := wire.HTTPBinding.Encode(wire.Format(-1), fullEvent(), wire.CloudEventOptions{})
	assert.ErrorIs(t, err, wire.ErrFormat)
}

func TestSubject(t *testing.T) {
	assert.Equal(t, "order/42", wire.Subject(outbox.Event{AggregateType: "order", AggregateID: "42"}))
	assert.Equal(t, "42", wire.Subject(outbox.Event{AggregateID: "42"}))
	assert.Equal(t, "", wire.Subject(outbox.Event{AggregateType: "order"}))
}

func TestAttributes(t *testing.T) {
	e := fullEvent()
	got := wire.Attributes(e, wire.CloudEventOptions{PartitionKey: "order/42"})
	want := []wire.Attribute{
		{"specversion", "1.0"}, {"id", e.ID}, {"source", wire.DefaultSource}, {"type", "order.created"},
		{"subject", "order/42"}, {"time", "2026-01-02T03:04:05.000006Z"}, {"datacontenttype", "application/json"},
		{"aggregatetype", "order"}, {"aggregateid", "42"}, {"idempotencykey", "order-42-created"},
		{"traceparent", e.Headers["traceparent"]}, {"tracestate", "congo=t61rcWkgMzE"}, {"partitionkey", "order/42"},
	}
	assert.Equal(t, want, got)

	// The key defaults to the ID: then it is left out, and decodes back.
	e.IdempotencyKey = e.ID
	for _, a := range wire.Attributes(e, wire.CloudEventOptions{Source: "/orders"}) {
		assert.NotEqual(t, "idempotencykey", a.Name)
		if a.Name == "source" {
			assert.Equal(t, "/orders", a.Value)
		}
	}
}

func TestEncodeBinaryHTTP(t *testing.T) {
	m, err := wire.HTTPBinding.Encode(wire.CloudEvents, fullEvent(), wire.CloudEventOptions{Source: "/orders"})
	require.NoError(t, err)
	h := headerMap(m)
	assert.Equal(t, "application/json", m.ContentType)
	assert.JSONEq(t, `{"total":"9.99 €"}`, string(m.Body))
	assert.Equal(t, "1.0", h["ce-specversion"])
	assert.Equal(t, "order.created", h["ce-type"])
	assert.Equal(t, "%2Forders", strings.ReplaceAll(h["ce-source"], "/", "%2F"), "a slash needs no encoding")
	assert.Equal(t, "order%2F42", strings.ReplaceAll(h["ce-subject"], "/", "%2F"))
	assert.NotContains(t, h, "ce-datacontenttype", "HTTP maps datacontenttype to Content-Type")
	assert.NotContains(t, h, "CE-Id", "an event header posing as an attribute is dropped")
	assert.Equal(t, fullEvent().ID, h["ce-id"])
	assert.Equal(t, "acme", h["tenant"])
	assert.Equal(t, fullEvent().Headers["traceparent"], h["traceparent"], "the protocol's trace header stays")
	assert.Equal(t, fullEvent().Headers["traceparent"], h["ce-traceparent"])
	assert.NotContains(t, h, wire.EventID, "no Outbox-* header in CloudEvents modes")
}

func TestPercentEncoding(t *testing.T) {
	// The binding's own example: "Euro € 😀" is "Euro%20%E2%82%AC%20%F0%9F%98%80".
	e := outbox.Event{ID: "1", Type: "t", AggregateType: "Euro € 😀", Payload: json.RawMessage(`1`)}
	for _, b := range []wire.Binding{wire.HTTPBinding, wire.NATSBinding} {
		m, err := b.Encode(wire.CloudEvents, e, wire.CloudEventOptions{})
		require.NoError(t, err)
		assert.Equal(t, "Euro%20%E2%82%AC%20%F0%9F%98%80", headerMap(m)["ce-aggregatetype"])
		back, err := wire.Decode(headerMap(m), m.Body)
		require.NoError(t, err)
		assert.Equal(t, "Euro € 😀", back.AggregateType)
	}
	// Kafka and AMQP carry UTF-8 as it is.
	m, err := wire.KafkaBinding.Encode(wire.CloudEvents, e, wire.CloudEventOptions{})
	require.NoError(t, err)
	assert.Equal(t, "Euro € 😀", headerMap(m)["ce_aggregatetype"])
	// A lone '%' decodes as itself.
	back, err := wire.Decode(map[string]string{"ce-specversion": "1.0", "ce-id": "50%", "ce-type": "%4"}, nil)
	require.NoError(t, err)
	assert.Equal(t, "50%", back.ID)
	assert.Equal(t, "%4", back.Type)
}

func TestNATSSendsDataContentType(t *testing.T) {
	m, err := wire.NATSBinding.Encode(wire.CloudEvents, fullEvent(), wire.CloudEventOptions{})
	require.NoError(t, err)
	assert.Equal(t, "application/json", headerMap(m)["ce-datacontenttype"])
}

func TestEncodeStructured(t *testing.T) {
	for _, b := range []wire.Binding{wire.HTTPBinding, wire.KafkaBinding, wire.NATSBinding, wire.AMQPBinding, wire.NoBinding} {
		for _, f := range []wire.Format{wire.CloudEventsJSON, wire.CloudEvents} {
			if f == wire.CloudEvents && b != wire.NoBinding {
				continue // binary there
			}
			m, err := b.Encode(f, fullEvent(), wire.CloudEventOptions{Source: "/orders"})
			require.NoError(t, err)
			assert.Equal(t, "application/cloudevents+json", m.ContentType)
			var doc map[string]any
			require.NoError(t, json.Unmarshal(m.Body, &doc))
			assert.Equal(t, map[string]any{
				"specversion": "1.0", "id": fullEvent().ID, "source": "/orders", "type": "order.created",
				"subject": "order/42", "time": "2026-01-02T03:04:05.000006Z", "datacontenttype": "application/json",
				"aggregatetype": "order", "aggregateid": "42", "idempotencykey": "order-42-created",
				"traceparent": fullEvent().Headers["traceparent"], "tracestate": "congo=t61rcWkgMzE",
				"data": map[string]any{"total": "9.99 €"},
			}, doc)
			assert.Equal(t, "acme", headerMap(m)["tenant"], "event headers stay protocol headers")
		}
	}
}

func TestEncodeNativeIsHeaders(t *testing.T) {
	m, err := wire.KafkaBinding.Encode(wire.Native, fullEvent(), wire.CloudEventOptions{})
	require.NoError(t, err)
	var want []wire.Attribute
	wire.Headers(fullEvent(), func(n, v string) { want = append(want, wire.Attribute{Name: n, Value: v}) })
	assert.Equal(t, want, m.Header)
	assert.Equal(t, "application/json", m.ContentType)
	assert.JSONEq(t, `{"total":"9.99 €"}`, string(m.Body))
}

func TestEncodeBadPayload(t *testing.T) {
	e := fullEvent()
	e.Payload = []byte("{not json")
	for _, f := range []wire.Format{wire.Native, wire.CloudEvents, wire.CloudEventsJSON} {
		_, err := wire.HTTPBinding.Encode(f, e, wire.CloudEventOptions{})
		assert.ErrorIs(t, err, outbox.ErrInvalidEvent, f.String())
	}
}

// Every binding and format decodes back to the event it encoded.
func TestDecodeRoundTrip(t *testing.T) {
	want := fullEvent()
	delete(want.Headers, "CE-Id")
	for _, b := range []wire.Binding{wire.HTTPBinding, wire.KafkaBinding, wire.NATSBinding, wire.AMQPBinding, wire.NoBinding} {
		for _, f := range []wire.Format{wire.Native, wire.CloudEvents, wire.CloudEventsJSON} {
			in := fullEvent()
			delete(in.Headers, "CE-Id")
			m, err := b.Encode(f, in, wire.CloudEventOptions{})
			require.NoError(t, err)
			got, err := wire.Decode(headerMap(m), m.Body)
			require.NoError(t, err, "%s %s", b.Prefix, f)
			assert.JSONEq(t, string(want.Payload.(json.RawMessage)), string(got.Payload.(json.RawMessage)))
			got.Payload, in.Payload = nil, nil
			assert.Equal(t, in, got, "%q %s", b.Prefix, f)
		}
	}
}

func TestDecodeStructuredVariants(t *testing.T) {
	// Another producer's event: a numeric extension, data_base64, no time.
	e, err := wire.DecodeStructured([]byte(`{"specversion":"1.0","id":"x","source":"/s","type":"t",
		"count":3,"flag":true,"data_base64":"aGk="}`))
	require.NoError(t, err)
	assert.Equal(t, "x", e.ID)
	assert.Equal(t, "x", e.IdempotencyKey)
	assert.Equal(t, map[string]string{"count": "3", "flag": "true"}, e.Headers)
	assert.Equal(t, []byte("hi"), e.Payload)

	_, err = wire.DecodeStructured([]byte(`{"id":"x","type":"t"}`))
	assert.ErrorContains(t, err, "specversion")
	_, err = wire.DecodeStructured([]byte(`[]`))
	assert.Error(t, err)
	e, err = wire.DecodeStructured([]byte(`{"specversion":"1.0","id":"x","type":"t","time":"yesterday"}`))
	assert.ErrorContains(t, err, "time")
	assert.Equal(t, "x", e.ID, "the rest decodes")
}

func TestDecodeDetectsByContentTypeParameters(t *testing.T) {
	body, err := wire.StructuredJSON(fullEvent(), wire.CloudEventOptions{})
	require.NoError(t, err)
	e, err := wire.Decode(map[string]string{"content-type": "application/cloudevents+json; charset=utf-8"}, body)
	require.NoError(t, err)
	assert.Equal(t, fullEvent().ID, e.ID)
	// Not CloudEvents: native, the body is the payload.
	e, err = wire.Decode(map[string]string{"Content-Type": "application/json"}, body)
	require.NoError(t, err)
	assert.Empty(t, e.ID)
	assert.True(t, errors.Is(wire.Format(9).Check(), wire.ErrFormat))
}

func TestTraceHeaderCaseIsDeterministic(t *testing.T) {
	e := outbox.Event{ID: "1", Type: "t", Headers: map[string]string{"Traceparent": "a", "TRACEPARENT": "b", "TraceParent": "c"}}
	for range 20 {
		for _, a := range wire.Attributes(e, wire.CloudEventOptions{}) {
			if a.Name == "traceparent" {
				assert.Equal(t, "b", a.Value, "the smallest name's value")
			}
		}
	}
}

func TestCheckSource(t *testing.T) {
	for _, ok := range []string{"", "/orders", "urn:gorm-outbox", "https://orders.example.com/v1", wire.DefaultSource, "orders"} {
		assert.NoError(t, wire.CheckSource(ok), ok)
	}
	for _, bad := range []string{"/my orders", "a\nb", "\x00", "http://[::1", "tab\there"} {
		assert.ErrorIs(t, wire.CheckSource(bad), wire.ErrSource, "%q", bad)
	}
}
