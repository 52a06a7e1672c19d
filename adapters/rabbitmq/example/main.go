// Command example publishes outbox events to RabbitMQ:
//
//	cd adapters/rabbitmq && go run ./example
//
// It needs RabbitMQ on 127.0.0.1:5672 with guest/guest (or RABBITMQ_URL).
// It writes three orders and their events in SQLite transactions, runs a
// relay that publishes them through the adapter to the topic exchange
// "outbox.events" (declared by the adapter), and reads them back from a
// temporary queue bound to "order.*".
package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/adapters/rabbitmq"
	"github.com/gorm-outbox/outbox/wire"
)

// Order is the business model.
type Order struct {
	ID       uint
	Customer string
	Total    int
}

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	url := cmp.Or(os.Getenv("RABBITMQ_URL"), "amqp://guest:guest@127.0.0.1:5672/")

	// The application's database, with the outbox in persistent mode.
	dir, err := os.MkdirTemp("", "outbox-rabbitmq-example")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	dsn := "file:" + filepath.Join(dir, "app.db") + outbox.SQLiteDSNOptions
	db, err := gorm.Open(sqlite.Open(dsn), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return err
	}
	if err := db.AutoMigrate(&Order{}); err != nil {
		return err
	}
	ob := outbox.Plugin(outbox.Config{Logger: slog.New(slog.NewTextHandler(os.Stderr, nil))})
	if err := db.Use(ob); err != nil {
		return err
	}

	// The adapter. Connect is optional (publishing connects lazily); here it
	// declares the exchange before the consumer binds to it.
	pub, err := rabbitmq.New(rabbitmq.Config{URL: url, DeclareExchange: true})
	if err != nil {
		return err
	}
	defer pub.Close()
	if err := pub.Connect(ctx); err != nil {
		return fmt.Errorf("is RabbitMQ running at %s? %w", url, err)
	}
	// The AsyncHandler: the relay publishes a batch before it waits for the
	// broker's confirms (pub.Handler() with ob.Handle waits for each).
	ob.HandleAsync("order.created", pub.AsyncHandler())

	// A consumer, standing in for another service. Messages are mandatory,
	// so without a bound queue the relay would keep retrying them.
	deliveries, stop, err := consume(url, rabbitmq.DefaultExchange, "order.*")
	if err != nil {
		return err
	}
	defer stop()

	for i, customer := range []string{"ada", "grace", "edsger"} {
		err := db.Transaction(func(tx *gorm.DB) error {
			order := Order{Customer: customer, Total: 10 * (i + 1)}
			if err := tx.Create(&order).Error; err != nil {
				return err
			}
			return outbox.Publish(tx, outbox.Event{
				Type: "order.created", AggregateType: "order", AggregateID: strconv.Itoa(int(order.ID)),
				Payload: order,
				Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
			})
		})
		if err != nil {
			return err
		}
	}

	// A service runs the relay for its whole life; this one stops once the
	// consumer has seen the three events.
	relay, err := ob.Relay(db, outbox.RelayConfig{OrderByAggregate: true})
	if err != nil {
		return err
	}
	relayCtx, stopRelay := context.WithCancel(ctx)
	relayDone := make(chan error, 1)
	go func() {
		relayDone <- relay.Run(relayCtx)
	}()
	for range 3 {
		select {
		case m := <-deliveries:
			fmt.Printf("received %s  message-id=%s  routing-key=%s  aggregate=%v/%v  body=%s\n",
				m.Type, m.MessageId, m.RoutingKey, m.Headers[wire.AggregateType], m.Headers[wire.AggregateID], m.Body)
		case err := <-relayDone: // only an invalid configuration: do not drop it
			stopRelay()
			return errors.Join(errors.New("the relay stopped before the events arrived"), err)
		case <-ctx.Done():
			stopRelay()
			if err := <-relayDone; err != nil {
				return fmt.Errorf("relay: %w", err)
			}
			return errors.New("timed out waiting for the events")
		}
	}
	stopRelay()
	if err := <-relayDone; err != nil {
		return fmt.Errorf("relay: %w", err)
	}

	var sent int64
	if err := db.Table(ob.Table()).Where("status = ?", outbox.StatusSent).Count(&sent).Error; err != nil {
		return err
	}
	fmt.Printf("%d outbox rows are %s\n", sent, outbox.StatusSent)
	return nil
}

// consume binds a temporary queue to the exchange and returns its messages.
func consume(url, exchange, bindingKey string) (<-chan amqp.Delivery, func(), error) {
	conn, err := amqp.Dial(url)
	if err != nil {
		return nil, nil, err
	}
	ch, err := conn.Channel()
	if err == nil {
		var q amqp.Queue
		q, err = ch.QueueDeclare("", false, true, true, false, nil)
		if err == nil {
			err = ch.QueueBind(q.Name, bindingKey, exchange, false, nil)
		}
		if err == nil {
			var d <-chan amqp.Delivery
			d, err = ch.Consume(q.Name, "", true, true, false, false, nil)
			if err == nil {
				return d, func() { _ = conn.Close() }, nil
			}
		}
	}
	_ = conn.Close()
	return nil, nil, err
}
