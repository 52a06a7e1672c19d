package rabbitmq_test

import (
	"context"
	"log"
	"os/signal"
	"syscall"
	"time"

	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/adapters/rabbitmq"
)

// New checks the configuration without connecting, so a service starts
// while the broker is down; the first publish (or Connect) dials. Each
// message goes to a topic exchange with the event type as routing key and
// counts as delivered once the broker confirms it. It needs a RabbitMQ
// broker, so this example is not run.
func ExampleNew() {
	pub, err := rabbitmq.New(rabbitmq.Config{
		URL:             "amqp://guest:guest@localhost:5672/",
		Exchange:        "orders.events",
		DeclareExchange: true, // durable topic exchange, declared on connect
	})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()

	// Optional: surface a wrong URL or credentials at startup.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := pub.Connect(ctx); err != nil {
		log.Print("broker not reachable yet; the relay will wait for it: ", err)
	}

	ob := outbox.Plugin(outbox.Config{}) // installed with db.Use(ob)
	ob.Handle(outbox.AnyEvent, pub.Handler())
}

// The AsyncHandler is the one to register: a relay publishes a whole batch
// on the Publisher's channel before it waits for the broker's confirms, so
// a batch costs about one round trip instead of one per event. Every event
// still counts as delivered only once the broker confirmed it, and with
// OrderByAggregate an aggregate's next event is published only once the
// previous one was. It needs a RabbitMQ broker, so this example is not
// run.
func ExamplePublisher_AsyncHandler() {
	var db *gorm.DB // opened by the application

	ob := outbox.Plugin(outbox.Config{})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}
	pub, err := rabbitmq.New(rabbitmq.Config{
		URL:             "amqp://guest:guest@localhost:5672/",
		DeclareExchange: true, // durable topic exchange "outbox.events"
	})
	if err != nil {
		log.Fatal(err)
	}
	defer pub.Close()
	ob.HandleAsync(outbox.AnyEvent, pub.AsyncHandler())

	relay, err := ob.Relay(db, outbox.RelayConfig{OrderByAggregate: true})
	if err != nil {
		log.Fatal(err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	if err := relay.Run(ctx); err != nil {
		log.Print(err)
	}
}
