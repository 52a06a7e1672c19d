package wire

import (
	"bytes"
	"cmp"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"mime"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gorm-outbox/outbox"
)

// Format is how an adapter lays an event out on the wire: [Native], or one
// of CloudEvents 1.0's content modes. Every adapter's Config has a Format
// field; its zero value is Native.
type Format int

const (
	// Native is the outbox's own layout: the payload as the body, the
	// event's fields in the Outbox-* headers of [Headers]. The broker
	// adapters' default in this release.
	Native Format = iota
	// CloudEvents is CloudEvents 1.0 in binary content mode where the
	// protocol binding defines one (HTTP, Kafka, NATS, AMQP): the payload
	// as the body, the attributes in prefixed headers. On a protocol
	// without headers (Redis Streams) it is structured mode.
	CloudEvents
	// CloudEventsJSON is CloudEvents 1.0 in structured content mode
	// everywhere: one JSON document (application/cloudevents+json) holding
	// the attributes and the payload as "data".
	CloudEventsJSON
)

// String returns "native", "cloudevents" or "cloudevents-json".
func (f Format) String() string {
	switch f {
	case Native:
		return "native"
	case CloudEvents:
		return "cloudevents"
	case CloudEventsJSON:
		return "cloudevents-json"
	}
	return "Format(" + strconv.Itoa(int(f)) + ")"
}

// ErrFormat is returned, wrapped, for a Format value that is none of the
// constants. Adapters' constructors refuse such a Config with it.
var ErrFormat = errors.New("wire: unknown Format")

// Check returns nil for [Native], [CloudEvents] and [CloudEventsJSON], and
// an error wrapping [ErrFormat] otherwise.
func (f Format) Check() error {
	if f < Native || f > CloudEventsJSON {
		return fmt.Errorf("%w %d (use wire.Native, wire.CloudEvents or wire.CloudEventsJSON)", ErrFormat, int(f))
	}
	return nil
}

// ErrSource is returned, wrapped, for a CloudEvents source that is not a
// URI-reference. Adapters' constructors refuse such a Config with it.
var ErrSource = errors.New("wire: the CloudEvents source is not a URI-reference")

// CheckSource returns nil for "" (which stands for [DefaultSource]) and for
// a URI-reference (RFC 3986: "/orders", "urn:example:orders",
// "https://orders.example.com"), and an error wrapping [ErrSource]
// otherwise: a space, a control character, or what net/url cannot parse.
// Every structured document with a bad source would fail the CloudEvents
// schema, and every consumer's SDK would refuse it.
func CheckSource(source string) error {
	for _, c := range []byte(source) {
		if c <= ' ' || c == 0x7f {
			return fmt.Errorf("%w: %q holds a space or a control character", ErrSource, source)
		}
	}
	if _, err := url.Parse(source); err != nil {
		return fmt.Errorf("%w: %q: %w", ErrSource, source, err)
	}
	return nil
}

// CloudEvents constants.
const (
	// SpecVersion is the specversion attribute of every event.
	SpecVersion = "1.0"
	// DefaultSource is the source attribute when an adapter's Config names
	// none. It names the outbox library, which suffices for uniqueness
	// (event IDs are unique on their own) but not for a consumer that
	// receives events from several services: set the adapter's Source to
	// one URI-reference per producing service, for example "/orders" or
	// "https://orders.example.com". It must stay the same for the life of
	// an event: a retry keeps id and source, which consumers dedupe by.
	DefaultSource = "urn:gorm-outbox"
	// ContentTypeJSON is the content type of a body that is the payload.
	ContentTypeJSON = "application/json"
	// ContentTypeCloudEventsJSON is the content type of a body in
	// structured mode.
	ContentTypeCloudEventsJSON = "application/cloudevents+json"
)

// The names of the extension attributes an outbox event may carry. They
// follow the spec's naming rule (a–z and 0–9 only, at most 20 characters).
const (
	// ExtAggregateType carries [outbox.Event.AggregateType], when set.
	ExtAggregateType = "aggregatetype"
	// ExtAggregateID carries [outbox.Event.AggregateID], when set.
	ExtAggregateID = "aggregateid"
	// ExtIdempotencyKey carries [outbox.Event.IdempotencyKey] when it is
	// not the event's ID (its default); a missing one decodes as the ID.
	ExtIdempotencyKey = "idempotencykey"
	// ExtTraceParent and ExtTraceState are the Distributed Tracing
	// extension's attributes, from the event's W3C trace context headers.
	ExtTraceParent = "traceparent"
	ExtTraceState  = "tracestate"
	// ExtPartitionKey is the Partitioning extension's attribute, which the
	// Kafka binding maps to the record key.
	ExtPartitionKey = "partitionkey"
)

