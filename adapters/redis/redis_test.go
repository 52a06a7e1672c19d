package redis_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
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

func newPublisher(t *testing.T, rdb outboxredis.Client, cfg outboxredis.Config) *outboxredis.Publisher {
	t.Helper()
	p, err := outboxredis.New(rdb, cfg)
	require.NoError(t, err)
	return p
}

func TestEntryFields(t *testing.T) {
	t.Parallel()
	rdb := connect(t)
	key := newKey(t, rdb)
	h := newPublisher(t, rdb, outboxredis.Config{Stream: key}).Handler()

	e := outbox.Event{
		ID:             "evt-1",
		Type:           "order.created",
		AggregateType:  "order",
		AggregateID:    "42",
		IdempotencyKey: "order-42-created",
		Payload:        json.RawMessage(`{"total":1250}`),
		OccurredAt:     time.Date(2025, 3, 4, 5, 6, 7, 123456000, time.UTC),
		Headers:        map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
	}
	require.NoError(t, h(t.Context(), e))
	require.NoError(t, h(t.Context(), outbox.Event{ID: "evt-2", Type: "order.paid", IdempotencyKey: "evt-2", Payload: json.RawMessage(`null`)}))

	msgs, err := rdb.XRange(t.Context(), key, "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, msgs, 2, "stream order is delivery order")
	assert.Equal(t, map[string]any{
		"id":              "evt-1",
		"type":            "order.created",
		"aggregate_type":  "order",
		"aggregate_id":    "42",
		"idempotency_key": "order-42-created",
		"occurred_at":     "2025-03-04T05:06:07.123456Z",
		"headers":         `{"traceparent":"00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}`,
		"payload":         `{"total":1250}`,
	}, msgs[0].Values)
	assert.Equal(t, "evt-2", msgs[1].Values[outboxredis.FieldID])
	assert.Equal(t, "{}", msgs[1].Values[outboxredis.FieldHeaders], "the field set is fixed, headers or not")
	assert.Equal(t, "", msgs[1].Values[outboxredis.FieldAggregateType])
	assert.Equal(t, "null", msgs[1].Values[outboxredis.FieldPayload])
}

func TestStreamFor(t *testing.T) {
	t.Parallel()
	rdb := connect(t)
	key := newKey(t, rdb)
	h := newPublisher(t, rdb, outboxredis.Config{
		StreamFor: func(e outbox.Event) string {
			if e.Type == "bad" {
				return ""
			}
			return key
		},
	}).Handler()
	require.NoError(t, h(t.Context(), outbox.Event{ID: "a", Type: "ok", Payload: json.RawMessage(`1`)}))
	n, err := rdb.XLen(t.Context(), key).Result()
	require.NoError(t, err)
	assert.EqualValues(t, 1, n)

	err = h(t.Context(), outbox.Event{ID: "b", Type: "bad", Payload: json.RawMessage(`{"secret":"do-not-log"}`)})
	require.Error(t, err)
	assert.True(t, outbox.IsPermanent(err))
	assert.Contains(t, err.Error(), "outbox/redis: publish event b")
	assert.NotContains(t, err.Error(), "do-not-log")
}

// argsRecorder is a go-redis hook that keeps the arguments of every XADD.
type argsRecorder struct {
	mu   sync.Mutex
	args [][]any
}

func (r *argsRecorder) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (r *argsRecorder) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return next
}
func (r *argsRecorder) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return func(ctx context.Context, cmd goredis.Cmder) error {
		if cmd.Name() == "xadd" {
			r.mu.Lock()
			r.args = append(r.args, slices.Clone(cmd.Args()))
			r.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

func TestMaxLenTrimming(t *testing.T) {
	t.Parallel()
	rdb := connect(t)
	ctx := t.Context()
	ev := func(i int) outbox.Event {
		return outbox.Event{ID: fmt.Sprintf("evt-%03d", i), Type: "tick", Payload: json.RawMessage(`{}`)}
	}

	t.Run("exact", func(t *testing.T) {
		key := newKey(t, rdb)
		h := newPublisher(t, rdb, outboxredis.Config{Stream: key, MaxLen: 3, ExactTrim: true}).Handler()
		for i := range 5 {
			require.NoError(t, h(ctx, ev(i)))
		}
		msgs, err := rdb.XRange(ctx, key, "-", "+").Result()
		require.NoError(t, err)
		var ids []any
		for _, m := range msgs {
			ids = append(ids, m.Values["id"])
		}
		assert.Equal(t, []any{"evt-002", "evt-003", "evt-004"}, ids, "the oldest entries are trimmed")
	})

	t.Run("approximate by default", func(t *testing.T) {
		key := newKey(t, rdb)
		rec := &argsRecorder{}
		client := goredis.NewClient(rdb.Options())
		t.Cleanup(func() { _ = client.Close() })
		client.AddHook(rec)
		h := newPublisher(t, client, outboxredis.Config{Stream: key, MaxLen: 10}).Handler()
		// Approximate trimming drops whole nodes (100 entries each by
		// default), so it takes a few hundred entries to see it work.
		for i := range 300 {
			require.NoError(t, h(ctx, ev(i)))
		}
		n, err := rdb.XLen(ctx, key).Result()
		require.NoError(t, err)
		assert.GreaterOrEqual(t, n, int64(10))
		assert.Less(t, n, int64(300), "the stream must have been trimmed")
		rec.mu.Lock()
		defer rec.mu.Unlock()
		require.NotEmpty(t, rec.args)
		assert.Equal(t, []any{"xadd", key, "maxlen", "~", int64(10), "*"}, rec.args[0][:6])
	})

	t.Run("no trimming when unset", func(t *testing.T) {
		key := newKey(t, rdb)
		h := newPublisher(t, rdb, outboxredis.Config{Stream: key}).Handler()
		for i := range 5 {
			require.NoError(t, h(ctx, ev(i)))
		}
		n, err := rdb.XLen(ctx, key).Result()
		require.NoError(t, err)
		assert.EqualValues(t, 5, n)
	})
}

func TestNewValidates(t *testing.T) {
	t.Parallel()
	_, err := outboxredis.New(nil, outboxredis.Config{})
	require.Error(t, err)
	rdb := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1"})
	t.Cleanup(func() { _ = rdb.Close() })
	_, err = outboxredis.New(rdb, outboxredis.Config{MaxLen: -1})
	require.Error(t, err)
	_, err = outboxredis.New(rdb, outboxredis.Config{Timeout: -1})
	require.Error(t, err)
}

// TestEndToEnd wires the real outbox: publish in a transaction, one relay
// pass, the entry is in the stream and the row is sent.
func TestEndToEnd(t *testing.T) {
	t.Parallel()
	rdb := connect(t)
	key := newKey(t, rdb)
	db, ob := openDB(t)
	ob.Handle("order.created", newPublisher(t, rdb, outboxredis.Config{Stream: key}).Handler())

	require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
		return outbox.Publish(tx, outbox.Event{ID: "e2e-1", Type: "order.created", AggregateType: "order", AggregateID: "1",
			Payload: map[string]int{"total": 99}})
	}))
	n, err := ob.Relay(db, outbox.RelayConfig{}).ProcessOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, n)

	msgs, err := rdb.XRange(t.Context(), key, "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	assert.Equal(t, "e2e-1", msgs[0].Values["id"])
	assert.JSONEq(t, `{"total":99}`, msgs[0].Values["payload"].(string))
	assert.Equal(t, outbox.StatusSent, record(t, db, "e2e-1").Status)
}

