package nats_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	outboxnats "github.com/gorm-outbox/outbox/adapters/nats"
	"github.com/gorm-outbox/outbox/wire"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
)

// consumerEnv is one consumer test's world: a stream of its own, a SQLite
// database with the outbox plugin and an effects table Handle writes to.
type consumerEnv struct {
	t      *testing.T
	nc     *natsgo.Conn
	js     jetstream.JetStream
	stream jetstream.Stream
	name   string // the stream's name
	prefix string // its subjects: prefix + ".>"
	db     *gorm.DB
	log    *syncBuffer
}

func newConsumerEnv(t *testing.T) *consumerEnv {
	t.Helper()
	nc, js := connect(t)
	stream, prefix := newStream(t, js)
	db, _ := openDB(t)
	require.NoError(t, db.Exec("CREATE TABLE effects (message_id TEXT NOT NULL, note TEXT)").Error)
	return &consumerEnv{t: t, nc: nc, js: js, stream: stream, name: stream.CachedInfo().Config.Name, prefix: prefix, db: db, log: &syncBuffer{}}
}

// config returns a consumer configuration on the env's stream, with a fresh
// durable name, quick redeliveries and the env's log.
func (env *consumerEnv) config(handle func(ctx context.Context, tx *gorm.DB, m outboxnats.Message) error) outboxnats.ConsumerConfig {
	return outboxnats.ConsumerConfig{
		Consumer: "c_" + randomName(),
		Stream:   env.name,
		Handle:   handle,
		NakDelay: 50 * time.Millisecond,
		Logger:   slog.New(slog.NewTextHandler(env.log, &slog.HandlerOptions{Level: slog.LevelDebug})),
	}
}

// effect is a Handle that records m's ID in the effects table.
func effect(tx *gorm.DB, m outboxnats.Message, note string) error {
	return tx.Exec("INSERT INTO effects (message_id, note) VALUES (?, ?)", m.Event.ID, note).Error
}

func (env *consumerEnv) effects() int64 {
	env.t.Helper()
	var n int64
	require.NoError(env.t, env.db.Raw("SELECT COUNT(*) FROM effects").Scan(&n).Error)
	return n
}

// publish puts e on the stream as the Publisher does.
func (env *consumerEnv) publish(e outbox.Event) {
	env.t.Helper()
	h := newPublisher(env.t, env.js, outboxnats.Config{SubjectPrefix: env.prefix + "."}).Handler()
	require.NoError(env.t, h(env.t.Context(), e))
}

// publishRaw publishes a message with e's outbox headers but no
// Nats-Msg-Id, so that the stream keeps every copy: a redelivery as a
// consumer sees it.
func (env *consumerEnv) publishRaw(e outbox.Event) {
	env.t.Helper()
	msg := natsgo.NewMsg(env.prefix + "." + e.Type)
	wire.Headers(e, msg.Header.Set)
	msg.Data = e.Payload.(json.RawMessage)
	_, err := env.js.PublishMsg(env.t.Context(), msg)
	require.NoError(env.t, err)
}

// run starts c.Run and returns a stop function (also run at cleanup) that
// cancels it, waits for it and checks it returned nil.
func (env *consumerEnv) run(c *outboxnats.Consumer) (stop func()) {
	env.t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				assert.NoError(env.t, err, "Run after cancel")
			case <-time.After(20 * time.Second):
				env.t.Error("Run did not return after cancel")
			}
		})
	}
	env.t.Cleanup(stop)
	return stop
}

func (env *consumerEnv) newConsumer(cfg outboxnats.ConsumerConfig) *outboxnats.Consumer {
	env.t.Helper()
	c, err := outboxnats.NewConsumer(env.db, env.js, cfg)
	require.NoError(env.t, err)
	return c
}

// waitSettled waits until the durable consumer has settled (acked or
// terminated) every message up to the stream's last, and returns its info.
func (env *consumerEnv) waitSettled(durable string, lastSeq uint64) *jetstream.ConsumerInfo {
	env.t.Helper()
	var info *jetstream.ConsumerInfo
	require.Eventually(env.t, func() bool {
		cons, err := env.js.Consumer(env.t.Context(), env.name, durable)
		if err != nil {
			return false
		}
		info, err = cons.Info(env.t.Context())
		return err == nil && info.AckFloor.Stream >= lastSeq && info.NumAckPending == 0
	}, 15*time.Second, 10*time.Millisecond, "messages up to %d not settled: %+v", lastSeq, info)
	return info
}

