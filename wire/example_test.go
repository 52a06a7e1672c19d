package wire_test

import (
	"fmt"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/wire"
)

// An adapter builds a message's headers by handing Headers a function that
// adds one header to the broker's message; here, a print.
func ExampleHeaders() {
	e := outbox.Event{
		ID:             "0190d6c2-7d3a-7b1e-9f0a-5c2e4b6d8a10",
		Type:           "order.created",
		AggregateType:  "order",
		AggregateID:    "42",
		IdempotencyKey: "order-42-created",
		OccurredAt:     time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC),
		Headers: map[string]string{
			"traceparent":     "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
			"tenant":          "acme",
			"outbox-event-id": "spoofed", // reserved: dropped
		},
	}
	wire.Headers(e, func(name, value string) {
		fmt.Printf("%s: %s\n", name, value)
	})
	// Output:
	// tenant: acme
	// traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01
	// Outbox-Event-Id: 0190d6c2-7d3a-7b1e-9f0a-5c2e4b6d8a10
	// Outbox-Event-Type: order.created
	// Outbox-Aggregate-Type: order
	// Outbox-Aggregate-Id: 42
	// Outbox-Idempotency-Key: order-42-created
	// Outbox-Occurred-At: 2026-01-02T03:04:05.000006Z
}

// A consumer reads the time back with TimeFormat.
func ExampleTimeFormat() {
	t, err := time.Parse(wire.TimeFormat, "2026-01-02T03:04:05.000006Z")
	fmt.Println(t, err)
	// Output: 2026-01-02 03:04:05.000006 +0000 UTC <nil>
}
