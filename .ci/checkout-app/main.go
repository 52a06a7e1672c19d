// The program .ci/checkout-install builds in an empty module outside the
// repository after running README.md's "From a checkout" commands, and runs:
// an event published in a PostgreSQL transaction (OUTBOX_TEST_POSTGRES_DSN)
// is delivered by the relay through the webhook adapter, to a local server
// that verifies its signature, and through the NATS adapter, to a JetStream
// stream of this run's own (OUTBOX_TEST_NATS_URL, default 127.0.0.1:4222).
// It is not part of any module of the repository (.ci is ignored by the go
// command's patterns).
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"time"

	"github.com/gorm-outbox/outbox"
	outboxnats "github.com/gorm-outbox/outbox/adapters/nats"
	"github.com/gorm-outbox/outbox/adapters/webhook"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

func main() {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)

	db, err := gorm.Open(postgres.Open(os.Getenv("OUTBOX_TEST_POSTGRES_DSN")), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	table := "checkout_" + id
	defer db.Exec("DROP TABLE IF EXISTS " + table)
	ob := outbox.Plugin(outbox.Config{Table: table})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}

	// The webhook adapter, to a server that checks the signature.
	secret := []byte("checkout")
	hooks := make(chan string, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if err := webhook.Verify(secret, r.Header, body, time.Minute); err != nil {
			http.Error(w, err.Error(), http.StatusUnauthorized)
			return
		}
		hooks <- string(body)
	}))
	defer srv.Close()
	sender, err := webhook.New(srv.URL, secret, webhook.Config{})
	if err != nil {
		log.Fatal(err)
	}

	// The NATS adapter, to a stream of this run's own.
	url := os.Getenv("OUTBOX_TEST_NATS_URL")
	if url == "" {
		url = nats.DefaultURL
	}
	nc, err := nats.Connect(url, nats.MaxReconnects(-1))
	if err != nil {
		log.Fatalf("NATS at %s: %v", url, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	stream := "CHECKOUT_" + id
	subject := "checkout_" + id + ".placed"
	s, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: stream, Subjects: []string{subject}})
	if err != nil {
		log.Fatalf("NATS at %s (JetStream): %v", url, err)
	}
	defer js.DeleteStream(context.Background(), stream)
	pub, err := outboxnats.New(js, outboxnats.Config{Subject: func(outbox.Event) string { return subject }})
	if err != nil {
		log.Fatal(err)
	}

	ob.Handle("order.placed", sender.Handler())
	ob.Handle("order.placed", pub.Handler())
	if err := db.Transaction(func(tx *gorm.DB) error {
		return outbox.Publish(tx, outbox.Event{ID: "order-1", Type: "order.placed", Payload: map[string]int{"total": 42}})
	}); err != nil {
		log.Fatal(err)
	}
	relay, err := ob.Relay(db, outbox.RelayConfig{})
	if err != nil {
		log.Fatal(err)
	}
	if n, err := relay.ProcessOnce(ctx); err != nil || n != 1 {
		log.Fatalf("relay: %d events, %v", n, err)
	}
	select {
	case body := <-hooks:
		fmt.Println("webhook:", body)
	case <-ctx.Done():
		log.Fatal("the webhook received nothing")
	}
	msg, err := s.GetLastMsgForSubject(ctx, subject)
	if err != nil {
		log.Fatalf("NATS: %v", err)
	}
	fmt.Println("nats:", string(msg.Data))
}
