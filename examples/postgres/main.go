// Command postgres is a small orders service on PostgreSQL: an HTTP endpoint
// creates orders and publishes an event in the same transaction, and a relay
// in the same process delivers the events.
//
//	DATABASE_URL=postgres://postgres@127.0.0.1:5432/test?sslmode=disable go run ./examples/postgres
//	curl -XPOST 'localhost:8080/orders?customer=ada&total=42'
//
// With -demo it places a few orders itself, waits for their delivery and
// exits. Run several copies against one database: their relays share the
// work without delivering an event twice while its claim is live.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	"os"
	"os/signal"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/gorm-outbox/outbox"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

type Order struct {
	ID        uint `gorm:"primaryKey"`
	Customer  string
	Total     int
	CreatedAt time.Time
}

type OrderCreated struct {
	OrderID  uint   `json:"order_id"`
	Customer string `json:"customer"`
	Total    int    `json:"total"`
}

func main() {
	addr := flag.String("addr", "localhost:8080", "HTTP listen address")
	demo := flag.Int("demo", 0, "place this many orders, wait for their delivery, and exit")
	flag.Parse()
	if err := run(*addr, *demo); err != nil {
		slog.Error("orders service failed", slog.Any("error", err))
		os.Exit(1)
	}
}

func run(addr string, demo int) error {
	dsn := os.Getenv("DATABASE_URL")
	if dsn == "" {
		dsn = "postgres://postgres@127.0.0.1:5432/test?sslmode=disable"
	}
	db, err := gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: logger.Default.LogMode(logger.Warn)})
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	if err := db.AutoMigrate(&Order{}); err != nil {
		return err
	}
	ob := outbox.Plugin(outbox.Config{})
	if err := db.Use(ob); err != nil {
		return err
	}

	var delivered atomic.Int64
	ob.Handle("order.created", func(ctx context.Context, e outbox.Event) error {
		var p OrderCreated
		if err := e.DecodePayload(&p); err != nil {
			return outbox.Permanent(err) // retrying cannot fix a bad payload
		}
		// Deliver: send an email, call a webhook, publish to a broker. At
		// least once: a consumer deduplicates by e.ID.
		slog.Info("order.created delivered", slog.String("event_id", e.ID), slog.Uint64("order_id", uint64(p.OrderID)))
		delivered.Add(1)
		return nil
	})

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	relay, err := ob.Relay(db, outbox.RelayConfig{})
	if err != nil {
		return err
	}
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(ctx) }()

	if demo > 0 {
		for i := range demo {
			if _, err := createOrder(ctx, db, fmt.Sprintf("customer-%d", i), 10*(i+1)); err != nil {
				return err
			}
		}
		deadline := time.Now().Add(30 * time.Second)
		for delivered.Load() < int64(demo) && time.Now().Before(deadline) {
			time.Sleep(50 * time.Millisecond)
		}
		stop()
		fmt.Printf("placed %d orders, delivered %d events\n", demo, delivered.Load())
		return <-relayDone
	}

	mux := http.NewServeMux()
	mux.HandleFunc("POST /orders", func(w http.ResponseWriter, r *http.Request) {
		total, err := strconv.Atoi(r.URL.Query().Get("total"))
		if err != nil {
			http.Error(w, "total must be an integer", http.StatusBadRequest)
			return
		}
		order, err := createOrder(r.Context(), db, r.URL.Query().Get("customer"), total)
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		fmt.Fprintf(w, "order %d created\n", order.ID)
	})
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	slog.Info("orders service listening", slog.String("addr", addr))
	if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return <-relayDone
}

// createOrder writes the order and its event in one transaction: both are
// committed or neither is.
func createOrder(ctx context.Context, db *gorm.DB, customer string, total int) (Order, error) {
	order := Order{Customer: customer, Total: total}
	err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		if err := tx.Create(&order).Error; err != nil {
			return err
		}
		id := strconv.Itoa(int(order.ID))
		return outbox.Publish(tx, outbox.Event{
			Type: "order.created", AggregateType: "order", AggregateID: id,
			IdempotencyKey: "order.created:" + id,
			Payload:        OrderCreated{OrderID: order.ID, Customer: customer, Total: total},
		})
	})
	return order, err
}
