package nats_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	outboxnats "github.com/gorm-outbox/outbox/adapters/nats"
	natsgo "github.com/nats-io/nats.go"
)

// BenchmarkAsyncHandler is the adapter's cost per event on a relay's
// path: batches of 100 events (a relay's default batch) started one after
// the other, then their acks awaited, on the shared server. Its CPU and
// allocations per event are the adapter's and nats.go's; the bench
// program's broker scenario puts them beside the client's own floor.
//
//	go test -run '^$' -bench AsyncHandler -benchmem ./adapters/nats
func BenchmarkAsyncHandler(b *testing.B) {
	_, js := connect(b) // checks the server has JetStream
	_, prefix := newStream(b, js)
	// A connection that reconnects for good, as the adapter asks.
	_, js = connectWith(b, brokerURL(b), natsgo.MaxReconnects(-1))
	h := newPublisher(b, js, outboxnats.Config{SubjectPrefix: prefix + "."}).AsyncHandler()
	const batch = 100
	t0 := time.Now().UTC().Truncate(time.Microsecond)
	// The events exist before the clock starts, as a relay's claim made
	// them; each has an ID of its own, so the stream's dedupe drops none.
	events := make([]outbox.Event, b.N)
	run := randomName()
	for i := range events {
		id := fmt.Sprintf("%s-%08d", run, i)
		events[i] = outbox.Event{
			ID: id, IdempotencyKey: id, Type: "order.created", AggregateType: "order", AggregateID: strconv.Itoa(i),
			Payload:    json.RawMessage(fmt.Sprintf(`{"total": 42, "order_id": %d}`, i)),
			OccurredAt: t0.Add(time.Duration(i) * time.Microsecond),
		}
	}
	ctx := context.Background()
	waits := make([]func() error, 0, batch)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := processCPU(b)
	for i := 0; i < len(events); i += batch {
		waits = waits[:0]
		for j := i; j < min(i+batch, len(events)); j++ {
			waits = append(waits, h(ctx, events[j]))
		}
		for _, wait := range waits {
			if err := wait(); err != nil {
				b.Fatal(err)
			}
		}
	}
	// The wall time per event is mostly the server's; the process's CPU
	// per event (nats.go's reader included) is the adapter's cost.
	b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
}

// processCPU is the user and system CPU time this process has used.
func processCPU(b *testing.B) time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		b.Fatal(err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
