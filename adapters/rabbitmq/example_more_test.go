package rabbitmq_test

import (
	"context"
	"log"
	"time"

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
