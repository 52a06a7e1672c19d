package rabbitmq

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxtest"
	"github.com/gorm-outbox/outbox/wire"
)

// consumerDB returns a SQLite database with the outbox plugin (and so the
// inbox) and a table the handlers write their effect to.
func consumerDB(t *testing.T) *gorm.DB {
	t.Helper()
	db, _ := openOutbox(t)
	require.NoError(t, db.Exec("CREATE TABLE effects (message_id TEXT PRIMARY KEY)").Error)
	return db
}

// effects returns the message IDs whose effect committed.
func effects(t *testing.T, db *gorm.DB) []string {
	t.Helper()
	var ids []string
	require.NoError(t, db.Raw("SELECT message_id FROM effects ORDER BY message_id").Scan(&ids).Error)
	return ids
}

// applyEffect is a handler's effect: a row in effects, written through tx.
// Its primary key would fail a second application of one message.
func applyEffect(tx *gorm.DB, m Message) error {
	return tx.Exec("INSERT INTO effects (message_id) VALUES (?)", m.Event.ID).Error
}

// logRecorder keeps what the consumer logs, for assertions.
type logRecorder struct {
	mu   sync.Mutex
	recs []slog.Record
}

func (l *logRecorder) Enabled(context.Context, slog.Level) bool { return true }
func (l *logRecorder) Handle(_ context.Context, r slog.Record) error {
	l.mu.Lock()
	l.recs = append(l.recs, r.Clone())
	l.mu.Unlock()
	return nil
}
func (l *logRecorder) WithAttrs([]slog.Attr) slog.Handler { return l }
func (l *logRecorder) WithGroup(string) slog.Handler      { return l }

// find returns the records at level whose message contains msg, each
// rendered as "message key=value ...".
func (l *logRecorder) find(level slog.Level, msg string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
	for _, r := range l.recs {
		if r.Level != level || !strings.Contains(r.Message, msg) {
			continue
		}
		var b strings.Builder
		b.WriteString(r.Message)
		r.Attrs(func(a slog.Attr) bool {
			b.WriteString(" " + a.String())
			return true
		})
		out = append(out, b.String())
	}
	return out
}

// all renders every record, to show that no payload is logged.
func (l *logRecorder) all() string {
	var b strings.Builder
	for _, lvl := range []slog.Level{slog.LevelDebug, slog.LevelInfo, slog.LevelWarn, slog.LevelError} {
		for _, s := range l.find(lvl, "") {
			b.WriteString(s + "\n")
		}
	}
	return b.String()
}

// consumerRig is one test's consumer side: a queue on the fixture's
// exchange, a database, a log.
type consumerRig struct {
	*fixture
	queue string
	db    *gorm.DB
	logs  *logRecorder
	name  string // the inbox's consumer name, shared by the rig's consumers
}

func newConsumerRig(t *testing.T) *consumerRig {
	t.Helper()
	return newConsumerRigOn(t, consumerDB(t))
}

// newConsumerRigOn is a rig whose consumers record in db (which has the
// plugin and the effects table).
func newConsumerRigOn(t *testing.T, db *gorm.DB) *consumerRig {
	t.Helper()
	f := newFixture(t)
	return &consumerRig{fixture: f, queue: f.queue("#", nil), db: db, logs: &logRecorder{}, name: randomName("consumer-")}
}

// consumer returns a Consumer of the rig's queue; cfg's zero fields get the
// rig's values and a RequeueDelay of 50ms.
func (r *consumerRig) consumer(conn Config, cfg ConsumerConfig) *Consumer {
	r.t.Helper()
	conn.URL = r.url
	if conn.ConnectionName == "" {
		conn.ConnectionName = randomName("outbox-test-consumer-")
	}
	if cfg.Consumer == "" {
		cfg.Consumer = r.name
	}
	if cfg.Queue == "" {
		cfg.Queue = r.queue
	}
	if cfg.RequeueDelay == 0 {
		cfg.RequeueDelay = 50 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(r.logs)
	}
	c, err := NewConsumer(r.db, conn, cfg)
	require.NoError(r.t, err)
	return c
}

// running is a Consumer's Run in a goroutine.
type running struct {
	cancel context.CancelFunc
	done   chan error
	once   sync.Once
}

// run starts c.Run; the test's end stops it.
func run(t *testing.T, c *Consumer) *running {
	t.Helper()
	return runCtx(t, context.Background(), c)
}

