// Command example delivers outbox events to a signed webhook:
//
//	cd adapters/webhook && go run ./example
//
// It starts a receiver on a free loopback port that checks each request
// with webhook.Verify, writes an order and its event in one SQLite
// transaction, and lets a relay post the event to the receiver.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/adapters/webhook"
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

var secret = []byte("example-secret") // in production: from a secret store

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	url, stop, err := startReceiver()
	if err != nil {
		return err
	}
	defer stop()

	dir, err := os.MkdirTemp("", "outbox-webhook-example")
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

	sender, err := webhook.New(url, secret, webhook.Config{Timeout: 5 * time.Second})
	if err != nil {
		return err
	}
	ob.HandleAsync("order.created", sender.AsyncHandler())

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
	var rec outbox.Row
	if err := db.Table(ob.Table()).Take(&rec).Error; err != nil {
		return err
	}
	fmt.Printf("outbox row %s is %s\n", rec.ID, rec.Status)
	return nil
}

// startReceiver serves what a receiving service does: verify, deduplicate
// by event ID, then process.
func startReceiver() (string, func(), error) {
	var (
		mu   sync.Mutex
		seen = map[string]bool{}
	)
	mux := http.NewServeMux()
	mux.HandleFunc("POST /hooks/orders", func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 2<<20))
		if err != nil {
			http.Error(w, "read error", http.StatusBadRequest)
			return
		}
		if err := webhook.Verify(secret, r.Header, body, 5*time.Minute); err != nil {
			http.Error(w, "unauthorized", http.StatusUnauthorized)
			return
		}
		var env webhook.Envelope
		if err := json.Unmarshal(body, &env); err != nil {
			http.Error(w, "bad body", http.StatusBadRequest)
			return
		}
		mu.Lock()
		dup := seen[env.ID]
		seen[env.ID] = true
		mu.Unlock()
		if !dup {
			fmt.Printf("receiver: verified %s %s (%s/%s) traceparent=%s payload=%s\n",
				env.Type, env.ID, env.AggregateType, env.AggregateID, r.Header.Get("traceparent"), env.Payload)
		}
		w.WriteHeader(http.StatusNoContent)
	})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", nil, err
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(l) }()
	return "http://" + l.Addr().String() + "/hooks/orders", func() { _ = srv.Close() }, nil
}