// Attribute is one CloudEvents context attribute, with its value in its
// canonical string form.
type Attribute struct {
	Name, Value string
}

// CloudEventOptions are what [Attributes] and [Binding.Encode] need beside
// the event.
type CloudEventOptions struct {
	// Source is the source attribute; "" is [DefaultSource].
	Source string
	// PartitionKey, when not empty, is the partitionkey extension (Kafka
	// sets it to the record key).
	PartitionKey string
}

// Subject is the subject attribute of an event: "{aggregate type}/{aggregate
// ID}" when both are set, the aggregate ID alone when only it is, and ""
// (no subject) when the event names no aggregate ID.
func Subject(e outbox.Event) string {
	switch {
	case e.AggregateID == "":
		return ""
	case e.AggregateType == "":
		return e.AggregateID
	}
	return e.AggregateType + "/" + e.AggregateID
}

// Attributes returns the CloudEvents context attributes of e, in this
// order, those with empty values left out: specversion, id, source, type,
// subject ([Subject]), time (OccurredAt in UTC, [TimeFormat]),
// datacontenttype (application/json), then the extensions aggregatetype,
// aggregateid, idempotencykey (when not the ID), traceparent and
// tracestate (from the event's headers, whatever their case), and
// partitionkey. The data attribute is the payload; the content modes carry
// it as the body or as "data".
func Attributes(e outbox.Event, o CloudEventOptions) []Attribute {
	a := make([]Attribute, 0, 12)
	add := func(name, value string) {
		if value != "" {
			a = append(a, Attribute{name, value})
		}
	}
	add("specversion", SpecVersion)
	add("id", e.ID)
	add("source", cmp.Or(o.Source, DefaultSource))
	add("type", e.Type)
	add("subject", Subject(e))
	if !e.OccurredAt.IsZero() {
		add("time", e.OccurredAt.UTC().Format(TimeFormat))
	}
	add("datacontenttype", ContentTypeJSON)
	add(ExtAggregateType, e.AggregateType)
	add(ExtAggregateID, e.AggregateID)
	if e.IdempotencyKey != e.ID {
		add(ExtIdempotencyKey, e.IdempotencyKey)
	}
	add(ExtTraceParent, header(e.Headers, "traceparent"))
	add(ExtTraceState, header(e.Headers, "tracestate"))
	add(ExtPartitionKey, o.PartitionKey)
	return a
}

// header returns h's value for name, matched ignoring case: the exact
// name's, or else that of the smallest of the names that match, so that
// the choice does not depend on map order.
func header(h map[string]string, name string) string {
	if v, ok := h[name]; ok {
		return v
	}
	found, v := "", ""
	for k, kv := range h {
		if strings.EqualFold(k, name) && (found == "" || k < found) {
			found, v = k, kv
		}
	}
	return v
}

// Binding is a protocol binding of CloudEvents: how binary content mode
// names its headers on one protocol. The adapters use the ones below.
type Binding struct {
	// Prefix is put before an attribute's name to form its header in
	// binary mode; "" means the protocol has no binary mode (its
	// CloudEvents format is structured).
	Prefix string
	// PercentEncode says that header values are percent-encoded (HTTP,
	// NATS): space, '"', '%' and every byte outside '!'..'~'.
	PercentEncode bool
	// ContentTypeAttribute says that binary mode sends datacontenttype as a
	// prefixed header too (NATS), not only as the protocol's content type.
	ContentTypeAttribute bool
}

// The bindings of the protocols the adapters speak.
var (
	// HTTPBinding is the HTTP protocol binding: ce- headers.
	HTTPBinding = Binding{Prefix: "ce-", PercentEncode: true}
	// NATSBinding is the NATS protocol binding: ce- headers (NATS 2.2 and
	// later), ce-datacontenttype among them.
	NATSBinding = Binding{Prefix: "ce-", PercentEncode: true, ContentTypeAttribute: true}
	// KafkaBinding is the Kafka protocol binding: ce_ headers, UTF-8 values
	// as they are; the record key is the partitionkey.
	KafkaBinding = Binding{Prefix: "ce_"}
	// AMQPBinding is the AMQP binding's application-property naming
	// (cloudEvents_), which the RabbitMQ adapter applies to AMQP 0-9-1
	// message headers: the binding is written for AMQP 1.0.
	AMQPBinding = Binding{Prefix: "cloudEvents_"}
	// NoBinding is for a protocol without a binding or headers (Redis
	// Streams): CloudEvents is structured mode there.
	NoBinding = Binding{}
)

// Message is an event laid out for a broker by [Binding.Encode]: headers in
// a fixed order, the body, and the content type, which the adapter puts
// where its protocol carries one (a Content-Type header, an AMQP property).
type Message struct {
	Header      []Attribute
	Body        []byte
	ContentType string
}

