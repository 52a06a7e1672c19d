package kafka_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/adapters/kafka"
	"github.com/gorm-outbox/outbox/outboxtest"
	"github.com/gorm-outbox/outbox/wire"
)

// inFlight is a client hook that counts the records the client holds
// (handed to Produce, neither acknowledged nor failed yet) and the most it
// held at once; full is closed once that reaches want.
type inFlight struct {
	mu      sync.Mutex
	n, most int
	want    int
	full    chan struct{}
}

func newInFlight(want int) *inFlight { return &inFlight{want: want, full: make(chan struct{})} }

func (f *inFlight) OnProduceRecordBuffered(*kgo.Record) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n++
	if f.n > f.most {
		f.most = f.n
		if f.most == f.want {
			close(f.full)
		}
	}
}

func (f *inFlight) OnProduceRecordUnbuffered(*kgo.Record, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.n--
}

func (f *inFlight) max() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.most
}

// holdFirstProduce makes the cluster answer its first produce request only
// once release is closed, or after a timeout: no record is acknowledged
// before then.
func holdFirstProduce(c *kfake.Cluster, release <-chan struct{}, timeout time.Duration) {
	var once atomic.Bool
	c.ControlKey(int16(kmsg.Produce), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.DropControl()
		if once.CompareAndSwap(false, true) {
			c.SleepControl(func() {
				select {
				case <-release:
				case <-time.After(timeout):
				}
			})
		}
		return nil, nil, false // the cluster answers it as usual
	})
}

// orderEvents are each aggregate's events, aggregates interleaved: event n
// of aggregate a has the ID evt-a-n and n in its payload.
func orderEvents(aggregates []string, each int) []outbox.Event {
	var events []outbox.Event
	for n := range each {
		for _, a := range aggregates {
			payload, _ := json.Marshal(map[string]int{"seq": n})
			events = append(events, outbox.Event{
				ID: fmt.Sprintf("evt-%s-%d", a, n), Type: "order.created", AggregateType: "order", AggregateID: a,
				Payload: json.RawMessage(payload),
			})
		}
	}
	return events
}

func seqOf(t *testing.T, r *kgo.Record) int {
	t.Helper()
	var v struct{ Seq int }
	require.NoError(t, json.Unmarshal(r.Value, &v))
	return v.Seq
}

// firstCopies is, per aggregate, the seq of each event's first record in
// the order the topic holds them (a partition's records in offset order).
func firstCopies(t *testing.T, recs []*kgo.Record) map[string][]int {
	t.Helper()
	seen := map[string]bool{}
	got := map[string][]int{}
	for _, r := range recs {
		id := header(r, wire.EventID)
		if seen[id] {
			continue
		}
		seen[id] = true
		got[string(r.Key)] = append(got[string(r.Key)], seqOf(t, r))
	}
	return got
}

func statusCount(t *testing.T, db *gorm.DB, status outbox.Status) int64 {
	t.Helper()
	var n int64
	require.NoError(t, db.Table(outbox.DefaultTable).Where("status = ?", status).Count(&n).Error)
	return n
}