// terminated subscribes to the advisories JetStream sends when durable
// terminates a message, and returns a function that waits for the next
// one's stream sequence.
func (env *consumerEnv) terminated(durable string) func() uint64 {
	env.t.Helper()
	sub, err := env.nc.SubscribeSync("$JS.EVENT.ADVISORY.CONSUMER.MSG_TERMINATED." + env.name + "." + durable)
	require.NoError(env.t, err)
	require.NoError(env.t, env.nc.Flush())
	env.t.Cleanup(func() { _ = sub.Unsubscribe() })
	return func() uint64 {
		env.t.Helper()
		msg, err := sub.NextMsg(15 * time.Second)
		require.NoError(env.t, err, "no terminated advisory")
		var adv struct {
			StreamSeq uint64 `json:"stream_seq"`
		}
		require.NoError(env.t, json.Unmarshal(msg.Data, &adv))
		return adv.StreamSeq
	}
}

func event(id string) outbox.Event {
	return outbox.Event{ID: id, Type: "order.paid", IdempotencyKey: id, AggregateType: "order", AggregateID: "42",
		Payload: json.RawMessage(`{"secret":"do-not-log"}`)}
}

// syncBuffer is a log destination several goroutines write to.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func TestConsumerCommitsOnceAndAcks(t *testing.T) {
	t.Parallel()
	env := newConsumerEnv(t)
	got := make(chan outboxnats.Message, 10)
	cfg := env.config(func(ctx context.Context, tx *gorm.DB, m outboxnats.Message) error {
		got <- m
		return effect(tx, m, "")
	})
	stop := env.run(env.newConsumer(cfg))
	occurred := time.Date(2025, 3, 4, 5, 6, 7, 123456000, time.UTC)
	e := event("evt-1")
	e.OccurredAt = occurred
	e.Headers = map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	env.publish(e)

	info := env.waitSettled(cfg.Consumer, 1)
	stop()
	require.Len(t, got, 1)
	m := <-got
	assert.Equal(t, "evt-1", m.Event.ID)
	assert.Equal(t, "order.paid", m.Event.Type)
	assert.Equal(t, "order", m.Event.AggregateType)
	assert.Equal(t, "42", m.Event.AggregateID)
	assert.Equal(t, occurred, m.Event.OccurredAt)
	assert.Equal(t, e.Headers["traceparent"], m.Event.Headers["traceparent"])
	assert.JSONEq(t, `{"secret":"do-not-log"}`, string(m.Event.Payload.(json.RawMessage)))
	assert.Equal(t, env.prefix+".order.paid", m.Raw.Subject())
	assert.EqualValues(t, 1, env.effects())
	assert.EqualValues(t, 1, info.Delivered.Consumer, "delivered once")

	ci, err := env.js.Consumer(t.Context(), env.name, cfg.Consumer)
	require.NoError(t, err)
	assert.Equal(t, jetstream.AckExplicitPolicy, ci.CachedInfo().Config.AckPolicy, "the durable is created with AckExplicit")
	assert.Equal(t, outboxnats.DefaultAckWait, ci.CachedInfo().Config.AckWait)
	assert.NotContains(t, env.log.String(), "do-not-log")
}

func TestConsumerDuplicateDeliveryHandledOnce(t *testing.T) {
	t.Parallel()
	env := newConsumerEnv(t)
	var calls atomic.Int32
	cfg := env.config(func(ctx context.Context, tx *gorm.DB, m outboxnats.Message) error {
		calls.Add(1)
		return effect(tx, m, "")
	})
	env.run(env.newConsumer(cfg))
	env.publishRaw(event("evt-dup"))
	env.publishRaw(event("evt-dup"))

	info := env.waitSettled(cfg.Consumer, 2)
	assert.EqualValues(t, 1, calls.Load(), "the second copy is skipped by the inbox")
	assert.EqualValues(t, 1, env.effects())
	assert.EqualValues(t, 2, info.Delivered.Stream, "both copies were delivered")
	assert.EqualValues(t, 2, info.Delivered.Consumer, "and both acked, not redelivered")
}

