package nats_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	outboxnats "github.com/gorm-outbox/outbox/adapters/nats"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// The end-to-end inbox test: a producer process (a business row and its
// event in one transaction, a relay publishing to JetStream) and a consumer
// process (Consumer: a business row per event and an onward event, through
// outbox.Consume), both SIGKILLed at random moments, round after round. At
// the end every committed event's effect must exist exactly once, and so
// must its onward event.
const (
	e2eRoleEnv     = "OUTBOX_NATS_E2E_ROLE" // "producer" or "consumer" in a child
	e2eDirEnv      = "OUTBOX_NATS_E2E_DIR"
	e2eStreamEnv   = "OUTBOX_NATS_E2E_STREAM"
	e2ePrefixEnv   = "OUTBOX_NATS_E2E_PREFIX"
	e2eWriteEnv    = "OUTBOX_NATS_E2E_WRITE" // "0": the producer only relays
	e2eRoundsEnv   = "OUTBOX_NATS_E2E_ROUNDS"
	e2eSeedEnv     = "OUTBOX_NATS_E2E_SEED"
	e2eDefaultRuns = 8
	// Short, so that what a killed child held comes back within the test:
	// the relay's lease and JetStream's ack wait.
	e2eLease   = 2 * time.Second
	e2eAckWait = 2 * time.Second
)

// e2eEffect is the consumer's business row: one per consumption, with no
// unique key, so that a doubled effect would show.
type e2eEffect struct {
	ID      uint `gorm:"primaryKey"`
	EventID string
}

// e2eOrder is the producer's business row; its ID is its event's ID.
type e2eOrder struct {
	ID string `gorm:"primaryKey"`
}

