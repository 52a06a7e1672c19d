// Package encode validates events and turns them into what the outbox
// stores: every default filled in, the payload and headers as JSON that
// every supported database accepts as written.
//
// It is internal because its rules are the root package's contract, not an
// API of their own: the errors it returns are the root's ErrInvalidEvent
// with the messages callers are shown, and an Encoded is the input of the
// root's INSERT and WAL writers. Being a package of its own lets the code
// under internal/ that writes events take an Encoded without importing the
// public package, which imports it.
package encode

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
)

// Field limits. They match the column sizes of the shipped schema, so an
// event that passes validation never fails its INSERT for length.
const (
	maxFieldLen     = 255      // id, type, aggregate type/id, idempotency key, header keys
	maxHeadersBytes = 64 << 10 // all headers, JSON encoded
)

// DefaultMaxPayload is the payload limit when Config.MaxPayloadBytes is 0.
const DefaultMaxPayload = 1 << 20

// Fields are the fields of an event as the publisher gives it: those of
// the root's outbox.Event, in its order, with its types. This package
// cannot import outbox.Event (an import cycle), so it repeats them; the
// root converts between the two, which costs no more than a copy, and a
// field added to one but not the other fails that conversion at compile
// time instead of being dropped silently.
type Fields = struct {
	ID             string
	Type           string
	AggregateType  string
	AggregateID    string
	IdempotencyKey string
	Payload        any
	Headers        map[string]string
	OccurredAt     time.Time
}

// Event is an event as published; see outbox.Event for its fields.
type Event Fields

// Like is satisfied by Event and by every type with its fields, the root's
// outbox.Event among them, so that All takes the publisher's slice as it
// is instead of a converted copy.
type Like interface{ ~Fields }

// Encoded is an event after validation: every default filled in, payload
// and headers in their stored JSON form.
type Encoded struct {
	Event
	PayloadJSON []byte
	HeadersJSON []byte // nil when there are no headers
	// Generated: the publisher set neither the ID nor the key, so the key
	// is a fresh UUID no other event can have.
	Generated bool
	// GeneratedID: the ID is a fresh UUID (the publisher may have chosen
	// the key).
	GeneratedID bool
}

// Received returns what a handler receives: the payload as json.RawMessage
// and a private copy of the headers, identical in every mode.
func (e *Encoded) Received() Event {
	ev := e.Event
	ev.Payload = json.RawMessage(e.PayloadJSON)
	if len(e.Headers) > 0 {
		h := make(map[string]string, len(e.Headers))
		for k, v := range e.Headers {
			h[k] = v
		}
		ev.Headers = h
	}
	return ev
}

// Encoder holds what validation depends on beyond the event itself.
type Encoder struct {
	// Invalid is wrapped by every validation error. It is the root's
	// ErrInvalidEvent, handed in rather than declared here so that the
	// public sentinel stays declared, and documented, where callers look.
	Invalid error
	// MaxPayload is the largest encoded payload accepted, in bytes.
	MaxPayload int
}

// All encodes events; generated, when not nil, says per event whether its
// ID and key were generated (the Publish hooks may have assigned the ID),
// which otherwise is read from the event. now is the default OccurredAt.
func All[E Like](c *Encoder, events []E, generated []bool, now time.Time) ([]Encoded, error) {
	out := make([]Encoded, len(events))
	for i := range events {
		ev := Event(events[i])
		gen := ev.ID == "" && ev.IdempotencyKey == ""
		if generated != nil {
			gen = generated[i]
		}
		if err := c.Encode(ev, gen, now, &out[i]); err != nil {
			if len(events) > 1 {
				return nil, fmt.Errorf("event %d of %d: %w", i+1, len(events), err)
			}
			return nil, err
		}
	}
	return out, nil
}

// NewID is an event's default ID: a UUIDv7, time ordered (good index
// locality).
func NewID() (string, error) {
	id, err := uuid.NewV7()
	if err != nil {
		return "", fmt.Errorf("outbox: generate event id: %w", err)
	}
	return id.String(), nil
}

