// Command quickstart shows the outbox on SQLite with nothing to install:
//
//	go run ./examples/quickstart
//
// It uses the pure-Go SQLite driver (github.com/libtnb/sqlite), so it
// builds without cgo (CGO_ENABLED=0 works); the first build compiles SQLite
// and takes a minute or two.
//
// Part 1 runs persistent mode: the event is written in the order's
// transaction and a relay delivers it. Part 2 runs memory mode: no table,
// the handler runs right after the commit.
package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/libtnb/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// Order is the business model. Embedding outbox.Recorder lets it record
// events that are published with its next write.
type Order struct {
	ID       uint
	Customer string
	Total    int
	outbox.Recorder
}

// OrderCreated is the event's payload.
type OrderCreated struct {
	OrderID  uint   `json:"order_id"`
	Customer string `json:"customer"`
	Total    int    `json:"total"`
}

func main() {
	dir, err := os.MkdirTemp("", "outbox-quickstart")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	fmt.Println("outbox quickstart: SQLite in", dir)
	fmt.Println("== persistent mode: outbox table + relay")
	if err := persistent(filepath.Join(dir, "persistent.db")); err != nil {
		log.Fatal(err)
	}
	fmt.Println()
	fmt.Println("== memory mode: no table, dispatched right after commit")
	if err := memory(filepath.Join(dir, "memory.db")); err != nil {
		log.Fatal(err)
	}
}

// open uses the SQLite settings docs/databases.md recommends: WAL, a busy timeout
// and immediate transactions, so writers and the relay never see "database
// is locked".
func open(path string) (*gorm.DB, error) {
	dsn := "file:" + path + outbox.SQLitePureGoDSNOptions
	db, err := gorm.Open(sqlite.Open(dsn), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return nil, err
	}
	return db, db.AutoMigrate(&Order{})
}

func persistent(path string) error {
	db, err := open(path)
	if err != nil {
		return err
	}
	ob := outbox.Plugin(outbox.Config{}) // persistent mode, table outbox_events
	if err := db.Use(ob); err != nil {
		return err
	}
	delivered := make(chan struct{}, 2)
	ob.Handle("order.created", func(ctx context.Context, e outbox.Event) error {
		var p OrderCreated
		if err := e.DecodePayload(&p); err != nil {
			return err
		}
		fmt.Printf("relay delivered %s for %s, total %d\n", e.Type, p.Customer, p.Total)
		delivered <- struct{}{}
		return nil
	})

	// Publish explicitly inside a transaction.
	err = db.Transaction(func(tx *gorm.DB) error {
		order := Order{Customer: "ada", Total: 42}
		if err := tx.Create(&order).Error; err != nil {
			return err
		}
		id := strconv.Itoa(int(order.ID))
		return outbox.Publish(tx, outbox.Event{
			Type: "order.created", AggregateType: "order", AggregateID: id,
			IdempotencyKey: "order.created:" + id,
			Payload:        OrderCreated{OrderID: order.ID, Customer: order.Customer, Total: order.Total},
		})
	})
	if err != nil {
		return err
	}

	// A rolled-back transaction leaves no event behind.
	_ = db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Create(&Order{Customer: "bob", Total: 1}).Error; err != nil {
			return err
		}
		if err := outbox.Publish(tx, outbox.Event{Type: "order.created", Payload: "never delivered"}); err != nil {
			return err
		}
		return errors.New("payment declined")
	})

	// Or record the event on the model: db.Create publishes it in the same
	// transaction as the INSERT.
	order := Order{Customer: "grace", Total: 7}
	order.Record(outbox.Event{Type: "order.created", AggregateType: "order",
		Payload: OrderCreated{Customer: order.Customer, Total: order.Total}})
	if err := db.Create(&order).Error; err != nil {
		return err
	}

	var pending int64
	db.Table(ob.Table()).Where("status = ?", outbox.StatusPending).Count(&pending)
	fmt.Printf("committed; %d events pending in %s\n", pending, ob.Table())

	ctx, cancel := context.WithCancel(context.Background())
	relay, err := ob.Relay(db, outbox.RelayConfig{PollInterval: 100 * time.Millisecond})
	if err != nil {
		log.Fatal(err)
	}
	stopped := make(chan error, 1)
	go func() { stopped <- relay.Run(ctx) }()
	for range 2 {
		<-delivered
	}
	cancel()
	if err := <-stopped; err != nil {
		return err
	}
	var sent int64
	db.Table(ob.Table()).Where("status = ?", outbox.StatusSent).Count(&sent)
	fmt.Printf("relay stopped; %d events sent\n", sent)
	return nil
}

func memory(path string) error {
	db, err := open(path)
	if err != nil {
		return err
	}
	ob := outbox.Plugin(outbox.Config{Mode: outbox.Memory})
	if err := db.Use(ob); err != nil {
		return err
	}
	ob.Handle("*", func(ctx context.Context, e outbox.Event) error {
		fmt.Printf("handler got %s right after commit\n", e.Type)
		return nil
	})
	return db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Create(&Order{Customer: "linus", Total: 3}).Error; err != nil {
			return err
		}
		if err := outbox.Publish(tx, outbox.Event{Type: "order.created"}); err != nil {
			return err
		}
		fmt.Println("published inside the transaction; nothing dispatched yet")
		return nil
	})
}
