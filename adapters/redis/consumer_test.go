package redis_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	outboxredis "github.com/gorm-outbox/outbox/adapters/redis"
	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// effect is a consumer's business row, written through Handle's tx.
type effect struct {
	ID        uint
	MessageID string
}

// consumerDB returns a SQLite database with the outbox plugin (and so the
// inbox table) and the effects table.
func consumerDB(t *testing.T) *gorm.DB {
	t.Helper()
	db, _ := openDB(t)
	require.NoError(t, db.AutoMigrate(&effect{}))
	return db
}

func effects(t *testing.T, db *gorm.DB) int64 {
	t.Helper()
	var n int64
	require.NoError(t, db.Model(&effect{}).Count(&n).Error)
	return n
}

// logBuf collects a Consumer's log lines as JSON.
type logBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *logBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *logBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

func (l *logBuf) logger() *slog.Logger { return slog.New(slog.NewJSONHandler(l, nil)) }

// calls counts Handle's calls per message ID.
type calls struct {
	mu sync.Mutex
	n  map[string]int
	ms []outboxredis.Message
}

func (c *calls) add(m outboxredis.Message, id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[id]++
	c.ms = append(c.ms, m)
	return c.n[id]
}

func (c *calls) get(id string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n[id]
}

func (c *calls) messages() []outboxredis.Message {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]outboxredis.Message(nil), c.ms...)
}

