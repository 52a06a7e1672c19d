package main

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/gorm-outbox/outbox"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
)

type Order struct {
	ID    uint
	Total int
}

func main() {
	db, err := gorm.Open(sqlite.Open("file:app.db"+outbox.SQLiteDSNOptions), &gorm.Config{})
	if err != nil {
		log.Fatal(err)
	}
	ob := outbox.Plugin(outbox.Config{}) // Persistent mode, table outbox_events
	if err := db.Use(ob); err != nil {   // creates the table when missing
		log.Fatal(err)
	}
	if err := db.AutoMigrate(&Order{}); err != nil {
		log.Fatal(err)
	}
	// A service runs the relay for its whole life; this one until its
	// order is delivered (ten seconds at most).
	ctx, stop := context.WithTimeout(context.Background(), 10*time.Second)
	defer stop()
	ob.Handle("order.placed", func(_ context.Context, e outbox.Event) error {
		fmt.Printf("delivered %s for order %s: %s\n", e.Type, e.AggregateID, e.Payload)
		stop()     // this program is done: the relay records the delivery and returns
		return nil // an error retries the event later, with backoff
	})

	// The order and its event commit together, or neither does.
	err = db.Transaction(func(tx *gorm.DB) error {
		order := Order{Total: 42}
		if err := tx.Create(&order).Error; err != nil {
			return err
		}
		return outbox.Publish(tx, outbox.Event{
			Type: "order.placed", AggregateType: "order", AggregateID: fmt.Sprint(order.ID), Payload: order,
		})
	})
	if err != nil {
		log.Fatal(err)
	}

	relay, err := ob.Relay(db, outbox.RelayConfig{})
	if err != nil {
		log.Fatal(err)
	}
	if err := relay.Run(ctx); err != nil {
		log.Fatal(err)
	}
}
