package rabbitmq

import (
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/gorm-outbox/outbox"
)

// AMQP headers that carry the event's fields, named as in the other outbox
// adapters so that consumers read the same headers whatever the broker.
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
)

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
		t[HeaderOccurredAt] = e.OccurredAt.UTC().Format(outbox.OccurredAtFormat)
	}
	return t
}
