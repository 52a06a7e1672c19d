package redis_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	outboxredis "github.com/gorm-outbox/outbox/adapters/redis"
	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// primaryWithReplica starts two test-owned servers, the second a replica
// of the first, and returns a client of each once the replica is online.
func primaryWithReplica(t testing.TB) (primary, replica *goredis.Client) {
	t.Helper()
	p, r := newServer(t), newServer(t)
	client := func(s *server) *goredis.Client {
		c := goredis.NewClient(&goredis.Options{Addr: s.addr(), ContextTimeoutEnabled: true, DialTimeout: time.Second})
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	primary, replica = client(p), client(r)
	// Redis 7 waits 5 s for more replicas before a full sync by default;
	// newServer's fsync of every write would be most of a publish's time.
	require.NoError(t, primary.ConfigSet(t.Context(), "repl-diskless-sync-delay", "0").Err())
	for _, c := range []*goredis.Client{primary, replica} {
		require.NoError(t, c.ConfigSet(t.Context(), "appendfsync", "everysec").Err())
	}
	require.NoError(t, replica.Do(t.Context(), "REPLICAOF", "127.0.0.1", strconv.Itoa(p.port)).Err())
	poll(t, 30*time.Second, "the replica to be online", func() (bool, string) {
		info, err := primary.Info(t.Context(), "replication").Result()
		if err != nil {
			return false, err.Error()
		}
		return strings.Contains(info, "connected_slaves:1") && strings.Contains(info, "state=online"), info
	})
	return primary, replica
}

// TestWaitReplicas: with WaitReplicas the XADD and the WAIT go in one
// round trip; an entry the replica acknowledged is on the replica when
// the publish returns, and one fewer replicas acknowledged than asked for
// is Unavailable (ErrUnderReplicated), the entry appended all the same. A
// primary refusing writes for want of replicas (NOREPLICAS) is Unavailable
// too.
func TestWaitReplicas(t *testing.T) {
	t.Parallel()
	primary, replica := primaryWithReplica(t)
	const key = "wait"
	var rec pipelineRecorder
	primary.AddHook(&rec)
	ev := func(id string) outbox.Event {
		return outbox.Event{ID: id, Type: "t", Payload: json.RawMessage(`{"secret":"do-not-log"}`)}
	}

	h := newPublisher(t, primary, outboxredis.Config{Stream: key, WaitReplicas: 1}).Handler()
	require.NoError(t, h(t.Context(), ev("e1")))
	msgs, err := replica.XRange(t.Context(), key, "-", "+").Result()
	require.NoError(t, err)
	require.Len(t, msgs, 1, "the replica has the entry when the publish returns")
	assert.Equal(t, "e1", msgs[0].Values[outboxredis.FieldID])
	assert.Equal(t, [][]string{{"xadd", "wait"}}, rec.pipelines(), "one round trip: XADD and WAIT 1 1000")
	assert.Equal(t, []any{"wait", 1, int64(1000)}, rec.last()[1].Args())

	h = newPublisher(t, primary, outboxredis.Config{Stream: key, WaitReplicas: 2, WaitTimeout: 100 * time.Millisecond}).Handler()
	began := time.Now()
	err = h(t.Context(), ev("e2"))
	require.Error(t, err)
	assert.GreaterOrEqual(t, time.Since(began), 100*time.Millisecond, "WAIT waited out its timeout")
	assert.ErrorIs(t, err, outboxredis.ErrUnderReplicated)
	assert.True(t, outbox.IsUnavailable(err), "%v", err)
	assert.Regexp(t, `^fewer replicas than Config.WaitReplicas acknowledged the entry: 1 of 2 within 100ms: entry \d+-\d+ appended to stream wait \(outbox/redis\) \(destination unavailable\)$`, err.Error(),
		"the cause first, then the entry, the stream and the adapter; never the event ID")
	assert.NotContains(t, err.Error(), "do-not-log")
	n, err := primary.XLen(t.Context(), key).Result()
	require.NoError(t, err)
	assert.EqualValues(t, 2, n, "the entry is appended: a retry adds a second one")

	require.NoError(t, primary.ConfigSet(t.Context(), "min-replicas-to-write", "2").Err())
	err = h(t.Context(), ev("e3"))
	require.Error(t, err)
	assert.True(t, strings.HasPrefix(err.Error(), "NOREPLICAS "), "%v", err)
	assert.True(t, outbox.IsUnavailable(err), "%v", err)
	err = newPublisher(t, primary, outboxredis.Config{Stream: key}).Handler()(t.Context(), ev("e4"))
	require.Error(t, err)
	assert.True(t, outbox.IsUnavailable(err), "without WaitReplicas too: %v", err)
}

// TestNewValidatesWait: WaitReplicas needs a client with one primary that
// pipelines, and a WaitTimeout below both Timeout and the client's
// ReadTimeout, whose reply would otherwise come after them.
func TestNewValidatesWait(t *testing.T) {
	t.Parallel()
	rdb := goredis.NewClient(&goredis.Options{Addr: "127.0.0.1:1", ReadTimeout: 2 * time.Second})
	t.Cleanup(func() { _ = rdb.Close() })
	cluster := goredis.NewClusterClient(&goredis.ClusterOptions{Addrs: []string{"127.0.0.1:1"}})
	t.Cleanup(func() { _ = cluster.Close() })
	for name, tc := range map[string]struct {
		rdb     outboxredis.Client
		cfg     outboxredis.Config
		wantErr string
	}{
		"default":                 {rdb, outboxredis.Config{WaitReplicas: 1}, ""},
		"negative replicas":       {rdb, outboxredis.Config{WaitReplicas: -1}, "negative WaitReplicas"},
		"negative timeout":        {rdb, outboxredis.Config{WaitReplicas: 1, WaitTimeout: -1}, "negative WaitTimeout"},
		"timeout unused":          {fakeClient{}, outboxredis.Config{WaitTimeout: time.Hour}, ""},
		"timeout over Timeout":    {rdb, outboxredis.Config{WaitReplicas: 1, WaitTimeout: time.Second, Timeout: time.Second}, "less than Timeout"},
		"timeout over read":       {rdb, outboxredis.Config{WaitReplicas: 1, WaitTimeout: 2 * time.Second}, "less than the client's ReadTimeout 2s"},
		"cluster client":          {cluster, outboxredis.Config{WaitReplicas: 1}, "not a *redis.ClusterClient"},
		"client without Pipeline": {fakeClient{}, outboxredis.Config{WaitReplicas: 1}, "needs a client with a Pipeline method"},
	} {
		_, err := outboxredis.New(tc.rdb, tc.cfg)
		if tc.wantErr == "" {
			assert.NoError(t, err, name)
			continue
		}
		assert.ErrorContains(t, err, tc.wantErr, name)
	}
}

// pipelineRecorder is a go-redis hook that keeps the commands of every
// pipeline that starts with an XADD (not the connection's handshake).
type pipelineRecorder struct{ cmds [][]goredis.Cmder }

func (r *pipelineRecorder) DialHook(next goredis.DialHook) goredis.DialHook { return next }
func (r *pipelineRecorder) ProcessHook(next goredis.ProcessHook) goredis.ProcessHook {
	return next
}
func (r *pipelineRecorder) ProcessPipelineHook(next goredis.ProcessPipelineHook) goredis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []goredis.Cmder) error {
		if len(cmds) > 0 && cmds[0].Name() == "xadd" {
			r.cmds = append(r.cmds, cmds)
		}
		return next(ctx, cmds)
	}
}