// Encode lays e out in format f on b's protocol.
//
// Native: the headers of [Headers], the payload as the body,
// application/json.
//
// CloudEvents on a binding with binary mode: first the event's own headers
// as [Headers] gives them (sorted, reserved Outbox-* names dropped, trace
// context kept as a protocol header), leaving out those whose name starts
// with b's prefix, in any case, which would pose as attributes; then one
// header per attribute of [Attributes] but datacontenttype (unless
// [Binding.ContentTypeAttribute]), named prefix + attribute; the payload
// as the body, application/json.
//
// CloudEventsJSON, and CloudEvents on [NoBinding]: the same event headers,
// and the structured document of [StructuredJSON] as the body,
// application/cloudevents+json.
//
// The error, wrapping [outbox.ErrInvalidEvent], is a payload that is not
// JSON; or wrapping [ErrFormat], an unknown f.
func (b Binding) Encode(f Format, e outbox.Event, o CloudEventOptions) (Message, error) {
	if err := f.Check(); err != nil {
		return Message{}, err
	}
	data, err := e.PayloadJSON()
	if err != nil {
		return Message{}, err
	}
	var m Message
	if f == Native {
		m.Header = make([]Attribute, 0, len(e.Headers)+len(reserved))
		Headers(e, func(name, value string) { m.Header = append(m.Header, Attribute{name, value}) })
		m.Body, m.ContentType = data, ContentTypeJSON
		return m, nil
	}
	attrs := Attributes(e, o)
	m.Header = make([]Attribute, 0, len(e.Headers)+len(attrs))
	for _, k := range slices.Sorted(maps.Keys(e.Headers)) {
		if Reserved(k) || (b.Prefix != "" && len(k) >= len(b.Prefix) && strings.EqualFold(k[:len(b.Prefix)], b.Prefix)) {
			continue
		}
		m.Header = append(m.Header, Attribute{k, e.Headers[k]})
	}
	if f == CloudEventsJSON || b.Prefix == "" {
		m.Body, err = structured(attrs, data)
		m.ContentType = ContentTypeCloudEventsJSON
		return m, err
	}
	for _, a := range attrs {
		if a.Name == "datacontenttype" && !b.ContentTypeAttribute {
			continue
		}
		v := a.Value
		if b.PercentEncode {
			v = percentEncode(v)
		}
		m.Header = append(m.Header, Attribute{b.Prefix + a.Name, v})
	}
	m.Body, m.ContentType = data, ContentTypeJSON
	return m, nil
}

// StructuredJSON returns e as a CloudEvents JSON document (structured
// content mode): the attributes of [Attributes] as string members, in that
// order, and the payload as "data", a JSON value.
func StructuredJSON(e outbox.Event, o CloudEventOptions) ([]byte, error) {
	data, err := e.PayloadJSON()
	if err != nil {
		return nil, err
	}
	return structured(Attributes(e, o), data)
}

func structured(attrs []Attribute, data []byte) ([]byte, error) {
	var buf bytes.Buffer
	buf.Grow(len(data) + 64*len(attrs))
	buf.WriteByte('{')
	for _, a := range attrs {
		k, _ := json.Marshal(a.Name)
		v, err := json.Marshal(a.Value)
		if err != nil {
			return nil, fmt.Errorf("%w: attribute %s: %w", outbox.ErrInvalidEvent, a.Name, err)
		}
		buf.Write(k)
		buf.WriteByte(':')
		buf.Write(v)
		buf.WriteByte(',')
	}
	buf.WriteString(`"data":`)
	buf.Write(data)
	buf.WriteByte('}')
	return buf.Bytes(), nil
}

// percentEncode encodes what the HTTP and NATS bindings require: space,
// '"', '%' and every byte outside printable ASCII, as %XX of its UTF-8
// bytes.
func percentEncode(s string) string {
	n := 0
	for i := 0; i < len(s); i++ {
		if mustEncode(s[i]) {
			n++
		}
	}
	if n == 0 {
		return s
	}
	const hex = "0123456789ABCDEF"
	b := make([]byte, 0, len(s)+2*n)
	for i := 0; i < len(s); i++ {
		c := s[i]
		if mustEncode(c) {
			b = append(b, '%', hex[c>>4], hex[c&15])
		} else {
			b = append(b, c)
		}
	}
	return string(b)
}

func mustEncode(c byte) bool { return c <= ' ' || c > '~' || c == '"' || c == '%' }