func TestConsumerRetriesAfterHandleError(t *testing.T) {
	t.Parallel()
	env := newConsumerEnv(t)
	var calls atomic.Int32
	delivered := make(chan uint64, 10)
	cfg := env.config(func(ctx context.Context, tx *gorm.DB, m outboxnats.Message) error {
		md, err := m.Raw.Metadata()
		require.NoError(t, err)
		delivered <- md.NumDelivered
		if err := effect(tx, m, "attempt"); err != nil {
			return err
		}
		if calls.Add(1) == 1 {
			return errors.New("database busy") // rolls the effect back
		}
		return nil
	})
	env.run(env.newConsumer(cfg))
	env.publish(event("evt-retry"))

	env.waitSettled(cfg.Consumer, 1)
	assert.EqualValues(t, 2, calls.Load())
	require.Len(t, delivered, 2)
	assert.EqualValues(t, 1, <-delivered)
	assert.EqualValues(t, 2, <-delivered, "nakked, then redelivered")
	assert.EqualValues(t, 1, env.effects(), "the failed attempt's effect rolled back")
	assert.Contains(t, env.log.String(), "will be redelivered")
	assert.NotContains(t, env.log.String(), "do-not-log")
}

func TestConsumerTerminatesPermanentError(t *testing.T) {
	t.Parallel()
	env := newConsumerEnv(t)
	var calls atomic.Int32
	cfg := env.config(func(ctx context.Context, tx *gorm.DB, m outboxnats.Message) error {
		calls.Add(1)
		if err := effect(tx, m, ""); err != nil {
			return err
		}
		if m.Event.ID == "evt-bad" {
			return outbox.Permanent(errors.New("order 42 does not exist"))
		}
		return nil
	})
	next := env.terminated(cfg.Consumer)
	env.run(env.newConsumer(cfg))
	env.publish(event("evt-bad"))
	env.publish(event("evt-good")) // the consumer goes on

	assert.EqualValues(t, 1, next(), "the permanent failure is terminated")
	info := env.waitSettled(cfg.Consumer, 2)
	assert.EqualValues(t, 2, calls.Load(), "no redelivery of the terminated message")
	assert.EqualValues(t, 2, info.Delivered.Consumer, "one delivery each")
	assert.EqualValues(t, 1, env.effects(), "only the good message's effect")
	logs := env.log.String()
	assert.Contains(t, logs, "level=ERROR")
	assert.Contains(t, logs, "message_id=evt-bad")
	assert.NotContains(t, logs, "do-not-log")
}

func TestConsumerTerminatesUndecodableAndIDless(t *testing.T) {
	t.Parallel()
	env := newConsumerEnv(t)
	var calls atomic.Int32
	cfg := env.config(func(ctx context.Context, tx *gorm.DB, m outboxnats.Message) error {
		calls.Add(1)
		return effect(tx, m, "")
	})
	next := env.terminated(cfg.Consumer)
	env.run(env.newConsumer(cfg))

	// No headers at all: no ID.
	_, err := env.js.Publish(t.Context(), env.prefix+".foreign", []byte(`{"secret":"do-not-log"}`))
	require.NoError(t, err)
	assert.EqualValues(t, 1, next())
	// An Outbox-Occurred-At that does not parse.
	msg := natsgo.NewMsg(env.prefix + ".broken")
	msg.Header.Set(wire.EventID, "evt-broken")
	msg.Header.Set(wire.OccurredAt, "yesterday")
	_, err = env.js.PublishMsg(t.Context(), msg)
	require.NoError(t, err)
	assert.EqualValues(t, 2, next())
	// An ID the inbox refuses (longer than its column).
	msg = natsgo.NewMsg(env.prefix + ".long")
	msg.Header.Set(wire.EventID, string(bytes.Repeat([]byte("x"), outbox.MaxInboxIDLen+1)))
	_, err = env.js.PublishMsg(t.Context(), msg)
	require.NoError(t, err)
	assert.EqualValues(t, 3, next())

	env.waitSettled(cfg.Consumer, 3)
	assert.Zero(t, calls.Load(), "Handle never sees them")
	logs := env.log.String()
	assert.Contains(t, logs, "without a message ID")
	assert.Contains(t, logs, "does not decode")
	assert.Contains(t, logs, "invalid message ID")
	assert.NotContains(t, logs, "do-not-log")
}

