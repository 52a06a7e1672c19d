package kafka

import (
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/wire"
)

// HeaderContentType is the record header that says what the value is,
// always "application/json": the event's JSON payload. The headers that
// carry the event's fields are named in package
// [github.com/gorm-outbox/outbox/wire], as in every outbox adapter.
const HeaderContentType = "Content-Type"

// headers returns the record's headers: those [wire.Headers] gives (the
// event's own, sorted by name so that equal events give equal records, then
// the Outbox-* fields), then Content-Type. An event header named
// Content-Type, in any case, is dropped, like the reserved Outbox-* names.
func headers(e outbox.Event) []kgo.RecordHeader {
	h := make([]kgo.RecordHeader, 0, len(e.Headers)+7)
	wire.Headers(e, func(k, v string) {
		if !strings.EqualFold(k, HeaderContentType) {
			h = append(h, kgo.RecordHeader{Key: k, Value: []byte(v)})
		}
	})
	return append(h, kgo.RecordHeader{Key: HeaderContentType, Value: []byte("application/json")})
}