// percentDecode reverses percentEncode; a '%' not followed by two hex
// digits stays as it is, as the bindings ask of a lenient decoder.
func percentDecode(s string) string {
	if !strings.Contains(s, "%") {
		return s
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		if s[i] == '%' && i+2 < len(s) {
			if h, ok1 := unhex(s[i+1]); ok1 {
				if l, ok2 := unhex(s[i+2]); ok2 {
					b = append(b, h<<4|l)
					i += 2
					continue
				}
			}
		}
		b = append(b, s[i])
	}
	return string(b)
}

func unhex(c byte) (byte, bool) {
	switch {
	case '0' <= c && c <= '9':
		return c - '0', true
	case 'a' <= c && c <= 'f':
		return c - 'a' + 10, true
	case 'A' <= c && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// binaryPrefixes are the header prefixes of binary mode that [Decode]
// recognises by a specversion header: HTTP's and NATS's, Kafka's, and
// AMQP's (both spellings the binding allows).
var binaryPrefixes = [...]string{"ce-", "ce_", "cloudEvents_", "cloudEvents:"}

// contextAttributes are the CloudEvents attributes that are not outbox
// event fields: [Decode] does not copy them to the event's headers.
var contextAttributes = map[string]bool{
	"specversion": true, "source": true, "subject": true, "datacontenttype": true,
	"dataschema": true, ExtPartitionKey: true,
}

// fromAttribute sets what one CloudEvents attribute says of e. Attributes
// that are not event fields (source, subject, ...) are left out; unknown
// extensions become headers, under their names.
func fromAttribute(e *outbox.Event, name, value string) error {
	switch name {
	case "id":
		e.ID = value
	case "type":
		e.Type = value
	case "time":
		t, err := time.Parse(time.RFC3339Nano, value)
		if err != nil {
			return fmt.Errorf("wire: CloudEvents attribute time: %w", err)
		}
		e.OccurredAt = t.UTC()
	case ExtAggregateType:
		e.AggregateType = value
	case ExtAggregateID:
		e.AggregateID = value
	case ExtIdempotencyKey:
		e.IdempotencyKey = value
	default:
		if contextAttributes[name] {
			return nil
		}
		if e.Headers == nil {
			e.Headers = map[string]string{}
		}
		if header(e.Headers, name) == "" {
			// A protocol header of the same name (traceparent) carries the
			// same value; keep the one already there.
			e.Headers[name] = value
		}
	}
	return nil
}

// DecodeStructured reads an event from a CloudEvents JSON document
// (structured content mode): id, type, time and the outbox extensions
// become the event's fields, other extensions its headers, "data" (or
// "data_base64", decoded) its payload. A document without specversion, id
// or type is an error.
func DecodeStructured(doc []byte) (outbox.Event, error) {
	var e outbox.Event
	var m map[string]json.RawMessage
	if err := json.Unmarshal(doc, &m); err != nil {
		return e, fmt.Errorf("wire: CloudEvents JSON: %w", err)
	}
	for _, req := range [...]string{"specversion", "id", "type"} {
		if _, ok := m[req]; !ok {
			return e, fmt.Errorf("wire: CloudEvents JSON: no %s attribute", req)
		}
	}
	var firstErr error
	for _, k := range slices.Sorted(maps.Keys(m)) {
		raw := m[k]
		switch k {
		case "data":
			e.Payload = json.RawMessage(raw)
			continue
		case "data_base64":
			var s string
			b, err := []byte(nil), json.Unmarshal(raw, &s)
			if err == nil {
				b, err = base64.StdEncoding.DecodeString(s)
			}
			if err != nil {
				if firstErr == nil {
					firstErr = fmt.Errorf("wire: CloudEvents JSON: data_base64: %w", err)
				}
				continue
			}
			e.Payload = b
			continue
		}
		v, err := attributeString(raw)
		if err == nil {
			err = fromAttribute(&e, k, v)
		}
		if err != nil && firstErr == nil {
			firstErr = fmt.Errorf("wire: CloudEvents JSON: %s: %w", k, err)
		}
	}
	if e.IdempotencyKey == "" {
		e.IdempotencyKey = e.ID
	}
	return e, firstErr
}

// attributeString is an attribute's canonical string: a JSON string as it
// is, a number or boolean as written.
func attributeString(raw json.RawMessage) (string, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var v any
	if err := json.Unmarshal(raw, &v); err != nil {
		return "", err
	}
	switch v.(type) {
	case float64, bool:
		return string(bytes.TrimSpace(raw)), nil
	}
	return "", fmt.Errorf("not a string, number or boolean")
}

// isStructured reports whether a content type is CloudEvents JSON.
func isStructured(contentType string) bool {
	mt, _, err := mime.ParseMediaType(contentType)
	return err == nil && mt == ContentTypeCloudEventsJSON
}
