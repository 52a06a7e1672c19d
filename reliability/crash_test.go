package reliability

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

const (
	childRoleEnv   = "OUTBOX_RELIABILITY_CHILD" // "crash" in the child process
	crashDSNEnv    = "OUTBOX_CRASH_DSN"
	crashServerEnv = "OUTBOX_CRASH_SERVER" // the server's name (see servers)
	crashRoundEnv  = "OUTBOX_CRASH_ROUND"
	crashRoundsEnv = "OUTBOX_CRASH_ROUNDS" // rounds of the parent; default 20
	crashSeedEnv   = "OUTBOX_CRASH_SEED"   // seed of the kill moments; default random

	crashBatch   = 10
	crashLease   = 1500 * time.Millisecond
	crashWriters = 2
)

func crashRelayConfig() outbox.RelayConfig {
	return outbox.RelayConfig{
		BatchSize:    crashBatch,
		PollInterval: 20 * time.Millisecond,
		Lease:        crashLease,
		// A row is abandoned after MaxAttempts claims without an outcome;
		// kills must not be able to push a row there.
		MaxAttempts: 1000,
		Backoff:     func(int) time.Duration { return 10 * time.Millisecond },
	}
}

func envInt(t testing.TB, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	require.NoError(t, err, "%s", name)
	return n
}

// TestCrashRecovery runs a writer and a relay in a child process (this test
// binary re-executed), SIGKILLs it at a random moment, starts another, and
// so on for OUTBOX_CRASH_ROUNDS rounds (default 20), on each server (a
// subtest per server). A relay in this process then drains the table, and
// the database is checked:
//
//   - every committed business row has its outbox row and at least one
//     delivery (nothing lost), and no outbox row or delivery exists for a
//     transaction that did not commit (rolled back on purpose, or cut short
//     by a kill);
//   - no event is delivered twice within one child's life;
//   - every redundant delivery is explained by a claim in flight at a kill:
//     if an event delivered in round r was delivered again later, the dead
//     child of round r held a claim on it when it was killed. Claims in
//     flight are read from the table right after each kill, once the dead
//     child's sessions have left the server. There are at most two
//     batches of them per kill (the one being delivered, and the next,
//     claimed while it was: engine.Loop.Claim), and at most one batch of
//     them is delivered again.
func TestCrashRecovery(t *testing.T) {
	long(t, "SIGKILLs relays in child processes, round after round")
	t.Parallel()
	forEachServer(t, testCrashRecovery)
}

