package redis_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
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
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
)

// countStatus counts the outbox rows of a status, with attempts other than
// 1 only when notOne is set.
func countStatus(t *testing.T, db *gorm.DB, status outbox.Status, notOne bool) int64 {
	t.Helper()
	q := db.Table(outbox.DefaultTable).Where("status = ?", status)
	if notOne {
		q = q.Where("attempts <> 1")
	}
	var n int64
	require.NoError(t, q.Count(&n).Error)
	return n
}

// TestAsyncBrokerOutage is TestBrokerOutage through the AsyncHandler: a
// test-owned redis-server stopped twice for 2 s under a steady writer and
// a running relay that pipelines its batches. Nothing is lost or failed,
// every event is sent at its first counted attempt (the batches the
// outages caught were handed back), and the relay logs "destination
// unavailable" once per outage.
func TestAsyncBrokerOutage(t *testing.T) {
	long(t, "a redis-server of its own, stopped twice under load")
	t.Parallel()
	srv := newServer(t)
	rdb := goredis.NewClient(&goredis.Options{
		Addr: srv.addr(), ContextTimeoutEnabled: true,
		DialTimeout: 500 * time.Millisecond, MaxRetries: 1,
	})
	t.Cleanup(func() { _ = rdb.Close() })
	const key = "outage-async"

	logs := outagetest.NewLogRecorder()
	db, ob := outboxtest.SQLite(t, outbox.Config{Logger: slog.New(logs)})
	h := newPublisher(t, rdb, outboxredis.Config{Stream: key, Timeout: time.Second}).AsyncHandler()
	var calls, down atomic.Int64
	ob.HandleAsync(outbox.AnyEvent, func(ctx context.Context, e outbox.Event) func() error {
		wait := h(ctx, e)
		return func() error {
			err := wait()
			calls.Add(1)
			if outbox.IsUnavailable(err) {
				down.Add(1)
			}
			return err
		}
	})
	relay := outboxtest.Relay(t, ob, db, outbox.RelayConfig{PollInterval: 50 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	relayDone := make(chan struct{})
	go func() { defer close(relayDone); _ = relay.Run(ctx) }()
	stopRelay := sync.OnceFunc(func() { cancel(); <-relayDone })
	t.Cleanup(stopRelay)

	var (
		mu        sync.Mutex
		committed []string
		stopW     = make(chan struct{})
		writer    sync.WaitGroup
	)
	writer.Go(func() {
		tick := time.NewTicker(10 * time.Millisecond)
		defer tick.Stop()
		for n := 0; ; n++ {
			select {
			case <-stopW:
				return
			case <-tick.C:
			}
			id := fmt.Sprintf("outage-async-%06d", n)
			err := db.Transaction(func(tx *gorm.DB) error {
				return outbox.Publish(tx, outbox.Event{ID: id, Type: "order.created", AggregateID: fmt.Sprintf("agg-%d", n%5),
					Payload: map[string]any{"n": n, "marker": outagetest.PayloadMarker}})
			})
			if err != nil {
				t.Errorf("publish %s: %v", id, err)
				return
			}
			mu.Lock()
			committed = append(committed, id)
			mu.Unlock()
		}
	})
	stopWriting := sync.OnceFunc(func() { close(stopW); writer.Wait() })
	t.Cleanup(stopWriting)

	const outages, outage = 2, 2 * time.Second
	for i := range outages {
		waitFor(t, 30*time.Second, "deliveries before the outage", func() bool {
			return countStatus(t, db, outbox.StatusSent, false) >= int64(20*(i+1))
		})
		srv.stop()
		time.Sleep(outage) // the outage itself
		srv.start()
		waitFor(t, 60*time.Second, "the relay to resume", func() bool { return logs.Count(outagetest.LogResumed) == i+1 })
	}
	stopWriting()
	waitFor(t, 60*time.Second, "every event sent", func() bool {
		return countStatus(t, db, outbox.StatusSent, false) == int64(len(committed))
	})
	stopRelay()

	seen := map[string]int{}
	for _, id := range streamIDs(t, rdb, key) {
		seen[id]++
	}
	lost, duplicates := 0, 0
	for _, id := range committed {
		switch n := seen[id]; {
		case n == 0:
			lost++
		default:
			duplicates += n - 1
		}
	}
	t.Logf("RESULT async outage: events %d, lost %d, duplicates %d, waits %d, %d of them Unavailable",
		len(committed), lost, duplicates, calls.Load(), down.Load())
	assert.Zero(t, lost)
	assert.Equal(t, len(committed), len(seen), "no entries but the events")
	assert.Zero(t, countStatus(t, db, outbox.StatusFailed, false))
	assert.Zero(t, countStatus(t, db, outbox.StatusSent, true), "no attempt is counted for the outages")
	assert.Positive(t, down.Load(), "the outages reached the handler")
	assert.Equal(t, outages, logs.Count(outagetest.LogPaused), "one \"destination unavailable\" per outage")
	assert.Equal(t, outages, logs.Count(outagetest.LogResumed))
	assert.Zero(t, logs.Count(outagetest.LogRetry), "no per-event warnings")
	assert.Zero(t, logs.Count(outagetest.LogFailed))
	for _, rec := range logs.Records() {
		assert.NotContains(t, rec.Text, outagetest.PayloadMarker, "a log record carries a payload")
	}
}

// The relay-kill test's child: a relay in this test binary, re-executed.
const (
	killDBEnv     = "OUTBOX_REDIS_KILL_DB" // the SQLite file, in the child
	killStreamEnv = "OUTBOX_REDIS_KILL_STREAM"
	killRoundsEnv = "OUTBOX_REDIS_KILL_ROUNDS" // default 8
	killSeedEnv   = "OUTBOX_REDIS_KILL_SEED"
	killBatch     = 50
	killEvents    = 2500
	// Short, so that a killed relay's batch comes back within the test.
	killLease = 2 * time.Second
)

func killRelayConfig() outbox.RelayConfig {
	return outbox.RelayConfig{BatchSize: killBatch, Lease: killLease, PollInterval: 20 * time.Millisecond}
}

func killDB(t testing.TB, path string) (*gorm.DB, *outbox.Outbox) {
	return outboxtest.Open(t, sqlite.Open("file:"+path+outbox.SQLiteDSNOptions), outbox.Config{})
}

// TestAsyncRelayKilled SIGKILLs a relay delivering through the
// AsyncHandler (a child process: this test binary re-executed) while it
// works through 2,500 events, round after round, each time once the
// stream has grown, at a random moment after; a relay in this process
// then delivers the rest. Nothing is lost; each kill duplicates at most
// the batch it was delivering (its XADDs appended, its rows not marked
// sent: delivered again once the lease ends), and a Consumer's inbox
// applies every event exactly once, dropping the duplicates.
func TestAsyncRelayKilled(t *testing.T) {
	if os.Getenv(killDBEnv) != "" {
		t.Skip("a child of this test")
	}
	long(t, "relays in child processes SIGKILLed mid-batch")
	t.Parallel()
	rdb := connect(t)
	stream := newKey(t, rdb)
	rounds := 8
	if v := os.Getenv(killRoundsEnv); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, killRoundsEnv)
		rounds = n
	}
	seed := uint64(rand.Int32())
	if v := os.Getenv(killSeedEnv); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		require.NoError(t, err, killSeedEnv)
		seed = n
	}
	rng := rand.New(rand.NewPCG(seed, seed))
	t.Logf("%d rounds, seed %d (%s=%d reproduces the kill moments)", rounds, seed, killSeedEnv, seed)

	path := filepath.Join(t.TempDir(), "outbox.db")
	db, ob := killDB(t, path)
	events, ids := numbered("kill", killEvents)
	for i := 0; i < len(events); i += 500 {
		outboxtest.Publish(t, db, events[i:i+500]...)
	}
	xlen := func() int64 {
		n, err := rdb.XLen(context.Background(), stream).Result()
		require.NoError(t, err)
		return n
	}

	kills := 0
	for r := range rounds {
		before := xlen()
		if before >= killEvents {
			break // all delivered once: more kills would prove nothing
		}
		cmd := exec.Command(os.Args[0], "-test.run", "^TestAsyncRelayKilledChild$", "-test.count=1")
		cmd.Env = append(os.Environ(), killDBEnv+"="+path, killStreamEnv+"="+stream)
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		require.NoError(t, cmd.Start())
		exited := make(chan struct{})
		go func() { _ = cmd.Wait(); close(exited) }()
		waitFor(t, 30*time.Second, "the child relay to deliver", func() bool { return xlen() > before })
		time.Sleep(time.Duration(rng.IntN(40)) * time.Millisecond) // the kill moment, at random
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		<-exited
		kills++
		t.Logf("round %d: stream %d -> %d entries", r+1, before, xlen())
	}
	require.Positive(t, kills)

	// The rest, and the batches the killed relays held once their leases
	// end.
	ob.HandleAsync(outbox.AnyEvent, newPublisher(t, rdb, outboxredis.Config{Stream: stream}).AsyncHandler())
	relay := outboxtest.Relay(t, ob, db, killRelayConfig())
	waitFor(t, 60*time.Second, "every event sent", func() bool {
		outboxtest.Drain(t, relay)
		return countStatus(t, db, outbox.StatusSent, false) == killEvents
	})

	copies := map[string]int{}
	all := streamIDs(t, rdb, stream)
	for _, id := range all {
		copies[id]++
	}
	lost := 0
	for _, id := range ids {
		if copies[id] == 0 {
			lost++
		}
	}
	duplicates := len(all) - len(copies)
	assert.Zero(t, lost, "events never appended")
	assert.Equal(t, killEvents, len(copies), "no entries but the events")
	assert.LessOrEqual(t, duplicates, kills*killBatch, "at most one batch duplicated per kill")

	cons := consumerDB(t)
	runConsumer(t, cons, rdb, outboxredis.ConsumerConfig{Stream: stream, Handle: func(_ context.Context, tx *gorm.DB, m outboxredis.Message) error {
		return tx.Create(&effect{MessageID: m.Event.ID}).Error
	}})
	entries := entryIDs(t, rdb, stream)
	waitFor(t, 60*time.Second, "the consumer to read and acknowledge every entry", func() bool {
		g := groupInfo(t, rdb, stream, "billing")
		return g.LastDeliveredID == entries[len(entries)-1] && g.Pending == 0
	})
	var distinct int64
	require.NoError(t, cons.Model(&effect{}).Distinct("message_id").Count(&distinct).Error)
	assert.EqualValues(t, killEvents, effects(t, cons), "every event applied once: the inbox dropped the duplicates")
	assert.EqualValues(t, killEvents, distinct)
	t.Logf("RESULT async relay kills: %d kills, %d events, %d entries, %d duplicates (bound %d), lost %d, applied %d",
		kills, killEvents, len(all), duplicates, kills*killBatch, lost, effects(t, cons))
}

// TestAsyncRelayKilledChild is TestAsyncRelayKilled's relay, running until
// it is killed.
func TestAsyncRelayKilledChild(t *testing.T) {
	path := os.Getenv(killDBEnv)
	if path == "" {
		t.Skip("run by TestAsyncRelayKilled")
	}
	rdb := connect(t)
	db, ob := killDB(t, path)
	ob.HandleAsync(outbox.AnyEvent, newPublisher(t, rdb, outboxredis.Config{Stream: os.Getenv(killStreamEnv)}).AsyncHandler())
	_ = outboxtest.Relay(t, ob, db, killRelayConfig()).Run(context.Background()) // until killed
}
