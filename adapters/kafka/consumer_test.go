package kafka_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/adapters/kafka"
)

// consumerDB returns the consumer's SQLite database, with the outbox
// plugin and an effects table Handle writes to.
func consumerDB(t *testing.T) *gorm.DB {
	t.Helper()
	db, _ := openOutbox(t)
	require.NoError(t, db.Exec(`CREATE TABLE effects (event_id TEXT NOT NULL, n INTEGER NOT NULL)`).Error)
	return db
}

// effects counts the effect rows of each event ID.
func effects(t *testing.T, db *gorm.DB) map[string]int {
	t.Helper()
	var rows []struct {
		EventID string
		N       int
	}
	require.NoError(t, db.Raw(`SELECT event_id, COUNT(*) AS n FROM effects GROUP BY event_id`).Scan(&rows).Error)
	m := map[string]int{}
	for _, r := range rows {
		m[r.EventID] = r.N
	}
	return m
}

func writeEffect(tx *gorm.DB, m kafka.Message) error {
	return tx.Exec(`INSERT INTO effects (event_id, n) VALUES (?, 1)`, m.Event.ID).Error
}

// logBuffer collects a Consumer's log lines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *logBuffer) logger() *slog.Logger { return slog.New(slog.NewTextHandler(b, nil)) }

// running is a Consumer running in a goroutine.
type running struct {
	cancel context.CancelFunc
	done   chan error
}

// stop stops the Consumer and returns Run's error.
func (r *running) stop(t *testing.T) error {
	t.Helper()
	r.cancel()
	select {
	case err := <-r.done:
		r.done <- err
		return err
	case <-time.After(20 * time.Second):
		t.Fatal("the consumer did not stop")
		return nil
	}
}

// newConsumer builds a Consumer on the cluster's brokers, consuming the
// default topic with group "g" unless cfg says otherwise.
func newConsumer(t *testing.T, db *gorm.DB, c *kfake.Cluster, cfg kafka.ConsumerConfig) *kafka.Consumer {
	t.Helper()
	if cfg.Consumer == "" {
		cfg.Consumer = "billing"
	}
	if cfg.Group == "" {
		cfg.Group = "g"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cons, err := kafka.NewConsumer(db, []kgo.Opt{kgo.SeedBrokers(c.ListenAddrs()...), kgo.FetchMaxWait(200 * time.Millisecond)}, cfg)
	require.NoError(t, err)
	return cons
}

// start runs cons until the test ends or stop is called.
func start(t *testing.T, cons *kafka.Consumer) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r := &running{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- cons.Run(ctx) }()
	t.Cleanup(func() { _ = r.stop(t) })
	return r
}

// committed returns the group's committed offset of each partition of
// topic (-1 or absent: none).
func committed(t *testing.T, c *kfake.Cluster, group, topic string) map[int32]int64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	off, err := groupOffsets(ctx, c.ListenAddrs(), group, topic)
	require.NoError(t, err)
	return off
}

// groupOffsets asks the brokers for group's committed offsets on topic's
// partitions (-1 or absent: none).
func groupOffsets(ctx context.Context, seeds []string, group, topic string) (map[int32]int64, error) {
	cl, err := kgo.NewClient(kgo.SeedBrokers(seeds...))
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	req := kmsg.NewPtrOffsetFetchRequest()
	req.Group = group // Topics nil: every topic the group committed to
	resp, err := req.RequestWith(ctx, cl)
	if err != nil {
		return nil, err
	}
	out := map[int32]int64{}
	for _, g := range resp.Groups {
		for _, rt := range g.Topics {
			for _, p := range rt.Partitions {
				if rt.Topic == topic {
					out[p.Partition] = p.Offset
				}
			}
		}
	}
	for _, rt := range resp.Topics {
		for _, p := range rt.Partitions {
			if rt.Topic != topic {
				continue
			}
			out[p.Partition] = p.Offset
		}
	}
	return out, nil
}

