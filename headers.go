package outbox

import (
	"encoding/json"
	"errors"
	"fmt"
)

// Header names under which the broker adapters carry an event's fields next
// to its own Headers, so consumers read the same names whatever the broker.
const (
	HeaderEventID        = "Outbox-Event-Id" // the consumer's deduplication key
	HeaderEventType      = "Outbox-Event-Type"
	HeaderAggregateType  = "Outbox-Aggregate-Type"
	HeaderAggregateID    = "Outbox-Aggregate-Id"
	HeaderIdempotencyKey = "Outbox-Idempotency-Key"
	HeaderOccurredAt     = "Outbox-Occurred-At" // formatted with OccurredAtFormat
)

// OccurredAtFormat renders OccurredAt in headers: RFC 3339 in UTC with the
// microseconds the outbox keeps, fixed width so that values sort as text.
const OccurredAtFormat = "2006-01-02T15:04:05.000000Z07:00"

// Metadata returns the event's fields as headers named Header*: ID, type,
// idempotency key, and the aggregate fields and OccurredAt when set.
func (e Event) Metadata() map[string]string {
	m := map[string]string{
		HeaderEventID:        e.ID,
		HeaderEventType:      e.Type,
		HeaderIdempotencyKey: e.IdempotencyKey,
	}
	if e.AggregateType != "" {
		m[HeaderAggregateType] = e.AggregateType
	}
	if e.AggregateID != "" {
		m[HeaderAggregateID] = e.AggregateID
	}
	if !e.OccurredAt.IsZero() {
		m[HeaderOccurredAt] = e.OccurredAt.UTC().Format(OccurredAtFormat)
	}
	return m
}

// PayloadJSON returns the payload as JSON: the bytes a handler received (a
// json.RawMessage), or, for an Event built by hand, the encoding Publish
// would store. Errors never quote the payload.
func (e Event) PayloadJSON() ([]byte, error) {
	var b []byte
	switch p := e.Payload.(type) {
	case json.RawMessage:
		b = p
	case []byte:
		b = p
	default:
		enc, err := json.Marshal(p)
		if err != nil {
			return nil, fmt.Errorf("%w: encode payload: %w", ErrInvalidEvent, err)
		}
		return enc, nil
	}
	if b == nil {
		return []byte("null"), nil
	}
	if !json.Valid(b) {
		return nil, fmt.Errorf("%w: %w", ErrInvalidEvent, errors.New("payload bytes are not valid JSON"))
	}
	return b, nil
}