// runConsumer starts a Consumer on its own goroutine; the returned stop
// (also a cleanup) cancels it and checks that Run returned nil.
func runConsumer(t *testing.T, db *gorm.DB, rdb outboxredis.ConsumerClient, cfg outboxredis.ConsumerConfig) (stop func()) {
	t.Helper()
	if cfg.Consumer == "" {
		cfg.Consumer = "billing"
	}
	if cfg.Group == "" {
		cfg.Group = "billing"
	}
	if cfg.Block == 0 {
		cfg.Block = 100 * time.Millisecond
	}
	c, err := outboxredis.NewConsumer(db, rdb, cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				assert.NoError(t, err, "Run")
			case <-time.After(10 * time.Second):
				t.Error("Run did not return after its context was cancelled")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// pending returns the group's count of pending entries, -1 when it cannot
// be read (no group yet). It is polled in Eventually: it must not fail t.
func pending(t *testing.T, rdb *goredis.Client, stream, group string) int64 {
	t.Helper()
	p, err := rdb.XPending(context.Background(), stream, group).Result()
	if err != nil {
		return -1
	}
	return p.Count
}

// entryIDs returns the IDs of the stream's entries, oldest first.
func entryIDs(t *testing.T, rdb *goredis.Client, stream string) []string {
	t.Helper()
	msgs, err := rdb.XRange(t.Context(), stream, "-", "+").Result()
	require.NoError(t, err)
	ids := make([]string, len(msgs))
	for i, m := range msgs {
		ids[i] = m.ID
	}
	return ids
}

// groupInfo returns the group's pending count and last delivered entry
// ID; the zero value when there is no such group (yet).
func groupInfo(t *testing.T, rdb *goredis.Client, stream, group string) goredis.XInfoGroup {
	t.Helper()
	groups, _ := rdb.XInfoGroups(t.Context(), stream).Result()
	for _, g := range groups {
		if g.Name == group {
			return g
		}
	}
	return goredis.XInfoGroup{}
}

const wait = 10 * time.Second
const tick = 10 * time.Millisecond

// publish appends e to stream as the publisher does.
func publish(t *testing.T, rdb *goredis.Client, stream string, e outbox.Event) {
	t.Helper()
	require.NoError(t, newPublisher(t, rdb, outboxredis.Config{Stream: stream}).Handler()(t.Context(), e))
}

// TestConsumerCommitsOnceAndAcks: an entry the publisher appended before
// the group existed (StartID "0") is decoded back into the event, its
// effect commits once, it is still pending while Handle runs (no ack
// before the commit) and acknowledged after.
func TestConsumerCommitsOnceAndAcks(t *testing.T) {
	t.Parallel()
	rdb := connect(t)
	stream := newKey(t, rdb)
	db := consumerDB(t)
	e := outbox.Event{
		ID: "evt-1", Type: "order.created", AggregateType: "order", AggregateID: "42",
		IdempotencyKey: "order-42-created", Payload: json.RawMessage(`{"total":1250}`),
		OccurredAt: time.Date(2025, 3, 4, 5, 6, 7, 123456000, time.UTC),
		Headers:    map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
	}
	publish(t, rdb, stream, e)
	var c calls
	pendingInHandle := make(chan int64, 1)
	runConsumer(t, db, rdb, outboxredis.ConsumerConfig{Stream: stream, Handle: func(ctx context.Context, tx *gorm.DB, m outboxredis.Message) error {
		c.add(m, m.Event.ID)
		p, err := rdb.XPending(ctx, stream, "billing").Result()
		if err != nil {
			return err
		}
		pendingInHandle <- p.Count
		return tx.Create(&effect{MessageID: m.Event.ID}).Error
	}})
	assert.EqualValues(t, 1, <-pendingInHandle, "the entry is pending, not acked, while Handle runs")
	require.Eventually(t, func() bool { return pending(t, rdb, stream, "billing") == 0 }, wait, tick, "acked after the commit")
	assert.EqualValues(t, 1, effects(t, db))
	ms := c.messages()
	require.Len(t, ms, 1)
	assert.Equal(t, e, ms[0].Event, "the event as published")
	assert.Equal(t, entryIDs(t, rdb, stream), []string{ms[0].Raw.ID})
	assert.Equal(t, ms[0].Raw.ID, groupInfo(t, rdb, stream, "billing").LastDeliveredID)
}

// TestConsumerDuplicateDelivery: the same event appended twice (a retried
// XADD) runs Handle once and both entries are acknowledged.
func TestConsumerDuplicateDelivery(t *testing.T) {
	t.Parallel()
	rdb := connect(t)
	stream := newKey(t, rdb)
	db := consumerDB(t)
	e := outbox.Event{ID: "evt-dup", Type: "order.created", IdempotencyKey: "evt-dup", Payload: json.RawMessage(`{}`)}
	publish(t, rdb, stream, e)
	publish(t, rdb, stream, e)
	var c calls
	runConsumer(t, db, rdb, outboxredis.ConsumerConfig{Stream: stream, Handle: func(_ context.Context, tx *gorm.DB, m outboxredis.Message) error {
		c.add(m, m.Event.ID)
		return tx.Create(&effect{MessageID: m.Event.ID}).Error
	}})
	ids := entryIDs(t, rdb, stream)
	require.Len(t, ids, 2)
	require.Eventually(t, func() bool {
		g := groupInfo(t, rdb, stream, "billing")
		return g.LastDeliveredID == ids[1] && g.Pending == 0
	}, wait, tick, "both entries delivered and acked")
	assert.Equal(t, 1, c.get("evt-dup"), "Handle ran once")
	assert.EqualValues(t, 1, effects(t, db))
}

// TestConsumerTransientErrorRedelivered: a Handle error rolls its effect
// back and leaves the entry pending; after ClaimIdle it is claimed
// (delivery count 2), succeeds, and is acknowledged.
func TestConsumerTransientErrorRedelivered(t *testing.T) {
	t.Parallel()
	rdb := connect(t)
	stream := newKey(t, rdb)
	db := consumerDB(t)
	var logs logBuf
	publish(t, rdb, stream, outbox.Event{ID: "evt-retry", Type: "order.created", IdempotencyKey: "evt-retry", Payload: json.RawMessage(`{"secret":"do-not-log"}`)})
	var c calls
	retryCount := make(chan int64, 1)
	runConsumer(t, db, rdb, outboxredis.ConsumerConfig{
		Stream: stream, ClaimIdle: 200 * time.Millisecond, Logger: logs.logger(),
		Handle: func(ctx context.Context, tx *gorm.DB, m outboxredis.Message) error {
			if err := tx.Create(&effect{MessageID: m.Event.ID}).Error; err != nil {
				return err
			}
			if c.add(m, m.Event.ID) == 1 {
				return errors.New("payment API timed out")
			}
			p, err := rdb.XPendingExt(ctx, &goredis.XPendingExtArgs{Stream: stream, Group: "billing", Start: m.Raw.ID, End: m.Raw.ID, Count: 1}).Result()
			if err != nil || len(p) != 1 {
				return errors.New("no pending entry")
			}
			retryCount <- p[0].RetryCount
			return nil
		},
	})
	assert.EqualValues(t, 2, <-retryCount, "the second attempt came through XAUTOCLAIM")
	require.Eventually(t, func() bool { return pending(t, rdb, stream, "billing") == 0 }, wait, tick, "acked after the retry committed")
	assert.Equal(t, 2, c.get("evt-retry"))
	assert.EqualValues(t, 1, effects(t, db), "the failed attempt's effect was rolled back")
	assert.Contains(t, logs.String(), "left pending, retried after ClaimIdle")
	assert.Contains(t, logs.String(), "payment API timed out")
	assert.NotContains(t, logs.String(), "do-not-log")
}

// TestConsumerPermanentTerminated: a Permanent error acknowledges the
// entry (it is never delivered again), logs it at Error with identifiers
// only, and, with DeadLetterStream, appends it there first.
func TestConsumerPermanentTerminated(t *testing.T) {
	t.Parallel()
	for _, deadLetter := range []bool{false, true} {
		t.Run(map[bool]string{false: "ack", true: "dead-letter"}[deadLetter], func(t *testing.T) {
			t.Parallel()
			rdb := connect(t)
			stream := newKey(t, rdb)
			db := consumerDB(t)
			var logs logBuf
			cfg := outboxredis.ConsumerConfig{Stream: stream, ClaimIdle: 100 * time.Millisecond, Logger: logs.logger()}
			if deadLetter {
				cfg.DeadLetterStream = newKey(t, rdb)
			}
			var c calls
			cfg.Handle = func(_ context.Context, tx *gorm.DB, m outboxredis.Message) error {
				c.add(m, m.Event.ID)
				if m.Event.Type == "bad" {
					return outbox.Permanent(errors.New("unknown order"))
				}
				return tx.Create(&effect{MessageID: m.Event.ID}).Error
			}
			publish(t, rdb, stream, outbox.Event{ID: "evt-bad", Type: "bad", IdempotencyKey: "evt-bad", Payload: json.RawMessage(`{"secret":"do-not-log"}`)})
			runConsumer(t, db, rdb, cfg)
			require.Eventually(t, func() bool { return strings.Contains(logs.String(), `"level":"ERROR"`) }, wait, tick)
			assert.EqualValues(t, 0, pending(t, rdb, stream, "billing"), "terminated: acked")
			badID := entryIDs(t, rdb, stream)[0]
			// Acked, it is out of the pending list, so no XAUTOCLAIM returns
			// it; a later entry goes through and the terminated one does not
			// come back.
			publish(t, rdb, stream, outbox.Event{ID: "evt-good", Type: "good", IdempotencyKey: "evt-good", Payload: json.RawMessage(`{}`)})
			require.Eventually(t, func() bool { return c.get("evt-good") == 1 && pending(t, rdb, stream, "billing") == 0 }, wait, tick)
			assert.Equal(t, 1, c.get("evt-bad"), "not redelivered")
			out := logs.String()
			assert.Contains(t, out, "message terminated")
			assert.Contains(t, out, `"message_id":"evt-bad"`)
			assert.Contains(t, out, `"entry_id":"`+badID+`"`)
			assert.Contains(t, out, "unknown order")
			assert.NotContains(t, out, "do-not-log")
			if deadLetter {
				dl, err := rdb.XRange(t.Context(), cfg.DeadLetterStream, "-", "+").Result()
				require.NoError(t, err)
				require.Len(t, dl, 1)
				assert.Equal(t, "evt-bad", dl[0].Values[outboxredis.FieldID])
				assert.Equal(t, `{"secret":"do-not-log"}`, dl[0].Values[outboxredis.FieldPayload])
				assert.Equal(t, stream, dl[0].Values["dead_letter_stream"])
				assert.Equal(t, badID, dl[0].Values["dead_letter_id"])
				assert.Equal(t, "permanent error", dl[0].Values["dead_letter_reason"])
			}
		})
	}
}

// TestConsumerUnusableEntriesTerminated: an entry without an ID (another
// producer's, with the default MessageID) and one whose fields do not
// decode are acknowledged and logged without calling Handle; the entry
// after them is consumed.
func TestConsumerUnusableEntriesTerminated(t *testing.T) {
	t.Parallel()
	rdb := connect(t)
	stream := newKey(t, rdb)
	db := consumerDB(t)
	var logs logBuf
	noID, err := rdb.XAdd(t.Context(), &goredis.XAddArgs{Stream: stream, Values: []any{"order", "42"}}).Result()
	require.NoError(t, err)
	bad, err := rdb.XAdd(t.Context(), &goredis.XAddArgs{Stream: stream, Values: []any{"id", "evt-x", "headers", "not json"}}).Result()
	require.NoError(t, err)
	publish(t, rdb, stream, outbox.Event{ID: "evt-good", Type: "good", IdempotencyKey: "evt-good", Payload: json.RawMessage(`{}`)})
	var c calls
	runConsumer(t, db, rdb, outboxredis.ConsumerConfig{Stream: stream, Logger: logs.logger(), Handle: func(_ context.Context, tx *gorm.DB, m outboxredis.Message) error {
		c.add(m, m.Event.ID)
		return nil
	}})
	require.Eventually(t, func() bool { return c.get("evt-good") == 1 && pending(t, rdb, stream, "billing") == 0 }, wait, tick)
	assert.Len(t, c.messages(), 1, "Handle ran only for the good entry")
	out := logs.String()
	assert.Contains(t, out, `"entry_id":"`+noID+`","reason":"no message ID"`)
	assert.Contains(t, out, `"entry_id":"`+bad+`","reason":"undecodable"`)
	assert.Equal(t, 2, strings.Count(out, `"level":"ERROR"`))
}

// TestConsumerForeignProducerMessageID: with MessageID set to the entry ID,
// another producer's entries are consumed, and the inbox holds that ID.
func TestConsumerForeignProducerMessageID(t *testing.T) {
	t.Parallel()
	rdb := connect(t)
	stream := newKey(t, rdb)
	db := consumerDB(t)
	entry, err := rdb.XAdd(t.Context(), &goredis.XAddArgs{Stream: stream, Values: []any{"order", "42"}}).Result()
	require.NoError(t, err)
	var c calls
	runConsumer(t, db, rdb, outboxredis.ConsumerConfig{
		Stream:    stream,
		MessageID: func(m outboxredis.Message) string { return m.Raw.ID },
		Handle: func(_ context.Context, tx *gorm.DB, m outboxredis.Message) error {
			c.add(m, m.Raw.ID)
			return tx.Create(&effect{MessageID: m.Raw.Values["order"].(string)}).Error
		},
	})
	require.Eventually(t, func() bool { return c.get(entry) == 1 && pending(t, rdb, stream, "billing") == 0 }, wait, tick)
	ran := false
	require.NoError(t, outbox.Consume(db, "billing", entry, func(*gorm.DB) error { ran = true; return nil }))
	assert.False(t, ran, "the inbox recorded the entry ID")
	assert.EqualValues(t, 1, effects(t, db))
}

// TestConsumerStartIDNewOnly: a group created with StartID "$" skips the
// entries already in the stream.
func TestConsumerStartIDNewOnly(t *testing.T) {
	t.Parallel()
	rdb := connect(t)
	stream := newKey(t, rdb)
	db := consumerDB(t)
	publish(t, rdb, stream, outbox.Event{ID: "evt-old", Type: "t", IdempotencyKey: "evt-old", Payload: json.RawMessage(`{}`)})
	var c calls
	runConsumer(t, db, rdb, outboxredis.ConsumerConfig{Stream: stream, StartID: "$", Handle: func(_ context.Context, _ *gorm.DB, m outboxredis.Message) error {
		c.add(m, m.Event.ID)
		return nil
	}})
	require.Eventually(t, func() bool {
		groups, err := rdb.XInfoGroups(t.Context(), stream).Result()
		return err == nil && len(groups) == 1
	}, wait, tick, "group created")
	publish(t, rdb, stream, outbox.Event{ID: "evt-new", Type: "t", IdempotencyKey: "evt-new", Payload: json.RawMessage(`{}`)})
	require.Eventually(t, func() bool { return c.get("evt-new") == 1 && pending(t, rdb, stream, "billing") == 0 }, wait, tick)
	assert.Equal(t, 0, c.get("evt-old"))
}

// TestConsumerCrashBetweenCommitAndAck: the first Consumer commits the
// effect, then loses its connection before XACK (its context cancelled, its
// client closed). The entry stays pending; a second Consumer of the group
// claims it after ClaimIdle, Consume skips Handle, and it is acknowledged.
//
// Not parallel: it sets the package's beforeAck hook.
func TestConsumerCrashBetweenCommitAndAck(t *testing.T) {
	rdb := connect(t)
	stream := newKey(t, rdb)
	db := consumerDB(t)
	publish(t, rdb, stream, outbox.Event{ID: "evt-crash", Type: "order.created", IdempotencyKey: "evt-crash", Payload: json.RawMessage(`{}`)})
	var c calls
	handle := func(_ context.Context, tx *gorm.DB, m outboxredis.Message) error {
		c.add(m, m.Event.ID)
		return tx.Create(&effect{MessageID: m.Event.ID}).Error
	}

	rdb1 := connect(t)
	var logs1 logBuf
	cfg1 := outboxredis.ConsumerConfig{Stream: stream, Name: "first", Handle: handle, Logger: logs1.logger()}
	c1, err := outboxredis.NewConsumer(db, rdb1, withDefaults(cfg1))
	require.NoError(t, err)
	ctx1, cancel1 := context.WithCancel(context.Background())
	defer cancel1()
	crashed := make(chan struct{})
	restore := outboxredis.SetBeforeAck(func(m outboxredis.Message) {
		// The commit is done; the process dies before the ack.
		cancel1()
		_ = rdb1.Close()
		close(crashed)
	})
	done1 := make(chan error, 1)
	go func() { done1 <- c1.Run(ctx1) }()
	select {
	case <-crashed:
	case <-time.After(wait):
		t.Fatal("the first consumer never reached the ack")
	}
	select {
	case err := <-done1:
		require.NoError(t, err)
	case <-time.After(wait):
		t.Fatal("the first consumer did not stop")
	}
	restore()
	assert.EqualValues(t, 1, effects(t, db), "committed")
	assert.EqualValues(t, 1, pending(t, rdb, stream, "billing"), "not acked")
	assert.Contains(t, logs1.String(), "XACK after the commit failed")

	runConsumer(t, db, rdb, outboxredis.ConsumerConfig{Stream: stream, Name: "second", Handle: handle, ClaimIdle: 200 * time.Millisecond})
	require.Eventually(t, func() bool { return pending(t, rdb, stream, "billing") == 0 }, wait, tick, "claimed and acked by the second consumer")
	assert.Equal(t, 1, c.get("evt-crash"), "Handle did not run again")
	assert.EqualValues(t, 1, effects(t, db))
}

// withDefaults fills in what runConsumer would.
func withDefaults(cfg outboxredis.ConsumerConfig) outboxredis.ConsumerConfig {
	if cfg.Consumer == "" {
		cfg.Consumer = "billing"
	}
	if cfg.Group == "" {
		cfg.Group = "billing"
	}
	if cfg.Block == 0 {
		cfg.Block = 100 * time.Millisecond
	}
	return cfg
}

func TestNewConsumerInvalidConfig(t *testing.T) {
	t.Parallel()
	db := consumerDB(t)
	bare, err := gorm.Open(db.Dialector, &gorm.Config{})
	require.NoError(t, err)
	t.Cleanup(func() {
		if sqlDB, err := bare.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	rdb := goredis.NewClient(&goredis.Options{Addr: defaultAddr})
	t.Cleanup(func() { _ = rdb.Close() })
	handle := func(context.Context, *gorm.DB, outboxredis.Message) error { return nil }
	ok := outboxredis.ConsumerConfig{Consumer: "billing", Handle: handle, Stream: "s", Group: "g"}
	for name, tc := range map[string]struct {
		db  *gorm.DB
		cfg func(*outboxredis.ConsumerConfig)
	}{
		"no plugin":       {db: bare},
		"no consumer":     {cfg: func(c *outboxredis.ConsumerConfig) { c.Consumer = "" }},
		"long consumer":   {cfg: func(c *outboxredis.ConsumerConfig) { c.Consumer = strings.Repeat("x", outbox.MaxInboxIDLen+1) }},
		"no handle":       {cfg: func(c *outboxredis.ConsumerConfig) { c.Handle = nil }},
		"no stream":       {cfg: func(c *outboxredis.ConsumerConfig) { c.Stream = "" }},
		"no group":        {cfg: func(c *outboxredis.ConsumerConfig) { c.Group = "" }},
		"negative count":  {cfg: func(c *outboxredis.ConsumerConfig) { c.Count = -1 }},
		"negative block":  {cfg: func(c *outboxredis.ConsumerConfig) { c.Block = -time.Second }},
		"negative idle":   {cfg: func(c *outboxredis.ConsumerConfig) { c.ClaimIdle = -time.Second }},
		"sub-ms idle":     {cfg: func(c *outboxredis.ConsumerConfig) { c.ClaimIdle = time.Microsecond }},
		"dead letter = s": {cfg: func(c *outboxredis.ConsumerConfig) { c.DeadLetterStream = "s" }},
	} {
		cfg := ok
		if tc.cfg != nil {
			tc.cfg(&cfg)
		}
		d := db
		if tc.db != nil {
			d = tc.db
		}
		_, err := outboxredis.NewConsumer(d, rdb, cfg)
		assert.ErrorIs(t, err, outbox.ErrInvalidConfig, name)
	}
	_, err = outboxredis.NewConsumer(db, rdb, ok)
	assert.NoError(t, err)
}

// TestConsumerHandlePanicLeftPending: a panic in Handle rolls its effect
// back and leaves the entry pending, as an error does; Run keeps going,
// and the claimed entry succeeds.
func TestConsumerHandlePanicLeftPending(t *testing.T) {
	t.Parallel()
	rdb := connect(t)
	stream := newKey(t, rdb)
	db := consumerDB(t)
	var logs logBuf
	publish(t, rdb, stream, outbox.Event{ID: "evt-panic", Type: "order.created", IdempotencyKey: "evt-panic", Payload: json.RawMessage(`{}`)})
	var c calls
	runConsumer(t, db, rdb, outboxredis.ConsumerConfig{
		Stream: stream, ClaimIdle: 200 * time.Millisecond, Logger: logs.logger(),
		Handle: func(ctx context.Context, tx *gorm.DB, m outboxredis.Message) error {
			if err := tx.Create(&effect{MessageID: m.Event.ID}).Error; err != nil {
				return err
			}
			if c.add(m, m.Event.ID) == 1 {
				panic("handler bug")
			}
			return nil
		},
	})
	require.Eventually(t, func() bool { return c.get("evt-panic") == 2 && pending(t, rdb, stream, "billing") == 0 }, wait, tick,
		"claimed again after the panic, then acked")
	assert.EqualValues(t, 1, effects(t, db), "the panicking attempt's effect was rolled back")
	assert.Contains(t, logs.String(), "Handle panicked: handler bug")
}
