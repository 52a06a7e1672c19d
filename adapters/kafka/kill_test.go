package kafka_test

import (
	"bufio"
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/adapters/kafka"
	"github.com/gorm-outbox/outbox/outboxtest"
	"github.com/gorm-outbox/outbox/wire"
)

// The relay-kill test: relays in child processes drain an outbox through
// the AsyncHandler to an in-process cluster and are SIGKILLed mid-batch,
// round after round; a last relay drains the rest.
const (
	killRoleEnv  = "OUTBOX_KAFKA_KILL_CHILD" // set in a child: the outbox's database file
	killSeedsEnv = "OUTBOX_KAFKA_KILL_SEEDS"
	killAcksEnv  = "OUTBOX_KAFKA_KILL_ACKS" // the child says "acked" after this many acks
	killSeedEnv  = "OUTBOX_KAFKA_KILL_SEED" // reproduces the kill moments
	killRounds   = 6
	killEvents   = 3000
	killBatch    = 100 // the relays' BatchSize: a kill redelivers at most one batch
	// Short, so that what a killed relay held comes back within the test,
	// and long enough that a loaded machine's relay does not give up on a
	// batch's acks (a duplicate that is not the kill's).
	killLease = 5 * time.Second
)

// TestAsyncRelayKilled SIGKILLs a relay process right after its n-th
// acknowledged record (n random), while the batch's records are in flight
// or acknowledged and not yet marked sent, six times; a last relay drains
// the rest. No event is lost or failed. Kafka keeps no record of what an
// earlier producer session sent, so the events a killed relay had produced
// and not marked are produced again by a later relay: the duplicates, told
// apart by the producer ID on their records (a session each), are at most
// one batch (100) per killed relay, and none is the last relay's. Consumers
// deduplicate by Outbox-Event-Id.
func TestAsyncRelayKilled(t *testing.T) {
	if os.Getenv(killRoleEnv) != "" {
		t.Skip("a child of this test")
	}
	long(t, "relay processes SIGKILLed mid-batch, round after round")
	seed := uint64(rand.Int32())
	if v := os.Getenv(killSeedEnv); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		require.NoError(t, err, killSeedEnv)
		seed = n
	}
	rng := rand.New(rand.NewPCG(seed, seed))
	t.Logf("seed %d (%s=%d reproduces the kill moments)", seed, killSeedEnv, seed)

	c := newCluster(t)
	seeds := c.ListenAddrs()
	path := filepath.Join(t.TempDir(), "outbox.db")
	db, ob := outboxtest.Open(t, sqlite.Open("file:"+path+outboxtest.DSNOptions), outbox.Config{})
	var ids []string
	for chunk := 0; chunk < killEvents; chunk += 500 {
		var events []outbox.Event
		for i := chunk; i < chunk+500; i++ {
			id := fmt.Sprintf("evt-%05d", i)
			ids = append(ids, id)
			events = append(events, outbox.Event{ID: id, Type: "order.created", AggregateType: "order",
				AggregateID: strconv.Itoa(i % 40), Payload: map[string]int{"n": i}})
		}
		publishEvents(t, db, events...)
	}

	kills := 0
	for round := 0; round < killRounds && statusCount(t, db, outbox.StatusSent) < killEvents; round++ {
		acks := 1 + rng.IntN(2*killBatch)
		child := startKillChild(t, path, seeds, acks)
		if !child.waitAcked(t, db) {
			child.kill(t)
			t.Logf("round %d: every event was marked sent before the relay's %d-th ack", round+1, acks)
			break
		}
		child.kill(t)
		kills++
		t.Logf("round %d: killed at its %d-th ack; %d events sent so far", round+1, acks, statusCount(t, db, outbox.StatusSent))
	}

	// The last relay, in this process, drains the rest.
	p := newProducer(t, seeds, kafka.Config{})
	ob.HandleAsync(outbox.AnyEvent, p.AsyncHandler())
	relay, err := ob.Relay(db, outbox.RelayConfig{BatchSize: killBatch, PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	ran := make(chan error, 1)
	go func() { ran <- relay.Run(ctx) }()
	deadline := time.Now().Add(60 * time.Second)
	for statusCount(t, db, outbox.StatusSent) < killEvents && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond) // polling a count with a deadline
	}
	cancel()
	require.NoError(t, <-ran)
	require.EqualValues(t, killEvents, statusCount(t, db, outbox.StatusSent), "every event sent")
	assert.Zero(t, statusCount(t, db, outbox.StatusFailed))
	last, _, err := p.Client().ProducerID(t.Context())
	require.NoError(t, err)

	total := stored(t, c, kafka.DefaultTopic)
	copies := map[string][]*kgo.Record{} // an event's records, oldest first (one key, one partition)
	for _, r := range consume(t, seeds, kafka.DefaultTopic, int(total)) {
		id := header(r, wire.EventID)
		copies[id] = append(copies[id], r)
	}
	assert.Equal(t, killEvents, len(copies), "no record of an event that was not published")
	lost, duplicates := 0, 0
	bySession := map[int64]int{} // producer ID: copies that were not an event's last
	for _, id := range ids {
		rs := copies[id]
		if len(rs) == 0 {
			lost++
			continue
		}
		duplicates += len(rs) - 1
		for _, r := range rs[:len(rs)-1] {
			bySession[r.ProducerID]++
		}
	}
	assert.Zero(t, lost, "events lost")
	assert.NotContains(t, bySession, last, "the last relay, never killed, left no duplicate")
	assert.LessOrEqual(t, len(bySession), kills, "duplicates come from the killed relays")
	for pid, n := range bySession {
		assert.LessOrEqual(t, n, killBatch, "relay session %d: at most one batch of duplicates", pid)
	}
	assert.Positive(t, duplicates, "no kill landed between a produce and its mark: the test proved nothing")
	perKill := slices.Sorted(maps.Values(bySession))
	t.Logf("KILL-RESULT kills=%d events=%d records=%d lost=%d duplicates=%d (per killed relay that left any, sorted: %v)",
		kills, killEvents, total, lost, duplicates, perKill)
}