func e2eOpen(t testing.TB, path string, cfg outbox.Config) (*gorm.DB, *outbox.Outbox) {
	t.Helper()
	db, err := gorm.Open(sqlite.Open("file:"+path+outbox.SQLiteDSNOptions), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	cfg.Logger = slog.New(slog.DiscardHandler)
	ob := outbox.Plugin(cfg)
	require.NoError(t, db.Use(ob))
	return db, ob
}

func TestInboxEndToEnd(t *testing.T) {
	if os.Getenv(e2eRoleEnv) != "" {
		t.Skip("a child of this test")
	}
	long(t, "producer and consumer child processes SIGKILLed round after round")
	rounds := e2eDefaultRuns
	if v := os.Getenv(e2eRoundsEnv); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, e2eRoundsEnv)
		rounds = n
	}
	seed := uint64(rand.Int32())
	if v := os.Getenv(e2eSeedEnv); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		require.NoError(t, err, e2eSeedEnv)
		seed = n
	}
	rng := rand.New(rand.NewPCG(seed, seed))
	t.Logf("%d rounds, seed %d (%s=%d reproduces the kill moments)", rounds, seed, e2eSeedEnv, seed)

	_, js := connect(t)
	// The shortest duplicate window JetStream takes (100 ms): the relay's republishes after a kill
	// reach the consumer as the duplicates a broker without dedupe (or
	// past its window) delivers, so the inbox has work to do.
	stream, prefix := newStreamWindow(t, js, 100*time.Millisecond)
	dir := t.TempDir()
	prod, _ := e2eOpen(t, filepath.Join(dir, "producer.db"), outbox.Config{})
	require.NoError(t, prod.AutoMigrate(&e2eOrder{}))
	cons, _ := e2eOpen(t, filepath.Join(dir, "consumer.db"), outbox.Config{})
	require.NoError(t, cons.AutoMigrate(&e2eEffect{}))
	t.Cleanup(func() { closeDBs(prod, cons) })

	env := []string{e2eDirEnv + "=" + dir, e2eStreamEnv + "=" + stream.CachedInfo().Config.Name, e2ePrefixEnv + "=" + prefix}
	var producer, consumer *e2eChild
	kills := map[string]int{}
	start := time.Now()
	for r := range rounds {
		if producer == nil {
			producer = startE2EChild(t, "producer", env)
		}
		if consumer == nil {
			consumer = startE2EChild(t, "consumer", env)
		}
		wait := time.Duration(200+rng.IntN(800)) * time.Millisecond
		timer := time.NewTimer(wait)
		<-timer.C
		switch rng.IntN(3) {
		case 0:
			producer.kill(t)
			producer = nil
			kills["producer"]++
		case 1:
			consumer.kill(t)
			consumer = nil
			kills["consumer"]++
		default:
			producer.kill(t)
			consumer.kill(t)
			producer, consumer = nil, nil
			kills["both"]++
		}
		t.Logf("round %d: kills so far %v", r+1, kills)
	}
	if producer != nil {
		producer.kill(t)
	}
	// The drain: a producer that only relays, and a consumer, until every
	// committed order has its effect.
	producer = startE2EChild(t, "producer", append(env, e2eWriteEnv+"=0"))
	if consumer == nil {
		consumer = startE2EChild(t, "consumer", env)
	}
	count := func(db *gorm.DB, q string) int64 {
		t.Helper()
		var n int64
		require.NoError(t, db.Raw(q).Scan(&n).Error)
		return n
	}
	committed := count(prod, "SELECT count(*) FROM e2e_orders")
	require.Positive(t, committed, "the producers committed nothing: the test proves nothing")
	deadline := time.Now().Add(90 * time.Second)
	for {
		done := count(cons, "SELECT count(DISTINCT event_id) FROM e2e_effects")
		if done >= committed {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the drain's deadline: %d of %d committed events consumed", done, committed)
		}
		time.Sleep(100 * time.Millisecond) // polling a count with a deadline, not synchronisation
	}
	// Let anything still in flight land, then stop both.
	producer.kill(t)
	consumer.kill(t)

	var orders []string
	require.NoError(t, prod.Model(&e2eOrder{}).Pluck("id", &orders).Error)
	perEvent := map[string]int{}
	var effects []e2eEffect
	require.NoError(t, cons.Find(&effects).Error)
	for _, e := range effects {
		perEvent[e.EventID]++
	}
	var missing, doubled, phantom int
	isOrder := map[string]bool{}
	for _, id := range orders {
		isOrder[id] = true
		switch perEvent[id] {
		case 0:
			missing++
		case 1:
		default:
			doubled++
		}
	}
	for id := range perEvent {
		if !isOrder[id] {
			phantom++
		}
	}
	var onward []struct {
		AggregateID string
		N           int
	}
	require.NoError(t, cons.Raw("SELECT aggregate_id, count(*) AS n FROM outbox_events WHERE event_type = 'invoice.created' GROUP BY aggregate_id").Scan(&onward).Error)
	onwardDoubled := 0
	for _, o := range onward {
		if o.N != 1 {
			onwardDoubled++
		}
	}
	assert.Zero(t, missing, "committed events whose effect is missing")
	assert.Zero(t, doubled, "committed events whose effect was applied more than once")
	assert.Zero(t, phantom, "effects of events no producer committed")
	assert.Len(t, onward, len(orders), "one onward event per consumed event")
	assert.Zero(t, onwardDoubled, "onward events published more than once")
	info, err := stream.Info(t.Context())
	require.NoError(t, err)
	duplicates := int64(info.State.Msgs) - int64(len(orders))
	if duplicates <= 0 {
		t.Log("no duplicate message reached the consumer in this run: it did not exercise the inbox (more rounds do)")
	}
	inbox := count(cons, "SELECT count(*) FROM outbox_inbox")
	assert.EqualValues(t, len(orders), inbox, "one inbox record per event")
	t.Logf("INBOX-E2E-RESULT rounds=%d kills=%v committed=%d duplicate_messages=%d effects=%d missing=%d doubled=%d phantom=%d onward=%d onward_doubled=%d elapsed=%v",
		rounds, kills, len(orders), duplicates, len(effects), missing, doubled, phantom, len(onward), onwardDoubled, time.Since(start).Round(time.Millisecond))
}

