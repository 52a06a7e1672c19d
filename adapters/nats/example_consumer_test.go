package nats_test

import (
	"context"
	"encoding/json"
	"log"
	"os/signal"
	"syscall"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	outboxnats "github.com/gorm-outbox/outbox/adapters/nats"
)

// NewConsumer applies the messages of a durable pull consumer on the
// stream "OUTBOX" to the database, each once: Handle writes through the
// inbox transaction tx, and the message is acked only after that
// transaction committed. A redelivery (a crash between commit and ack, a
// re-sent event) is skipped by the inbox and acked. It needs a NATS server,
// so this example is not run.
func ExampleNewConsumer() {
	db, err := gorm.Open(sqlite.Open("shipping.db"), &gorm.Config{})
	if err != nil {
		log.Fatal(err)
	}
	if err := db.Use(outbox.Plugin(outbox.Config{})); err != nil { // the inbox table lives here
		log.Fatal(err)
	}
	nc, err := natsgo.Connect(natsgo.DefaultURL, natsgo.MaxReconnects(-1), natsgo.ReconnectWait(2*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}

	c, err := outboxnats.NewConsumer(db, js, outboxnats.ConsumerConfig{
		Consumer:       "shipping",                      // the inbox's name, and the durable's
		Stream:         "OUTBOX",                        // the stream the Publisher fills
		FilterSubjects: []string{"outbox.order.placed"}, // only these events
		Handle: func(ctx context.Context, tx *gorm.DB, m outboxnats.Message) error {
			var order struct {
				ID string `json:"id"`
			}
			body, _ := m.Event.PayloadJSON() // the message body
			if err := json.Unmarshal(body, &order); err != nil {
				return outbox.Permanent(err) // never decodes: terminated, not redelivered
			}
			// An error rolls this back and redelivers the message after NakDelay.
			return tx.Exec("INSERT INTO shipments (order_id) VALUES (?)", order.ID).Error
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := c.Run(ctx); err != nil { // nil once ctx is done
		log.Fatal(err)
	}
}
