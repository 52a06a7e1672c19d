package kafka_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/adapters/kafka"
	"github.com/gorm-outbox/outbox/wire"
)

func TestRecord(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	p := newProducer(t, c.ListenAddrs(), kafka.Config{})

	e := testEvent("evt-1", "42", 1)
	// Reserved names among the event's headers must not override the
	// event's own fields.
	e.Headers[wire.AggregateID] = "spoofed"
	e.Headers["outbox-event-type"] = "spoofed" // in any case
	e.Headers["content-type"] = "text/plain"   // the adapter's own header
	e.Headers["b-custom"] = "2"
	require.NoError(t, p.Handler()(t.Context(), e))
	// An event without aggregate, with a Go payload (memory mode, direct
	// calls), encoded as Publish would.
	require.NoError(t, p.Publish(t.Context(), outbox.Event{ID: "evt-2", Type: "order.noted", Payload: map[string]int{"n": 1}}))

	recs := consume(t, c.ListenAddrs(), kafka.DefaultTopic, 2)
	byID := map[string]*kgo.Record{}
	for _, r := range recs {
		byID[header(r, wire.EventID)] = r
	}
	r := byID["evt-1"]
	require.NotNil(t, r)
	assert.Equal(t, kafka.DefaultTopic, r.Topic)
	assert.Equal(t, "42", string(r.Key), "the key is the aggregate ID")
	assert.JSONEq(t, `{"seq":1}`, string(r.Value))
	assert.Equal(t, []kgo.RecordHeader{
		{Key: "b-custom", Value: []byte("2")},
		{Key: "traceparent", Value: []byte("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")},
		{Key: wire.EventID, Value: []byte("evt-1")},
		{Key: wire.EventType, Value: []byte("order.created")},
		{Key: wire.AggregateType, Value: []byte("order")},
		{Key: wire.AggregateID, Value: []byte("42")},
		{Key: wire.IdempotencyKey, Value: []byte("key-evt-1")},
		{Key: wire.OccurredAt, Value: []byte("2026-05-04T03:02:01.123456Z")},
		{Key: kafka.HeaderContentType, Value: []byte("application/json")},
	}, r.Headers)

	r = byID["evt-2"]
	require.NotNil(t, r)
	assert.Nil(t, r.Key, "no aggregate, no key")
	assert.JSONEq(t, `{"n":1}`, string(r.Value))
	assert.Empty(t, header(r, wire.AggregateID))
}

func TestTopicMapping(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.SeedTopics(1, "events.order.created", "events.order.paid"))
	p := newProducer(t, c.ListenAddrs(), kafka.Config{TopicFor: func(e outbox.Event) string { return "events." + e.Type }})

	created := testEvent("evt-created", "1", 1)
	paid := testEvent("evt-paid", "1", 2)
	paid.Type = "order.paid"
	require.NoError(t, p.Publish(t.Context(), created))
	require.NoError(t, p.Publish(t.Context(), paid))
	assert.Equal(t, "evt-created", header(consume(t, c.ListenAddrs(), "events.order.created", 1)[0], wire.EventID))
	assert.Equal(t, "evt-paid", header(consume(t, c.ListenAddrs(), "events.order.paid", 1)[0], wire.EventID))

	// A type that makes no valid topic name fails for good, before any
	// network round trip.
	bad := testEvent("evt-bad", "1", 3)
	bad.Type = "order created!"
	err := p.Publish(t.Context(), bad)
	require.Error(t, err)
	assert.True(t, outbox.IsPermanent(err))
	assert.Equal(t, `topic name may hold only ASCII letters, digits, '.', '_' and '-': topic "events.order created!" (outbox/kafka) (permanent)`, err.Error(),
		"the cause first, then the topic and the adapter; never the event ID")

	_, err = kafka.New(kafka.Config{Topic: "no spaces"})
	require.ErrorContains(t, err, "outbox/kafka: Topic")
}

