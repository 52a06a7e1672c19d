// Package wire says how an outbox event looks on a broker: the names of the
// headers that carry its fields, the text format of its OccurredAt, and
// [Headers], which every broker adapter of this repository uses to build a
// message's headers. Consumers read the same names whatever the broker.
//
// Application code needs this package only to read those headers, for
// example msg.Header.Get(wire.EventID) to deduplicate. Adapters add their
// own headers (a Content-Type, a broker's deduplication ID, a signature);
// their packages document them.
//
// # Reserved names
//
// The six names below are reserved: [Headers] drops an event header with one
// of them, so that a consumer can trust an Outbox-* header to describe the
// event, not whatever a publisher put in [outbox.Event.Headers]. The
// comparison ignores case, because HTTP, and the bridges that carry broker
// messages over it, fold header names: "outbox-event-id" would reach such a
// consumer as Outbox-Event-Id.
package wire

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/gorm-outbox/outbox"
)

// The headers that carry an event's fields. Their values are the fields as
// they are, except OccurredAt, formatted with [TimeFormat].
const (
	// EventID carries [outbox.Event.ID], the consumer's deduplication key.
	// Always set.
	EventID = "Outbox-Event-Id"
	// EventType carries [outbox.Event.Type]. Always set.
	EventType = "Outbox-Event-Type"
	// AggregateType carries [outbox.Event.AggregateType], when not empty.
	AggregateType = "Outbox-Aggregate-Type"
	// AggregateID carries [outbox.Event.AggregateID], when not empty.
	AggregateID = "Outbox-Aggregate-Id"
	// IdempotencyKey carries [outbox.Event.IdempotencyKey]. Always set; a
	// published event's key defaults to its ID.
	IdempotencyKey = "Outbox-Idempotency-Key"
	// OccurredAt carries [outbox.Event.OccurredAt] in UTC, formatted with
	// [TimeFormat], when not zero.
	OccurredAt = "Outbox-Occurred-At"
)

// reserved lists the names above in the order [Headers] sets them.
var reserved = [...]string{EventID, EventType, AggregateType, AggregateID, IdempotencyKey, OccurredAt}

// TimeFormat is the layout of the [OccurredAt] header, and of the adapters'
// other renderings of OccurredAt as text: RFC 3339 in UTC with the
// microseconds the outbox keeps, fixed width so that values sort as text,
// for example "2026-01-02T03:04:05.000006Z". time.Parse(TimeFormat, v) and
// time.Parse(time.RFC3339Nano, v) read it back.
const TimeFormat = "2006-01-02T15:04:05.000000Z07:00"

// Reserved reports whether name is one of the header names above, ignoring
// case. [Headers] drops event headers with such names.
func Reserved(name string) bool {
	for _, r := range reserved {
		if strings.EqualFold(name, r) {
			return true
		}
	}
	return false
}

// Headers calls set once for each header that carries e on a broker: first
// the event's own headers (trace context included) in increasing byte order
// of their names, so that equal events give equal messages, leaving out
// those whose names are [Reserved]; then, in this order, [EventID],
// [EventType], [AggregateType] and [AggregateID] when not empty,
// [IdempotencyKey], and [OccurredAt] when not zero.
//
// Names and values are passed as they are: a broker with a stricter header
// syntax than the outbox (which accepts any UTF-8 without NUL) checks them
// in set.
func Headers(e outbox.Event, set func(name, value string)) {
	for _, k := range slices.Sorted(maps.Keys(e.Headers)) {
		if !Reserved(k) {
			set(k, e.Headers[k])
		}
	}
	set(EventID, e.ID)
	set(EventType, e.Type)
	if e.AggregateType != "" {
		set(AggregateType, e.AggregateType)
	}
	if e.AggregateID != "" {
		set(AggregateID, e.AggregateID)
	}
	set(IdempotencyKey, e.IdempotencyKey)
	if !e.OccurredAt.IsZero() {
		set(OccurredAt, e.OccurredAt.UTC().Format(TimeFormat))
	}
}

// Decode reads an event back from a message that [Headers] built: headers
// are the message's headers (a broker's multi-valued header gives its first
// value), body its payload, which becomes [outbox.Event.Payload] as a
// json.RawMessage. Reserved names are matched ignoring case; every other
// header goes to [outbox.Event.Headers]. A message of another producer
// decodes too, with the fields it does not carry left empty: a consumer
// that needs an ID then takes its own (the broker's message ID).
//
// The error, for an [OccurredAt] that does not parse, comes with the event
// decoded from everything else.
func Decode(headers map[string]string, body []byte) (outbox.Event, error) {
	var e outbox.Event
	var err error
	for k, v := range headers {
		switch {
		case strings.EqualFold(k, EventID):
			e.ID = v
		case strings.EqualFold(k, EventType):
			e.Type = v
		case strings.EqualFold(k, AggregateType):
			e.AggregateType = v
		case strings.EqualFold(k, AggregateID):
			e.AggregateID = v
		case strings.EqualFold(k, IdempotencyKey):
			e.IdempotencyKey = v
		case strings.EqualFold(k, OccurredAt):
			t, perr := time.Parse(time.RFC3339Nano, v)
			if perr != nil {
				err = fmt.Errorf("wire: header %s: %w", OccurredAt, perr)
				continue
			}
			e.OccurredAt = t.UTC()
		default:
			if e.Headers == nil {
				e.Headers = map[string]string{}
			}
			e.Headers[k] = v
		}
	}
	if body != nil {
		e.Payload = json.RawMessage(body)
	}
	return e, err
}
