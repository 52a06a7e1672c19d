package wire_test

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/wire"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type header struct{ name, value string }

func collect(e outbox.Event) []header {
	var h []header
	wire.Headers(e, func(name, value string) { h = append(h, header{name, value}) })
	return h
}

func TestNames(t *testing.T) {
	// The values are the wire format: consumers in any language match them.
	for name, want := range map[string]string{
		wire.EventID:        "Outbox-Event-Id",
		wire.EventType:      "Outbox-Event-Type",
		wire.AggregateType:  "Outbox-Aggregate-Type",
		wire.AggregateID:    "Outbox-Aggregate-Id",
		wire.IdempotencyKey: "Outbox-Idempotency-Key",
		wire.OccurredAt:     "Outbox-Occurred-At",
		wire.TimeFormat:     "2006-01-02T15:04:05.000000Z07:00",
	} {
		if name != want {
			t.Errorf("got %q, want %q", name, want)
		}
	}
}

func TestHeadersMinimal(t *testing.T) {
	got := collect(outbox.Event{ID: "1", Type: "t", IdempotencyKey: "k"})
	want := []header{{wire.EventID, "1"}, {wire.EventType, "t"}, {wire.IdempotencyKey, "k"}}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v, want %v", got, want)
	}
}

func TestHeadersFull(t *testing.T) {
	e := outbox.Event{
		ID: "1", Type: "t", AggregateType: "order", AggregateID: "9", IdempotencyKey: "k",
		// Not UTC, and with nanoseconds: rendered in UTC, microseconds.
		OccurredAt: time.Date(2026, 1, 2, 5, 4, 5, 6789, time.FixedZone("+02", 2*3600)),
		Headers: map[string]string{
			"b": "2", "a": "1", "B": "3", "traceparent": "tp",
			// Reserved names, in any case, are dropped.
			"Outbox-Event-Id": "spoofed", "outbox-aggregate-id": "spoofed",
			"OUTBOX-OCCURRED-AT": "spoofed", "Outbox-Idempotency-Key": "spoofed",
			"Outbox-Event-Type": "spoofed", "Outbox-Aggregate-Type": "spoofed",
			// Other Outbox- names are the event's own.
			"Outbox-Tenant": "acme",
		},
	}
	want := []header{
		{"B", "3"}, {"Outbox-Tenant", "acme"}, {"a", "1"}, {"b", "2"}, {"traceparent", "tp"},
		{wire.EventID, "1"}, {wire.EventType, "t"}, {wire.AggregateType, "order"}, {wire.AggregateID, "9"},
		{wire.IdempotencyKey, "k"}, {wire.OccurredAt, "2026-01-02T03:04:05.000006Z"},
	}
	for range 10 { // map order must not leak into the result
		if got := collect(e); !slices.Equal(got, want) {
			t.Fatalf("got %v,\nwant %v", got, want)
		}
	}
}

func TestHeadersPassesValuesAsTheyAre(t *testing.T) {
	// Checking a broker's syntax is the adapter's job.
	e := outbox.Event{ID: "a\nb", Type: "t", IdempotencyKey: "", Headers: map[string]string{"x y": ""}}
	want := []header{{"x y", ""}, {wire.EventID, "a\nb"}, {wire.EventType, "t"}, {wire.IdempotencyKey, ""}}
	if got := collect(e); !slices.Equal(got, want) {
		t.Fatalf("got %q, want %q", got, want)
	}
}

func TestReserved(t *testing.T) {
	for _, name := range []string{
		wire.EventID, wire.EventType, wire.AggregateType, wire.AggregateID, wire.IdempotencyKey, wire.OccurredAt,
		"outbox-event-id", "OUTBOX-OCCURRED-AT",
	} {
		if !wire.Reserved(name) {
			t.Errorf("Reserved(%q) = false", name)
		}
	}
	for _, name := range []string{"", "Outbox-", "Outbox-Event", "Outbox-Event-Id ", "X-Outbox-Event-Id", "traceparent", "Content-Type"} {
		if wire.Reserved(name) {
			t.Errorf("Reserved(%q) = true", name)
		}
	}
}

func TestTimeFormatRoundTrips(t *testing.T) {
	for _, tm := range []time.Time{
		time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC),
		time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC),
	} {
		s := tm.Format(wire.TimeFormat)
		if len(s) != len("2006-01-02T15:04:05.000000Z") || !strings.HasSuffix(s, "Z") {
			t.Errorf("%v formats as %q, not fixed width in UTC", tm, s)
		}
		for _, layout := range []string{wire.TimeFormat, time.RFC3339Nano} {
			back, err := time.Parse(layout, s)
			if err != nil || !back.Equal(tm) {
				t.Errorf("time.Parse(%q, %q) = %v, %v; want %v", layout, s, back, err, tm)
			}
		}
	}
}

func TestDecodeIsHeadersReversed(t *testing.T) {
	e := outbox.Event{ID: "evt-1", Type: "order.created", AggregateType: "order", AggregateID: "42",
		IdempotencyKey: "order.created:42", OccurredAt: time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC),
		Headers: map[string]string{"traceparent": "00-abc-def-01", "Outbox-Event-Id": "forged"}}
	hs := map[string]string{}
	wire.Headers(e, func(k, v string) { hs[k] = v })
	got, err := wire.Decode(hs, []byte(`{"total":42}`))
	require.NoError(t, err)
	assert.Equal(t, "evt-1", got.ID, "the reserved header, not the forged event header")
	assert.Equal(t, "order.created", got.Type)
	assert.Equal(t, "order", got.AggregateType)
	assert.Equal(t, "42", got.AggregateID)
	assert.Equal(t, "order.created:42", got.IdempotencyKey)
	assert.True(t, e.OccurredAt.Equal(got.OccurredAt))
	assert.Equal(t, map[string]string{"traceparent": "00-abc-def-01"}, got.Headers)
	raw, err := got.PayloadJSON()
	require.NoError(t, err)
	assert.JSONEq(t, `{"total":42}`, string(raw))

	// Names folded by an HTTP hop are read all the same.
	got, err = wire.Decode(map[string]string{"outbox-event-id": "evt-2", "OUTBOX-OCCURRED-AT": "not a time"}, nil)
	assert.Error(t, err)
	assert.Equal(t, "evt-2", got.ID)
	assert.Nil(t, got.Payload)
}