// TestOrderPerAggregate produces the events of each aggregate one at a time
// (what the relay does with OrderByAggregate), aggregates concurrently, and
// checks that each aggregate's events sit in one partition in order.
func TestOrderPerAggregate(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	p := newProducer(t, c.ListenAddrs(), kafka.Config{})

	const aggregates, each = 6, 20
	var wg sync.WaitGroup
	for a := range aggregates {
		wg.Go(func() {
			for i := range each {
				if err := p.Publish(t.Context(), testEvent(fmt.Sprintf("evt-%d-%d", a, i), fmt.Sprintf("agg-%d", a), i)); err != nil {
					t.Errorf("publish: %v", err)
					return
				}
			}
		})
	}
	wg.Wait()

	recs := consume(t, c.ListenAddrs(), kafka.DefaultTopic, aggregates*each)
	partition := map[string]int32{}
	next := map[string]int{}
	partitions := map[int32]bool{}
	// A consumer sees each partition in offset order, which is all that
	// ordering per aggregate needs.
	for _, r := range recs {
		key := string(r.Key)
		require.Equal(t, key, header(r, wire.AggregateID))
		if p, ok := partition[key]; ok {
			require.Equal(t, p, r.Partition, "all events of %s in one partition", key)
		}
		partition[key] = r.Partition
		partitions[r.Partition] = true
		var v struct{ Seq int }
		require.NoError(t, json.Unmarshal(r.Value, &v))
		require.Equal(t, next[key], v.Seq, "events of %s in order", key)
		next[key]++
	}
	for a := range aggregates {
		assert.Equal(t, each, next[fmt.Sprintf("agg-%d", a)])
	}
	assert.Greater(t, len(partitions), 1, "aggregates spread over partitions")
}

// TestProducerRetriesDoNotDuplicate makes the broker store a record but
// answer REQUEST_TIMED_OUT, as a broker does when replication is slow. The
// client retries; the idempotent producer's sequence numbers let the broker
// drop the copy. A client without idempotence, under the same fault,
// stores the record twice: the fault does exercise the retry.
func TestProducerRetriesDoNotDuplicate(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	p := newProducer(t, c.ListenAddrs(), kafka.Config{})
	// The first produce also sets up the producer ID and metadata, so the
	// fault below hits a plain produce request.
	require.NoError(t, p.Publish(t.Context(), testEvent("evt-warmup", "1", 0)))

	fault := c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.RequestTimedOut, Count: 2})
	require.NoError(t, p.Publish(t.Context(), testEvent("evt-retried", "1", 1)))
	require.Equal(t, 2, fault.Hits(), "the broker answered the first two attempts with a timeout")
	assert.EqualValues(t, 2, stored(t, c, kafka.DefaultTopic), "one record per event")
	assert.Equal(t, map[string]int{"evt-warmup": 1, "evt-retried": 1}, countIDs(consume(t, c.ListenAddrs(), kafka.DefaultTopic, 2)))

	plain, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DisableIdempotentWrite())
	require.NoError(t, err)
	defer plain.Close()
	c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: kerr.RequestTimedOut, Count: 1})
	require.NoError(t, plain.ProduceSync(t.Context(), &kgo.Record{Topic: kafka.DefaultTopic, Key: []byte("1"), Value: []byte("{}")}).FirstErr())
	assert.EqualValues(t, 4, stored(t, c, kafka.DefaultTopic), "without idempotence the retry stores a second copy")
}

// TestRelayResendDuplicates documents the limit of idempotence: an event
// handed over twice (the relay retries after a lost ack or a crash before
// "mark sent") is two records. Consumers deduplicate by Outbox-Event-Id.
func TestRelayResendDuplicates(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	p := newProducer(t, c.ListenAddrs(), kafka.Config{})
	e := testEvent("evt-twice", "1", 1)
	require.NoError(t, p.Publish(t.Context(), e))
	require.NoError(t, p.Publish(t.Context(), e))
	assert.Equal(t, map[string]int{"evt-twice": 2}, countIDs(consume(t, c.ListenAddrs(), kafka.DefaultTopic, 2)))
}

func TestClientChecks(t *testing.T) {
	t.Parallel()
	c := newCluster(t)

	plain, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.DisableIdempotentWrite())
	require.NoError(t, err)
	defer plain.Close()
	_, err = kafka.New(kafka.Config{Client: plain})
	require.ErrorContains(t, err, "disables idempotent writes")

	txn, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...), kgo.TransactionalID("outbox"))
	require.NoError(t, err)
	defer txn.Close()
	_, err = kafka.New(kafka.Config{Client: txn})
	require.ErrorContains(t, err, "transactional")

	_, err = kafka.New(kafka.Config{ClientOptions: []kgo.Opt{kgo.DisableIdempotentWrite()}})
	require.ErrorContains(t, err, "disables idempotent writes")

	// A shared client is used as is and left open by Close.
	shared, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	require.NoError(t, err)
	defer shared.Close()
	p, err := kafka.New(kafka.Config{Client: shared})
	require.NoError(t, err)
	assert.Same(t, shared, p.Client())
	require.NoError(t, p.Publish(t.Context(), testEvent("evt-shared", "1", 1)))
	p.Close()
	require.NoError(t, shared.Ping(t.Context()), "Close leaves a shared client open")
}

