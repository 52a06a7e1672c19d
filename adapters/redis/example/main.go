// Command example appends outbox events to a Redis stream:
//
//	cd adapters/redis && go run ./example
//
// It needs Redis on 127.0.0.1:6379 (or REDIS_ADDR). It writes an order and
// its event in one SQLite transaction, lets a relay XADD the event to the
// stream "outbox:example", reads the entry back and deletes the stream.
package main

import (
	"cmp"
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/gorm-outbox/outbox"
	outboxredis "github.com/gorm-outbox/outbox/adapters/redis"
	"github.com/redis/go-redis/v9"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// Order is the business model.
type Order struct {
	ID       uint
	Customer string
	Total    int
}

const stream = "outbox:example"

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	addr := cmp.Or(os.Getenv("REDIS_ADDR"), "127.0.0.1:6379")
	// ContextTimeoutEnabled lets the relay's deadline bound each XADD.
	rdb := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	if err := rdb.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("connect to %s: %w", addr, err)
	}
	defer rdb.Del(context.Background(), stream)

	dir, err := os.MkdirTemp("", "outbox-redis-example")
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

	pub, err := outboxredis.New(rdb, outboxredis.Config{Stream: stream, MaxLen: 10_000})
	if err != nil {
		return err
	}
	// A relay pipelines each batch's XADDs: one round trip per batch.
	ob.HandleAsync(outbox.AnyEvent, pub.AsyncHandler())

	err = db.Transaction(func(tx *gorm.DB) error {
		order := Order{Customer: "ada", Total: 42}
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

	// A real service runs relay.Run(ctx) in a goroutine for its lifetime;
	// one pass is enough here.
	relay, err := ob.Relay(db, outbox.RelayConfig{})
	if err != nil {
		return err
	}
	if _, err := relay.ProcessOnce(ctx); err != nil {
		return err
	}

	entries, err := rdb.XRange(ctx, stream, "-", "+").Result()
	if err != nil {
		return err
	}
	for _, m := range entries {
		fmt.Printf("stream %s entry %s\n", stream, m.ID)
		for _, f := range []string{
			outboxredis.FieldID, outboxredis.FieldType, outboxredis.FieldAggregateType, outboxredis.FieldAggregateID,
			outboxredis.FieldOccurredAt, outboxredis.FieldHeaders, outboxredis.FieldPayload,
		} {
			fmt.Printf("  %-15s %v\n", f+":", m.Values[f])
		}
	}

	var rec outbox.Row
	if err := db.Table(ob.Table()).Take(&rec).Error; err != nil {
		return err
	}
	fmt.Printf("outbox row %s is %s\n", rec.ID, rec.Status)
	return nil
}