// newStreamWindow is newStream with a duplicate window of its own.
func newStreamWindow(t *testing.T, js jetstream.JetStream, window time.Duration) (jetstream.Stream, string) {
	t.Helper()
	s, prefix := newStream(t, js)
	cfg := s.CachedInfo().Config
	cfg.Duplicates = window
	s, err := js.UpdateStream(t.Context(), cfg)
	require.NoError(t, err)
	return s, prefix
}

func closeDBs(dbs ...*gorm.DB) {
	for _, db := range dbs {
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	}
}

type e2eChild struct {
	role string
	cmd  *exec.Cmd
	done chan error
}

func startE2EChild(t *testing.T, role string, env []string) *e2eChild {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run", "^TestInboxEndToEndChild$", "-test.count=1")
	cmd.Env = append(append(os.Environ(), env...), e2eRoleEnv+"="+role)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	require.NoError(t, cmd.Start())
	c := &e2eChild{role: role, cmd: cmd, done: make(chan error, 1)}
	go func() { c.done <- cmd.Wait() }()
	t.Cleanup(func() { c.kill(t) })
	return c
}

func (c *e2eChild) kill(t *testing.T) {
	t.Helper()
	if c.cmd.ProcessState != nil {
		return
	}
	_ = c.cmd.Process.Signal(syscall.SIGKILL)
	select {
	case <-c.done:
	case <-time.After(10 * time.Second):
		t.Errorf("the %s child did not exit after SIGKILL", c.role)
	}
}

// TestInboxEndToEndChild is a producer or a consumer of TestInboxEndToEnd,
// running until it is killed.
func TestInboxEndToEndChild(t *testing.T) {
	role := os.Getenv(e2eRoleEnv)
	if role == "" {
		t.Skip("run by TestInboxEndToEnd")
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
	dir := os.Getenv(e2eDirEnv)
	switch role {
	case "producer":
		db, ob := e2eOpen(t, filepath.Join(dir, "producer.db"), outbox.Config{})
		pub, err := outboxnats.New(js, outboxnats.Config{SubjectPrefix: os.Getenv(e2ePrefixEnv) + "."})
		require.NoError(t, err)
		ob.HandleAsync("order.created", pub.AsyncHandler())
		relay, err := ob.Relay(db, outbox.RelayConfig{Lease: e2eLease, PollInterval: 100 * time.Millisecond})
		require.NoError(t, err)
		go func() { _ = relay.Run(ctx) }()
		if os.Getenv(e2eWriteEnv) == "0" {
			<-ctx.Done()
			return
		}
		base := randomName()
		for i := 0; ctx.Err() == nil; i++ {
			id := base + "-" + strconv.Itoa(i)
			err := db.Transaction(func(tx *gorm.DB) error {
				if err := tx.Create(&e2eOrder{ID: id}).Error; err != nil {
					return err
				}
				return outbox.Publish(tx, outbox.Event{ID: id, Type: "order.created", Payload: map[string]string{"order": id}})
			})
			if err != nil {
				fmt.Fprintln(os.Stderr, "producer:", err)
			}
		}
	case "consumer":
		db, _ := e2eOpen(t, filepath.Join(dir, "consumer.db"), outbox.Config{})
		c, err := outboxnats.NewConsumer(db, js, outboxnats.ConsumerConfig{
			Consumer: "billing",
			Stream:   os.Getenv(e2eStreamEnv),
			Durable:  "billing",
			AckWait:  e2eAckWait,
			Handle: func(ctx context.Context, tx *gorm.DB, m outboxnats.Message) error {
				if err := tx.Create(&e2eEffect{EventID: m.Event.ID}).Error; err != nil {
					return err
				}
				// No idempotency key: only the inbox keeps this onward event
				// single.
				return outbox.Publish(tx, outbox.Event{Type: "invoice.created", AggregateType: "order", AggregateID: m.Event.ID,
					Payload: map[string]string{"order": m.Event.ID}})
			},
		})
		require.NoError(t, err)
		require.NoError(t, c.Run(ctx))
	default:
		t.Fatalf("unknown role %q", role)
	}
}
