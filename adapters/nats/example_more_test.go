package nats_test

import (
	"context"
	"log"
	"os/signal"
	"syscall"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	outboxnats "github.com/gorm-outbox/outbox/adapters/nats"
)

// New wraps a JetStream context; its handlers publish each event on
// "outbox."+type, with Nats-Msg-Id set to the event ID so that JetStream
// drops a re-sent event within the stream's duplicate window. Handler
// waits for the stream's ack before it returns; register it with Handle
// when each publish must be awaited on its own. It needs a NATS server, so
// this example is not run.
func ExampleNew() {
	// Reconnect forever: with nats.go's default of 60 attempts, an outage of
	// about two minutes would close the connection for good.
	nc, err := natsgo.Connect(natsgo.DefaultURL, natsgo.MaxReconnects(-1), natsgo.ReconnectWait(2*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}

	pub, err := outboxnats.New(js, outboxnats.Config{
		ExpectStream: "OUTBOX", // a stream bound to "outbox.>", Duplicates >= the retry horizon
	})
	if err != nil {
		log.Fatal(err)
	}
	ob := outbox.Plugin(outbox.Config{}) // installed with db.Use(ob)
	ob.Handle(outbox.AnyEvent, pub.Handler())
}

// AsyncHandler is the registration to use: the relay starts the publishes
// of a whole batch (with OrderByAggregate, one event per aggregate at a
// time) before it waits for any ack, so a batch costs about one round
// trip to the server. It needs a NATS server, so this example is not run.
func ExamplePublisher_AsyncHandler() {
	nc, err := natsgo.Connect(natsgo.DefaultURL, natsgo.MaxReconnects(-1), natsgo.ReconnectWait(2*time.Second))
	if err != nil {
		log.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		log.Fatal(err)
	}
	pub, err := outboxnats.New(js, outboxnats.Config{ExpectStream: "OUTBOX"})
	if err != nil {
		log.Fatal(err)
	}

	db, err := gorm.Open(sqlite.Open("app.db"), &gorm.Config{})
	if err != nil {
		log.Fatal(err)
	}
	ob := outbox.Plugin(outbox.Config{})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}
	ob.HandleAsync(outbox.AnyEvent, pub.AsyncHandler())

	relay, err := ob.Relay(db, outbox.RelayConfig{OrderByAggregate: true})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := relay.Run(ctx); err != nil { // nil once ctx is done
		log.Fatal(err)
	}
}