func testCrashRecovery(t *testing.T, s server) {
	dsn := s.fresh(t)
	rounds, rng := killPlan(t, "crash test", s, crashRoundsEnv, 20, crashSeedEnv)

	db := openGorm(t, s.open(dsn))
	ob := install(t, db, outbox.Config{Logger: newLogSink().logger()})
	for _, stmt := range s.crashDDL {
		require.NoError(t, db.Exec(stmt).Error)
	}

	start := time.Now()
	seen := map[string]bool{} // id|locked_until pairs already attributed
	inflight := make([]map[string]bool, rounds)
	var startupKills, maxInflight, totalInflight int
	for r := range rounds {
		child := startCrashChild(t, s, db, dsn, r)
		if rng.IntN(5) == 0 {
			// Kill it while it starts up.
			startupKills++
			waitKillMoment(time.Duration(rng.IntN(150)) * time.Millisecond)
		} else {
			child.waitRunning(t, s, db)
			waitKillMoment(time.Duration(rng.IntN(300)) * time.Millisecond)
		}
		child.killAndWaitGone(t, s, db)
		inflight[r] = newClaims(t, db, ob, seen)
		require.LessOrEqual(t, len(inflight[r]), 2*crashBatch, "round %d: more claims in flight than a batch and the one claimed ahead of it", r)
		maxInflight = max(maxInflight, len(inflight[r]))
		totalInflight += len(inflight[r])
	}
	killed := time.Since(start)

	// Drain what the children left, as round number `rounds`.
	ob.Handle("order.created", recordDelivery(db, rounds))
	drain(t, db, ob.Table(), outboxtest.Relay(t, ob, db, crashRelayConfig()), 60*time.Second)

	q := func(query string) int64 {
		t.Helper()
		var n int64
		require.NoError(t, db.Raw(query).Scan(&n).Error)
		return n
	}
	// The events by ID, as the outbox writes them (schema version 3).
	table := "(SELECT " + ob.IDColumn() + " AS id, status FROM " + ob.Table() + ")"
	committed := q(`SELECT count(*) FROM crash_orders`)
	require.Positive(t, committed, "the children committed nothing: the test proves nothing")
	assert.Zero(t, q(`SELECT count(*) FROM crash_orders o WHERE NOT EXISTS (SELECT 1 FROM `+table+` e WHERE e.id = o.event_id)`),
		"a committed business row has no outbox row")
	assert.Zero(t, q(`SELECT count(*) FROM `+table+` e WHERE NOT EXISTS (SELECT 1 FROM crash_orders o WHERE o.event_id = e.id)`),
		"an outbox row exists for a transaction that did not commit")
	lost := q(`SELECT count(*) FROM crash_orders o WHERE NOT EXISTS (SELECT 1 FROM crash_deliveries d WHERE d.event_id = o.event_id)`)
	assert.Zero(t, lost, "committed events never delivered")
	assert.Zero(t, q(`SELECT count(*) FROM crash_deliveries d WHERE NOT EXISTS (SELECT 1 FROM crash_orders o WHERE o.event_id = d.event_id)`),
		"an event was delivered whose transaction did not commit")
	assert.Zero(t, q(`SELECT count(*) FROM crash_orders WHERE id LIKE 'rb-%'`), "a rolled-back transaction committed")
	assert.Equal(t, map[outbox.Status]int64{outbox.StatusSent: committed}, statusCounts(t, db, ob.Table()))

	deliveries := q(`SELECT count(*) FROM crash_deliveries`)
	distinct := q(`SELECT count(DISTINCT event_id) FROM crash_deliveries`)
	assert.Zero(t, q(`SELECT count(*) FROM (SELECT event_id, round FROM crash_deliveries GROUP BY event_id, round HAVING count(*) > 1) x`),
		"an event was delivered twice within one child's life (no kill in between)")

	// Every delivery followed by another delivery of the same event must be
	// explained by a claim the child of its round held when it was killed.
	var redundant []struct {
		EventID string
		Round   int
	}
	require.NoError(t, db.Raw(`SELECT d.event_id, d.round FROM crash_deliveries d
		WHERE EXISTS (SELECT 1 FROM crash_deliveries d2 WHERE d2.event_id = d.event_id AND d2.round > d.round)`).Scan(&redundant).Error)
	perRound := map[int]int{}
	for _, d := range redundant {
		require.Less(t, d.Round, rounds)
		assert.True(t, inflight[d.Round][d.EventID], "event %s was redelivered after round %d, whose child held no claim on it", d.EventID, d.Round)
		perRound[d.Round]++
	}
	maxPerKill := 0
	for _, n := range perRound {
		maxPerKill = max(maxPerKill, n)
	}
	assert.LessOrEqual(t, maxPerKill, crashBatch, "a kill redelivered more than one batch")
	assert.EqualValues(t, deliveries-distinct, len(redundant))

	t.Logf("CRASH-RESULT server=%s rounds=%d kills=%d startup_kills=%d committed=%d delivered=%d lost=%d deliveries=%d duplicated=%d max_dup_per_kill=%d claims_in_flight_at_kills=%d max_in_flight=%d batch=%d kill_phase=%v total=%v",
		s.name, rounds, rounds, startupKills, committed, distinct, lost, deliveries, deliveries-distinct, maxPerKill,
		totalInflight, maxInflight, crashBatch, killed.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}

// killPlan reads a kill test's rounds (def unless roundsEnv says) and the
// seed of its kill moments (random unless seedEnv says), logs them, and
// returns the rounds and the source of the kill moments.
func killPlan(t *testing.T, what string, s server, roundsEnv string, def int, seedEnv string) (int, *rand.Rand) {
	t.Helper()
	rounds := envInt(t, roundsEnv, def)
	seed := uint64(envInt(t, seedEnv, int(rand.Int32())))
	t.Logf("%s on %s: %d rounds, seed %d (%s=%d reproduces the kill moments)", what, s.name, rounds, seed, seedEnv, seed)
	return rounds, rand.New(rand.NewPCG(seed, seed))
}

// waitRunning waits until the child is ready and checks that its sessions
// show under its tag: otherwise the wait for them to end after the kill
// proves nothing.
func (c *crashChild) waitRunning(t *testing.T, s server, db *gorm.DB) {
	t.Helper()
	c.waitReady(t)
	n, err := s.sessions(db, c.tag)
	require.NoError(t, err)
	require.Positive(t, n, "no session of the running child is visible under %q", c.tag)
}

// killAndWaitGone kills the child and waits until its sessions have left
// the server: it may still be finishing a statement the child sent just
// before it died (a claim, a commit), and what the test reads next must
// be the dead child's final state.
func (c *crashChild) killAndWaitGone(t *testing.T, s server, db *gorm.DB) {
	t.Helper()
	c.kill(t)
	eventually(t, 30*time.Second, func() error {
		n, err := s.sessions(db, c.tag)
		if err != nil {
			return err
		}
		if n > 0 {
			return fmt.Errorf("%d sessions of the killed child still open", n)
		}
		return nil
	})
}

// waitKillMoment waits for the randomly chosen moment of a kill.
func waitKillMoment(d time.Duration) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	<-timer.C
}