// sum adds the committed offsets (none counts as 0).
func sum(off map[int32]int64) int64 {
	var n int64
	for _, o := range off {
		n += max(o, 0)
	}
	return n
}

// allCommitted reports whether the group committed every partition of
// topic up to its end.
func allCommitted(t *testing.T, c *kfake.Cluster, group, topic string) bool {
	t.Helper()
	off := committed(t, c, group, topic)
	for _, p := range c.PartitionInfos(topic) {
		if p.HighWatermark > 0 && off[p.Partition] != p.HighWatermark {
			return false
		}
	}
	return true
}

// produceRaw produces a record as another producer would.
func produceRaw(t *testing.T, c *kfake.Cluster, rec *kgo.Record) *kgo.Record {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(c.ListenAddrs()...))
	require.NoError(t, err)
	defer cl.Close()
	r, err := cl.ProduceSync(t.Context(), rec).First()
	require.NoError(t, err)
	return r
}

func publish(t *testing.T, p *kafka.Producer, events ...outbox.Event) {
	t.Helper()
	for _, e := range events {
		require.NoError(t, p.Publish(t.Context(), e))
	}
}

// TestConsumerEffectOnce: each event's effect is committed once, in the
// consumer's transaction, and every partition's offset is committed up to
// its end; the Message carries the decoded event and the record.
func TestConsumerEffectOnce(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	p := newProducer(t, c.ListenAddrs(), kafka.Config{})
	db := consumerDB(t)
	var mu sync.Mutex
	var got []kafka.Message
	cons := newConsumer(t, db, c, kafka.ConsumerConfig{Handle: func(_ context.Context, tx *gorm.DB, m kafka.Message) error {
		mu.Lock()
		got = append(got, m)
		mu.Unlock()
		return writeEffect(tx, m)
	}})
	var events []outbox.Event
	for i := range 6 {
		events = append(events, testEvent(fmt.Sprintf("once-%d", i), fmt.Sprint(i%3), i))
	}
	publish(t, p, events...)
	start(t, cons)

	waitFor(t, 20*time.Second, "every offset committed", func() bool { return allCommitted(t, c, "g", kafka.DefaultTopic) })
	want := map[string]int{}
	for _, e := range events {
		want[e.ID] = 1
	}
	assert.Equal(t, want, effects(t, db))

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, got, 6)
	i := slices.IndexFunc(got, func(m kafka.Message) bool { return m.Event.ID == "once-4" })
	require.GreaterOrEqual(t, i, 0)
	m := got[i]
	assert.Equal(t, "order.created", m.Event.Type)
	assert.Equal(t, "1", m.Event.AggregateID)
	assert.Equal(t, "key-once-4", m.Event.IdempotencyKey)
	payload, err := m.Event.PayloadJSON()
	require.NoError(t, err)
	assert.JSONEq(t, `{"seq":4}`, string(payload))
	assert.Equal(t, events[4].OccurredAt, m.Event.OccurredAt)
	assert.Equal(t, "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01", m.Event.Headers["traceparent"])
	assert.Equal(t, kafka.DefaultTopic, m.Raw.Topic)
	assert.Equal(t, "1", string(m.Raw.Key))
}

// TestConsumerDuplicate: the same event produced twice (a relay's
// re-send) runs Handle once, and both records are committed.
func TestConsumerDuplicate(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	p := newProducer(t, c.ListenAddrs(), kafka.Config{})
	db := consumerDB(t)
	var calls atomic.Int32
	cons := newConsumer(t, db, c, kafka.ConsumerConfig{Handle: func(_ context.Context, tx *gorm.DB, m kafka.Message) error {
		calls.Add(1)
		return writeEffect(tx, m)
	}})
	e := testEvent("dup-1", "7", 1)
	publish(t, p, e, e)
	require.EqualValues(t, 2, stored(t, c, kafka.DefaultTopic))
	start(t, cons)

	waitFor(t, 20*time.Second, "both records committed", func() bool { return allCommitted(t, c, "g", kafka.DefaultTopic) })
	assert.EqualValues(t, 1, calls.Load())
	assert.Equal(t, map[string]int{"dup-1": 1}, effects(t, db))
}

