package reliability

import (
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"testing"
	"time"

	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/gorm-outbox/outbox"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

const (
	inboxRoundsEnv = "OUTBOX_INBOX_CRASH_ROUNDS" // rounds of the parent; default 10
	inboxSeedEnv   = "OUTBOX_INBOX_CRASH_SEED"   // seed of the kill moments; default random
	inboxMultiEnv  = "OUTBOX_INBOX_CRASH_MULTI"  // "1": the child's MySQL DSN has multiStatements

	// inboxWindow is how many messages a child delivers: round r's are
	// those from r*inboxWindow/2 on, half of them its predecessor's again
	// (redeliveries of what it consumed, or not yet, when it was killed),
	// half new. Each consumer goroutine of a child delivers every one of
	// them, in an order of its own.
	inboxWindow    = 400
	inboxConsumers = 3
	inboxConsumer  = "billing"
)

var errInboxHandler = errors.New("the handler fails on purpose")

// TestInboxCrash SIGKILLs consumer processes (this test binary re-executed)
// at random moments, round after round, on each server. Each child runs
// three goroutines that each deliver every message of its round's window
// (half of them its predecessor's again), in an order of their own, through
// Consume: a business row (the effect) and an onward event per
// message, and every seventh delivery failing after its effect. Duplicates
// therefore arrive concurrently, and kills land inside Consume's
// transactions, between their commit and the next message, and on
// connections Consume holds out of the pool (where its INSERT travels with
// the BEGIN: PostgreSQL through pgx; MySQL in the rounds whose DSN has
// multiStatements, every other one). A last child runs to completion. Then
// every message's effect must exist exactly once, its inbox record once,
// and its onward event once.
func TestInboxCrash(t *testing.T) {
	long(t, "SIGKILLs consumers in child processes, round after round")
	t.Parallel()
	forEachServer(t, testInboxCrash)
}

func testInboxCrash(t *testing.T, s server) {
	dsn := s.fresh(t)
	rounds, rng := killPlan(t, "inbox crash test", s, inboxRoundsEnv, 10, inboxSeedEnv)

	db := openGorm(t, s.open(dsn))
	ob := install(t, db, outbox.Config{Logger: newLogSink().logger()})
	require.NoError(t, db.Exec(`CREATE TABLE inbox_effects (message_id varchar(64) NOT NULL, round integer NOT NULL)`).Error)

	start := time.Now()
	for r := range rounds {
		child := startInboxChild(t, s, db, dsn, r, false)
		child.waitRunning(t, s, db)
		waitKillMoment(time.Duration(50+rng.IntN(400)) * time.Millisecond)
		child.killAndWaitGone(t, s, db)
	}
	killed := time.Since(start)
	// The last child delivers every message once more and exits.
	last := startInboxChild(t, s, db, dsn, rounds, true)
	last.waitExit(t, 10*time.Minute)
	messages := inboxTotal(rounds)

	q := func(query string) int64 {
		t.Helper()
		var n int64
		require.NoError(t, db.Raw(query).Scan(&n).Error)
		return n
	}
	effects := q(`SELECT count(*) FROM inbox_effects`)
	assert.EqualValues(t, messages, q(`SELECT count(DISTINCT message_id) FROM inbox_effects`), "messages whose effect exists")
	assert.Zero(t, q(`SELECT count(*) FROM (SELECT message_id FROM inbox_effects GROUP BY message_id HAVING count(*) > 1) x`),
		"messages whose effect was committed more than once")
	assert.EqualValues(t, messages, q(`SELECT count(*) FROM `+outbox.DefaultInboxTable+` WHERE consumer = '`+inboxConsumer+`'`), "inbox records")
	onward := q(`SELECT count(*) FROM ` + ob.Table() + ` WHERE event_type = 'invoice.created'`)
	assert.EqualValues(t, messages, onward, "onward events")
	assert.EqualValues(t, messages, q(`SELECT count(DISTINCT aggregate_id) FROM `+ob.Table()+` WHERE event_type = 'invoice.created'`),
		"messages with an onward event")
	killedRounds := q(`SELECT count(DISTINCT round) FROM inbox_effects WHERE round < ` + strconv.Itoa(rounds))
	toLast := q(`SELECT count(*) FROM inbox_effects WHERE round = ` + strconv.Itoa(rounds))
	t.Logf("INBOX-CRASH-RESULT server=%s rounds=%d rounds_that_committed_effects=%d messages=%d consumed_by_the_last_child=%d effects=%d onward=%d kill_phase=%v total=%v",
		s.name, rounds, killedRounds, messages, toLast, effects, onward, killed.Round(time.Millisecond), time.Since(start).Round(time.Millisecond))
}

func startInboxChild(t *testing.T, s server, db *gorm.DB, dsn string, round int, last bool) *crashChild {
	t.Helper()
	tag := fmt.Sprintf("outbox-inbox-%s-%d", randomHex(4), round)
	cmd := exec.Command(os.Args[0], "-test.run=^TestInboxCrashChild$", "-test.count=1", childTimeout(t))
	multi := "0"
	if round%2 == 1 {
		multi = "1"
	}
	lastRun := "0"
	if last {
		lastRun = "1"
	}
	cmd.Env = append(os.Environ(),
		childRoleEnv+"=inbox", crashServerEnv+"="+s.name, crashDSNEnv+"="+s.tagged(t, db, dsn, tag),
		crashRoundEnv+"="+strconv.Itoa(round), inboxMultiEnv+"="+multi, "OUTBOX_INBOX_CRASH_LAST="+lastRun,
		"GORACE=halt_on_error=1")
	return startChild(t, cmd, tag)
}

// waitExit waits for a child that ends on its own, and fails the test if
// it failed.
func (c *crashChild) waitExit(t *testing.T, timeout time.Duration) {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- c.cmd.Wait() }()
	select {
	case err := <-done:
		_ = c.stdin.Close()
		require.NoError(t, err, "the last child failed:\n%s", c.output())
	case <-time.After(bound(t, timeout)):
		_ = c.cmd.Process.Kill()
		t.Fatalf("the last child did not finish in %v:\n%s", timeout, c.output())
	}
}

