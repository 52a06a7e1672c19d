package kafka_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/adapters/kafka"
)

// NewConsumer joins a consumer group and applies each record through
// outbox.Consume: the effect and the inbox entry commit together, and the
// record's offset is committed only after that. The same event produced
// twice (a relay's re-send) is applied once. The in-process kfake cluster
// stands in for the brokers; a service passes its own kgo.SeedBrokers (and
// TLS, SASL options).
func ExampleNewConsumer() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, kafka.DefaultTopic))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()

	// The consumer's database, with the outbox plugin (for its inbox).
	dir, err := os.MkdirTemp("", "kafka-consumer-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := gorm.Open(sqlite.Open(filepath.Join(dir, "billing.db")+outbox.SQLiteDSNOptions), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	if sqlDB, err := db.DB(); err == nil {
		defer sqlDB.Close()
	}
	if err := db.Use(outbox.Plugin(outbox.Config{Logger: slog.New(slog.DiscardHandler)})); err != nil {
		log.Fatal(err)
	}
	if err := db.Exec(`CREATE TABLE invoices (order_id TEXT NOT NULL)`).Error; err != nil {
		log.Fatal(err)
	}

	// What the producing service's relay puts on the topic: one event, twice.
	producer, err := kafka.New(kafka.Config{SeedBrokers: cluster.ListenAddrs()})
	if err != nil {
		log.Fatal(err)
	}
	defer producer.Close()
	e := outbox.Event{ID: "0190d6c2-7d3a-7b1e-9f0a-5c2e4b6d8a10", Type: "order.created",
		AggregateType: "order", AggregateID: "42", Payload: json.RawMessage(`{"total":42}`)}
	for range 2 {
		if err := producer.Publish(context.Background(), e); err != nil {
			log.Fatal(err)
		}
	}

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	handled := make(chan struct{}, 2)
	consumer, err := kafka.NewConsumer(db, []kgo.Opt{kgo.SeedBrokers(cluster.ListenAddrs()...)}, kafka.ConsumerConfig{
		Consumer: "billing", // the inbox's name for this consumer; also the group's
		Handle: func(ctx context.Context, tx *gorm.DB, m kafka.Message) error {
			var order struct{ Total int }
			if err := m.Event.DecodePayload(&order); err != nil {
				return outbox.Permanent(err) // never retried: logged, committed past
			}
			fmt.Printf("%s %s total=%d\n", m.Event.Type, m.Event.AggregateID, order.Total)
			handled <- struct{}{}
			return tx.Exec(`INSERT INTO invoices (order_id) VALUES (?)`, m.Event.AggregateID).Error
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- consumer.Run(ctx) }()
	<-handled
	// Wait until both records are committed: the duplicate skipped too.
	for ctx.Err() == nil {
		if off, err := groupOffsets(ctx, cluster.ListenAddrs(), "billing", kafka.DefaultTopic); err == nil && sum(off) == 2 {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	fmt.Println("Run:", <-done)
	var invoices int64
	db.Table("invoices").Count(&invoices)
	fmt.Println("invoices:", invoices)
	// Output:
	// order.created 42 total=42
	// Run: <nil>
	// invoices: 1
}