// TestConsumerRetry: a Handle error leaves the record's offset
// uncommitted; the record is retried after RetryDelay and succeeds, and
// the next record of its partition waits for it (order is kept).
func TestConsumerRetry(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	p := newProducer(t, c.ListenAddrs(), kafka.Config{})
	db := consumerDB(t)
	logs := &logBuffer{}
	var mu sync.Mutex
	var order []string
	var offsetsWhileFailing []int64
	cons := newConsumer(t, db, c, kafka.ConsumerConfig{
		RetryDelay: 50 * time.Millisecond,
		Logger:     logs.logger(),
		Handle: func(_ context.Context, tx *gorm.DB, m kafka.Message) error {
			mu.Lock()
			order = append(order, m.Event.ID)
			n := len(order)
			mu.Unlock()
			if m.Event.ID == "retry-a" && n <= 3 {
				// Not committed while it fails: the group has no
				// offset past it.
				off := committed(t, c, "g", kafka.DefaultTopic)[m.Raw.Partition]
				mu.Lock()
				offsetsWhileFailing = append(offsetsWhileFailing, off)
				mu.Unlock()
				return errors.New("database busy")
			}
			return writeEffect(tx, m)
		},
	})
	// Same key: same partition, a before b.
	publish(t, p, testEvent("retry-a", "9", 1), testEvent("retry-b", "9", 2))
	start(t, cons)

	waitFor(t, 20*time.Second, "every offset committed", func() bool { return allCommitted(t, c, "g", kafka.DefaultTopic) })
	assert.Equal(t, map[string]int{"retry-a": 1, "retry-b": 1}, effects(t, db))
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"retry-a", "retry-a", "retry-a", "retry-a", "retry-b"}, order)
	for _, off := range offsetsWhileFailing {
		assert.Less(t, off, int64(1), "no offset past the failing record is committed")
	}
	assert.Equal(t, 3, strings.Count(logs.String(), "level=WARN msg=\"outbox/kafka: consumer: record failed; retrying it"))
	assert.Contains(t, logs.String(), "error=\"database busy\"")
}

// TestConsumerPermanent: a Permanent error from Handle commits past the
// record, logged at Error with its identifiers and not its payload; it is
// not tried again, and the partition goes on.
func TestConsumerPermanent(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	p := newProducer(t, c.ListenAddrs(), kafka.Config{})
	db := consumerDB(t)
	logs := &logBuffer{}
	var calls sync.Map
	cons := newConsumer(t, db, c, kafka.ConsumerConfig{
		Logger: logs.logger(),
		Handle: func(_ context.Context, tx *gorm.DB, m kafka.Message) error {
			n, _ := calls.LoadOrStore(m.Event.ID, new(atomic.Int32))
			n.(*atomic.Int32).Add(1)
			if err := writeEffect(tx, m); err != nil {
				return err
			}
			if m.Event.ID == "perm-a" {
				return outbox.Permanent(errors.New("unknown order"))
			}
			return nil
		},
	})
	publish(t, p, testEvent("perm-a", "5", 1), testEvent("perm-b", "5", 2))
	start(t, cons)

	waitFor(t, 20*time.Second, "every offset committed", func() bool { return allCommitted(t, c, "g", kafka.DefaultTopic) })
	assert.Equal(t, map[string]int{"perm-b": 1}, effects(t, db), "the permanent failure's transaction rolled back")
	for _, id := range []string{"perm-a", "perm-b"} {
		n, _ := calls.Load(id)
		assert.EqualValues(t, 1, n.(*atomic.Int32).Load(), id)
	}
	out := logs.String()
	assert.Contains(t, out, `level=ERROR msg="outbox/kafka: consumer: record failed permanently; committing past it"`)
	assert.Contains(t, out, "topic=outbox.events")
	assert.Contains(t, out, "key=5")
	assert.Contains(t, out, "message_id=perm-a")
	assert.Contains(t, out, `error="unknown order (permanent)"`)
	assert.NotContains(t, out, "seq")
}