// runCtx starts c.Run with a context derived from parent.
func runCtx(t *testing.T, parent context.Context, c *Consumer) *running {
	t.Helper()
	ctx, cancel := context.WithCancel(parent)
	r := &running{cancel: cancel, done: make(chan error, 1)}
	go func() { r.done <- c.Run(ctx) }()
	t.Cleanup(func() { r.stop(t) })
	return r
}

// stop cancels Run and waits for it to return nil.
func (r *running) stop(t *testing.T) {
	t.Helper()
	r.once.Do(func() {
		r.cancel()
		select {
		case err := <-r.done:
			assert.NoError(t, err, "Run returns nil once its context is cancelled")
		case <-time.After(10 * time.Second):
			t.Error("Run did not return within 10s of its cancel")
		}
	})
}

// queueState returns the queue's ready messages and consumers.
func (r *consumerRig) queueState(q string) (messages, consumers int) {
	r.t.Helper()
	var st amqp.Queue
	r.admin(func(ch *amqp.Channel) error {
		var err error
		st, err = ch.QueueDeclarePassive(q, false, false, false, false, nil)
		return err
	})
	return st.Messages, st.Consumers
}

// settled returns how many messages the queue holds once every consumer
// of it has stopped. The broker removes a channel's consumers and requeues
// its unacknowledged messages in one step, so a count taken after the
// consumers are gone includes whatever was never acknowledged or rejected.
func (r *consumerRig) settled(q string) int {
	r.t.Helper()
	require.Eventually(r.t, func() bool { _, n := r.queueState(q); return n == 0 }, 10*time.Second, 10*time.Millisecond,
		"the stopped consumers are gone from queue %s", q)
	n, _ := r.queueState(q)
	return n
}

// publishRaw puts a message on the fixture's exchange as a foreign producer
// would, without the outbox's headers unless given.
func (r *consumerRig) publishRaw(msg amqp.Publishing) {
	r.t.Helper()
	require.NoError(r.t, r.ch.PublishWithContext(r.t.Context(), r.exchange, "foreign.thing", false, false, msg))
}

// deadLettered declares a dead-letter queue and returns the arguments that
// make a queue dead-letter to it, and its deliveries.
func (r *consumerRig) deadLettered() (amqp.Table, <-chan amqp.Delivery) {
	r.t.Helper()
	dlq := r.fixture.queue("no.such.routing.key", nil)
	ch, err := r.conn.Channel()
	require.NoError(r.t, err)
	d, err := ch.Consume(dlq, "", true, false, false, false, nil)
	require.NoError(r.t, err)
	return amqp.Table{"x-dead-letter-exchange": "", "x-dead-letter-routing-key": dlq}, d
}

// acks counts the acknowledgements a Consumer attempts, through its
// beforeAck hook, and records whether each was a redelivery.
type acks struct {
	mu          sync.Mutex
	ids         []string
	redelivered []bool
}

func (a *acks) hook(m Message) {
	a.mu.Lock()
	a.ids = append(a.ids, m.Event.ID)
	a.redelivered = append(a.redelivered, m.Raw.Redelivered)
	a.mu.Unlock()
}

func (a *acks) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.ids)
}

func (a *acks) waitFor(t *testing.T, n int) {
	t.Helper()
	require.Eventually(t, func() bool { return a.count() >= n }, 10*time.Second, 5*time.Millisecond, "%d acknowledgements", n)
}

