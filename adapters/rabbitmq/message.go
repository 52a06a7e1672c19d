package rabbitmq

import (
	"encoding/json"
	"errors"
	"fmt"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/gorm-outbox/outbox"
)

// AMQP headers that carry the event's fields, named as in the other outbox
// adapters so that consumers read the same headers whatever the broker.
const (
	// HeaderEventID carries the event ID, the consumer's deduplication key.
	HeaderEventID = "Outbox-Event-Id"
	// HeaderEventType carries the event type.
	HeaderEventType = "Outbox-Event-Type"
	// HeaderAggregateType carries the aggregate type, when the event has one.
	HeaderAggregateType = "Outbox-Aggregate-Type"
	// HeaderAggregateID carries the aggregate ID, when the event has one.
	HeaderAggregateID = "Outbox-Aggregate-Id"
	// HeaderIdempotencyKey carries the publisher's idempotency key.
	HeaderIdempotencyKey = "Outbox-Idempotency-Key"
	// HeaderOccurredAt carries when the event happened: RFC 3339, UTC,
	// microseconds.
	HeaderOccurredAt = "Outbox-Occurred-At"
)

// occurredAtFormat keeps the microseconds the outbox stores, with a fixed
// width so that the header sorts as text.
const occurredAtFormat = "2006-01-02T15:04:05.000000Z07:00"

var reserved = map[string]bool{
	HeaderEventID:        true,
	HeaderEventType:      true,
	HeaderAggregateType:  true,
	HeaderAggregateID:    true,
	HeaderIdempotencyKey: true,
	HeaderOccurredAt:     true,
}

// headers returns the event's headers (trace context included) plus its
// fields. An event header with a reserved name is dropped, so a consumer can
// trust that the outbox-* headers describe the event.
func headers(e outbox.Event) amqp.Table {
	t := make(amqp.Table, len(e.Headers)+6)
	for k, v := range e.Headers {
		if !reserved[k] {
			t[k] = v
		}
	}
	t[HeaderEventID] = e.ID
	t[HeaderEventType] = e.Type
	if e.AggregateType != "" {
		t[HeaderAggregateType] = e.AggregateType
	}
	if e.AggregateID != "" {
		t[HeaderAggregateID] = e.AggregateID
	}
	t[HeaderIdempotencyKey] = e.IdempotencyKey
	if !e.OccurredAt.IsZero() {
		t[HeaderOccurredAt] = e.OccurredAt.UTC().Format(occurredAtFormat)
	}
	return t
}

// payloadBytes returns the JSON body. Relayed events already hold it as
// json.RawMessage; an event handed over directly is encoded the way
// outbox.Publish would encode it.
func payloadBytes(e outbox.Event) ([]byte, error) {
	var b []byte
	switch p := e.Payload.(type) {
	case json.RawMessage:
		b = p
	case []byte:
		b = p
	default:
		enc, err := json.Marshal(p)
		if err != nil {
			return nil, fmt.Errorf("encode payload: %w", err)
		}
		return enc, nil
	}
	if b == nil {
		return []byte("null"), nil
	}
	if !json.Valid(b) {
		// No detail: a syntax error would quote the payload.
		return nil, errors.New("payload bytes are not valid JSON")
	}
	return b, nil
}