// TestRecordErrorsAreNotUnavailable: errors the broker returns for the
// record, not for itself, count attempts (or fail the event for good).
func TestRecordErrorsAreNotUnavailable(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	p := newProducer(t, c.ListenAddrs(), kafka.Config{})
	require.NoError(t, p.Publish(t.Context(), testEvent("evt-warmup", "1", 0)))
	for code, permanent := range map[*kerr.Error]bool{kerr.TopicAuthorizationFailed: false, kerr.MessageTooLarge: true} {
		c.Fault(kfake.Fault{Keys: []kmsg.Key{kmsg.Produce}, Err: code, Count: 1})
		err := p.Publish(t.Context(), testEvent("evt-"+code.Message, "1", 1))
		require.ErrorIs(t, err, code)
		// The broker's error first (franz-go may add details to it), then
		// the topic and the adapter.
		suffix := ": topic " + kafka.DefaultTopic + " (outbox/kafka)"
		if permanent {
			suffix += " (permanent)"
		}
		assert.True(t, strings.HasPrefix(err.Error(), code.Error()), "%v", err)
		assert.True(t, strings.HasSuffix(err.Error(), suffix), "%v", err)
		assert.NotContains(t, err.Error(), "evt-", "the event ID is the relay's to log")
		assert.Equal(t, permanent, outbox.IsPermanent(err), "%v", err)
		assert.False(t, outbox.IsUnavailable(err), "%v", err)
	}
}

func TestInvalidPayloadIsPermanent(t *testing.T) {
	t.Parallel()
	p, err := kafka.New(kafka.Config{})
	require.NoError(t, err)
	defer p.Close()
	err = p.Publish(t.Context(), outbox.Event{ID: "evt-bad", Type: "x", Payload: json.RawMessage(`{"secret":`)})
	require.True(t, outbox.IsPermanent(err))
	assert.ErrorIs(t, err, outbox.ErrInvalidEvent)
	assert.True(t, strings.HasSuffix(err.Error(), ": topic "+kafka.DefaultTopic+" (outbox/kafka) (permanent)"), "%v", err)
	assert.NotContains(t, err.Error(), "evt-bad", "the event ID is the relay's to log")
	assert.False(t, strings.Contains(err.Error(), "secret"), "payloads never appear in errors")
}

// TestPublishDuringOutage publishes while the broker is down: the publish
// fails within its context, and the record it gave up on is not produced
// behind the relay's back once the broker returns, so the relay's retry is
// the only copy.
func TestPublishDuringOutage(t *testing.T) {
	t.Parallel()
	broker := newRestartable(t)
	c := broker.start()
	seeds := c.ListenAddrs()
	p := newProducer(t, seeds, kafka.Config{ClientOptions: []kgo.Opt{kgo.MetadataMinAge(100 * time.Millisecond)}})
	require.NoError(t, p.Publish(t.Context(), testEvent("evt-before", "1", 0)))
	c.Close()

	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	began := time.Now()
	err := p.Publish(ctx, testEvent("evt-during", "1", 1))
	require.ErrorIs(t, err, context.DeadlineExceeded)
	assert.False(t, outbox.IsPermanent(err))
	assert.True(t, outbox.IsUnavailable(err), "no broker to ack: the destination is down")
	assert.Equal(t, "no ack from the broker: context deadline exceeded: topic "+kafka.DefaultTopic+" (outbox/kafka) (destination unavailable)", err.Error())
	assert.Less(t, time.Since(began), 5*time.Second, "the handler returns when its context ends")

	c = broker.start()
	// The relay's retry of the failed event. It may fail again at first:
	// franz-go fails a partition's buffered records together, and the
	// abandoned attempt may still be buffered when the retry joins it.
	retries := 0
	require.Eventually(t, func() bool {
		retries++
		return p.Publish(t.Context(), testEvent("evt-during", "1", 1)) == nil
	}, 10*time.Second, 10*time.Millisecond)
	t.Logf("the retry succeeded at attempt %d", retries)
	require.NoError(t, p.Publish(t.Context(), testEvent("evt-after", "1", 2)))
	assert.EqualValues(t, 3, stored(t, c, kafka.DefaultTopic), "no copy of the abandoned attempt")
	recs := consume(t, seeds, kafka.DefaultTopic, 3)
	assert.Equal(t, map[string]int{"evt-before": 1, "evt-during": 1, "evt-after": 1}, countIDs(recs))
	var order []string
	for _, r := range recs {
		order = append(order, header(r, wire.EventID))
	}
	assert.Equal(t, []string{"evt-before", "evt-during", "evt-after"}, order, "one key, one partition, in order")
}
