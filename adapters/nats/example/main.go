// Command example publishes outbox events to NATS JetStream:
//
//	cd adapters/nats && go run ./example
//
// It needs nats-server with JetStream on 127.0.0.1:4222 (or NATS_URL). It
// creates (or updates) the stream OUTBOX_EXAMPLE bound to "outbox.>", writes
// an order and its event in one SQLite transaction, lets a relay publish the
// event, and reads it back from the stream.
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
	outboxnats "github.com/gorm-outbox/outbox/adapters/nats"
	"github.com/gorm-outbox/outbox/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
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

func main() {
	if err := run(); err != nil {
		log.Fatal(err)
	}
}

func run() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	url := cmp.Or(os.Getenv("NATS_URL"), "nats://127.0.0.1:4222")
	// Keep reconnecting for as long as the server is away. With nats.go's
	// default (60 attempts, 2s apart) an outage of about two minutes closes
	// the connection for good, and no event is published again until the
	// process restarts.
	nc, err := nats.Connect(url, nats.MaxReconnects(-1), nats.ReconnectWait(2*time.Second))
	if err != nil {
		return fmt.Errorf("connect to %s: %w", url, err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	// The duplicate window is how long a re-sent event (after a relay crash
	// between publish and "mark sent") is still recognised and dropped.
	stream, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
		Name:       "OUTBOX_EXAMPLE",
		Subjects:   []string{"outbox.>"},
		Storage:    jetstream.FileStorage,
		Duplicates: 10 * time.Minute,
		MaxAge:     time.Hour,
	})
	if err != nil {
		return fmt.Errorf("create stream: %w", err)
	}
	// The example cleans up after itself; a service keeps its stream.
	defer js.DeleteStream(context.Background(), "OUTBOX_EXAMPLE")

	dir, err := os.MkdirTemp("", "outbox-nats-example")
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
	logger := slog.New(slog.NewTextHandler(os.Stderr, nil))
	ob := outbox.Plugin(outbox.Config{Logger: logger})
	if err := db.Use(ob); err != nil {
		return err
	}

	pub, err := outboxnats.New(js, outboxnats.Config{ExpectStream: "OUTBOX_EXAMPLE", Logger: logger})
	if err != nil {
		return err
	}
	// The relay starts a batch's publishes before it waits for their acks
	// (pub.Handler(), with ob.Handle, waits for each in turn).
	ob.HandleAsync("order.created", pub.AsyncHandler())

	var order Order
	err = db.Transaction(func(tx *gorm.DB) error {
		order = Order{Customer: "ada", Total: 42}
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

	msg, err := stream.GetLastMsgForSubject(ctx, "outbox.order.created")
	if err != nil {
		return fmt.Errorf("read back: %w", err)
	}
	fmt.Printf("stream %s seq %d subject %s\n", "OUTBOX_EXAMPLE", msg.Sequence, msg.Subject)
	fmt.Printf("  Nats-Msg-Id:        %s\n", msg.Header.Get(jetstream.MsgIDHeader))
	fmt.Printf("  Outbox-Event-Type:  %s\n", msg.Header.Get(wire.EventType))
	fmt.Printf("  Outbox-Aggregate:   %s/%s\n", msg.Header.Get(wire.AggregateType), msg.Header.Get(wire.AggregateID))
	fmt.Printf("  traceparent:        %s\n", msg.Header.Get("traceparent"))
	fmt.Printf("  payload:            %s\n", msg.Data)

	var rec outbox.Row
	if err := db.Table(ob.Table()).Where("status = ?", outbox.StatusSent).Take(&rec).Error; err != nil {
		return err
	}
	fmt.Printf("outbox row %s is %s\n", rec.ID, rec.Status)
	return nil
}
