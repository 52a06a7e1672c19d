package nats_test

import (
	"log"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/gorm-outbox/outbox"
	outboxnats "github.com/gorm-outbox/outbox/adapters/nats"
)

// New wraps a JetStream context; its Handler publishes each event on
// "outbox."+type and waits for the stream's ack, with Nats-Msg-Id set to
// the event ID so that JetStream drops a re-sent event within the stream's
// duplicate window. It needs a NATS server, so this example is not run.
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
