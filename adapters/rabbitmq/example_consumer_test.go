package rabbitmq_test

import (
	"context"
	"errors"
	"log"
	"os/signal"
	"syscall"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/adapters/rabbitmq"
)

// A Consumer applies each message's effect and records it in the inbox in
// one transaction, then acknowledges the message: a redelivery (after a
// crash between the commit and the ack, or a duplicate publish) is
// acknowledged without running Handle again. The queue must exist; give it
// a dead-letter exchange (x-dead-letter-exchange) to keep the messages the
// Consumer rejects. It needs a RabbitMQ broker, so this example is not run.
func ExampleNewConsumer() {
	var db *gorm.DB // opened by the application, with db.Use(outbox.Plugin(...))

	c, err := rabbitmq.NewConsumer(db, rabbitmq.Config{URL: "amqp://guest:guest@localhost:5672/"}, rabbitmq.ConsumerConfig{
		Consumer: "billing",
		Queue:    "billing.orders",
		Handle: func(ctx context.Context, tx *gorm.DB, m rabbitmq.Message) error {
			var order struct {
				ID    string `json:"id"`
				Total int    `json:"total"`
			}
			if err := m.Event.DecodePayload(&order); err != nil {
				return outbox.Permanent(err) // never decodes: dead-letter it
			}
			if order.ID == "" {
				return outbox.Permanent(errors.New("order without ID"))
			}
			// Write through tx only: it commits with the inbox entry.
			return tx.Exec("INSERT INTO invoices (order_id, total) VALUES (?, ?)", order.ID, order.Total).Error
		},
		// Messages of other producers: deduplicate by the AMQP message-id.
		// MessageID: func(m rabbitmq.Message) string { return m.Raw.MessageId },
	})
	if err != nil {
		log.Fatal(err)
	}

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := c.Run(ctx); err != nil { // reconnects by itself; nil once ctx is done
		log.Fatal(err)
	}
}
