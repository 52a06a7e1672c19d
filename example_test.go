package outbox_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"

	"github.com/gorm-outbox/outbox"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

type Order struct {
	ID    uint
	Total int
	outbox.Recorder
}

type OrderCreated struct {
	ID    uint `json:"id"`
	Total int  `json:"total"`
}

// openDB opens a SQLite database in a temporary directory with the settings
// the README recommends.
func openDB() (*gorm.DB, func()) {
	dir, err := os.MkdirTemp("", "outbox-example")
	if err != nil {
		log.Fatal(err)
	}
	dsn := "file:" + filepath.Join(dir, "app.db") + outbox.SQLiteDSNOptions
	db, err := gorm.Open(sqlite.Open(dsn), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	if err := db.AutoMigrate(&Order{}); err != nil {
		log.Fatal(err)
	}
	return db, func() {
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
		_ = os.RemoveAll(dir)
	}
}

var quiet = slog.New(slog.DiscardHandler)

// Publish writes the event in the same transaction as the order: both commit
// or neither does. A relay delivers it afterwards.
func ExamplePublish() {
	db, done := openDB()
	defer done()

	ob := outbox.Plugin(outbox.Config{Logger: quiet})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}
	ob.Handle("order.created", func(ctx context.Context, e outbox.Event) error {
		var p OrderCreated
		if err := e.DecodePayload(&p); err != nil {
			return err
		}
		fmt.Printf("delivered %s: order %d, total %d\n", e.Type, p.ID, p.Total)
		return nil
	})

	err := db.Transaction(func(tx *gorm.DB) error {
		order := Order{Total: 42}
		if err := tx.Create(&order).Error; err != nil {
			return err
		}
		id := strconv.Itoa(int(order.ID))
		return outbox.Publish(tx, outbox.Event{
			Type:           "order.created",
			AggregateType:  "order",
			AggregateID:    id,
			IdempotencyKey: "order.created:" + id,
			Payload:        OrderCreated{ID: order.ID, Total: order.Total},
		})
	})
	if err != nil {
		log.Fatal(err)
	}

	relay, err := ob.Relay(db, outbox.RelayConfig{})
	if err != nil {
		log.Fatal(err)
	}
	n, err := relay.ProcessOnce(context.Background())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("claimed", n)
	// Output:
	// delivered order.created: order 1, total 42
	// claimed 1
}

// Publish belongs in the transaction of the business write: on a *gorm.DB
// outside one it writes nothing and says so. PublishAlone publishes events
// that belong to no business write, by themselves.
func ExamplePublishAlone() {
	db, done := openDB()
	defer done()
	ob := outbox.Plugin(outbox.Config{Logger: quiet})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}
	ob.Handle("report.requested", func(ctx context.Context, e outbox.Event) error {
		fmt.Println("delivered", e.Type)
		return nil
	})

	err := outbox.Publish(db, outbox.Event{Type: "report.requested"})
	fmt.Println("outside a transaction:", errors.Is(err, outbox.ErrNoTransaction))
	if err := outbox.PublishAlone(db, outbox.Event{Type: "report.requested"}); err != nil {
		log.Fatal(err)
	}
	relay, err := ob.Relay(db, outbox.RelayConfig{})
	if err != nil {
		log.Fatal(err)
	}
	n, err := relay.ProcessOnce(context.Background())
	fmt.Println("claimed", n, err)
	// Output:
	// outside a transaction: true
	// delivered report.requested
	// claimed 1 <nil>
}

// AfterCommit runs a function once the outermost transaction has committed,
// and never if it rolls back.
func ExampleAfterCommit() {
	db, done := openDB()
	defer done()
	if err := db.Use(outbox.Plugin(outbox.Config{Mode: outbox.Memory})); err != nil {
		log.Fatal(err)
	}

	_ = db.Transaction(func(tx *gorm.DB) error {
		outbox.AfterCommit(tx, func() { fmt.Println("committed: invalidate the cache") })
		fmt.Println("inside the transaction")
		return tx.Create(&Order{Total: 1}).Error
	})
	_ = db.Transaction(func(tx *gorm.DB) error {
		outbox.AfterCommit(tx, func() { fmt.Println("never printed") })
		return fmt.Errorf("rolled back")
	})
	// Output:
	// inside the transaction
	// committed: invalidate the cache
}

// A model that embeds Recorder records events on itself; creating, saving or
// deleting it publishes them in that statement's transaction.
func ExampleRecorder() {
	db, done := openDB()
	defer done()
	ob := outbox.Plugin(outbox.Config{Mode: outbox.Memory})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}
	ob.Handle("*", func(ctx context.Context, e outbox.Event) error {
		fmt.Println("got", e.Type, "for", e.AggregateType, e.AggregateID)
		return nil
	})

	order := Order{ID: 7, Total: 10}
	order.Record(outbox.Event{Type: "order.created", AggregateType: "order", AggregateID: "7"})
	if err := db.Create(&order).Error; err != nil {
		log.Fatal(err)
	}
	// Saving again publishes nothing new: recorded events are cleared.
	if err := db.Save(&order).Error; err != nil {
		log.Fatal(err)
	}
	// Output:
	// got order.created for order 7
}

// A relay delivers persistent events in the background until its context is
// cancelled. Several relays, in one process or many, can share a table.
func ExampleRelay_Run() {
	db, done := openDB()
	defer done()
	ob := outbox.Plugin(outbox.Config{Logger: quiet})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}
	delivered := make(chan string)
	ob.Handle("order.created", func(ctx context.Context, e outbox.Event) error {
		delivered <- e.IdempotencyKey
		return nil
	})

	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan error)
	relay, err := ob.Relay(db, outbox.RelayConfig{})
	if err != nil {
		log.Fatal(err)
	}
	go func() { stopped <- relay.Run(ctx) }()

	if err := outbox.PublishAlone(db, outbox.Event{Type: "order.created", IdempotencyKey: "order-1"}); err != nil {
		log.Fatal(err)
	}
	fmt.Println("delivered", <-delivered)
	cancel()
	fmt.Println("relay stopped:", <-stopped)
	// Output:
	// delivered order-1
	// relay stopped: <nil>
}