type killChild struct {
	cmd   *exec.Cmd
	acked chan struct{}
	done  chan error
	once  sync.Once
}

func startKillChild(t *testing.T, path string, seeds []string, acks int) *killChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", "^TestAsyncRelayKilledChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), killRoleEnv+"="+path, killSeedsEnv+"="+strings.Join(seeds, ","), killAcksEnv+"="+strconv.Itoa(acks))
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	c := &killChild{cmd: cmd, acked: make(chan struct{}), done: make(chan error, 1)}
	go func() {
		s := bufio.NewScanner(out)
		for s.Scan() {
			if s.Text() == "acked" {
				close(c.acked)
			}
		}
		c.done <- cmd.Wait()
	}()
	t.Cleanup(func() { c.kill(t) })
	return c
}

// waitAcked waits for the child's "acked" and reports whether it came:
// false when every event was marked sent first.
func (c *killChild) waitAcked(t *testing.T, db *gorm.DB) bool {
	t.Helper()
	deadline := time.After(60 * time.Second)
	poll := time.NewTicker(100 * time.Millisecond)
	defer poll.Stop()
	for {
		select {
		case <-c.acked:
			return true
		case err := <-c.done:
			t.Fatalf("the relay exited: %v", err)
		case <-poll.C: // polling a count
			if statusCount(t, db, outbox.StatusSent) == killEvents {
				return false
			}
		case <-deadline:
			t.Fatalf("no ack within 60 s")
		}
	}
}

func (c *killChild) kill(t *testing.T) {
	t.Helper()
	c.once.Do(func() {
		_ = c.cmd.Process.Signal(syscall.SIGKILL)
		select {
		case <-c.done:
		case <-time.After(10 * time.Second):
			t.Errorf("the relay did not exit after SIGKILL")
		}
	})
}

// ackCounter says "acked" on stdout at the n-th acknowledged record.
type ackCounter struct {
	mu    sync.Mutex
	n, at int
}

func (a *ackCounter) OnProduceRecordUnbuffered(_ *kgo.Record, err error) {
	if err != nil {
		return
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.n++
	if a.n == a.at {
		fmt.Println("acked")
	}
}

// TestAsyncRelayKilledChild is a relay of TestAsyncRelayKilled, running
// until it is killed.
func TestAsyncRelayKilledChild(t *testing.T) {
	path := os.Getenv(killRoleEnv)
	if path == "" {
		t.Skip("run by TestAsyncRelayKilled")
	}
	acks, err := strconv.Atoi(os.Getenv(killAcksEnv))
	require.NoError(t, err)
	db, ob := outboxtest.Open(t, sqlite.Open("file:"+path+outboxtest.DSNOptions), outbox.Config{})
	p, err := kafka.New(kafka.Config{
		SeedBrokers:   strings.Split(os.Getenv(killSeedsEnv), ","),
		ClientOptions: []kgo.Opt{kgo.WithHooks(&ackCounter{at: acks})},
	})
	require.NoError(t, err)
	ob.HandleAsync(outbox.AnyEvent, p.AsyncHandler())
	relay, err := ob.Relay(db, outbox.RelayConfig{BatchSize: killBatch, Lease: killLease, PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, relay.Run(context.Background()))
}