// TestConsumerNoID: a record without an Outbox-Event-Id header (another
// producer's) and one whose Outbox-Occurred-At does not parse are logged
// and committed past without running Handle; a MessageID that names
// records by their position lets the foreign record through.
func TestConsumerNoID(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.SeedTopics(1, "foreign"))
	db := consumerDB(t)
	logs := &logBuffer{}
	var calls atomic.Int32
	cons := newConsumer(t, db, c, kafka.ConsumerConfig{
		Topics: []string{"foreign"},
		Logger: logs.logger(),
		Handle: func(context.Context, *gorm.DB, kafka.Message) error { calls.Add(1); return nil },
	})
	produceRaw(t, c, &kgo.Record{Topic: "foreign", Key: []byte("k1"), Value: []byte(`{"secret":1}`)})
	produceRaw(t, c, &kgo.Record{Topic: "foreign", Key: []byte("k2"), Value: []byte(`{}`), Headers: []kgo.RecordHeader{
		{Key: "Outbox-Event-Id", Value: []byte("bad-time")}, {Key: "Outbox-Occurred-At", Value: []byte("yesterday")},
	}})
	r := start(t, cons)
	waitFor(t, 20*time.Second, "both records committed", func() bool { return allCommitted(t, c, "g", "foreign") })
	require.NoError(t, r.stop(t))
	assert.Zero(t, calls.Load())
	out := logs.String()
	assert.Equal(t, 2, strings.Count(out, "level=ERROR"))
	assert.Contains(t, out, "key=k1")
	assert.Contains(t, out, "message ID: "+outbox.ErrInvalidInboxID.Error()+": empty ID")
	assert.Contains(t, out, "decode record")
	assert.NotContains(t, out, "secret")

	// Another group, with IDs from the record's position.
	var ids []string
	var mu sync.Mutex
	cons2 := newConsumer(t, db, c, kafka.ConsumerConfig{
		Group:  "g2",
		Topics: []string{"foreign"},
		MessageID: func(m kafka.Message) string {
			return fmt.Sprintf("%s/%d/%d", m.Raw.Topic, m.Raw.Partition, m.Raw.Offset)
		},
		Handle: func(_ context.Context, _ *gorm.DB, m kafka.Message) error {
			mu.Lock()
			defer mu.Unlock()
			ids = append(ids, fmt.Sprintf("%s/%d/%d", m.Raw.Topic, m.Raw.Partition, m.Raw.Offset))
			return nil
		},
	})
	start(t, cons2)
	waitFor(t, 20*time.Second, "the foreign record committed", func() bool { return allCommitted(t, c, "g2", "foreign") })
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"foreign/0/0"}, ids, "the record with a bad time is still undecodable")
}

