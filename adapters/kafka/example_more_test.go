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

// New builds a Producer whose handlers turn each event into one record,
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
	ob.HandleAsync(outbox.AnyEvent, producer.AsyncHandler())

	// Handler, for ob.Handle, produces one event and waits for its ack:
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

// AsyncHandler starts each event's produce and returns a wait for the
// broker's acknowledgement, so that a relay has a whole batch in flight:
// it starts every event of a batch, in order, before it waits for any.
// Register it with HandleAsync; the handler calls below are what a relay
// does with a batch of three events of one aggregate.
func ExampleProducer_AsyncHandler() {
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
	ob.HandleAsync(outbox.AnyEvent, producer.AsyncHandler())

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := producer.AsyncHandler()
	var waits []func() error
	for i, typ := range []string{"order.created", "order.paid", "order.shipped"} {
		waits = append(waits, start(ctx, outbox.Event{
			ID: fmt.Sprintf("evt-%d", i+1), Type: typ,
			AggregateType: "order", AggregateID: "42", Payload: json.RawMessage(`{"order":42}`),
		}))
	}
	for i, wait := range waits { // all three are in flight
		fmt.Printf("evt-%d acknowledged: %v\n", i+1, wait())
	}

	consumer, err := kgo.NewClient(kgo.SeedBrokers(cluster.ListenAddrs()...),
		kgo.ConsumeTopics(kafka.DefaultTopic), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	if err != nil {
		log.Fatal(err)
	}
	defer consumer.Close()
	for got := 0; got < 3 && ctx.Err() == nil; {
		consumer.PollFetches(ctx).EachRecord(func(r *kgo.Record) {
			got++
			for _, h := range r.Headers {
				if h.Key == wire.EventType {
					fmt.Printf("offset %d key=%s %s\n", r.Offset, r.Key, h.Value)
				}
			}
		})
	}
	// Output:
	// evt-1 acknowledged: <nil>
	// evt-2 acknowledged: <nil>
	// evt-3 acknowledged: <nil>
	// offset 0 key=42 order.created
	// offset 1 key=42 order.paid
	// offset 2 key=42 order.shipped
}