func TestNewConsumerChecksConfig(t *testing.T) {
	t.Parallel()
	db, _ := openOutbox(t)
	bare, err := gorm.Open(sqlite.Open("file:"+filepath.Join(t.TempDir(), "bare.db")), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	t.Cleanup(func() {
		if s, err := bare.DB(); err == nil {
			_ = s.Close()
		}
	})
	handle := func(context.Context, *gorm.DB, Message) error { return nil }
	ok := ConsumerConfig{Consumer: "billing", Handle: handle, Queue: "orders"}
	with := func(edit func(*ConsumerConfig)) ConsumerConfig { c := ok; edit(&c); return c }

	for _, tc := range []struct {
		name string
		db   *gorm.DB
		conn Config
		cfg  ConsumerConfig
		want string
	}{
		{"nil db", nil, Config{}, ok, "no outbox plugin"},
		{"db without the plugin", bare, Config{}, ok, "no outbox plugin"},
		{"no Consumer", db, Config{}, with(func(c *ConsumerConfig) { c.Consumer = "" }), "Consumer: " + outbox.ErrInvalidInboxID.Error() + ": empty ID"},
		{"Consumer too long", db, Config{}, with(func(c *ConsumerConfig) { c.Consumer = strings.Repeat("x", outbox.MaxInboxIDLen+1) }), "longer than the inbox's 255"},
		{"no Handle", db, Config{}, with(func(c *ConsumerConfig) { c.Handle = nil }), "Handle is required"},
		{"no Queue", db, Config{}, with(func(c *ConsumerConfig) { c.Queue = "" }), "Queue is required"},
		{"negative Prefetch", db, Config{}, with(func(c *ConsumerConfig) { c.Prefetch = -1 }), "Prefetch -1"},
		{"Prefetch over 65535", db, Config{}, with(func(c *ConsumerConfig) { c.Prefetch = 65536 }), "Prefetch 65536"},
		{"negative RequeueDelay", db, Config{}, with(func(c *ConsumerConfig) { c.RequeueDelay = -time.Second }), "RequeueDelay -1s"},
		{"bad URL", db, Config{URL: "http://secret@localhost/"}, ok, "invalid URL"},
		{"Recovery set", db, Config{AMQP: amqp.Config{Recovery: &amqp.Recovery{}}}, ok, "Recovery must be nil"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := NewConsumer(tc.db, tc.conn, tc.cfg)
			require.ErrorIs(t, err, outbox.ErrInvalidConfig)
			require.ErrorContains(t, err, tc.want)
			require.NotContains(t, err.Error(), "secret")
			require.Nil(t, c)
		})
	}

	// A valid configuration does not connect: nothing listens on port 1.
	c, err := NewConsumer(db, Config{URL: "amqp://guest:guest@127.0.0.1:1/"}, ok)
	require.NoError(t, err)
	require.NotNil(t, c)
}

// TestConsumerCommitsThenAcks: each message's effect commits once, Handle
// sees the event as the outbox published it, and every message is
// acknowledged (none is left on the queue once the consumer stopped).
func TestConsumerCommitsThenAcks(t *testing.T) {
	t.Parallel()
	r := newConsumerRig(t)
	p := r.publisher(Config{})
	var (
		mu   sync.Mutex
		seen []Message
	)
	c := r.consumer(Config{}, ConsumerConfig{Handle: func(ctx context.Context, tx *gorm.DB, m Message) error {
		mu.Lock()
		seen = append(seen, m)
		mu.Unlock()
		return applyEffect(tx, m)
	}})
	var a acks
	c.beforeAck = a.hook
	rn := run(t, c)

	ids := []string{"evt-a", "evt-b", "evt-c"}
	for _, id := range ids {
		require.NoError(t, p.Publish(t.Context(), testEvent(id)))
	}
	a.waitFor(t, len(ids))
	rn.stop(t)

	assert.Equal(t, ids, effects(t, r.db))
	assert.Zero(t, r.settled(r.queue), "every message was acknowledged")
	require.Len(t, seen, len(ids))
	want := testEvent("evt-a")
	for _, m := range seen {
		if m.Event.ID != "evt-a" {
			continue
		}
		assert.Equal(t, want.Type, m.Event.Type)
		assert.Equal(t, want.AggregateType, m.Event.AggregateType)
		assert.Equal(t, want.AggregateID, m.Event.AggregateID)
		assert.Equal(t, want.IdempotencyKey, m.Event.IdempotencyKey)
		assert.True(t, want.OccurredAt.Equal(m.Event.OccurredAt))
		assert.Equal(t, want.Headers, m.Event.Headers)
		raw, ok := m.Event.Payload.(json.RawMessage)
		require.True(t, ok, "the payload is the body as json.RawMessage: %T", m.Event.Payload)
		assert.JSONEq(t, `{"total":7}`, string(raw))
		assert.Equal(t, "evt-a", m.Raw.MessageId)
	}
	assert.NotContains(t, r.logs.all(), "total", "payloads are never logged")
}

// TestConsumerDuplicateDelivery publishes one event twice, as a relay that
// lost a confirm does: Handle runs once, and both messages are
// acknowledged.
func TestConsumerDuplicateDelivery(t *testing.T) {
	t.Parallel()
	duplicateDelivery(t, newConsumerRig(t))
}

