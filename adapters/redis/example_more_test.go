package redis_test

import (
	"context"
	"log"
	"os/signal"
	"syscall"

	goredis "github.com/redis/go-redis/v9"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	outboxredis "github.com/gorm-outbox/outbox/adapters/redis"
)

// New wraps a go-redis client; its AsyncHandler appends each event to a
// stream with XADD, a relay's batch in one pipeline. Consumers read the
// stream with a consumer group and deduplicate by the entry's "id" field.
// It needs a Redis server, so this example is not run.
func ExampleNew() {
	// ContextTimeoutEnabled lets the relay's deadline bound each XADD.
	rdb := goredis.NewClient(&goredis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	defer rdb.Close()

	pub, err := outboxredis.New(rdb, outboxredis.Config{
		Stream: "orders:events",
		MaxLen: 100_000, // trim the oldest entries (approximately)
	})
	if err != nil {
		log.Fatal(err)
	}
	ob := outbox.Plugin(outbox.Config{}) // installed with db.Use(ob)
	ob.HandleAsync(outbox.AnyEvent, pub.AsyncHandler())
}

// AsyncHandler pipelines a relay's deliveries: the relay starts every
// event of a claimed batch before it waits for any, and the publisher
// sends their XADDs (and, with WaitReplicas, one WAIT after them) in one
// round trip. With OrderByAggregate an aggregate's next event is started
// only once the previous one's entry is in Redis. Handler, one XADD at a
// time, still works with ob.Handle. It needs a Redis server, so this
// example is not run.
func ExamplePublisher_AsyncHandler() {
	db, err := gorm.Open(sqlite.Open("orders.db"), &gorm.Config{})
	if err != nil {
		log.Fatal(err)
	}
	ob := outbox.Plugin(outbox.Config{})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}
	rdb := goredis.NewClient(&goredis.Options{Addr: "localhost:6379", ContextTimeoutEnabled: true})
	defer rdb.Close()

	// WaitReplicas: each pipeline ends with one WAIT for a replica.
	pub, err := outboxredis.New(rdb, outboxredis.Config{WaitReplicas: 1})
	if err != nil {
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
