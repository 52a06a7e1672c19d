package outbox

import (
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Event is a fact about the domain, written to the outbox in the transaction
// that made it true and delivered to handlers after that transaction commits.
//
// Only Type is required. The zero values of the other fields are filled in by
// [Publish]: ID becomes a new UUIDv7, IdempotencyKey becomes ID, and
// OccurredAt becomes the current time.
type Event struct {
	// ID identifies this event; consumers deduplicate deliveries by it.
	// Defaults to a new UUIDv7, which is time ordered (good index locality).
	ID string
	// Type names the event, for example "order.created". Handlers are
	// registered per type. Required.
	Type string
	// AggregateType and AggregateID name the entity the event is about, for
	// example "order" and "42". Optional.
	AggregateType string
	AggregateID   string
	// IdempotencyKey makes publishing idempotent: of several events with the
	// same key, the first one written wins and the others are no-ops, across
	// transactions too, for as long as the first is in the table (retention
	// deletes sent rows after RelayConfig.RetainSent); memory mode
	// remembers the last 10,000 keys. Defaults to ID.
	IdempotencyKey string
	// Payload is encoded with encoding/json when the event is published. A
	// []byte or json.RawMessage holding valid JSON is stored as it is.
	// Handlers always receive it as a json.RawMessage, in both modes; use
	// [Event.DecodePayload] to decode it. On PostgreSQL the payload is stored
	// as jsonb, so handlers receive equal JSON, not necessarily equal bytes
	// (key order and whitespace may change).
	Payload any
	// Headers carry metadata such as trace context. Optional.
	Headers map[string]string
	// OccurredAt is when the event happened, kept in UTC at microsecond
	// precision. Defaults to the time of publishing.
	OccurredAt time.Time
}

// DecodePayload decodes the event's JSON payload into v.
func (e Event) DecodePayload(v any) error {
	raw, err := e.PayloadJSON()
	if err != nil {
		return err
	}
	if err := json.Unmarshal(raw, v); err != nil {
		return fmt.Errorf("outbox: decode payload of event %s: %w", e.ID, err)
	}
	return nil
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