func duplicateDelivery(t *testing.T, r *consumerRig) {
	p := r.publisher(Config{})
	var calls atomic.Int32
	c := r.consumer(Config{}, ConsumerConfig{Handle: func(_ context.Context, tx *gorm.DB, m Message) error {
		calls.Add(1)
		return applyEffect(tx, m)
	}})
	var a acks
	c.beforeAck = a.hook
	rn := run(t, c)

	require.NoError(t, p.Publish(t.Context(), testEvent("evt-twice")))
	require.NoError(t, p.Publish(t.Context(), testEvent("evt-twice")))
	a.waitFor(t, 2)
	rn.stop(t)

	assert.Equal(t, int32(1), calls.Load(), "Handle ran once")
	assert.Equal(t, []string{"evt-twice"}, effects(t, r.db))
	assert.Zero(t, r.settled(r.queue), "both messages were acknowledged")
}

// TestConsumerRequeuesAfterDelay: a Handle error leaves the message
// unacknowledged; the broker redelivers it after RequeueDelay, and it
// succeeds then.
func TestConsumerRequeuesAfterDelay(t *testing.T) {
	t.Parallel()
	r := newConsumerRig(t)
	p := r.publisher(Config{})
	const delay = 200 * time.Millisecond
	var (
		mu    sync.Mutex
		at    []time.Time
		redel []bool
	)
	c := r.consumer(Config{}, ConsumerConfig{RequeueDelay: delay, Handle: func(_ context.Context, tx *gorm.DB, m Message) error {
		mu.Lock()
		defer mu.Unlock()
		at = append(at, time.Now())
		redel = append(redel, m.Raw.Redelivered)
		if len(at) == 1 {
			if err := applyEffect(tx, m); err != nil {
				return err
			}
			return errors.New("simulated transient failure") // rolls the effect back
		}
		return applyEffect(tx, m)
	}})
	var a acks
	c.beforeAck = a.hook
	rn := run(t, c)

	require.NoError(t, p.Publish(t.Context(), testEvent("evt-flaky")))
	a.waitFor(t, 1)
	rn.stop(t)

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, at, 2, "one failure, one success")
	assert.Equal(t, []bool{false, true}, redel, "the second attempt is the broker's redelivery")
	assert.GreaterOrEqual(t, at[1].Sub(at[0]), delay, "requeued after RequeueDelay, not at once")
	assert.Equal(t, []string{"evt-flaky"}, effects(t, r.db), "the failed attempt's effect rolled back")
	assert.Zero(t, r.settled(r.queue))
	warn := r.logs.find(slog.LevelWarn, "handler failed")
	require.Len(t, warn, 1)
	assert.Contains(t, warn[0], "message_id=evt-flaky")
	assert.Contains(t, warn[0], "simulated transient failure")
}

// TestConsumerRequeueDelayHoldsOneSlot: a message waiting for its requeue
// holds one prefetch slot, not the consumer: with Prefetch 2 the other
// messages flow through the other slot. Stopping does not wait for the
// delay, and the waiting message goes back to the queue.
func TestConsumerRequeueDelayHoldsOneSlot(t *testing.T) {
	t.Parallel()
	r := newConsumerRig(t)
	p := r.publisher(Config{})
	c := r.consumer(Config{}, ConsumerConfig{Prefetch: 2, RequeueDelay: time.Hour, Handle: func(_ context.Context, tx *gorm.DB, m Message) error {
		if m.Event.ID == "evt-stuck" {
			return errors.New("simulated outage of a downstream service")
		}
		return applyEffect(tx, m)
	}})
	var a acks
	c.beforeAck = a.hook
	rn := run(t, c)

	ids := []string{"evt-stuck", "evt-1", "evt-2", "evt-3", "evt-4"}
	for _, id := range ids {
		require.NoError(t, p.Publish(t.Context(), testEvent(id)))
	}
	a.waitFor(t, 4)
	start := time.Now()
	rn.stop(t)
	assert.Less(t, time.Since(start), 5*time.Second, "stopping cuts the requeue delay short")

	assert.Equal(t, []string{"evt-1", "evt-2", "evt-3", "evt-4"}, effects(t, r.db))
	assert.Equal(t, 1, r.settled(r.queue), "the failing message is back on the queue")
}

