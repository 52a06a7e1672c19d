package redis_test

import (
	"log"

	goredis "github.com/redis/go-redis/v9"

	"github.com/gorm-outbox/outbox"
	outboxredis "github.com/gorm-outbox/outbox/adapters/redis"
)

// New wraps a go-redis client; its Handler appends each event to a stream
// with XADD and waits for the reply. Consumers read the stream with a
// consumer group and deduplicate by the entry's "id" field. It needs a
// Redis server, so this example is not run.
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
	ob.Handle(outbox.AnyEvent, pub.Handler())
}