// TestAsyncPipelines: a relay with an AsyncHandler has a whole batch in
// flight. The cluster holds its first produce request until the client
// holds every record of the batch (or 10 s), so no record is acknowledged
// before the last one was handed over: 40 records were in flight at once
// with 2 workers, and each partition took them in batch order. The control
// is the Handler, which the same relay runs with one record per worker.
func TestAsyncPipelines(t *testing.T) {
	t.Parallel()
	const batch, workers = 40, 2
	aggregates := []string{"a", "b", "c", "d", "e", "f", "g", "h"}
	events := orderEvents(aggregates, batch/len(aggregates))

	c := newCluster(t)
	flight := newInFlight(batch)
	p := newProducer(t, c.ListenAddrs(), kafka.Config{ClientOptions: []kgo.Opt{kgo.WithHooks(flight)}})
	holdFirstProduce(c, flight.full, 10*time.Second)
	db, ob := openOutbox(t)
	ob.HandleAsync(outbox.AnyEvent, p.AsyncHandler())
	publishEvents(t, db, events...)
	relay, err := ob.Relay(db, outbox.RelayConfig{BatchSize: batch, Workers: workers})
	require.NoError(t, err)
	n, err := relay.ProcessOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, batch, n)
	assert.Equal(t, batch, flight.max(), "the whole batch in flight at once, with %d workers", workers)
	assert.EqualValues(t, batch, statusCount(t, db, outbox.StatusSent))

	recs := consume(t, c.ListenAddrs(), kafka.DefaultTopic, batch)
	assert.EqualValues(t, batch, stored(t, c, kafka.DefaultTopic), "one record per event")
	// Batch order is the events' order; a partition's records must follow it.
	rank := map[string]int{}
	for i, e := range events {
		rank[e.ID] = i
	}
	last := map[int32]int{}
	for _, r := range recs {
		i := rank[header(r, wire.EventID)]
		if prev, ok := last[r.Partition]; ok {
			assert.Less(t, prev, i, "partition %d in batch order", r.Partition)
		}
		last[r.Partition] = i
	}

	// The control: the Handler, one record per worker at a time.
	c2 := newCluster(t)
	flight2 := newInFlight(batch)
	p2 := newProducer(t, c2.ListenAddrs(), kafka.Config{ClientOptions: []kgo.Opt{kgo.WithHooks(flight2)}})
	db2, ob2 := openOutbox(t)
	ob2.Handle(outbox.AnyEvent, p2.Handler())
	publishEvents(t, db2, events...)
	relay2, err := ob2.Relay(db2, outbox.RelayConfig{BatchSize: batch, Workers: workers})
	require.NoError(t, err)
	_, err = relay2.ProcessOnce(t.Context())
	require.NoError(t, err)
	assert.LessOrEqual(t, flight2.max(), workers, "the Handler: at most one record per worker")
	assert.EqualValues(t, batch, statusCount(t, db2, outbox.StatusSent))
}

// partitionOf is the partition the Producer's client picks for key among
// n: the default partitioner hashes keys as Kafka's Java client does.
func partitionOf(key string, n int) int32 {
	return int32(kgo.StickyKeyPartitioner(nil).ForTopic(kafka.DefaultTopic).Partition(&kgo.Record{Key: []byte(key)}, n))
}