// TestConsumerPermanentDeadLetters: a Permanent error rejects the message
// without requeue, so the queue's dead-letter exchange receives it; it is
// not redelivered, and the rejection is logged at Error level with
// identifiers only.
func TestConsumerPermanentDeadLetters(t *testing.T) {
	t.Parallel()
	r := newConsumerRig(t)
	args, dead := r.deadLettered()
	q := r.fixture.queue("#", args)
	p := r.publisher(Config{})
	var calls atomic.Int32
	c := r.consumer(Config{}, ConsumerConfig{Queue: q, Handle: func(_ context.Context, tx *gorm.DB, m Message) error {
		calls.Add(1)
		if err := applyEffect(tx, m); err != nil {
			return err
		}
		return outbox.Permanent(errors.New("simulated invalid order"))
	}})
	rn := run(t, c)

	require.NoError(t, p.Publish(t.Context(), testEvent("evt-bad")))
	m := receive(t, dead)
	assert.Equal(t, "evt-bad", m.MessageId)
	deaths, _ := m.Headers["x-death"].([]any)
	require.Len(t, deaths, 1)
	assert.Equal(t, "rejected", deaths[0].(amqp.Table)["reason"])
	rn.stop(t)

	assert.Equal(t, int32(1), calls.Load(), "not redelivered")
	assert.Empty(t, effects(t, r.db), "the effect rolled back")
	assert.Zero(t, r.settled(q))
	errs := r.logs.find(slog.LevelError, "handler failed permanently")
	require.Len(t, errs, 1)
	assert.Contains(t, errs[0], "message_id=evt-bad")
	assert.Contains(t, errs[0], "simulated invalid order")
	assert.NotContains(t, r.logs.all(), "total", "payloads are never logged")
}

// TestConsumerRejectsUnusableMessages: a message without an ID (a foreign
// producer's, with the default MessageID) and one whose Outbox headers do
// not decode never reach Handle and are dead-lettered.
func TestConsumerRejectsUnusableMessages(t *testing.T) {
	t.Parallel()
	r := newConsumerRig(t)
	args, dead := r.deadLettered()
	q := r.fixture.queue("#", args)
	var calls atomic.Int32
	c := r.consumer(Config{}, ConsumerConfig{Queue: q, Handle: func(context.Context, *gorm.DB, Message) error {
		calls.Add(1)
		return nil
	}})
	run(t, c)

	r.publishRaw(amqp.Publishing{MessageId: "foreign-1", Body: []byte(`{"secret":1}`)})
	r.publishRaw(amqp.Publishing{MessageId: "foreign-2", Headers: amqp.Table{wire.EventID: "evt-odd", wire.OccurredAt: "yesterday"}})
	got := map[string]bool{}
	for range 2 {
		got[receive(t, dead).MessageId] = true
	}
	assert.Equal(t, map[string]bool{"foreign-1": true, "foreign-2": true}, got)
	assert.Zero(t, calls.Load())
	assert.Len(t, r.logs.find(slog.LevelError, "no usable ID"), 1)
	bad := r.logs.find(slog.LevelError, "cannot be decoded")
	require.Len(t, bad, 1)
	assert.Contains(t, bad[0], wire.OccurredAt)
	assert.NotContains(t, r.logs.all(), "secret", "payloads are never logged")
}

// TestConsumerForeignMessageID deduplicates a foreign producer's messages
// by their AMQP message-id property.
func TestConsumerForeignMessageID(t *testing.T) {
	t.Parallel()
	r := newConsumerRig(t)
	var (
		calls atomic.Int32
		a     acks
	)
	c := r.consumer(Config{}, ConsumerConfig{
		MessageID: func(m Message) string { return m.Raw.MessageId },
		Handle: func(_ context.Context, tx *gorm.DB, m Message) error {
			calls.Add(1)
			return tx.Exec("INSERT INTO effects (message_id) VALUES (?)", m.Raw.MessageId).Error
		},
	})
	c.beforeAck = a.hook
	rn := run(t, c)

	r.publishRaw(amqp.Publishing{MessageId: "ext-1", Body: []byte(`{}`)})
	r.publishRaw(amqp.Publishing{MessageId: "ext-1", Body: []byte(`{}`)})
	a.waitFor(t, 2)
	rn.stop(t)
	assert.Equal(t, int32(1), calls.Load())
	assert.Equal(t, []string{"ext-1"}, effects(t, r.db))
	assert.Zero(t, r.settled(r.queue))
}

// currentConn returns the consumer's current connection, nil between
// sessions: the hook through which tests cut it.
func (c *Consumer) currentConn() *amqp.Connection {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.conn
}