// TestConsumerCrashBeforeAck: the process dies after the transaction
// committed and before the offset commit. A new Consumer in the same group
// reads the record again; the inbox skips Handle, and the offset is
// committed this time.
func TestConsumerCrashBeforeAck(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.SeedTopics(1, "crash"))
	p := newProducer(t, c.ListenAddrs(), kafka.Config{Topic: "crash"})
	db := consumerDB(t)
	var calls atomic.Int32
	handle := func(_ context.Context, tx *gorm.DB, m kafka.Message) error {
		calls.Add(1)
		return writeEffect(tx, m)
	}
	first := newConsumer(t, db, c, kafka.ConsumerConfig{Topics: []string{"crash"}, Handle: handle})
	crash := errors.New("crash")
	kafka.SetBeforeAck(first, func(kafka.Message) error { return crash })
	publish(t, p, testEvent("crash-1", "1", 1))
	r := start(t, first)
	select {
	case err := <-r.done:
		r.done <- err
		require.ErrorIs(t, err, crash)
	case <-time.After(20 * time.Second):
		t.Fatal("the consumer did not reach the ack")
	}
	assert.Equal(t, map[string]int{"crash-1": 1}, effects(t, db), "the transaction committed")
	assert.EqualValues(t, 1, calls.Load())
	off, ok := committed(t, c, "g", "crash")[0]
	assert.True(t, !ok || off == -1, "the offset was not committed: %d", off)

	var redelivered atomic.Int32
	second := newConsumer(t, db, c, kafka.ConsumerConfig{Topics: []string{"crash"}, Handle: handle})
	kafka.SetBeforeAck(second, func(m kafka.Message) error {
		if m.Event.ID == "crash-1" {
			redelivered.Add(1)
		}
		return nil
	})
	start(t, second)
	waitFor(t, 20*time.Second, "the redelivery committed", func() bool { return allCommitted(t, c, "g", "crash") })
	assert.EqualValues(t, 1, redelivered.Load(), "the record was read again")
	assert.EqualValues(t, 1, calls.Load(), "Handle did not run again")
	assert.Equal(t, map[string]int{"crash-1": 1}, effects(t, db))
}

// TestConsumerRebalance: a second member joins while the first is
// consuming, and the first leaves later (its partitions move, with what it
// finished committed on the way): every event's effect is committed
// exactly once, every offset ends committed, each aggregate's first
// handlings are in order, and the second member handled the events
// produced after the first left.
func TestConsumerRebalance(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	p := newProducer(t, c.ListenAddrs(), kafka.Config{})
	db := consumerDB(t)
	var mu sync.Mutex
	seen := map[string]bool{}
	last := map[string]int{}
	var outOfOrder []string
	var handleOnce func(context.Context, *gorm.DB, kafka.Message) error
	by := map[string]int{}
	handle := func(member string) func(context.Context, *gorm.DB, kafka.Message) error {
		return func(ctx context.Context, tx *gorm.DB, m kafka.Message) error {
			mu.Lock()
			by[member]++
			mu.Unlock()
			return handleOnce(ctx, tx, m)
		}
	}
	handleOnce = func(_ context.Context, tx *gorm.DB, m kafka.Message) error {
		mu.Lock()
		var seq struct{ Seq int }
		_ = m.Event.DecodePayload(&seq)
		if !seen[m.Event.ID] {
			seen[m.Event.ID] = true
			if seq.Seq < last[m.Event.AggregateID] {
				outOfOrder = append(outOfOrder, m.Event.ID)
			}
			last[m.Event.AggregateID] = seq.Seq
		}
		mu.Unlock()
		return writeEffect(tx, m)
	}
	const n = 60
	var events []outbox.Event
	for i := range n {
		events = append(events, testEvent(fmt.Sprintf("reb-%02d", i), fmt.Sprint(i%6), i))
	}
	publish(t, p, events[:n/3]...)
	a := start(t, newConsumer(t, db, c, kafka.ConsumerConfig{Handle: handle("a")}))
	waitFor(t, 20*time.Second, "the first member consuming", func() bool { return len(effects(t, db)) > 0 })
	start(t, newConsumer(t, db, c, kafka.ConsumerConfig{Handle: handle("b")}))
	publish(t, p, events[n/3:2*n/3]...)
	waitFor(t, 20*time.Second, "more effects", func() bool { return len(effects(t, db)) >= n/2 })
	require.NoError(t, a.stop(t))
	// Only the second member is left for these.
	publish(t, p, events[2*n/3:]...)

	waitFor(t, 30*time.Second, "every offset committed", func() bool { return allCommitted(t, c, "g", kafka.DefaultTopic) })
	want := map[string]int{}
	for _, e := range events {
		want[e.ID] = 1
	}
	assert.Equal(t, want, effects(t, db))
	mu.Lock()
	defer mu.Unlock()
	assert.Empty(t, outOfOrder)
	assert.Positive(t, by["a"])
	assert.Positive(t, by["b"], "partitions moved to the second member")
}

