package redis_test

import (
	"context"
	"log"
	"os/signal"
	"syscall"
	"time"

	goredis "github.com/redis/go-redis/v9"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	outboxredis "github.com/gorm-outbox/outbox/adapters/redis"
)

// Invoice is a consumer's business row.
type Invoice struct {
	ID      uint
	OrderID string
}

// NewConsumer reads a stream through a consumer group and applies each
// entry once: Handle writes through tx, in the transaction that records the
// message in the inbox, and the entry is acknowledged (XACK) only after
// that commit. A redelivered entry (a retried XADD, a consumer that crashed
// before its XACK) finds its record and is acknowledged without running
// Handle again. It needs a Redis server, so this example is not run.
func ExampleNewConsumer() {
	db, err := gorm.Open(sqlite.Open("billing.db"), &gorm.Config{})
	if err != nil {
		log.Fatal(err)
	}
	// The plugin creates the inbox table; the consumer needs no relay.
	if err := db.Use(outbox.Plugin(outbox.Config{})); err != nil {
		log.Fatal(err)
	}
	if err := db.AutoMigrate(&Invoice{}); err != nil {
		log.Fatal(err)
	}
	rdb := goredis.NewClient(&goredis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	defer rdb.Close()

	c, err := outboxredis.NewConsumer(db, rdb, outboxredis.ConsumerConfig{
		Consumer: "billing",
		Stream:   outboxredis.DefaultStream, // the publisher's default
		Group:    "billing",
		// A transient error is retried once pending for this long; a
		// crashed consumer's entries are taken over after it too.
		ClaimIdle: 30 * time.Second,
		Handle: func(ctx context.Context, tx *gorm.DB, m outboxredis.Message) error {
			if m.Event.Type != "order.created" {
				return nil // acknowledged, nothing to do
			}
			var order struct {
				ID string `json:"id"`
			}
			if err := m.Event.DecodePayload(&order); err != nil {
				return outbox.Permanent(err) // never succeeds: terminated
			}
			return tx.Create(&Invoice{OrderID: order.ID}).Error
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