// TestConsumerCrashBetweenCommitAndAck: the first consumer commits the
// effect and dies before its ack (the hook stops it and cuts its
// connection). The broker redelivers the message to a new Consumer, whose
// inbox skips Handle and which acknowledges it.
func TestConsumerCrashBetweenCommitAndAck(t *testing.T) {
	t.Parallel()
	crashBetweenCommitAndAck(t, newConsumerRig(t))
}

func crashBetweenCommitAndAck(t *testing.T, r *consumerRig) {
	p := r.publisher(Config{})
	var calls atomic.Int32
	handle := func(_ context.Context, tx *gorm.DB, m Message) error {
		calls.Add(1)
		return applyEffect(tx, m)
	}

	first := r.consumer(Config{}, ConsumerConfig{Handle: handle})
	crashed := make(chan struct{})
	ctx, crash := context.WithCancel(context.Background())
	defer crash()
	first.beforeAck = func(Message) {
		// The process dies here: after the commit, before the ack.
		crash()
		assert.NoError(t, first.currentConn().Close())
		close(crashed)
	}
	rn1 := runCtx(t, ctx, first)
	require.NoError(t, p.Publish(t.Context(), testEvent("evt-crash")))
	select {
	case <-crashed:
	case <-time.After(10 * time.Second):
		t.Fatal("the first consumer never got to its ack")
	}
	rn1.stop(t)
	require.Equal(t, []string{"evt-crash"}, effects(t, r.db), "the effect committed before the crash")
	assert.Equal(t, 1, r.settled(r.queue), "the message was not acknowledged")

	second := r.consumer(Config{}, ConsumerConfig{Handle: handle})
	var a acks
	second.beforeAck = a.hook
	rn2 := run(t, second)
	a.waitFor(t, 1)
	rn2.stop(t)

	assert.Equal(t, []bool{true}, a.redelivered, "the second consumer got the broker's redelivery")
	assert.Equal(t, int32(1), calls.Load(), "Handle did not run again")
	assert.Equal(t, []string{"evt-crash"}, effects(t, r.db))
	assert.Zero(t, r.settled(r.queue), "the redelivery was acknowledged")
}

// TestConsumerReconnects cuts the consumer's connection between a commit
// and its ack: the consumer reconnects by itself, the broker redelivers
// the message, Handle is skipped, and the message is acknowledged; what is
// published afterwards is consumed on the new connection.
func TestConsumerReconnects(t *testing.T) {
	t.Parallel()
	r := newConsumerRig(t)
	p := r.publisher(Config{})
	var calls atomic.Int32
	c := r.consumer(Config{}, ConsumerConfig{Handle: func(_ context.Context, tx *gorm.DB, m Message) error {
		calls.Add(1)
		return applyEffect(tx, m)
	}})
	var (
		a   acks
		cut atomic.Bool
	)
	c.beforeAck = func(m Message) {
		if cut.CompareAndSwap(false, true) {
			assert.NoError(t, c.currentConn().Close())
		}
		a.hook(m)
	}
	rn := run(t, c)

	require.NoError(t, p.Publish(t.Context(), testEvent("evt-cut")))
	a.waitFor(t, 2)
	require.NoError(t, p.Publish(t.Context(), testEvent("evt-later")))
	a.waitFor(t, 3)
	rn.stop(t)

	a.mu.Lock()
	assert.Equal(t, []string{"evt-cut", "evt-cut", "evt-later"}, a.ids)
	assert.Equal(t, []bool{false, true, false}, a.redelivered)
	a.mu.Unlock()
	assert.Equal(t, int32(2), calls.Load(), "the redelivery did not run Handle")
	assert.Equal(t, []string{"evt-cut", "evt-later"}, effects(t, r.db))
	assert.Zero(t, r.settled(r.queue))
	assert.Len(t, r.logs.find(slog.LevelWarn, "ack failed after the commit"), 1)
	assert.Len(t, r.logs.find(slog.LevelWarn, "lost its connection"), 1)
}