func TestConsumerForeignProducerMessageID(t *testing.T) {
	t.Parallel()
	env := newConsumerEnv(t)
	var calls atomic.Int32
	cfg := env.config(func(ctx context.Context, tx *gorm.DB, m outboxnats.Message) error {
		calls.Add(1)
		return tx.Exec("INSERT INTO effects (message_id) VALUES (?)", m.Raw.Headers().Get(jetstream.MsgIDHeader)).Error
	})
	cfg.MessageID = func(m outboxnats.Message) string { return m.Raw.Headers().Get(jetstream.MsgIDHeader) }
	env.run(env.newConsumer(cfg))
	for _, id := range []string{"foreign-1", "foreign-2"} {
		msg := natsgo.NewMsg(env.prefix + ".foreign")
		msg.Data = []byte(`{}`)
		msg.Header.Set(jetstream.MsgIDHeader, id) // and no Outbox-* header
		_, err := env.js.PublishMsg(t.Context(), msg)
		require.NoError(t, err)
	}
	env.waitSettled(cfg.Consumer, 2)
	assert.EqualValues(t, 2, calls.Load())
	assert.EqualValues(t, 2, env.effects())
	var ids []string
	require.NoError(t, env.db.Raw("SELECT message_id FROM outbox_inbox WHERE consumer = ? ORDER BY message_id", cfg.Consumer).Scan(&ids).Error)
	assert.Equal(t, []string{"foreign-1", "foreign-2"}, ids, "the inbox records the Nats-Msg-Id")
}

