package wire_test

import (
	"fmt"

	"github.com/gorm-outbox/outbox/wire"
)

// Reserved is the check Headers applies to an event's own headers, ignoring
// case as HTTP does: a consumer can trust an Outbox-* header to describe the
// event, whatever a publisher put in outbox.Event.Headers. An adapter that
// adds headers of its own uses it to keep the same promise.
func ExampleReserved() {
	for _, name := range []string{wire.EventID, "outbox-event-id", "OUTBOX-OCCURRED-AT", "Outbox-Tenant", "traceparent"} {
		fmt.Printf("%-20s %v\n", name, wire.Reserved(name))
	}
	// Output:
	// Outbox-Event-Id      true
	// outbox-event-id      true
	// OUTBOX-OCCURRED-AT   true
	// Outbox-Tenant        false
	// traceparent          false
}