// TestNewConsumerInvalid: configuration errors wrap ErrInvalidConfig.
func TestNewConsumerInvalid(t *testing.T) {
	t.Parallel()
	db := consumerDB(t)
	plain, err := gorm.Open(db.Dialector, &gorm.Config{})
	require.NoError(t, err)
	t.Cleanup(func() {
		if sqlDB, err := plain.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	handle := func(context.Context, *gorm.DB, kafka.Message) error { return nil }
	for name, tc := range map[string]struct {
		db  *gorm.DB
		cfg kafka.ConsumerConfig
	}{
		"nil db":         {nil, kafka.ConsumerConfig{Consumer: "c", Handle: handle}},
		"no plugin":      {plain, kafka.ConsumerConfig{Consumer: "c", Handle: handle}},
		"no consumer":    {db, kafka.ConsumerConfig{Handle: handle}},
		"no handle":      {db, kafka.ConsumerConfig{Consumer: "c"}},
		"bad topic":      {db, kafka.ConsumerConfig{Consumer: "c", Handle: handle, Topics: []string{"a b"}}},
		"negative delay": {db, kafka.ConsumerConfig{Consumer: "c", Handle: handle, RetryDelay: -time.Second}},
	} {
		_, err := kafka.NewConsumer(tc.db, nil, tc.cfg)
		assert.ErrorIs(t, err, outbox.ErrInvalidConfig, name)
	}
	_, err = kafka.NewConsumer(db, []kgo.Opt{kgo.AutoCommitMarks()}, kafka.ConsumerConfig{Consumer: "c", Handle: handle})
	assert.ErrorIs(t, err, outbox.ErrInvalidConfig, "a commit option the Consumer cannot have")
}

// TestConsumerRevokeWhileRetrying: a partition blocked on a failing record
// has committed what came before it; when its member leaves, the retry
// loop stops (Run returns), and the next member starts at the failing
// record and finishes it.
func TestConsumerRevokeWhileRetrying(t *testing.T) {
	t.Parallel()
	c := newCluster(t, kfake.SeedTopics(1, "blocked"))
	p := newProducer(t, c.ListenAddrs(), kafka.Config{Topic: "blocked"})
	db := consumerDB(t)
	var failures atomic.Int32
	a := start(t, newConsumer(t, db, c, kafka.ConsumerConfig{
		Topics:     []string{"blocked"},
		RetryDelay: 20 * time.Millisecond,
		Handle: func(_ context.Context, tx *gorm.DB, m kafka.Message) error {
			if m.Event.ID == "blocked-2" {
				failures.Add(1)
				return errors.New("downstream unavailable")
			}
			return writeEffect(tx, m)
		},
	}))
	publish(t, p, testEvent("blocked-1", "1", 1), testEvent("blocked-2", "1", 2))
	waitFor(t, 20*time.Second, "the first record committed, the second failing", func() bool {
		return failures.Load() >= 2 && committed(t, c, "g", "blocked")[0] == 1
	})
	require.NoError(t, a.stop(t))
	after := failures.Load()

	var second []string
	var mu sync.Mutex
	start(t, newConsumer(t, db, c, kafka.ConsumerConfig{
		Topics: []string{"blocked"},
		Handle: func(_ context.Context, tx *gorm.DB, m kafka.Message) error {
			mu.Lock()
			second = append(second, m.Event.ID)
			mu.Unlock()
			return writeEffect(tx, m)
		},
	}))
	waitFor(t, 20*time.Second, "the failing record done by the next member", func() bool { return allCommitted(t, c, "g", "blocked") })
	assert.Equal(t, after, failures.Load(), "the first member stopped retrying")
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"blocked-2"}, second, "the next member starts at the failing record")
	assert.Equal(t, map[string]int{"blocked-1": 1, "blocked-2": 1}, effects(t, db))
}
