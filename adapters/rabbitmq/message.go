package rabbitmq

import (
	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/wire"
)

// message lays e out in the Publisher's format ([wire.AMQPBinding]): the
// AMQP headers, body and content-type property of [wire.Binding.Encode],
// and in every format the properties MessageId (the event ID), Type,
// Timestamp and persistent delivery. In [wire.Native] the headers are those
// of [wire.Headers], as in every outbox adapter.
func (p *Publisher) message(e outbox.Event) (amqp.Publishing, error) {
	m, err := wire.AMQPBinding.Encode(p.format, e, p.ce)
	if err != nil {
		return amqp.Publishing{}, err
	}
	t := make(amqp.Table, len(m.Header))
	for _, h := range m.Header {
		t[h.Name] = h.Value
	}
	return amqp.Publishing{
		Headers:      t,
		ContentType:  m.ContentType,
		DeliveryMode: amqp.Persistent,
		MessageId:    e.ID,
		Timestamp:    e.OccurredAt,
		Type:         e.Type,
		Body:         m.Body,
	}, nil
}