// TestInboxCrashChild is the child process of TestInboxCrash.
func TestInboxCrashChild(t *testing.T) {
	if os.Getenv(childRoleEnv) != "inbox" {
		t.Skip("helper process of TestInboxCrash; runs only when re-executed by it")
	}
	// The last child runs to its end, however its parent's stdin goes.
	last := os.Getenv("OUTBOX_INBOX_CRASH_LAST") == "1"
	fail, round, s := startedChild("inbox child", !last)
	dsn := os.Getenv(crashDSNEnv)
	if s.name == "mysql" && os.Getenv(inboxMultiEnv) == "1" {
		cfg, err := mysqldriver.ParseDSN(dsn)
		if err != nil {
			fail("dsn: %v", err)
		}
		cfg.MultiStatements = true
		dsn = cfg.FormatDSN()
	}
	db, err := gorm.Open(s.open(dsn), &gorm.Config{Logger: logger.Discard})
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
	errs := make(chan error, inboxConsumers)
	for c := range inboxConsumers {
		go func() {
			first, n := round*inboxWindow/2, inboxWindow
			if last {
				first, n = 0, inboxTotal(round)
			}
			rng := rand.New(rand.NewPCG(uint64(round), uint64(c)))
			for i, m := range rng.Perm(n) {
				id := "m-" + strconv.Itoa(first+m)
				failing := !last && (i+c)%7 == 3
				if err := consumeInboxCrash(db, id, round, failing); err != nil {
					errs <- fmt.Errorf("consumer %d, message %s: %w", c, id, err)
					return
				}
			}
			errs <- nil
		}()
	}
	fmt.Println("ready")
	for range inboxConsumers {
		if err := <-errs; err != nil {
			fail("%v", err)
		}
	}
	if !last {
		select {} // killed by the parent
	}
	// Done: exit as the killed children do, without TestMain's leak check
	// (the outbox's background goroutines outlive the consumers by design).
	os.Exit(0)
}

// inboxTotal is how many messages the children of rounds rounds deliver.
func inboxTotal(rounds int) int { return (rounds + 1) * inboxWindow / 2 }

// consumeInboxCrash delivers message id once through Consume: a business
// row and an onward event, failing after both when failing. No other error
// is expected: the deadlocks of concurrent deliveries on MySQL are
// Consume's to retry.
func consumeInboxCrash(db *gorm.DB, id string, round int, failing bool) error {
	err := outbox.Consume(db, inboxConsumer, id, func(tx *gorm.DB) error {
		if err := tx.Exec(`INSERT INTO inbox_effects (message_id, round) VALUES (?, ?)`, id, round).Error; err != nil {
			return err
		}
		if err := outbox.Publish(tx, outbox.Event{Type: "invoice.created", AggregateType: "message", AggregateID: id,
			Payload: map[string]any{"round": round}}); err != nil {
			return err
		}
		if failing {
			return errInboxHandler
		}
		return nil
	})
	if failing && errors.Is(err, errInboxHandler) {
		return nil
	}
	return err
}
