package rabbitmq

import (
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/wire"
)

// headers returns the message's AMQP headers: those [wire.Headers] gives,
// the event's own (trace context included, reserved Outbox-* names
// dropped) and the Outbox-* fields, as in every outbox adapter.
func headers(e outbox.Event) amqp.Table {
	t := make(amqp.Table, len(e.Headers)+6)
	wire.Headers(e, func(k, v string) { t[k] = v })
	return t
}