// newClaims returns the IDs of the rows claimed and not yet resolved that
// no earlier call saw with the same lease: after a kill, the claims the dead
// child held.
func newClaims(t *testing.T, db *gorm.DB, ob *outbox.Outbox, seen map[string]bool) map[string]bool {
	t.Helper()
	var rows []struct {
		ID          string
		LockedUntil time.Time
	}
	require.NoError(t, db.Table(ob.Table()).Select(ob.IDColumn()+" AS id, locked_until").
		Where("status = ? AND locked_until IS NOT NULL", outbox.StatusPending).Scan(&rows).Error)
	out := map[string]bool{}
	for _, r := range rows {
		key := r.ID + "|" + r.LockedUntil.UTC().Format(time.RFC3339Nano)
		if !seen[key] {
			seen[key] = true
			out[r.ID] = true
		}
	}
	return out
}

// recordDelivery returns a handler that records each delivery as a row of
// its own, so that duplicates can be counted.
func recordDelivery(db *gorm.DB, round int) outbox.Handler {
	return func(ctx context.Context, e outbox.Event) error {
		return db.WithContext(ctx).Exec(`INSERT INTO crash_deliveries (event_id, round) VALUES (?, ?)`, e.ID, round).Error
	}
}

type crashChild struct {
	tag    string // names its sessions (server.tagged)
	cmd    *exec.Cmd
	stdin  io.Closer
	ready  chan struct{}
	mu     sync.Mutex
	stderr bytes.Buffer
}

func (c *crashChild) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stderr.Write(p)
}

func (c *crashChild) output() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.stderr.String()
}

func startCrashChild(t *testing.T, s server, db *gorm.DB, dsn string, round int) *crashChild {
	t.Helper()
	tag := fmt.Sprintf("outbox-crash-%s-%d", randomHex(4), round)
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1", childTimeout(t))
	cmd.Env = append(os.Environ(),
		childRoleEnv+"=crash", crashServerEnv+"="+s.name, crashDSNEnv+"="+s.tagged(t, db, dsn, tag),
		crashRoundEnv+"="+strconv.Itoa(round),
		"GORACE=halt_on_error=1") // a race in the child ends it, and the parent sees that
	return startChild(t, cmd, tag)
}

