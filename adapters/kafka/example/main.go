// Command example publishes outbox events to Kafka:
//
//	cd adapters/kafka && go run ./example
//
// With KAFKA_BROKERS unset it starts an in-process cluster (kfake), so it
// needs nothing installed; set KAFKA_BROKERS=host:9092,... to use real
// brokers (the topic "outbox.events" must exist or be auto-created). It
// writes orders and their events in SQLite transactions, runs a relay that
// produces them through the adapter, and reads them back: each order's
// events are in one partition, in order.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/adapters/kafka"
	"github.com/gorm-outbox/outbox/wire"
)

// Order is the business model.
type Order struct {
	ID     uint
	Status string
}

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	var seeds []string
	if env := os.Getenv("KAFKA_BROKERS"); env != "" {
		seeds = strings.Split(env, ",")
	} else {
		cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, kafka.DefaultTopic))
		if err != nil {
			return err
		}
		defer cluster.Close()
		seeds = cluster.ListenAddrs()
		fmt.Println("in-process Kafka (kfake) at", seeds)
	}

	// The application's database, with the outbox in persistent mode.
	dir, err := os.MkdirTemp("", "outbox-kafka-example")
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

	// The adapter: topic "outbox.events", key = aggregate ID. The relay
	// starts a batch's records before it waits for their acks.
	producer, err := kafka.New(kafka.Config{SeedBrokers: seeds})
	if err != nil {
		return err
	}
	defer producer.Close()
	ob.HandleAsync(outbox.AnyEvent, producer.AsyncHandler())

	// Two orders, each created then paid then shipped: six events whose
	// per-order order must survive into Kafka.
	const orders = 2
	for range orders {
		var order Order
		if err := db.Transaction(func(tx *gorm.DB) error {
			order = Order{Status: "created"}
			if err := tx.Create(&order).Error; err != nil {
				return err
			}
			return outbox.Publish(tx, orderEvent("order.created", order))
		}); err != nil {
			return err
		}
		for _, status := range []string{"paid", "shipped"} {
			if err := db.Transaction(func(tx *gorm.DB) error {
				order.Status = status
				if err := tx.Save(&order).Error; err != nil {
					return err
				}
				return outbox.Publish(tx, orderEvent("order."+status, order))
			}); err != nil {
				return err
			}
		}
	}

	// A service runs the relay for its whole life. OrderByAggregate makes
	// it produce an order's events one at a time, oldest first (the orders
	// in flight together).
	// Run returns an error only for an invalid configuration: it ends the
	// wait for the events at once instead of being dropped.
	relay, err := ob.Relay(db, outbox.RelayConfig{OrderByAggregate: true})
	if err != nil {
		return err
	}
	relayCtx, stopRelay := context.WithCancel(ctx)
	waitCtx, relayFailed := context.WithCancelCause(ctx)
	defer relayFailed(nil)
	relayDone := make(chan error, 1)
	go func() {
		err := relay.Run(relayCtx)
		if err != nil {
			relayFailed(err)
		}
		relayDone <- err
	}()
	stop := func() error { stopRelay(); return <-relayDone }

	// A consumer, standing in for another service.
	consumer, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumeTopics(kafka.DefaultTopic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		return errors.Join(err, stop())
	}
	defer consumer.Close()
	for received := 0; received < 3*orders; {
		fetches := consumer.PollFetches(waitCtx)
		if waitCtx.Err() != nil {
			if err := stop(); err != nil {
				return fmt.Errorf("relay: %w", err)
			}
			return errors.New("timed out waiting for the events")
		}
		fetches.EachRecord(func(r *kgo.Record) {
			received++
			fmt.Printf("partition %d offset %d  key=%s  %s  %s\n",
				r.Partition, r.Offset, r.Key, header(r, wire.EventType), r.Value)
		})
	}
	if err := stop(); err != nil {
		return fmt.Errorf("relay: %w", err)
	}

	var sent int64
	if err := db.Table(ob.Table()).Where("status = ?", outbox.StatusSent).Count(&sent).Error; err != nil {
		return err
	}
	fmt.Printf("%d outbox rows are %s\n", sent, outbox.StatusSent)
	return nil
}

func orderEvent(typ string, o Order) outbox.Event {
	return outbox.Event{
		Type: typ, AggregateType: "order", AggregateID: strconv.Itoa(int(o.ID)),
		Payload: o,
		Headers: map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
	}
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}