// TestAsyncOrderByAggregate: with OrderByAggregate a relay produces each
// aggregate's events in order, several aggregates in flight together. The
// broker refuses the partition of the produce request that carries
// evt-c-2 (INVALID_RECORD, a permanent error): evt-c-2 fails, nothing of
// aggregate c after it reaches the topic, and the aggregates of the other
// partitions go on to their last event. Once evt-c-2 is replayed, the rest
// follows, and every aggregate's records are in order, once each.
func TestAsyncOrderByAggregate(t *testing.T) {
	t.Parallel()
	aggregates := []string{"a", "b", "c", "d", "f"} // partitions 1, 2, 1, 2, 0
	const each = 5
	events := orderEvents(aggregates, each)

	c := newCluster(t)
	// Uncompressed, so that the fault can find the event in the request.
	p := newProducer(t, c.ListenAddrs(), kafka.Config{ClientOptions: []kgo.Opt{kgo.ProducerBatchCompression(kgo.NoCompression())}})
	fault := c.Fault(kfake.Fault{
		Keys: []kmsg.Key{kmsg.Produce}, Topic: kafka.DefaultTopic, Partitions: []int32{partitionOf("c", 3)}, Err: kerr.InvalidRecord,
		When: func(r kmsg.Request) bool {
			for _, tp := range r.(*kmsg.ProduceRequest).Topics {
				for _, pp := range tp.Partitions {
					if bytes.Contains(pp.Records, []byte("evt-c-2")) {
						return true
					}
				}
			}
			return false
		},
	})
	db, ob := openOutbox(t)
	ob.HandleAsync(outbox.AnyEvent, p.AsyncHandler())
	publishEvents(t, db, events...)
	relay, err := ob.Relay(db, outbox.RelayConfig{OrderByAggregate: true, Workers: 1})
	require.NoError(t, err)
	outboxtest.Drain(t, relay)
	require.Equal(t, 1, fault.Hits())

	refused := record(t, db, "evt-c-2")
	assert.Equal(t, outbox.StatusFailed, refused.Status)
	require.NotNil(t, refused.LastError)
	assert.Contains(t, *refused.LastError, "INVALID_RECORD")
	for n := 3; n < each; n++ {
		r := record(t, db, fmt.Sprintf("evt-c-%d", n))
		assert.Equal(t, outbox.StatusPending, r.Status, "held behind evt-c-2")
		assert.Zero(t, r.Attempts, "held behind evt-c-2: no attempt")
	}
	// The refused partition may have carried another aggregate's record
	// (a's: the same partition), refused with it: whatever was refused,
	// each aggregate's records are the first of its events, in order, and
	// they are exactly its sent rows.
	sent := statusCount(t, db, outbox.StatusSent)
	recs := consume(t, c.ListenAddrs(), kafka.DefaultTopic, int(sent))
	for _, r := range recs {
		require.Equal(t, partitionOf(string(r.Key), 3), r.Partition, "partitionOf agrees with the client")
	}
	got := firstCopies(t, recs)
	assert.EqualValues(t, sent, stored(t, c, kafka.DefaultTopic), "one record per sent event, none for a held one")
	assert.Equal(t, []int{0, 1}, got["c"], "aggregate c: nothing after the refused evt-c-2")
	for _, a := range aggregates {
		if partitionOf(a, 3) != partitionOf("c", 3) {
			assert.Len(t, got[a], each, "aggregate %s, on another partition, goes on", a)
		}
		for i, seq := range got[a] {
			require.Equal(t, i, seq, "aggregate %s in order", a)
			assert.Equal(t, outbox.StatusSent, record(t, db, fmt.Sprintf("evt-%s-%d", a, seq)).Status)
		}
	}
	t.Logf("after the refusal: %v", got)

	replayed, err := ob.Replay(db, outbox.Filter{})
	require.NoError(t, err)
	require.Positive(t, replayed)
	outboxtest.Drain(t, relay)
	assert.EqualValues(t, len(events), statusCount(t, db, outbox.StatusSent))
	recs = consume(t, c.ListenAddrs(), kafka.DefaultTopic, len(events))
	assert.EqualValues(t, len(events), stored(t, c, kafka.DefaultTopic), "a refused record is not stored: no copy")
	want := map[string][]int{}
	for _, a := range aggregates {
		for n := range each {
			want[a] = append(want[a], n)
		}
	}
	assert.Equal(t, want, firstCopies(t, recs), "every aggregate complete and in order")
}

