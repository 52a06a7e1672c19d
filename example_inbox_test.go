package outbox_test

import (
	"errors"
	"fmt"
	"log"

	"github.com/gorm-outbox/outbox"
	"gorm.io/gorm"
)

// Invoice is a consumer's business row.
type Invoice struct {
	ID      uint
	OrderID string
}

// Consume applies a message's effect once per consumer and message ID: a
// redelivery of the same message finds its record and skips fn, and a
// failed attempt records nothing, so the retry runs. Acknowledge the
// message to the broker only after Consume returned nil.
func ExampleConsume() {
	db, done := openDB()
	defer done()
	if err := db.Use(outbox.Plugin(outbox.Config{Logger: quiet})); err != nil {
		log.Fatal(err)
	}
	if err := db.AutoMigrate(&Invoice{}); err != nil {
		log.Fatal(err)
	}
	attempt := 0
	bill := func(tx *gorm.DB) error {
		attempt++
		if err := tx.Create(&Invoice{OrderID: "42"}).Error; err != nil {
			return err
		}
		if attempt == 1 {
			return errors.New("payment API timed out") // rolled back with the invoice
		}
		// Published onward in the same transaction as the invoice.
		return outbox.Publish(tx, outbox.Event{Type: "invoice.created", Payload: map[string]string{"order": "42"}})
	}
	// The broker delivers the message three times: a failure, a success, a
	// duplicate.
	for range 3 {
		err := outbox.Consume(db, "billing", "evt-0192", bill)
		fmt.Println("ack:", err == nil)
	}
	var invoices int64
	db.Model(&Invoice{}).Count(&invoices)
	fmt.Println("fn ran", attempt, "times; invoices:", invoices)
	// Output:
	// ack: false
	// ack: true
	// ack: true
	// fn ran 2 times; invoices: 1
}
