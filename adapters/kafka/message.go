package kafka

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/gorm-outbox/outbox"
)

// Record headers that carry the event's fields, named as in the other
// outbox adapters so that consumers read the same headers whatever the
// broker.
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
	// HeaderContentType is always "application/json": the value is the
	// event's JSON payload.
	HeaderContentType = "Content-Type"
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
	HeaderContentType:    true,
}

// headers returns the event's headers (trace context included), sorted by
// name so that equal events give equal records, then its fields. An event
// header with a reserved name is dropped, so a consumer can trust that the
// Outbox-* headers describe the event.
func headers(e outbox.Event) []kgo.RecordHeader {
	h := make([]kgo.RecordHeader, 0, len(e.Headers)+7)
	for _, k := range slices.Sorted(maps.Keys(e.Headers)) {
		if !reserved[k] {
			h = append(h, kgo.RecordHeader{Key: k, Value: []byte(e.Headers[k])})
		}
	}
	add := func(k, v string) { h = append(h, kgo.RecordHeader{Key: k, Value: []byte(v)}) }
	add(HeaderEventID, e.ID)
	add(HeaderEventType, e.Type)
	if e.AggregateType != "" {
		add(HeaderAggregateType, e.AggregateType)
	}
	if e.AggregateID != "" {
		add(HeaderAggregateID, e.AggregateID)
	}
	add(HeaderIdempotencyKey, e.IdempotencyKey)
	if !e.OccurredAt.IsZero() {
		add(HeaderOccurredAt, e.OccurredAt.UTC().Format(occurredAtFormat))
	}
	add(HeaderContentType, "application/json")
	return h
}

// payloadBytes returns the JSON value. Relayed events already hold it as
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