// TestBrokerOutage stops a test-owned redis-server while the relay runs: the
// handler fails and the relay keeps the events pending; after a restart they
// are appended, each at least once.
func TestBrokerOutage(t *testing.T) {
	t.Parallel()
	srv := newServer(t)
	rdb := goredis.NewClient(&goredis.Options{
		Addr: srv.addr(), ContextTimeoutEnabled: true,
		DialTimeout: 500 * time.Millisecond, MaxRetries: 1,
	})
	t.Cleanup(func() { _ = rdb.Close() })
	const key = "outage"

	db, ob := openDB(t)
	ob.Handle(outbox.AnyEvent, newPublisher(t, rdb, outboxredis.Config{Stream: key, Timeout: time.Second}).Handler())
	relay := ob.Relay(db, outbox.RelayConfig{MaxAttempts: 1000, Backoff: func(int) time.Duration { return 0 }})
	publish := func(ids ...string) {
		t.Helper()
		require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
			for _, id := range ids {
				if err := outbox.Publish(tx, outbox.Event{ID: id, Type: "order.created", Payload: map[string]string{"id": id}}); err != nil {
					return err
				}
			}
			return nil
		}))
	}

	publish("before")
	_, err := relay.ProcessOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, outbox.StatusSent, record(t, db, "before").Status)

	srv.stop()
	publish("during-1", "during-2")
	for range 2 {
		n, err := relay.ProcessOnce(t.Context())
		require.NoError(t, err, "handler errors are recorded, not returned")
		require.Equal(t, 2, n)
	}
	rec := record(t, db, "during-1")
	assert.Equal(t, outbox.StatusPending, rec.Status, "a broker outage is retried, never a permanent failure")
	assert.Equal(t, 2, rec.Attempts)
	require.NotNil(t, rec.LastError)
	assert.Contains(t, *rec.LastError, "outbox/redis: publish event during-1 to stream outage")

	srv.start()
	publish("after")
	require.Eventually(t, func() bool {
		_, err := relay.ProcessOnce(t.Context())
		require.NoError(t, err)
		var pending int64
		require.NoError(t, db.Table(outbox.DefaultTable).Where("status <> ?", outbox.StatusSent).Count(&pending).Error)
		return pending == 0
	}, 30*time.Second, 50*time.Millisecond, "events published during the outage must be delivered after it")

	msgs, err := rdb.XRange(t.Context(), key, "-", "+").Result()
	require.NoError(t, err)
	seen := map[string]int{}
	for _, m := range msgs {
		seen[m.Values["id"].(string)]++
	}
	for _, id := range []string{"before", "during-1", "during-2", "after"} {
		assert.GreaterOrEqual(t, seen[id], 1, "event %s must be in the stream (at least once)", id)
	}
	assert.Len(t, seen, 4, "no other entries")
}