// Encode validates e, fills in its defaults and writes the result to out;
// generated is stored as out.Generated.
func (c *Encoder) Encode(e Event, generated bool, now time.Time, out *Encoded) error {
	if e.Type == "" {
		return fmt.Errorf("%w: Type is required", c.Invalid)
	}
	genID := generated || e.ID == ""
	if e.ID == "" {
		id, err := NewID()
		if err != nil {
			return err
		}
		e.ID = id
	}
	if e.IdempotencyKey == "" {
		e.IdempotencyKey = e.ID
	}
	if e.OccurredAt.IsZero() {
		e.OccurredAt = now
	}
	e.OccurredAt = e.OccurredAt.UTC().Truncate(time.Microsecond)
	if y := e.OccurredAt.Year(); y < 1 || y > 9999 {
		// Both databases' time types and SQLite's text format hold 4-digit
		// years; outside them the time would not come back as written.
		return fmt.Errorf("%w: event %s: OccurredAt year %d is outside 1-9999", c.Invalid, e.ID, y)
	}
	for _, f := range [...]struct{ name, v string }{
		{"ID", e.ID}, {"Type", e.Type}, {"AggregateType", e.AggregateType},
		{"AggregateID", e.AggregateID}, {"IdempotencyKey", e.IdempotencyKey},
	} {
		if err := c.checkText(f.name, f.v); err != nil {
			return err
		}
	}

	payload, err := encodePayload(e.Payload)
	if err != nil {
		return fmt.Errorf("%w: event %s (%s): %w", c.Invalid, e.ID, e.Type, err)
	}
	if len(payload) > c.MaxPayload {
		return fmt.Errorf("%w: event %s (%s): payload is %d bytes, over the %d-byte limit (Config.MaxPayloadBytes)",
			c.Invalid, e.ID, e.Type, len(payload), c.MaxPayload)
	}
	var headers []byte
	if len(e.Headers) > 0 {
		for k, v := range e.Headers {
			if k == "" {
				return fmt.Errorf("%w: event %s: empty header name", c.Invalid, e.ID)
			}
			if err := c.checkText("header name", k); err != nil {
				return err
			}
			if !utf8.ValidString(v) || strings.IndexByte(v, 0) >= 0 {
				return fmt.Errorf("%w: event %s: header %q: value must be valid UTF-8 without NUL bytes", c.Invalid, e.ID, k)
			}
		}
		headers, err = json.Marshal(e.Headers)
		if err != nil {
			return fmt.Errorf("%w: event %s: encode headers: %w", c.Invalid, e.ID, err)
		}
		if len(headers) > maxHeadersBytes {
			return fmt.Errorf("%w: event %s: headers are %d bytes encoded, over the %d-byte limit", c.Invalid, e.ID, len(headers), maxHeadersBytes)
		}
	}
	*out = Encoded{Event: e, PayloadJSON: payload, HeadersJSON: headers, Generated: generated, GeneratedID: genID}
	return nil
}

// checkText enforces what both databases can store in a text column of the
// shipped schema: valid UTF-8, no NUL byte, at most maxFieldLen bytes.
func (c *Encoder) checkText(name, v string) error {
	switch {
	case len(v) > maxFieldLen:
		return fmt.Errorf("%w: %s is %d bytes, over the %d-byte limit", c.Invalid, name, len(v), maxFieldLen)
	case !utf8.ValidString(v):
		return fmt.Errorf("%w: %s is not valid UTF-8", c.Invalid, name)
	case strings.IndexByte(v, 0) >= 0:
		return fmt.Errorf("%w: %s contains a NUL byte", c.Invalid, name)
	}
	return nil
}

func encodePayload(p any) ([]byte, error) {
	var b []byte
	switch v := p.(type) {
	case json.RawMessage:
		b = v
	case []byte:
		b = v
	default:
		var err error
		if b, err = json.Marshal(v); err != nil {
			return nil, fmt.Errorf("encode payload: %w", err)
		}
		// encoding/json writes each invalid byte of a string as \ufffd;
		// the same bytes as json.RawMessage are refused below, so these
		// are too rather than silently changed. A MarshalJSON may write
		// the escape on purpose: only a string of the value itself
		// counts.
		if bytes.Contains(b, []byte(`\ufffd`)) && hasInvalidUTF8(reflect.ValueOf(v), 0) {
			return nil, errNotUTF8
		}
		if !utf8.Valid(b) { // from a MarshalJSON
			return nil, errNotUTF8
		}
		return b, checkStorableJSON(b)
	}
	if b == nil {
		return []byte("null"), nil
	}
	if !utf8.Valid(b) {
		return nil, errNotUTF8
	}
	if !json.Valid(b) {
		if nestingDepth(b) > maxValidatorDepth {
			return nil, fmt.Errorf("payload nests arrays and objects deeper than %d levels, which MariaDB's JSON cannot store", maxJSONDepth)
		}
		return nil, errors.New("payload bytes are not valid JSON")
	}
	if err := checkStorableJSON(b); err != nil {
		return nil, err
	}
	// Own the bytes: the caller may reuse its buffer before the commit.
	return bytes.Clone(b), nil
}
