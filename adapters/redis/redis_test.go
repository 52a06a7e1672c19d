package redis_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	outboxredis "github.com/gorm-outbox/outbox/adapters/redis"
	"github.com/gorm-outbox/outbox/internal/outagetest"
	"github.com/gorm-outbox/outbox/outboxtest"
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
	assert.Equal(t, "StreamFor returned an empty stream key (outbox/redis) (permanent)", err.Error(), "the cause first; never the event ID")
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
	n, err := outboxtest.Relay(t, ob, db, outbox.RelayConfig{}).ProcessOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, n)

	msgs, err := rdb.XRange(t.Context(), key, "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, msgs, 1)
	assert.Equal(t, "e2e-1", msgs[0].Values["id"])
	assert.JSONEq(t, `{"total":99}`, msgs[0].Values["payload"].(string))
	assert.Equal(t, outbox.StatusSent, record(t, db, "e2e-1").Status)
}

// fakeClient answers every XADD with err.
type fakeClient struct{ err error }

func (f fakeClient) XAdd(ctx context.Context, _ *goredis.XAddArgs) *goredis.StringCmd {
	cmd := goredis.NewStringCmd(ctx, "xadd")
	cmd.SetErr(f.err)
	return cmd
}

// errorCases are XADD errors, each with whether it says Redis is down:
// both handlers classify them alike.
func errorCases() map[string]errorCase {
	return map[string]errorCase{
		"connection refused":  {&net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("connect", syscall.ECONNREFUSED)}, true},
		"connection reset":    {&net.OpError{Op: "read", Net: "tcp", Err: os.NewSyscallError("read", syscall.ECONNRESET)}, true},
		"connection closed":   {io.EOF, true},
		"i/o timeout":         {&net.OpError{Op: "read", Net: "tcp", Err: os.ErrDeadlineExceeded}, true},
		"DNS failure":         {&net.OpError{Op: "dial", Net: "tcp", Err: &net.DNSError{Err: "no such host", Name: "redis.invalid", IsNotFound: true}}, true},
		"deadline":            {context.DeadlineExceeded, true},
		"client closed":       {goredis.ErrClosed, true},
		"pool timeout":        {goredis.ErrPoolTimeout, true},
		"loading":             {errors.New("LOADING Redis is loading the dataset in memory"), true},
		"read-only replica":   {errors.New("READONLY You can't write against a read only replica."), true},
		"master down":         {errors.New("MASTERDOWN Link with MASTER is down and replica-serve-stale-data is set to 'no'."), true},
		"too few replicas":    {errors.New("NOREPLICAS Not enough good replicas to write."), true},
		"cluster down":        {errors.New("CLUSTERDOWN The cluster is down"), true},
		"busy script":         {errors.New("BUSY Redis is busy running a script."), true},
		"out of memory":       {errors.New("OOM command not allowed when used memory > 'maxmemory'."), true},
		"max clients":         {errors.New("ERR max number of clients reached"), true},
		"wrong password":      {errors.New("WRONGPASS invalid username-password pair or user is disabled."), true},
		"wrong type":          {errors.New("WRONGTYPE Operation against a key holding the wrong kind of value"), false},
		"ACL forbids the key": {errors.New("NOPERM No permissions to access a key"), false},
		"cancelled by caller": {context.Canceled, false},
	}
}

type errorCase struct {
	err         error
	unavailable bool
}

// TestErrorClassification checks, without a server, which XADD errors say
// Redis is down (the relay pauses and counts no attempt) and which are
// about the event or its stream (retried with backoff, counted).
func TestErrorClassification(t *testing.T) {
	t.Parallel()
	for name, tc := range errorCases() {
		p := newPublisher(t, fakeClient{err: tc.err}, outboxredis.Config{Stream: "s"})
		err := p.Handler()(t.Context(), outbox.Event{ID: "e1", Type: "t", Payload: json.RawMessage(`{"secret":"do-not-log"}`)})
		require.Error(t, err, name)
		assert.ErrorIs(t, err, tc.err, name)
		assert.Equal(t, tc.unavailable, outbox.IsUnavailable(err), "%s: %v", name, err)
		assert.False(t, outbox.IsPermanent(err), name)
		want := tc.err.Error() + ": stream s (outbox/redis)"
		if tc.unavailable {
			want += " (destination unavailable)"
		}
		assert.Equal(t, want, err.Error(), "%s: the cause first, then the stream and the adapter; never the event ID", name)
		assert.NotContains(t, err.Error(), "do-not-log", name)
	}
}