// TestAsyncBrokerOutage: a batch started while the broker is down is
// handed back (ProcessOnce's error satisfies IsUnavailable) with no attempt
// counted, once every record's wait ran into HandlerTimeout, and is
// delivered once the broker is back: nothing lost, every event sent at its
// first counted attempt, each aggregate's first copies in order. A record
// the broker stored though its ack was lost would be a second copy; there
// are at most as many as handed-back events.
func TestAsyncBrokerOutage(t *testing.T) {
	t.Parallel()
	broker := newRestartable(t)
	c := broker.start()
	seeds := c.ListenAddrs()
	p := newProducer(t, seeds, kafka.Config{ClientOptions: []kgo.Opt{kgo.MetadataMinAge(100 * time.Millisecond)}})
	db, ob := openOutbox(t)
	ob.HandleAsync(outbox.AnyEvent, p.AsyncHandler())
	const timeout = 500 * time.Millisecond
	relay, err := ob.Relay(db, outbox.RelayConfig{HandlerTimeout: timeout})
	require.NoError(t, err)

	aggregates := []string{"a", "b", "c", "d", "e"}
	events := orderEvents(aggregates, 8)
	before, during := events[:10], events[10:]
	publishEvents(t, db, before...)
	n, err := relay.ProcessOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, len(before), n)

	c.Close() // the broker goes away
	publishEvents(t, db, during...)
	began := time.Now()
	n, err = relay.ProcessOnce(t.Context())
	require.Error(t, err)
	assert.True(t, outbox.IsUnavailable(err), "%v", err)
	assert.Equal(t, len(during), n)
	assert.Less(t, time.Since(began), time.Duration(len(during))*timeout/2, "the waits ran out together, not one after the other")
	assert.Contains(t, err.Error(), "no ack from the broker: context deadline exceeded: topic "+kafka.DefaultTopic+" (outbox/kafka)")
	for _, e := range during {
		r := record(t, db, e.ID)
		assert.Equal(t, outbox.StatusPending, r.Status, e.ID)
		assert.Zero(t, r.Attempts, "%s: handed back, no attempt counted", e.ID)
	}

	c = broker.start()
	deadline := time.Now().Add(20 * time.Second)
	cycles := 0
	for statusCount(t, db, outbox.StatusSent) < int64(len(events)) {
		require.True(t, time.Now().Before(deadline), "not all sent after the broker returned")
		cycles++
		_, err := relay.ProcessOnce(t.Context())
		if err != nil {
			require.True(t, outbox.IsUnavailable(err), "%v", err)
		}
	}
	t.Logf("all sent after %d cycles", cycles)
	var attempts []int
	require.NoError(t, db.Table(outbox.DefaultTable).Distinct("attempts").Pluck("attempts", &attempts).Error)
	assert.Equal(t, []int{1}, attempts, "every event sent at its first counted attempt")

	total := stored(t, c, kafka.DefaultTopic)
	recs := consume(t, seeds, kafka.DefaultTopic, int(total))
	copies := countIDs(recs)
	duplicates := 0
	for _, e := range events {
		require.Positive(t, copies[e.ID], "%s lost", e.ID)
		duplicates += copies[e.ID] - 1
	}
	assert.LessOrEqual(t, duplicates, len(during), "at most one extra copy per handed-back event")
	t.Logf("%d records for %d events: %d duplicates", total, len(events), duplicates)
	got := firstCopies(t, recs)
	for _, a := range aggregates {
		assert.True(t, slices.IsSorted(got[a]), "aggregate %s in order: %v", a, got[a])
	}
}

// TestAsyncBufferFull: a client that buffers at most 2 records makes each
// start wait for room instead of refusing the record: a batch of 30 goes
// through whole and in order with never more than 2 in flight. With the
// broker down, a start that found no room before its deadline is the
// wait's Unavailable error, like the records ahead of it.
func TestAsyncBufferFull(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	flight := newInFlight(0)
	p := newProducer(t, c.ListenAddrs(), kafka.Config{ClientOptions: []kgo.Opt{kgo.MaxBufferedRecords(2), kgo.WithHooks(flight)}})
	db, ob := openOutbox(t)
	ob.HandleAsync(outbox.AnyEvent, p.AsyncHandler())
	events := orderEvents([]string{"a", "b", "c"}, 10)
	publishEvents(t, db, events...)
	relay, err := ob.Relay(db, outbox.RelayConfig{})
	require.NoError(t, err)
	n, err := relay.ProcessOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, len(events), n)
	assert.EqualValues(t, len(events), statusCount(t, db, outbox.StatusSent))
	assert.LessOrEqual(t, flight.max(), 3, "the 2 buffered records and the one waiting for room")
	recs := consume(t, c.ListenAddrs(), kafka.DefaultTopic, len(events))
	assert.Len(t, countIDs(recs), len(events))
	got := firstCopies(t, recs)
	for a, seqs := range got {
		assert.Equal(t, []int{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}, seqs, "aggregate %s", a)
	}

	c.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	h := p.AsyncHandler()
	var waits []func() error
	for i := range 4 {
		waits = append(waits, h(ctx, testEvent(fmt.Sprintf("evt-full-%d", i), "1", i)))
	}
	for i, wait := range waits {
		err := wait()
		require.ErrorIs(t, err, context.DeadlineExceeded, "record %d", i)
		assert.True(t, outbox.IsUnavailable(err), "record %d: %v", i, err)
	}
}

