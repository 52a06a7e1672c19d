package kafka_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/adapters/kafka"
	"github.com/gorm-outbox/outbox/wire"
)

// New builds a Producer whose Handler turns each event into one record,
// keyed by the aggregate ID so that an aggregate's events share a partition.
// The in-process kfake cluster stands in for the brokers; a service passes
// its own SeedBrokers (and TLS, SASL through ClientOptions).
func ExampleNew() {
	cluster, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.SeedTopics(3, kafka.DefaultTopic))
	if err != nil {
		log.Fatal(err)
	}
	defer cluster.Close()

	producer, err := kafka.New(kafka.Config{SeedBrokers: cluster.ListenAddrs()})
	if err != nil {
		log.Fatal(err)
	}
	defer producer.Close()
	ob := outbox.Plugin(outbox.Config{}) // installed with db.Use(ob)
	ob.Handle(outbox.AnyEvent, producer.Handler())

	// What a relay does with a committed event:
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	err = producer.Handler()(ctx, outbox.Event{
		ID: "0190d6c2-7d3a-7b1e-9f0a-5c2e4b6d8a10", Type: "order.created",
		AggregateType: "order", AggregateID: "42", Payload: json.RawMessage(`{"total":42}`),
	})
	fmt.Println("produced:", err)

	consumer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...),
		kgo.ConsumeTopics(kafka.DefaultTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		log.Fatal(err)
	}
	defer consumer.Close()
	for got := 0; got == 0 && ctx.Err() == nil; {
		consumer.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			got++
			fmt.Printf("%s key=%s value=%s\n", r.Topic, r.Key, r.Value)
			for _, h := range r.Headers {
				if h.Key == wire.EventID || h.Key == wire.EventType || h.Key == kafka.HeaderContentType {
					fmt.Printf("  %s: %s\n", h.Key, h.Value)
				}
			}
		})
	}
	// Output:
	// produced: <nil>
	// outbox.events key=42 value={"total":42}
	//   Outbox-Event-Id: 0190d6c2-7d3a-7b1e-9f0a-5c2e4b6d8a10
	//   Outbox-Event-Type: order.created
	//   Content-Type: application/json
}
