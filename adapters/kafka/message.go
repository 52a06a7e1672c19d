package kafka

import (
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/wire"
)

// HeaderContentType is the record header that says what the value is, in
// [wire.Native] format: always "application/json", the event's JSON
// payload. The headers that carry the event's fields are named in package
// [github.com/gorm-outbox/outbox/wire], as in every outbox adapter.
//
// In the CloudEvents formats the header is "content-type", in lower case,
// as the CloudEvents Kafka binding names it: application/json in binary
// mode, application/cloudevents+json in structured mode.
const HeaderContentType = "Content-Type"

// headerCEContentType is the Kafka binding's content type header.
const headerCEContentType = "content-type"

// record lays e out as a record of topic with key, in p's format.
//
// Native: the headers [wire.Headers] gives (the event's own, sorted by name
// so that equal events give equal records, then the Outbox-* fields), then
// Content-Type. CloudEvents: the headers and value of
// [wire.KafkaBinding]'s Encode, then content-type; a non-empty key is the
// partitionkey extension. In every format an event header named
// Content-Type, in any case, is dropped, like the reserved names.
func (p *Producer) record(topic string, key []byte, e outbox.Event) (*kgo.Record, error) {
	var o wire.CloudEventOptions
	ct := HeaderContentType
	if p.format != wire.Native {
		o.Source, o.PartitionKey, ct = p.source, string(key), headerCEContentType
	}
	m, err := wire.KafkaBinding.Encode(p.format, e, o)
	if err != nil {
		return nil, err
	}
	h := make([]kgo.RecordHeader, 0, len(m.Header)+1)
	for _, a := range m.Header {
		if !strings.EqualFold(a.Name, HeaderContentType) {
			h = append(h, kgo.RecordHeader{Key: a.Name, Value: []byte(a.Value)})
		}
	}
	h = append(h, kgo.RecordHeader{Key: ct, Value: []byte(m.ContentType)})
	return &kgo.Record{Topic: topic, Key: key, Value: m.Body, Headers: h}, nil
}