// TestConsumerWaitsForBroker starts a consumer while the broker cannot be
// reached: Run keeps trying, logs the outage once, and consumes once the
// broker is back.
func TestConsumerWaitsForBroker(t *testing.T) {
	t.Parallel()
	r := newConsumerRig(t)
	p := r.publisher(Config{})
	var o outage
	o.down.Store(true)
	c := r.consumer(Config{AMQP: amqpConfigWithDial(o.dial)}, ConsumerConfig{Handle: func(_ context.Context, tx *gorm.DB, m Message) error {
		return applyEffect(tx, m)
	}})
	var a acks
	c.beforeAck = a.hook
	rn := run(t, c)
	require.NoError(t, p.Publish(t.Context(), testEvent("evt-wait")))
	require.Eventually(t, func() bool { return len(r.logs.find(slog.LevelWarn, "cannot reach the broker")) > 0 }, 10*time.Second, 5*time.Millisecond)

	o.down.Store(false)
	a.waitFor(t, 1)
	rn.stop(t)
	assert.Equal(t, []string{"evt-wait"}, effects(t, r.db))
	assert.Len(t, r.logs.find(slog.LevelWarn, "cannot reach the broker"), 1, "the outage is logged once")
	assert.Len(t, r.logs.find(slog.LevelInfo, "consuming resumed"), 1)
	assert.Zero(t, r.settled(r.queue))
}

// TestConsumerRunTwice: one Consumer runs once at a time.
func TestConsumerRunTwice(t *testing.T) {
	t.Parallel()
	r := newConsumerRig(t)
	c := r.consumer(Config{}, ConsumerConfig{Handle: func(context.Context, *gorm.DB, Message) error { return nil }})
	run(t, c)
	require.Eventually(t, func() bool { return c.currentConn() != nil }, 10*time.Second, 5*time.Millisecond)
	require.ErrorContains(t, c.Run(t.Context()), "already running")
}

// TestConsumerPostgres runs the duplicate and the crash between commit and
// ack with the inbox on PostgreSQL, in a schema of its own, when
// OUTBOX_TEST_POSTGRES_DSN is set.
func TestConsumerPostgres(t *testing.T) {
	t.Parallel()
	dsn := os.Getenv("OUTBOX_TEST_POSTGRES_DSN")
	if dsn == "" {
		t.Skip("OUTBOX_TEST_POSTGRES_DSN is not set")
	}
	open := func(t *testing.T) *gorm.DB {
		admin, err := gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: logger.Discard})
		require.NoError(t, err)
		t.Cleanup(func() {
			if s, err := admin.DB(); err == nil {
				_ = s.Close()
			}
		})
		schema := randomName("t_consumer_")
		require.NoError(t, admin.Exec("CREATE SCHEMA "+schema).Error)
		t.Cleanup(func() { _ = admin.Exec("DROP SCHEMA " + schema + " CASCADE").Error })
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		db, _ := outboxtest.Open(t, postgres.Open(dsn+sep+"search_path="+schema), outbox.Config{})
		require.NoError(t, db.Exec("CREATE TABLE effects (message_id TEXT PRIMARY KEY)").Error)
		return db
	}
	t.Run("duplicate", func(t *testing.T) {
		t.Parallel()
		duplicateDelivery(t, newConsumerRigOn(t, open(t)))
	})
	t.Run("crash between commit and ack", func(t *testing.T) {
		t.Parallel()
		crashBetweenCommitAndAck(t, newConsumerRigOn(t, open(t)))
	})
}

// TestConsumerHandlerPanic: a panicking Handle rolls its transaction back
// and the message is requeued like after an error, without bringing the
// consumer down.
func TestConsumerHandlerPanic(t *testing.T) {
	t.Parallel()
	r := newConsumerRig(t)
	p := r.publisher(Config{})
	var calls atomic.Int32
	c := r.consumer(Config{}, ConsumerConfig{Handle: func(_ context.Context, tx *gorm.DB, m Message) error {
		if err := applyEffect(tx, m); err != nil {
			return err
		}
		if calls.Add(1) == 1 {
			panic("simulated bug")
		}
		return nil
	}})
	var a acks
	c.beforeAck = a.hook
	rn := run(t, c)
	require.NoError(t, p.Publish(t.Context(), testEvent("evt-panic")))
	a.waitFor(t, 1)
	rn.stop(t)
	assert.Equal(t, int32(2), calls.Load())
	assert.Equal(t, []string{"evt-panic"}, effects(t, r.db), "the panicking attempt's effect rolled back")
	errs := r.logs.find(slog.LevelError, "handler panicked")
	require.Len(t, errs, 1)
	assert.Contains(t, errs[0], "simulated bug")
	assert.Zero(t, r.settled(r.queue))
}
