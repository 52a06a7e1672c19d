package nats_test

import (
	"bufio"
	"context"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	outboxnats "github.com/gorm-outbox/outbox/adapters/nats"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A relay with AsyncHandler SIGKILLed in the middle of a batch, round after
// round: a child process relays a backlog from a SQLite file to JetStream
// and, once a chosen number of its publishes have been acked, stops inside
// a wave (the batch on the wire, some of its acks in, no outcome recorded)
// and says so; the test kills it there. The next relay re-sends that batch
// once the lease has passed.
const (
	killRoleEnv   = "OUTBOX_NATS_KILL_ROLE" // set in a child
	killDirEnv    = "OUTBOX_NATS_KILL_DIR"
	killPrefixEnv = "OUTBOX_NATS_KILL_PREFIX"
	killHoldEnv   = "OUTBOX_NATS_KILL_HOLD" // the child stops after this many acks; 0: never
	killHeld      = "HELD"                  // the child's line once it has stopped
	killBatch     = 100
	killEvents    = 2000
	killRounds    = 5
)

// TestAsyncRelayKilledMidBatch: no event is lost, the re-sent batches are
// the only duplicates on the wire (at most one batch per kill), and the
// stream's duplicate window (Nats-Msg-Id) drops them all: the stream holds
// each event once.
func TestAsyncRelayKilledMidBatch(t *testing.T) {
	if os.Getenv(killRoleEnv) != "" {
		t.Skip("a child of this test")
	}
	long(t, "relay child processes SIGKILLed mid-batch")
	nc, js := connect(t)
	stream, prefix := newStream(t, js)

	// Every publish, duplicates included, as the wire carries it: a plain
	// subscriber gets the messages JetStream's dedupe drops. The client's
	// reader puts them in the channel as they arrive (a full channel would
	// drop them: the count would fall short).
	msgs := make(chan *natsgo.Msg, 4*killEvents)
	sub, err := nc.ChanSubscribe(prefix+".>", msgs)
	require.NoError(t, err)
	require.NoError(t, nc.Flush())

	dir := t.TempDir()
	db, _ := e2eOpen(t, filepath.Join(dir, "relay.db"), outbox.Config{})
	t.Cleanup(func() { closeDBs(db) })
	var ids []string
	for i := 0; i < killEvents; i += 500 {
		var events []outbox.Event
		for j := i; j < i+500; j++ {
			id := fmt.Sprintf("k-%05d", j)
			events = append(events, outbox.Event{ID: id, Type: "order.created", Payload: map[string]int{"n": j}})
			ids = append(ids, id)
		}
		publishEvents(t, db, events...)
	}

	env := []string{killDirEnv + "=" + dir, killPrefixEnv + "=" + prefix}
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0))
	began := time.Now()
	for r := range killRounds {
		hold := 1 + rng.IntN(killBatch*2)
		c := startKillChild(t, append(env, killHoldEnv+"="+strconv.Itoa(hold)))
		c.waitHeld(t, 60*time.Second)
		c.kill(t)
		t.Logf("round %d: killed after %d acks (%v)", r+1, hold, time.Since(began).Round(time.Millisecond))
	}
	// The drain's relay starts once the killed relays' leases have passed:
	// its first sweep then finds their rows. (A relay that starts while a
	// dead relay's lease holds rows below its watermark finds them only
	// at its next sweep, engine.SweepEvery later.)
	var leased []outbox.Row
	require.NoError(t, db.Table(outbox.DefaultTable).Where("status = ? AND locked_until IS NOT NULL", outbox.StatusPending).Find(&leased).Error)
	require.NotEmpty(t, leased, "no batch held by a killed relay: the kills did not land mid-batch")
	var leaseEnd time.Time
	for _, row := range leased {
		if row.LockedUntil.After(leaseEnd) {
			leaseEnd = *row.LockedUntil
		}
	}
	waitFor(t, time.Until(leaseEnd)+10*time.Second, "the killed relays' leases to pass", func() bool { return time.Now().After(leaseEnd) })
	drain := startKillChild(t, append(env, killHoldEnv+"=0"))
	deadline := time.Now().Add(90 * time.Second)
	for {
		var pending int64
		require.NoError(t, db.Table(outbox.DefaultTable).Where("status <> ?", outbox.StatusSent).Count(&pending).Error)
		if pending == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the drain's deadline: %d of %d events not sent", pending, killEvents)
		}
		time.Sleep(100 * time.Millisecond) // polling a count with a deadline, not synchronisation
	}
	t.Logf("drained (%v)", time.Since(began).Round(time.Millisecond))
	drain.kill(t)
	// Every publish reached the subscriber before the server answers this
	// flush: each was acked, after the server had routed it.
	require.NoError(t, nc.Flush())
	dropped, err := sub.Dropped()
	require.NoError(t, err)
	require.Zero(t, dropped, "the wire count fell short")
	require.NoError(t, sub.Unsubscribe())
	wire := map[string]int{}
	sent := len(msgs)
	for range sent {
		wire[(<-msgs).Header.Get(jetstream.MsgIDHeader)]++
	}

	seen := streamIDs(t, js, stream.CachedInfo().Config.Name)
	var lost, stored int
	for _, id := range ids {
		switch seen[id] {
		case 0:
			lost++
		case 1:
		default:
			stored += seen[id] - 1
		}
	}
	onWire := sent - len(wire)
	assert.Zero(t, lost, "events lost")
	assert.Len(t, seen, killEvents, "the stream holds only the committed events")
	assert.Zero(t, stored, "re-sends stored: the duplicate window must drop them")
	assert.Len(t, wire, killEvents, "every event was published")
	assert.Positive(t, onWire, "no batch was re-sent: the kills did not land mid-batch")
	assert.LessOrEqual(t, onWire, killRounds*killBatch, "duplicates on the wire: at most one batch per kill")
	t.Logf("KILL-RESULT kills=%d events=%d published=%d re-sent=%d (at most %d) stored_twice=%d lost=%d",
		killRounds, killEvents, sent, onWire, killRounds*killBatch, stored, lost)
}