// TestAsyncClientClosed: records in flight when the client closes, and
// records started after, fail with kgo.ErrClientClosed, which is
// Unavailable: the relay hands them back without counting attempts, and a
// new Producer delivers them.
func TestAsyncClientClosed(t *testing.T) {
	t.Parallel()
	broker := newRestartable(t)
	c := broker.start()
	seeds := c.ListenAddrs()
	p := newProducer(t, seeds, kafka.Config{})
	require.NoError(t, p.AsyncHandler()(t.Context(), testEvent("evt-warmup", "1", 0))())
	c.Close()
	var waits []func() error
	for i := range 3 {
		waits = append(waits, p.AsyncHandler()(t.Context(), testEvent(fmt.Sprintf("evt-closing-%d", i), "1", i)))
	}
	p.Close() // with records in flight
	for i, wait := range waits {
		err := wait()
		require.ErrorIs(t, err, kgo.ErrClientClosed, "record %d", i)
		assert.True(t, outbox.IsUnavailable(err), "record %d: %v", i, err)
	}

	// A relay whose Producer is closed, then replaced.
	c = broker.start()
	var current atomic.Pointer[kafka.Producer]
	current.Store(p)
	db, ob := openOutbox(t)
	ob.HandleAsync(outbox.AnyEvent, func(ctx context.Context, e outbox.Event) func() error {
		return current.Load().AsyncHandler()(ctx, e)
	})
	events := orderEvents([]string{"a", "b"}, 3)
	publishEvents(t, db, events...)
	relay, err := ob.Relay(db, outbox.RelayConfig{})
	require.NoError(t, err)
	_, err = relay.ProcessOnce(t.Context())
	require.ErrorIs(t, err, kgo.ErrClientClosed)
	assert.True(t, outbox.IsUnavailable(err), "%v", err)
	for _, e := range events {
		r := record(t, db, e.ID)
		assert.Equal(t, outbox.StatusPending, r.Status)
		assert.Zero(t, r.Attempts, "handed back: no attempt counted")
	}

	current.Store(newProducer(t, seeds, kafka.Config{}))
	n, err := relay.ProcessOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, len(events), n)
	assert.EqualValues(t, len(events), statusCount(t, db, outbox.StatusSent))
	assert.EqualValues(t, len(events)+1, stored(t, c, kafka.DefaultTopic), "the warm-up and each event once")
	copies := countIDs(consume(t, seeds, kafka.DefaultTopic, len(events)+1))
	for _, e := range events {
		assert.Equal(t, 1, copies[e.ID], e.ID)
	}
}

