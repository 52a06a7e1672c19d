package kafka

import (
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
	HeaderEventID = outbox.HeaderEventID
	// HeaderEventType carries the event type.
	HeaderEventType = outbox.HeaderEventType
	// HeaderAggregateType carries the aggregate type, when the event has one.
	HeaderAggregateType = outbox.HeaderAggregateType
	// HeaderAggregateID carries the aggregate ID, when the event has one.
	HeaderAggregateID = outbox.HeaderAggregateID
	// HeaderIdempotencyKey carries the publisher's idempotency key.
	HeaderIdempotencyKey = outbox.HeaderIdempotencyKey
	// HeaderOccurredAt carries when the event happened: RFC 3339, UTC,
	// microseconds.
	HeaderOccurredAt = outbox.HeaderOccurredAt
	// HeaderContentType is always "application/json": the value is the
	// event's JSON payload.
	HeaderContentType = "Content-Type"
)

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
		add(HeaderOccurredAt, e.OccurredAt.UTC().Format(outbox.OccurredAtFormat))
	}
	add(HeaderContentType, "application/json")
	return h
}