type killChild struct {
	cmd   *exec.Cmd
	held  chan struct{}
	done  chan error
	lines sync.WaitGroup
}

func startKillChild(t *testing.T, env []string) *killChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", "^TestAsyncRelayKilledChild$", "-test.count=1")
	cmd.Env = append(append(os.Environ(), env...), killRoleEnv+"=relay")
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	c := &killChild{cmd: cmd, held: make(chan struct{}), done: make(chan error, 1)}
	c.lines.Go(func() {
		s := bufio.NewScanner(out)
		for s.Scan() {
			if s.Text() == killHeld {
				close(c.held)
				continue
			}
			fmt.Fprintln(os.Stderr, s.Text())
		}
	})
	go func() { c.lines.Wait(); c.done <- cmd.Wait() }()
	t.Cleanup(func() { c.kill(t) })
	return c
}

func (c *killChild) waitHeld(t *testing.T, timeout time.Duration) {
	t.Helper()
	select {
	case <-c.held:
	case err := <-c.done:
		c.done <- err
		t.Fatalf("the relay child exited before it stopped mid-batch: %v", err)
	case <-time.After(timeout):
		t.Fatalf("the relay child did not stop mid-batch within %v", timeout)
	}
}

func (c *killChild) kill(t *testing.T) {
	t.Helper()
	if c.cmd.ProcessState != nil {
		return
	}
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		t.Errorf("the relay child did not exit after SIGKILL")
	}
}

// TestAsyncRelayKilledChild is the relay of TestAsyncRelayKilledMidBatch,
// running until it is killed.
func TestAsyncRelayKilledChild(t *testing.T) {
	if os.Getenv(killRoleEnv) == "" {
		t.Skip("run by TestAsyncRelayKilledMidBatch")
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	url := os.Getenv(urlEnv)
	if url == "" {
		url = defaultURL
	}
	nc, err := natsgo.Connect(url, natsgo.MaxReconnects(-1))
	require.NoError(t, err)
	defer nc.Close()
	js, err := jetstream.New(nc)
	require.NoError(t, err)
	hold, err := strconv.Atoi(os.Getenv(killHoldEnv))
	require.NoError(t, err)

	db, ob := e2eOpen(t, filepath.Join(os.Getenv(killDirEnv), "relay.db"), outbox.Config{})
	pub, err := outboxnats.New(js, outboxnats.Config{SubjectPrefix: os.Getenv(killPrefixEnv) + "."})
	require.NoError(t, err)
	h := pub.AsyncHandler()
	var (
		mu    sync.Mutex
		acked int
	)
	ob.HandleAsync(outbox.AnyEvent, func(ctx context.Context, e outbox.Event) func() error {
		wait := h(ctx, e)
		return func() error {
			err := wait()
			mu.Lock()
			acked++
			stopHere := acked == hold
			mu.Unlock()
			if stopHere {
				fmt.Println(killHeld)
				select {} // mid-wave, until the SIGKILL
			}
			return err
		}
	})
	relay, err := ob.Relay(db, outbox.RelayConfig{BatchSize: killBatch, Lease: e2eLease, PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	require.NoError(t, relay.Run(ctx))
}