// TestAsyncRecordAndSpan: the AsyncHandler's record is Publish's (key,
// value, headers with the span's trace context), its span opens at the
// start and ends in the wait with the wait's error, and its errors are
// Publish's, the permanent ones before any produce.
func TestAsyncRecordAndSpan(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	tel := &fakeTelemetry{}
	p := newProducer(t, c.ListenAddrs(), kafka.Config{Telemetry: tel})
	h := p.AsyncHandler()

	async, sync := testEvent("evt-async", "42", 1), testEvent("evt-sync", "42", 1)
	sync.IdempotencyKey = async.IdempotencyKey
	wait := h(t.Context(), async)
	sends, _, ends, _ := tel.snapshot()
	require.Len(t, sends, 1, "the span opens at the start")
	assert.Equal(t, "evt-async", sends[0].e.ID)
	assert.Empty(t, ends, "and stays open until the wait")
	require.NoError(t, wait())
	_, _, ends, _ = tel.snapshot()
	assert.Equal(t, []error{nil}, ends)
	require.NoError(t, p.Publish(t.Context(), sync))

	recs := consume(t, c.ListenAddrs(), kafka.DefaultTopic, 2)
	byID := map[string]*kgo.Record{}
	for _, r := range recs {
		byID[header(r, wire.EventID)] = r
	}
	a, s := byID["evt-async"], byID["evt-sync"]
	require.NotNil(t, a)
	require.NotNil(t, s)
	assert.Equal(t, s.Key, a.Key)
	assert.Equal(t, s.Value, a.Value)
	assert.Equal(t, fakeTraceParent, header(a, "traceparent"), "the span's trace context")
	withoutID := func(hs []kgo.RecordHeader) []kgo.RecordHeader {
		return slices.DeleteFunc(slices.Clone(hs), func(h kgo.RecordHeader) bool { return h.Key == wire.EventID })
	}
	assert.Equal(t, withoutID(s.Headers), withoutID(a.Headers), "the same headers as Publish's")

	bad := testEvent("evt-bad", "42", 2)
	bad.Payload = json.RawMessage(`{"broken":`)
	badTopic := kafka.Config{TopicFor: func(outbox.Event) string { return "no spaces" }}
	for name, tc := range map[string]struct {
		p *kafka.Producer
		e outbox.Event
	}{
		"unencodable payload": {p, bad},
		"invalid topic":       {newProducer(t, c.ListenAddrs(), badTopic), testEvent("evt-topic", "42", 3)},
	} {
		before := stored(t, c, kafka.DefaultTopic)
		asyncErr := tc.p.AsyncHandler()(t.Context(), tc.e)()
		require.Error(t, asyncErr, name)
		assert.True(t, outbox.IsPermanent(asyncErr), "%s: %v", name, asyncErr)
		assert.Equal(t, tc.p.Publish(t.Context(), tc.e).Error(), asyncErr.Error(), name)
		assert.Equal(t, before, stored(t, c, kafka.DefaultTopic), "%s: nothing produced", name)
	}
	_, _, ends, _ = tel.snapshot()
	require.Len(t, ends, 4)
	assert.True(t, outbox.IsPermanent(ends[2]), "the span ends with the wait's error: %v", ends[2])
}

// TestClientLinger: the client New builds sends records as they come
// (ProducerLinger 0: a relay waits for a wave's acks right after starting
// it) unless ClientOptions set a linger; a client that flushes manually
// would hold them until a Flush, and is refused.
func TestClientLinger(t *testing.T) {
	t.Parallel()
	p := newProducer(t, []string{"127.0.0.1:1"}, kafka.Config{})
	assert.Equal(t, time.Duration(0), p.Client().OptValue(kgo.ProducerLinger))
	p = newProducer(t, []string{"127.0.0.1:1"}, kafka.Config{ClientOptions: []kgo.Opt{kgo.ProducerLinger(5 * time.Millisecond)}})
	assert.Equal(t, 5*time.Millisecond, p.Client().OptValue(kgo.ProducerLinger), "the application's linger wins")

	_, err := kafka.New(kafka.Config{ClientOptions: []kgo.Opt{kgo.ManualFlushing()}})
	require.ErrorContains(t, err, "kgo.ManualFlushing")
	manual, err := kgo.NewClient(kgo.SeedBrokers("127.0.0.1:1"), kgo.ManualFlushing())
	require.NoError(t, err)
	defer manual.Close()
	_, err = kafka.New(kafka.Config{Client: manual})
	require.ErrorContains(t, err, "kgo.ManualFlushing")
}