func (r *pipelineRecorder) pipelines() [][]string {
	var names [][]string
	for _, cmds := range r.cmds {
		var n []string
		for _, c := range cmds {
			n = append(n, c.Name())
		}
		names = append(names, n)
	}
	return names
}

func (r *pipelineRecorder) last() []goredis.Cmder { return r.cmds[len(r.cmds)-1] }

// BenchmarkPublishWait is one event's XADD to a primary with one replica
// on loopback, without WAIT and with WaitReplicas 1, one at a time and
// from several goroutines (as the relay's workers call the handler).
func BenchmarkPublishWait(b *testing.B) {
	primary, _ := primaryWithReplica(b)
	for _, wait := range []int{0, 1} {
		p, err := outboxredis.New(primary, outboxredis.Config{Stream: "bench", WaitReplicas: wait})
		require.NoError(b, err)
		h := p.Handler()
		e := outbox.Event{ID: "bench", Type: "t", Payload: json.RawMessage(`{"total":1250}`)}
		b.Run(fmt.Sprintf("WaitReplicas=%d", wait), func(b *testing.B) {
			for b.Loop() {
				if err := h(context.Background(), e); err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("WaitReplicas=%d/parallel", wait), func(b *testing.B) {
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if err := h(context.Background(), e); err != nil {
						b.Error(err)
						return
					}
				}
			})
		})
	}
}