// TestConsumerRedeliveryAfterCrashBetweenCommitAndAck stops a consumer
// after its transaction committed and before its ack: JetStream redelivers
// the message to the next consumer, which skips Handle and acks it.
func TestConsumerRedeliveryAfterCrashBetweenCommitAndAck(t *testing.T) {
	t.Parallel()
	env := newConsumerEnv(t)
	var calls atomic.Int32
	handle := func(ctx context.Context, tx *gorm.DB, m outboxnats.Message) error {
		calls.Add(1)
		return effect(tx, m, "")
	}
	cfg := env.config(handle)
	cfg.AckWait = time.Second // how soon the crashed consumer's message comes back

	// The first consumer, on a connection of its own, crashes before its ack.
	nc1, js1 := connect(t)
	first, err := outboxnats.NewConsumer(env.db, js1, cfg)
	require.NoError(t, err)
	reached, release := make(chan struct{}), make(chan struct{})
	outboxnats.SetBeforeAck(first, func(jetstream.Msg) {
		close(reached)
		<-release
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	firstDone := make(chan error, 1)
	go func() { firstDone <- first.Run(ctx) }()
	env.publish(event("evt-crash"))
	select {
	case <-reached:
	case <-time.After(15 * time.Second):
		t.Fatal("the first consumer did not reach its ack")
	}
	assert.EqualValues(t, 1, env.effects(), "committed before the ack")
	// The process dies: it stops, and its ack never reaches the server.
	cancel()
	nc1.Close()
	close(release)
	select {
	case err := <-firstDone:
		require.NoError(t, err)
	case <-time.After(15 * time.Second):
		t.Fatal("the first consumer's Run did not return")
	}

	// The second consumer gets the redelivery.
	redelivered := make(chan uint64, 1)
	second := env.newConsumer(cfg)
	outboxnats.SetBeforeAck(second, func(m jetstream.Msg) {
		md, err := m.Metadata()
		if assert.NoError(t, err) {
			redelivered <- md.NumDelivered
		}
	})
	env.run(second)
	select {
	case n := <-redelivered:
		assert.EqualValues(t, 2, n, "the same message, delivered again")
	case <-time.After(15 * time.Second):
		t.Fatal("the message was not redelivered")
	}
	env.waitSettled(cfg.Consumer, 1)
	assert.EqualValues(t, 1, calls.Load(), "Handle does not run again")
	assert.EqualValues(t, 1, env.effects())
	assert.Contains(t, env.log.String(), "ack after commit failed")
}

// TestConsumerLongHandleNotRedelivered runs a Handle for longer than twice
// the ack wait: InProgress keeps JetStream from redelivering it meanwhile,
// and from redelivering the message fetched with it that waits its turn.
func TestConsumerLongHandleNotRedelivered(t *testing.T) {
	t.Parallel()
	env := newConsumerEnv(t)
	var calls atomic.Int32
	cfg := env.config(func(ctx context.Context, tx *gorm.DB, m outboxnats.Message) error {
		calls.Add(1)
		if m.Event.ID == "evt-slow" {
			select { // a slow effect, not a synchronisation
			case <-time.After(2500 * time.Millisecond):
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return effect(tx, m, "")
	})
	cfg.AckWait = time.Second
	env.publish(event("evt-slow"))
	env.publish(event("evt-next"))
	env.run(env.newConsumer(cfg))

	info := env.waitSettled(cfg.Consumer, 2)
	assert.EqualValues(t, 2, calls.Load())
	assert.EqualValues(t, 2, info.Delivered.Consumer, "two deliveries: nothing redelivered while being worked on or waiting")
	assert.EqualValues(t, 2, env.effects())
}

func TestConsumerConcurrencyAndExistingConsumer(t *testing.T) {
	t.Parallel()
	env := newConsumerEnv(t)
	durable := "existing_" + randomName()
	cons, err := env.js.CreateOrUpdateConsumer(t.Context(), env.name, jetstream.ConsumerConfig{
		Durable: durable, AckPolicy: jetstream.AckExplicitPolicy, AckWait: 10 * time.Second,
		FilterSubject: env.prefix + ".order.>",
	})
	require.NoError(t, err)
	var inFlight, most atomic.Int32
	cfg := env.config(func(ctx context.Context, tx *gorm.DB, m outboxnats.Message) error {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for old := most.Load(); n > old && !most.CompareAndSwap(old, n); old = most.Load() {
		}
		return effect(tx, m, "")
	})
	cfg.Stream, cfg.JetStreamConsumer, cfg.Concurrency, cfg.FetchBatch = "", cons, 4, 8
	c, err := outboxnats.NewConsumer(env.db, nil, cfg)
	require.NoError(t, err)
	const n = 40
	for i := range n {
		env.publish(outbox.Event{ID: fmt.Sprintf("evt-%02d", i), Type: "order.paid", Payload: json.RawMessage(`{}`)})
	}
	env.run(c)
	env.waitSettled(durable, n)
	assert.EqualValues(t, n, env.effects())
	assert.LessOrEqual(t, most.Load(), int32(4))
}

func TestNewConsumerInvalidConfig(t *testing.T) {
	t.Parallel()
	env := newConsumerEnv(t)
	handle := func(context.Context, *gorm.DB, outboxnats.Message) error { return nil }
	ok := outboxnats.ConsumerConfig{Consumer: "c", Stream: env.name, Handle: handle}
	noAck, err := env.js.CreateOrUpdateConsumer(t.Context(), env.name, jetstream.ConsumerConfig{Durable: "noack_" + randomName(), AckPolicy: jetstream.AckNonePolicy})
	require.NoError(t, err)
	plain, err := gorm.Open(sqlite.Open(filepath.Join(t.TempDir(), "plain.db")), &gorm.Config{})
	require.NoError(t, err)
	t.Cleanup(func() {
		if sqlDB, err := plain.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	with := func(f func(*outboxnats.ConsumerConfig)) outboxnats.ConsumerConfig { c := ok; f(&c); return c }
	for name, tc := range map[string]struct {
		db  *gorm.DB
		js  jetstream.JetStream
		cfg outboxnats.ConsumerConfig
	}{
		"nil db":           {nil, env.js, ok},
		"no plugin":        {plain, env.js, ok},
		"no Consumer":      {env.db, env.js, with(func(c *outboxnats.ConsumerConfig) { c.Consumer = "" })},
		"no Handle":        {env.db, env.js, with(func(c *outboxnats.ConsumerConfig) { c.Handle = nil })},
		"no Stream":        {env.db, env.js, with(func(c *outboxnats.ConsumerConfig) { c.Stream = "" })},
		"nil js":           {env.db, nil, ok},
		"bad durable":      {env.db, env.js, with(func(c *outboxnats.ConsumerConfig) { c.Consumer = "orders.v1" })},
		"negative delay":   {env.db, env.js, with(func(c *outboxnats.ConsumerConfig) { c.NakDelay = -time.Second })},
		"negative batch":   {env.db, env.js, with(func(c *outboxnats.ConsumerConfig) { c.FetchBatch = -1 })},
		"consumer+stream":  {env.db, env.js, with(func(c *outboxnats.ConsumerConfig) { c.JetStreamConsumer = noAck })},
		"AckNone consumer": {env.db, nil, with(func(c *outboxnats.ConsumerConfig) { c.Stream, c.JetStreamConsumer = "", noAck })},
	} {
		_, err := outboxnats.NewConsumer(tc.db, tc.js, tc.cfg)
		assert.ErrorIs(t, err, outbox.ErrInvalidConfig, name)
	}

	// A stream that does not exist is Run's error, not a retry forever.
	c := env.newConsumer(with(func(c *outboxnats.ConsumerConfig) { c.Stream = "NO_SUCH_STREAM_" + randomName() }))
	err = c.Run(t.Context())
	require.Error(t, err)
	assert.ErrorIs(t, err, jetstream.ErrStreamNotFound)
}

func TestConsumerHandlePanicRedelivers(t *testing.T) {
	t.Parallel()
	env := newConsumerEnv(t)
	var calls atomic.Int32
	cfg := env.config(func(ctx context.Context, tx *gorm.DB, m outboxnats.Message) error {
		if err := effect(tx, m, ""); err != nil {
			return err
		}
		if calls.Add(1) == 1 {
			panic("handler bug")
		}
		return nil
	})
	c := env.newConsumer(cfg)
	env.run(c)
	env.publish(event("evt-panic"))
	require.Eventually(t, func() bool { return calls.Load() == 2 }, 15*time.Second, 10*time.Millisecond, "redelivered after the panic")
	env.waitSettled(cfg.Consumer, 1)
	assert.EqualValues(t, 1, env.effects(), "the panicking attempt rolled back")
	assert.Contains(t, env.log.String(), "Handle panicked: handler bug")
	assert.Error(t, c.Run(t.Context()), "a second Run while the first runs (it handled the message)")
}

// TestConsumerRecreatesDeletedDurable deletes the durable under a running
// consumer: Run creates it again, and the new durable, which starts from
// the stream's first message again, finds the consumed one in the inbox.
func TestConsumerRecreatesDeletedDurable(t *testing.T) {
	t.Parallel()
	env := newConsumerEnv(t)
	var calls atomic.Int32
	cfg := env.config(func(ctx context.Context, tx *gorm.DB, m outboxnats.Message) error {
		calls.Add(1)
		return effect(tx, m, "")
	})
	env.run(env.newConsumer(cfg))
	env.publish(event("evt-before"))
	env.waitSettled(cfg.Consumer, 1)
	require.NoError(t, env.js.DeleteConsumer(t.Context(), env.name, cfg.Consumer))
	env.publish(event("evt-after"))
	info := env.waitSettled(cfg.Consumer, 2)
	assert.EqualValues(t, 2, info.Delivered.Consumer, "the new durable delivered both messages")
	assert.EqualValues(t, 2, calls.Load(), "the first one is skipped as consumed")
	assert.EqualValues(t, 2, env.effects())
}

// TestConsumerBrokerOutage restarts a test-owned server under a running
// consumer: Run rides the outage out and consumes what is published after.
func TestConsumerBrokerOutage(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	nc, js := connectWith(t, srv.url(), natsgo.MaxReconnects(-1), natsgo.ReconnectWait(50*time.Millisecond))
	createStream(t, js, "CONSUMER_OUTAGE", "consumer_outage.>")
	db, _ := openDB(t)
	require.NoError(t, db.Exec("CREATE TABLE effects (message_id TEXT NOT NULL, note TEXT)").Error)
	env := &consumerEnv{t: t, nc: nc, js: js, name: "CONSUMER_OUTAGE", prefix: "consumer_outage", db: db, log: &syncBuffer{}}
	cfg := env.config(func(ctx context.Context, tx *gorm.DB, m outboxnats.Message) error { return effect(tx, m, "") })
	cfg.FetchMaxWait = 500 * time.Millisecond
	env.run(env.newConsumer(cfg))
	env.publish(event("evt-1"))
	env.waitSettled(cfg.Consumer, 1)

	srv.stop()
	srv.start()
	h := newPublisher(t, js, outboxnats.Config{SubjectPrefix: "consumer_outage.", Timeout: time.Second}).Handler()
	require.Eventually(t, func() bool { return h(t.Context(), event("evt-2")) == nil }, 30*time.Second, 50*time.Millisecond, "publish after the restart")
	require.Eventually(t, func() bool { return env.effects() == 2 }, 30*time.Second, 20*time.Millisecond, "consumed after the restart")
	env.waitSettled(cfg.Consumer, 2)
}
