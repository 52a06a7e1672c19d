package kafka_test

import (
	"context"
	"encoding/json"
	"flag"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/adapters/kafka"
	"github.com/gorm-outbox/outbox/wire"
)

// The rules of the repository's two test commands (README, "Testing";
// docs/testing.md), kept here rather than imported: this module requires
// the core at its release version, whose internal packages it cannot use.
// The broker is in process (kfake), so no test here needs a service; only
// the long ones wait for the full suite.
const fullEnv = "OUTBOX_TEST_FULL"

// full: the full suite runs (OUTBOX_TEST_FULL=1, what CI runs).
func full() bool { return os.Getenv(fullEnv) == "1" }

// runSelected: go test was given -run, so the tests it runs were named.
func runSelected() bool {
	f := flag.Lookup("test.run")
	return f != nil && f.Value.String() != ""
}

// long marks a test that takes its time: it runs in the full suite or when
// -run names it, so that the quick command stays quick. what says what
// makes it long.
func long(t *testing.T, what string) {
	t.Helper()
	if full() || runSelected() {
		return
	}
	t.Skipf("a long test (%s): it runs with %s=1 (the full suite) or when -run names it", what, fullEnv)
}

// newCluster starts an in-process Kafka cluster (kfake) with the default
// topic in three partitions, stopped when the test ends.
func newCluster(t *testing.T, opts ...kfake.Opt) *kfake.Cluster {
	t.Helper()
	c, err := kfake.NewCluster(append([]kfake.Opt{kfake.NumBrokers(1), kfake.SeedTopics(3, kafka.DefaultTopic)}, opts...)...)
	require.NoError(t, err)
	t.Cleanup(c.Close)
	return c
}

func newProducer(t *testing.T, seeds []string, cfg kafka.Config) *kafka.Producer {
	t.Helper()
	cfg.SeedBrokers = seeds
	p, err := kafka.New(cfg)
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

// consume reads topic from the start until it has want records, failing
// the test after a deadline.
func consume(t *testing.T, seeds []string, topic string, want int) []*kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	require.NoError(t, err)
	defer cl.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 15*time.Second)
	defer cancel()
	var recs []*kgo.Record
	for len(recs) < want {
		fs := cl.PollFetches(ctx)
		if ctx.Err() != nil {
			t.Fatalf("read %d of %d records from %s before the deadline", len(recs), want, topic)
		}
		fs.EachError(func(topic string, p int32, err error) { t.Fatalf("fetch %s/%d: %v", topic, p, err) })
		fs.EachRecord(func(r *kgo.Record) { recs = append(recs, r) })
	}
	return recs
}

// stored is how many records the topic holds, from the broker's side: the
// exact count, duplicates included, without racing a consumer.
func stored(t *testing.T, c *kfake.Cluster, topic string) int64 {
	t.Helper()
	var n int64
	for _, p := range c.PartitionInfos(topic) {
		n += p.HighWatermark - p.LogStartOffset
	}
	return n
}

func header(r *kgo.Record, key string) string {
	for _, h := range r.Headers {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// countIDs counts the records of each event ID.
func countIDs(recs []*kgo.Record) map[string]int {
	n := map[string]int{}
	for _, r := range recs {
		n[header(r, wire.EventID)]++
	}
	return n
}

func testEvent(id, aggregate string, seq int) outbox.Event {
	payload, _ := json.Marshal(map[string]int{"seq": seq})
	return outbox.Event{
		ID:             id,
		Type:           "order.created",
		AggregateType:  "order",
		AggregateID:    aggregate,
		IdempotencyKey: "key-" + id,
		Payload:        json.RawMessage(payload),
		Headers:        map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
		OccurredAt:     time.Date(2026, 5, 4, 3, 2, 1, 123456000, time.UTC),
	}
}

// restartable starts a cluster that can be stopped and started again on
// the same port with the same data, as a broker restart would.
type restartable struct {
	t    *testing.T
	port int
	dir  string
}

func newRestartable(t *testing.T) *restartable {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	return &restartable{t: t, port: port, dir: t.TempDir()}
}

// start starts the cluster; it is stopped when the test ends at the latest.
func (r *restartable) start() *kfake.Cluster {
	r.t.Helper()
	c, err := kfake.NewCluster(kfake.NumBrokers(1), kfake.Ports(r.port), kfake.DataDir(r.dir), kfake.SeedTopics(3, kafka.DefaultTopic))
	require.NoError(r.t, err)
	r.t.Cleanup(c.Close)
	return c
}
