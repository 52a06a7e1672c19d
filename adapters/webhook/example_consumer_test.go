package webhook_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"

	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/adapters/webhook"
)

// NewConsumer is the receiving end of a Sender: an http.Handler that
// verifies the signature, decodes the envelope and applies the event in the
// inbox transaction, answering 204 only once that committed. The same event
// posted twice (a lost response) is applied once, and both posts get a 204.
func ExampleNewConsumer() {
	key := []byte("whsec_example")
	dir, err := os.MkdirTemp("", "webhook-consumer-example")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)

	// The receiving service's database, with the outbox plugin installed:
	// it holds the inbox table.
	db, err := gorm.Open(sqlite.Open("file:"+filepath.Join(dir, "billing.db")+outbox.SQLiteDSNOptions),
		&gorm.Config{Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		log.Fatal(err)
	}
	defer sqlDB.Close()
	if err := db.Use(outbox.Plugin(outbox.Config{})); err != nil {
		log.Fatal(err)
	}
	type Invoice struct {
		OrderID string `gorm:"primaryKey"`
		Total   int
	}
	if err := db.AutoMigrate(&Invoice{}); err != nil {
		log.Fatal(err)
	}

	consumer, err := webhook.NewConsumer(db, key, webhook.ConsumerConfig{
		Consumer: "billing",
		Logger:   slog.New(slog.DiscardHandler),
		Handle: func(ctx context.Context, tx *gorm.DB, m webhook.Message) error {
			var order struct {
				Total int `json:"total"`
			}
			if err := json.Unmarshal(m.Event.Payload.(json.RawMessage), &order); err != nil {
				return outbox.Permanent(err) // 422: the sender fails the event
			}
			return tx.Create(&Invoice{OrderID: m.Event.AggregateID, Total: order.Total}).Error
		},
	})
	if err != nil {
		log.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.Handle("POST /hooks/orders", consumer)
	srv := httptest.NewServer(mux)
	defer srv.Close()

	// The producing side: normally the outbox relay calls the handler.
	sender, err := webhook.New(srv.URL+"/hooks/orders", key, webhook.Config{})
	if err != nil {
		log.Fatal(err)
	}
	send := sender.Handler()
	e := outbox.Event{ID: "evt-1", Type: "order.created", AggregateType: "order", AggregateID: "42",
		Payload: json.RawMessage(`{"total":1250}`)}
	fmt.Println(send(context.Background(), e))
	fmt.Println(send(context.Background(), e)) // delivered again: skipped, acknowledged

	var invoices []Invoice
	if err := db.Find(&invoices).Error; err != nil {
		log.Fatal(err)
	}
	fmt.Println(invoices)
	// Output:
	// <nil>
	// <nil>
	// [{42 1250}]
}