// startChild starts cmd, a child whose sessions carry tag and which prints
// "ready" once it runs.
func startChild(t *testing.T, cmd *exec.Cmd, tag string) *crashChild {
	t.Helper()
	c := &crashChild{tag: tag, cmd: cmd, ready: make(chan struct{})}
	cmd.Stderr = c
	stdout, err := cmd.StdoutPipe()
	require.NoError(t, err)
	stdin, err := cmd.StdinPipe()
	require.NoError(t, err)
	c.stdin = stdin
	require.NoError(t, cmd.Start())
	go func() {
		sc := bufio.NewScanner(stdout)
		once := false
		for sc.Scan() {
			if sc.Text() == "ready" && !once {
				once = true
				close(c.ready)
			}
		}
	}()
	return c
}

func (c *crashChild) waitReady(t *testing.T) {
	t.Helper()
	select {
	case <-c.ready:
	case <-time.After(bound(t, 60*time.Second)):
		_ = c.cmd.Process.Kill()
		t.Fatalf("child did not get ready:\n%s", c.output())
	}
}

// kill SIGKILLs the child and checks that it was still running: a child
// that exited on its own failed.
func (c *crashChild) kill(t *testing.T) {
	t.Helper()
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	err := c.cmd.Wait()
	_ = c.stdin.Close()
	ws, ok := c.cmd.ProcessState.Sys().(syscall.WaitStatus)
	if !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("child exited on its own (%v) before it was killed:\n%s", err, c.output())
	}
}

var errRollback = errors.New("rolled back on purpose")

// startedChild reads what a re-executed child is told (its round, its
// server) and returns fail, which ends it with a message its parent shows.
// With watch, the child stops when its parent goes away (the parent holds
// its stdin).
func startedChild(name string, watch bool) (fail func(format string, args ...any), round int, s server) {
	if watch {
		go func() {
			_, _ = io.Copy(io.Discard, os.Stdin)
			os.Exit(0)
		}()
	}
	fail = func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, name+": "+format+"\n", args...)
		os.Exit(2)
	}
	round, err := strconv.Atoi(os.Getenv(crashRoundEnv))
	if err != nil {
		fail("round: %v", err)
	}
	s, ok := serverNamed(os.Getenv(crashServerEnv))
	if !ok {
		fail("unknown server %q", os.Getenv(crashServerEnv))
	}
	return fail, round, s
}

// TestCrashChild is the child process of TestCrashRecovery: writers that
// commit a business row and its event per transaction (every fifth
// transaction rolls back on purpose) and a relay whose handler records each
// delivery. It runs until it is killed, or until its parent goes away.
func TestCrashChild(t *testing.T) {
	if os.Getenv(childRoleEnv) != "crash" {
		t.Skip("helper process of TestCrashRecovery; runs only when re-executed by it")
	}
	fail, round, s := startedChild("crash child", true)
	db, err := gorm.Open(s.open(os.Getenv(crashDSNEnv)), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		fail("open: %v", err)
	}
	ob := outbox.Plugin(outbox.Config{
		Logger:             slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn})),
		DisableAutoMigrate: true,
	})
	if err := db.Use(ob); err != nil {
		fail("use: %v", err)
	}
	ob.Handle("order.created", recordDelivery(db, round))
	relay, err := ob.Relay(db, crashRelayConfig())
	if err != nil {
		fail("relay: %v", err)
	}
	go func() {
		if err := relay.Run(context.Background()); err != nil {
			fail("relay: %v", err)
		}
	}()
	for w := range crashWriters {
		go func() {
			for seq := 0; ; seq++ {
				id := fmt.Sprintf("r%04d-w%d-%06d", round, w, seq)
				rollback := seq%5 == 4
				if rollback {
					id = "rb-" + id
				}
				err := db.Transaction(func(tx *gorm.DB) error {
					if err := tx.Exec(`INSERT INTO crash_orders (id, event_id, round) VALUES (?, ?, ?)`, id, id, round).Error; err != nil {
						return err
					}
					err := outbox.Publish(tx, outbox.Event{
						ID: id, Type: "order.created", AggregateType: "order", AggregateID: id,
						Payload: map[string]any{"round": round, "seq": seq},
					})
					if err != nil {
						return err
					}
					if rollback {
						return errRollback
					}
					return nil
				})
				if err != nil && !(rollback && errors.Is(err, errRollback)) {
					fail("writer: %v", err)
				}
			}
		}()
	}
	fmt.Println("ready")
	select {}
}
