// Package wire says how an outbox event looks on a broker, in each
// [Format] the adapters offer: [Native] (the outbox's own Outbox-* headers,
// the adapters' default) and CloudEvents 1.0 in binary ([CloudEvents]) or
// structured ([CloudEventsJSON]) content mode. [Headers] and
// [Binding.Encode] build messages; [Decode] reads any of them back, which
// the adapters' consumers use. [Telemetry] is how adapters report their
// sends and receives to a tracing system (package outboxotel).
//
// Application code needs this package only to read messages, for example
// msg.Header.Get(wire.EventID) to deduplicate in Native format, or
// wire.Decode in any. Adapters add their own headers (a Content-Type, a
// broker's deduplication ID, a signature); their packages document them.
//
// # Native and CloudEvents, field by field
//
// One row per event field: its Native header, its CloudEvents attribute
// (binary mode: the binding's prefix + the name, such as ce-id on HTTP and
// NATS, ce_id on Kafka, cloudEvents_id on RabbitMQ; structured mode: a
// member of the JSON document).
//
//	event field                 Native header             CloudEvents attribute
//	-----------                 -------------             ---------------------
//	ID                          Outbox-Event-Id           id
//	Type                        Outbox-Event-Type         type
//	OccurredAt (UTC, µs)        Outbox-Occurred-At        time
//	AggregateType/AggregateID   Outbox-Aggregate-Type,    subject ("{type}/{id}", or
//	                            Outbox-Aggregate-Id       "{id}" without a type; see
//	                                                      [Subject]), and the extensions
//	                                                      aggregatetype, aggregateid
//	IdempotencyKey              Outbox-Idempotency-Key    idempotencykey (extension;
//	                                                      left out when it is the ID)
//	Payload (JSON)              the body                  data: the body (binary), the
//	                                                      "data" member (structured)
//	-                           Content-Type:             datacontenttype
//	                            application/json          (application/json)
//	-                           -                         specversion ("1.0")
//	-                           -                         source (the adapter's
//	                                                      Config.Source, default
//	                                                      [DefaultSource])
//	Headers["traceparent"],     traceparent, tracestate   traceparent, tracestate
//	Headers["tracestate"]       (as every event header)   (Distributed Tracing
//	                                                      extension) and the protocol's
//	                                                      own traceparent header
//	Headers (others)            one header each           one protocol header each
//	                                                      (not attributes)
//	Kafka record key            -                         partitionkey (Partitioning
//	                                                      extension, Kafka only)
//
// The adapters put the PRODUCER span of the send in the trace context (see
// [Telemetry]): a message is one hop from the relay to the consumer, so the
// Distributed Tracing extension and the protocol's header carry the same
// value, as that extension asks.
//
// Which binding each adapter follows: HTTP (webhook, [HTTPBinding]), Kafka
// ([KafkaBinding]), NATS ([NATSBinding]; binary mode needs NATS 2.2
// headers), RabbitMQ (AMQP 0-9-1: the AMQP binding, written for AMQP 1.0,
// applied to message headers, [AMQPBinding]); Redis Streams has none, and
// both CloudEvents formats are structured mode there ([NoBinding]).
//
// # Reserved names
//
// The six Native names below are reserved: [Headers] drops an event header
// with one of them, so that a consumer can trust an Outbox-* header to
// describe the event, not whatever a publisher put in
// [outbox.Event.Headers]. The comparison ignores case, because HTTP, and
// the bridges that carry broker messages over it, fold header names:
// "outbox-event-id" would reach such a consumer as Outbox-Event-Id. In the
// CloudEvents formats an event header whose name starts with the binding's
// prefix is dropped for the same reason.
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
	if len(e.Headers) > 0 { // sorting the keys of none still allocates
		for _, k := range slices.Sorted(maps.Keys(e.Headers)) {
			if !Reserved(k) {
				set(k, e.Headers[k])
			}
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

// Decode reads an event back from a message an adapter built in any
// [Format]: headers are the message's headers (a broker's multi-valued
// header gives its first value; a protocol that carries the content type
// elsewhere, as AMQP does, passes it as "Content-Type"), body its payload.
//
//   - A Content-Type of application/cloudevents+json: the body is decoded
//     with [DecodeStructured]; headers other than Content-Type go to
//     [outbox.Event.Headers].
//   - A specversion header with one of the bindings' prefixes (ce-, ce_,
//     cloudEvents_, cloudEvents:, in any case): CloudEvents binary mode.
//     The prefixed headers are the attributes (percent-decoded for ce-),
//     mapped as DecodeStructured maps them; the body is the payload.
//   - Otherwise [Native]: the reserved names, matched ignoring case, are
//     the event's fields.
//
// In every case the remaining headers but Content-Type go to
// [outbox.Event.Headers] and the
// body becomes [outbox.Event.Payload] as a json.RawMessage. A message of
// another producer decodes too, with the fields it does not carry left
// empty: a consumer that needs an ID then takes its own (the broker's
// message ID).
//
// The error, for a time or [OccurredAt] that does not parse or a
// structured document that is not valid, comes with the event decoded
// from everything else.
func Decode(headers map[string]string, body []byte) (outbox.Event, error) {
	if isStructured(header(headers, "Content-Type")) {
		e, err := DecodeStructured(body)
		for k, v := range headers {
			if !strings.EqualFold(k, "Content-Type") && header(e.Headers, k) == "" {
				if e.Headers == nil {
					e.Headers = map[string]string{}
				}
				e.Headers[k] = v
			}
		}
		return e, err
	}
	for _, p := range binaryPrefixes {
		if header(headers, p+"specversion") != "" {
			return decodeBinary(headers, body, p)
		}
	}
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
		case strings.EqualFold(k, "Content-Type"):
			// The protocol's, not the event's: adapters never send an event
			// header of that name.
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

// decodeBinary reads CloudEvents binary mode, whose attribute headers start
// with prefix.
func decodeBinary(headers map[string]string, body []byte, prefix string) (outbox.Event, error) {
	var e outbox.Event
	var err error
	var plain []string
	// Attributes first, so that a protocol traceparent header does not
	// shadow the extension (they carry the same value when we sent them).
	for _, k := range slices.Sorted(maps.Keys(headers)) {
		v := headers[k]
		if len(k) <= len(prefix) || !strings.EqualFold(k[:len(prefix)], prefix) {
			plain = append(plain, k)
			continue
		}
		if prefix == "ce-" {
			v = percentDecode(v)
		}
		if aerr := fromAttribute(&e, strings.ToLower(k[len(prefix):]), v); aerr != nil && err == nil {
			err = aerr
		}
	}
	for _, k := range plain {
		if strings.EqualFold(k, "Content-Type") || header(e.Headers, k) != "" {
			continue
		}
		if e.Headers == nil {
			e.Headers = map[string]string{}
		}
		e.Headers[k] = headers[k]
	}
	if e.IdempotencyKey == "" {
		e.IdempotencyKey = e.ID
	}
	if body != nil {
		e.Payload = json.RawMessage(body)
	}
	return e, err
}