// TestErrorsFromRealServers: nothing listening is Unavailable; a key of
// another type is Redis answering, so the event is retried and counted.
func TestErrorsFromRealServers(t *testing.T) {
	t.Parallel()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := l.Addr().String()
	require.NoError(t, l.Close())
	down := goredis.NewClient(&goredis.Options{Addr: addr, ContextTimeoutEnabled: true, MaxRetries: -1})
	t.Cleanup(func() { _ = down.Close() })
	err = newPublisher(t, down, outboxredis.Config{}).Handler()(t.Context(), outbox.Event{ID: "e1", Type: "t", Payload: json.RawMessage(`1`)})
	require.Error(t, err)
	assert.True(t, outbox.IsUnavailable(err), "%v", err)

	rdb := connect(t)
	key := newKey(t, rdb)
	require.NoError(t, rdb.Set(t.Context(), key, "not a stream", 0).Err())
	err = newPublisher(t, rdb, outboxredis.Config{Stream: key}).Handler()(t.Context(), outbox.Event{ID: "e2", Type: "t", Payload: json.RawMessage(`1`)})
	require.Error(t, err)
	assert.Equal(t, "WRONGTYPE Operation against a key holding the wrong kind of value: stream "+key+" (outbox/redis)", err.Error())
	assert.False(t, outbox.IsUnavailable(err), "%v", err)
	assert.False(t, outbox.IsPermanent(err), "%v", err)
}

// TestBrokerOutage stops a test-owned redis-server twice under a steady
// writer and a running relay. Nothing is lost or failed, no attempt is
// spent on the outages (every event is sent at its first counted attempt),
// and the relay logs "destination unavailable" once per outage instead of
// a warning per event. Entries appended twice (an XADD whose reply the
// outage swallowed) are allowed: at least once.
func TestBrokerOutage(t *testing.T) {
	long(t, "a redis-server of its own, stopped twice under load")
	t.Parallel()
	srv := newServer(t)
	rdb := goredis.NewClient(&goredis.Options{
		Addr: srv.addr(), ContextTimeoutEnabled: true,
		DialTimeout: 500 * time.Millisecond, MaxRetries: 1,
	})
	t.Cleanup(func() { _ = rdb.Close() })
	const key = "outage"

	r := outagetest.NewRig(t, "outbox/redis:", "outage", 10*time.Millisecond, func(*slog.Logger) outbox.Handler {
		return newPublisher(t, rdb, outboxredis.Config{Stream: key, Timeout: time.Second}).Handler()
	})
	const outages, down = 2, 2 * time.Second
	for i := range outages {
		waitFor(t, 30*time.Second, "deliveries before the outage", func() bool { return r.Statuses()[outbox.StatusSent] >= 20*(i+1) })
		srv.stop()
		time.Sleep(down) // the outage itself
		srv.start()
		waitFor(t, 60*time.Second, "the relay to resume", func() bool { return r.Logs.Count(outagetest.LogResumed) == i+1 })
	}
	r.StopWriting()
	r.WaitSent(60 * time.Second)
	r.Stop()

	msgs, err := rdb.XRange(t.Context(), key, "-", "+").Result()
	require.NoError(t, err)
	seen := map[string]int{}
	for _, m := range msgs {
		seen[m.Values[outboxredis.FieldID].(string)]++
	}
	rep := r.Report(seen)
	r.CheckLogs()
	assert.Zero(t, rep.Lost)
	assert.Zero(t, rep.Failed)
	assert.Len(t, seen, rep.Events, "no entries but the events")
	assert.Equal(t, map[int]int{1: rep.Events}, rep.Attempts, "no attempt is counted for the outages")
	assert.Equal(t, outages, rep.Paused, "one \"destination unavailable\" per outage")
	assert.Equal(t, outages, rep.Resumed)
	assert.Zero(t, rep.RetryWarnings, "no per-event warnings")
	assert.Zero(t, rep.FailedLogs)
}

// waitFor polls cond every 20ms until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
