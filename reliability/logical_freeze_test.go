//go:build linux

package reliability

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/gorm-outbox/outbox"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
)

// A relay frozen (SIGSTOP) for longer than wal_sender_timeout: the server
// ends its walsender, a standby takes the slot over and delivers what the
// frozen relay had not confirmed. When the frozen relay resumes (SIGCONT),
// its socket still holds what the server streamed to it before giving it
// up; it must deliver none of it.

const (
	freezeSecondsEnv = "OUTBOX_FREEZE_SECONDS" // how long each freeze lasts; default 9
	freezeRoundsEnv  = "OUTBOX_FREEZE_ROUNDS"  // freezes, of the relay streaming at the time; default 1

	// freezeWalSenderTimeout is wal_sender_timeout, set by the relay on its
	// replication connection: the server ends the frozen relay's walsender
	// once it has heard nothing from it for that long.
	freezeWalSenderTimeout = 5 * time.Second

	freezeAggregates = 8 // the writer's events belong to this many aggregates, round robin

	// freezeLease is the relays' lease, and so their statement timeout
	// (10 s, the default, below it) and their handlers' budget (12 s).
	// The other Logical tests' 1.5 s (logicalLease, longer under load) lets the leases of a
	// killed relay pass quickly; this test kills no relay, and on a
	// loaded machine (load 38-55 on 2 cores) a handler's INSERT, a
	// connection or the statement that records a delivery takes longer
	// than 1.5 s: the row's lease passed before its delivery was
	// recorded, and the event was delivered again, as at least once
	// allows, by the other relay 11 to 88 times a run, which the stale
	// check cannot tell from a frozen relay's deliveries (none with this
	// lease, at the same load). It stays well below the waits' stall
	// bounds (30 s and more), which a stale session's leased rows,
	// claimed from the table once it passes, must not reach.
	freezeLease = 15 * time.Second

	// staleLog is what a relay logs when it gives up a stream the server
	// may have ended.
	staleLog = "the replication session may be over on the server's side"
)

// lfPayload is an event of the freeze test: k is its index among its
// aggregate's events, in commit order.
type lfPayload struct {
	Order string `json:"order"`
	Agg   string `json:"agg"`
	K     int    `json:"k"`
}

// The freeze test's deliveries carry the event's aggregate and index, and
// when the handler began, on CLOCK_MONOTONIC (one clock for every process
// of the machine).
var freezeDDL = []string{
	`ALTER TABLE lg_deliveries ADD COLUMN agg text, ADD COLUMN k integer, ADD COLUMN at_ns bigint`,
}

// monoNow reads CLOCK_MONOTONIC, which the test and its children share.
func monoNow() int64 {
	var ts syscall.Timespec
	if _, _, errno := syscall.Syscall(syscall.SYS_CLOCK_GETTIME, 1 /* CLOCK_MONOTONIC */, uintptr(unsafe.Pointer(&ts)), 0); errno != 0 {
		panic(errno)
	}
	return ts.Nano()
}

// lfWriter commits one event per transaction in a loop, each of an
// aggregate in turn (every fifth transaction rolled back on purpose, every
// third event with an explicit ID), until stop. pause waits for the
// transaction in progress and holds the writer until resume.
type lfWriter struct {
	mu     sync.Mutex // held by the writer around each transaction, and by pause
	stop   func() (committed int)
	paused bool
}

func (w *lfWriter) pause()  { w.mu.Lock(); w.paused = true }
func (w *lfWriter) resume() { w.paused = false; w.mu.Unlock() }

func startLfWriter(t *testing.T, db *gorm.DB) *lfWriter {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	errs := make(chan error, 1)
	w := &lfWriter{}
	go func() {
		committed := 0
		defer func() { done <- committed }()
		next := map[string]int{} // the next k of each aggregate
		for seq := 0; ctx.Err() == nil; seq++ {
			agg := fmt.Sprintf("a%d", seq%freezeAggregates)
			id := fmt.Sprintf("f-%06d", seq)
			rollback := seq%5 == 4
			if rollback {
				id = "rb-" + id
			}
			p := lfPayload{Order: id, Agg: agg, K: next[agg]}
			ev := outbox.Event{Type: "order.created", AggregateType: "acct", AggregateID: agg, Payload: p}
			if seq%3 == 1 {
				ev.ID = "x:" + id
			}
			w.mu.Lock()
			err := db.Transaction(func(tx *gorm.DB) error {
				if err := tx.Exec(`INSERT INTO lg_orders (id, events, round) VALUES (?, 1, 0)`, id).Error; err != nil {
					return err
				}
				if err := outbox.Publish(tx, ev); err != nil {
					return err
				}
				if rollback {
					return errRollback
				}
				return nil
			})
			w.mu.Unlock()
			switch {
			case rollback && errors.Is(err, errRollback):
			case err != nil:
				errs <- err
				return
			default:
				committed++
				next[agg]++
				sleepOrDone(ctx, 2*time.Millisecond)
			}
		}
	}()
	var stopped bool
	w.stop = func() int {
		if stopped {
			return 0
		}
		stopped = true
		cancel()
		n := <-done
		select {
		case err := <-errs:
			t.Errorf("writer: %v", err)
		default:
		}
		return n
	}
	t.Cleanup(func() {
		if w.paused {
			w.resume()
		}
		w.stop()
	})
	return w
}

// maxFreezeTakeover bounds the time from the SIGSTOP of the active relay to
// the standby's first delivery: wal_sender_timeout, then the standby's
// retries (every 0.5-1 s), its connection and its first batch, 5 s on an
// idle machine, scaled by the machine's slowdown, but below the 60 s of
// the cluster's default wal_sender_timeout, which the bound is there to
// catch (RELIABILITY.md).
func maxFreezeTakeover() time.Duration {
	return min(freezeWalSenderTimeout+scaled(5*time.Second), 50*time.Second)
}

// processState reads the state letter of /proc/<pid>/stat: T once a
// SIGSTOP has taken effect.
func processState(pid int) (string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return "", err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')') // the command name may hold spaces
	if i < 0 || i+2 >= len(s) {
		return "", fmt.Errorf("unexpected /proc/%d/stat: %q", pid, s)
	}
	return s[i+2 : i+3], nil
}

// TestLogicalFrozenRelayDeliversNothingStale runs two relays in child
// processes on one slot (the first streams it, the second stands by), with
// OrderByAggregate, under a steady writer whose events belong to a few
// aggregates. Each round (OUTBOX_FREEZE_ROUNDS, default 1):
//
//   - the writer pauses until the relays have delivered and the slot
//     confirmed everything, so that nothing is in flight when it freezes;
//   - the relay streaming the slot at that moment (the first, unless a
//     session was given up under load and the other took the slot) is
//     SIGSTOPped for OUTBOX_FREEZE_SECONDS (default 9;
//     at least until the standby has delivered what the server had
//     streamed to the frozen relay), and the writer resumes: the server
//     streams new transactions into the frozen relay's socket until it
//     gives the walsender up;
//   - the standby must take over: its first delivery within
//     maxFreezeTakeover of the SIGSTOP (measured, polled every 20 ms);
//   - the frozen relay gets SIGCONT and must give the stream up and stand
//     by, delivering nothing of what it finds buffered.
//
// Every delivery is recorded with the relay that made it, the event's
// aggregate and index, and when the handler began (CLOCK_MONOTONIC). At the
// end: 0 lost, 0 phantom, no delivery of an event that the other relay had
// delivered before (the stale deliveries of issue 19), and no delivery of
// an event after a later event of its aggregate. The freeze comes between
// batches on purpose: a handler that a freeze interrupts finishes its
// delivery on resuming, which no relay can call back.
//
// On a loaded machine the writer commits faster than a relay delivers, so
// the backlogs it leaves (at the pause, while the standby works through
// what the frozen relay had been sent, and when it stops) take a time of
// the machine's: on 2 cores at load 12-24, up to 3,800 events were still
// in the slot when the writer stopped, all delivered 19 to 77 s later,
// never more than 0.35 s without progress (issue 37: "857 of 8086
// committed events not delivered" within the fixed minute this wait had).
// The waits for a backlog fail only when it stops going down
// (waitDrained), not because it goes down slowly; what they wait for is
// unchanged.
//
// Before the fix the cluster's default wal_sender_timeout (60 s) applied
// and the standby did not take over within the bound; with the cluster's
// at 5 s, the resumed relay delivered 9 to 11 events the standby had
// delivered (RELIABILITY.md).
func TestLogicalFrozenRelayDeliversNothingStale(t *testing.T) {
	long(t, "a cluster of its own, a relay process frozen under load")
	t.Parallel()
	_, dsn := logicalCluster(t)
	db := openGorm(t, postgres.Open(dsn))
	ob := install(t, db, logicalConfig(newLogSink().logger()))
	for _, stmt := range append(append([]string{}, logicalDDL...), freezeDDL...) {
		require.NoError(t, db.Exec(stmt).Error)
	}
	freeze := time.Duration(envInt(t, freezeSecondsEnv, 9)) * time.Second
	rounds := envInt(t, freezeRoundsEnv, 1)

	relays := make([]*crashChild, 2)
	for i := range relays {
		tag := fmt.Sprintf("outbox-lfreeze-%s-%d", randomHex(4), i)
		relays[i] = startLogicalChild(t, tag, "TestLogicalFreezeRelayChild", childRoleEnv+"=logical-freeze",
			logicalDSNEnv+"="+withParam(t, dsn, "application_name", tag), logicalRoundEnv+"="+strconv.Itoa(i))
		relays[i].waitReady(t)
		if i == 0 {
			eventually(t, 30*time.Second, func() error {
				if h := slotHolder(t, db); h != tag {
					return fmt.Errorf("the slot is streamed by %q, not by %s", h, tag)
				}
				return nil
			})
		}
	}
	t.Cleanup(func() {
		for _, c := range relays {
			if c.cmd.ProcessState == nil {
				_ = c.cmd.Process.Signal(syscall.SIGCONT)
			}
		}
		if t.Failed() {
			for _, c := range relays {
				t.Logf("relay %s:\n%s", c.tag, c.output())
			}
		}
	})
	q := func(query string, args ...any) int64 {
		t.Helper()
		var n int64
		require.NoError(t, db.Raw(query, args...).Scan(&n).Error)
		return n
	}
	delivered := func(round int, atLeast int64) func() error {
		return func() error {
			var n int64
			err := db.Raw(`SELECT count(*) FROM lg_deliveries WHERE round = ?`, round).Scan(&n).Error
			if err == nil && n < atLeast {
				err = fmt.Errorf("relay %d delivered %d events, waiting for %d", round, n, atLeast)
			}
			return err
		}
	}
	// waitDelivered waits until relay round has delivered atLeast events,
	// for as long as it keeps delivering.
	waitDelivered := func(round int, atLeast int64) {
		t.Helper()
		waitDrained(t, 30*time.Second, func() (int64, error) {
			var n int64
			if err := db.Raw(`SELECT count(*) FROM lg_deliveries WHERE round = ?`, round).Scan(&n).Error; err != nil {
				return -1, err
			}
			if n < atLeast {
				return atLeast - n, fmt.Errorf("relay %d delivered %d events, waiting for %d", round, n, atLeast)
			}
			return 0, nil
		})
	}
	// unconfirmed is how many bytes of the WAL before lsn the slot has
	// not confirmed (0 once it has).
	unconfirmed := func(lsn string) (int64, error) {
		var n int64
		err := db.Raw(`SELECT GREATEST(?::pg_lsn - confirmed_flush_lsn, 0)::bigint FROM pg_replication_slots WHERE slot_name = ?`, lsn, logicalSlot).Scan(&n).Error
		return n, err
	}
	standingBy := func(c *crashChild, times int) func() error {
		return func() error {
			if n := strings.Count(c.output(), standbyLog); n < times {
				return fmt.Errorf("relay %s has found the slot busy %d times, waiting for %d", c.tag, n, times)
			}
			return nil
		}
	}
	eventually(t, 30*time.Second, standingBy(relays[1], 1))

	w := startLfWriter(t, db)
	waitDelivered(0, 50)
	type roundResult struct {
		takeover, frozen time.Duration
		buffered         int64 // bytes the server streamed to the frozen relay past what it had confirmed
	}
	var results []roundResult
	var stoppedAt, resumedAt []int64 // CLOCK_MONOTONIC of each SIGSTOP and SIGCONT
	var frozenIdx []int              // the relay each round froze
	for r := range rounds {
		// Quiesce: everything committed delivered, no row left in flight,
		// the slot confirmed past it. What is left (undelivered events,
		// pending rows, bytes the slot has not confirmed) only goes down
		// while the writer is paused, at the pace of the machine.
		w.pause()
		var lsn string
		require.NoError(t, db.Raw(`SELECT pg_current_wal_lsn()::text`).Scan(&lsn).Error)
		waitDrained(t, 30*time.Second, func() (int64, error) {
			c, err := readLgCounts(t, db)
			if err != nil {
				return -1, err
			}
			var pending int64
			if err := db.Raw(`SELECT count(*) FROM `+ob.Table()+` WHERE status = ?`, outbox.StatusPending).Scan(&pending).Error; err != nil {
				return -1, err
			}
			behind, err := unconfirmed(lsn)
			if err != nil {
				return -1, err
			}
			if left := c.lost + pending + behind; left > 0 {
				return left, fmt.Errorf("%d events not yet delivered, %d rows pending, the slot %d bytes short of %s", c.lost, pending, behind, lsn)
			}
			return 0, nil
		})
		var confirmedAt string
		require.NoError(t, db.Raw(`SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = ?`, logicalSlot).Scan(&confirmedAt).Error)

		// Freeze the relay streaming the slot now. Under load, a relay
		// starved past half its wal_sender_timeout gives its session up and
		// the other may take the slot: the relay the round freezes is the
		// one the server streams to, looked at again once it is stopped
		// (its walsender keeps the slot for wal_sender_timeout after the
		// stop, so another holder then means the slot changed hands first).
		var (
			active, standby *crashChild
			standbyRound    int
			frozenAt        time.Time
		)
		for attempt := 1; ; attempt++ {
			var holder string
			eventually(t, 30*time.Second, func() error {
				if holder = slotHolder(t, db); holder != relays[0].tag && holder != relays[1].tag {
					return fmt.Errorf("the slot is streamed by %q, neither relay", holder)
				}
				return nil
			})
			ai := 0
			if holder == relays[1].tag {
				ai = 1
			}
			active, standby, standbyRound = relays[ai], relays[1-ai], 1-ai
			frozenAt = time.Now()
			stopped := monoNow()
			require.NoError(t, active.cmd.Process.Signal(syscall.SIGSTOP))
			eventually(t, 10*time.Second, func() error {
				st, err := processState(active.cmd.Process.Pid)
				if err == nil && st != "T" {
					err = fmt.Errorf("relay %s is in state %s, not stopped", active.tag, st)
				}
				return err
			})
			if slotHolder(t, db) == active.tag {
				stoppedAt, frozenIdx = append(stoppedAt, stopped), append(frozenIdx, ai)
				break
			}
			require.Less(t, attempt, 5, "round %d: the slot changed hands at every freeze", r)
			t.Logf("round %d: the slot left relay %s as it was frozen; thawing it and freezing the relay streaming now", r, active.tag)
			require.NoError(t, active.cmd.Process.Signal(syscall.SIGCONT))
		}
		before := q(`SELECT count(*) FROM lg_deliveries WHERE round = ?`, standbyRound)
		w.resume()

		// Until the standby delivers: follow what the server streams to the
		// frozen relay's walsender, until it ends.
		var res roundResult
		var sent string
		takeoverBound := maxFreezeTakeover()
		eventually(t, takeoverBound+5*time.Second, func() error {
			var s []string
			if err := db.Raw(`SELECT sent_lsn::text FROM pg_stat_replication WHERE application_name = ? AND sent_lsn IS NOT NULL`, active.tag).Scan(&s).Error; err != nil {
				return err
			}
			if len(s) > 0 {
				sent = s[0]
			}
			return delivered(standbyRound, before+1)()
		})
		res.takeover = time.Since(frozenAt)
		assert.Less(t, res.takeover, takeoverBound, "round %d: the standby took %v to deliver after the active relay froze", r, res.takeover)
		require.NotEmpty(t, sent, "round %d: never saw the frozen relay's walsender", r)
		require.NoError(t, db.Raw(`SELECT ?::pg_lsn - ?::pg_lsn`, sent, confirmedAt).Scan(&res.buffered).Error)
		// The standby delivers what the server had streamed to the frozen
		// relay before the frozen relay resumes: the slot's confirmed
		// position moves towards sent as it does (the writer committing
		// meanwhile, on a loaded machine, faster than a relay delivers).
		waitDrained(t, 30*time.Second, func() (int64, error) {
			behind, err := unconfirmed(sent)
			if err == nil && behind > 0 {
				err = fmt.Errorf("the standby has not yet confirmed up to %s: %d bytes short", sent, behind)
			}
			return behind, err
		})
		if rest := time.Until(frozenAt.Add(freeze)); rest > 0 {
			time.Sleep(rest) // the freeze itself: nothing to wait for
		}
		res.frozen = time.Since(frozenAt)
		standbys := strings.Count(active.output(), standbyLog) // before it can log another
		resumedAt = append(resumedAt, monoNow())
		require.NoError(t, active.cmd.Process.Signal(syscall.SIGCONT))
		// It gives the stream up and stands by.
		eventually(t, 30*time.Second, standingBy(active, standbys+1))
		assert.Contains(t, active.output(), staleLog, "round %d: the resumed relay gave the stream up, but not for its staleness", r)
		assert.Equal(t, standby.tag, slotHolder(t, db), "round %d: the standby streams the slot", r)
		waitDelivered(standbyRound, before+50)
		results = append(results, res)
	}
	committed := w.stop()
	require.Positive(t, committed)
	drainStart := time.Now()
	c := waitAllDelivered(t, db, 60*time.Second)
	drained := time.Since(drainStart)
	assert.Zero(t, c.lost, "committed events never delivered")
	assert.Zero(t, c.phantom, "events delivered whose transaction did not commit")

	// Stale: delivered by a relay after the other relay had delivered it.
	stale := q(`SELECT count(*) FROM lg_deliveries d WHERE EXISTS (SELECT 1 FROM lg_deliveries e
		WHERE e.order_id = d.order_id AND e.n = d.n AND e.round <> d.round AND e.seq < d.seq)`)
	// Out of order: delivered after a later event of its aggregate.
	outOfOrder := q(`SELECT count(*) FROM lg_deliveries d WHERE EXISTS (SELECT 1 FROM lg_deliveries e
		WHERE e.agg = d.agg AND e.k > d.k AND e.seq < d.seq)`)
	// Delivered by a resumed relay before it streamed again (when the
	// other froze, in the next round).
	var afterResume int64
	for r, at := range resumedAt {
		until := int64(math.MaxInt64)
		if r+1 < len(stoppedAt) {
			until = stoppedAt[r+1]
		}
		afterResume += q(`SELECT count(*) FROM lg_deliveries WHERE round = ? AND at_ns > ? AND at_ns < ?`, frozenIdx[r], at, until)
	}
	assert.Zero(t, stale, "deliveries of an event the other relay had already delivered")
	assert.Zero(t, outOfOrder, "deliveries after a later event of the same aggregate")
	if stale > 0 || outOfOrder > 0 {
		// The deliveries of the events concerned, in the order the
		// deliveries table took them: which relay, when its handler began
		// (CLOCK_MONOTONIC) and when its INSERT ran. Redeliveries after a
		// lease passed come with the relays' logs of statements that timed
		// out; a frozen relay's come right after its SIGCONT.
		var rows []struct {
			Seq         int64
			Round       int
			EventID     string
			Agg         string
			K           int
			AtNs        int64
			DeliveredAt time.Time
		}
		require.NoError(t, db.Raw(`SELECT seq, round, event_id, agg, k, at_ns, delivered_at FROM lg_deliveries d
			WHERE (order_id, n) IN (SELECT order_id, n FROM lg_deliveries GROUP BY 1, 2 HAVING count(DISTINCT round) > 1)
			OR EXISTS (SELECT 1 FROM lg_deliveries e WHERE e.agg = d.agg AND (e.k > d.k AND e.seq < d.seq OR e.k < d.k AND e.seq > d.seq))
			ORDER BY agg, seq LIMIT 60`).Scan(&rows).Error)
		for _, d := range rows {
			t.Logf("delivery seq=%d relay=%d event=%s agg=%s k=%d handler_began=%d inserted=%s", d.Seq, d.Round, d.EventID, d.Agg, d.K, d.AtNs, d.DeliveredAt.Format("15:04:05.000"))
		}
	}

	var takeovers, frozen []time.Duration
	var buffered []int64
	for _, r := range results {
		takeovers = append(takeovers, r.takeover.Round(time.Millisecond))
		frozen = append(frozen, r.frozen.Round(time.Millisecond))
		buffered = append(buffered, r.buffered)
	}
	t.Logf("LOGICAL-FREEZE-RESULT rounds=%d frozen=%v takeover=%v (bound %v) streamed_to_frozen_bytes=%v committed_txns=%d events=%d delivered=%d lost=%d phantom=%d duplicated=%d stale=%d out_of_order=%d by_resumed_relay_after_sigcont=%d drained_after_writer=%v slowdown=%.1f",
		rounds, frozen, takeovers, maxFreezeTakeover(), buffered, c.orders, c.events, c.distinct, c.lost, c.phantom,
		c.deliveries-c.distinct, stale, outOfOrder, afterResume, drained.Round(time.Millisecond), slowdown())
	for _, r := range relays {
		r.kill(t)
	}
}

// TestLogicalFreezeRelayChild is a relay child of
// TestLogicalFrozenRelayDeliversNothingStale: a relay in Logical mode with
// OrderByAggregate whose handler records each delivery under its index,
// with the event's aggregate and when the handler began. It runs until it
// is killed, or until its parent goes away.
func TestLogicalFreezeRelayChild(t *testing.T) {
	if os.Getenv(childRoleEnv) != "logical-freeze" {
		t.Skip("helper process of TestLogicalFrozenRelayDeliversNothingStale; runs only when re-executed by it")
	}
	db, ob, index, fail := logicalChild()
	ob.Handle("order.created", func(ctx context.Context, e outbox.Event) error {
		at := monoNow()
		raw, ok := e.Payload.(json.RawMessage)
		if !ok {
			return outbox.Permanent(fmt.Errorf("payload is %T", e.Payload))
		}
		var p lfPayload
		if err := json.Unmarshal(raw, &p); err != nil || p.Order == "" {
			return outbox.Permanent(fmt.Errorf("payload %s: %v", raw, err))
		}
		return db.WithContext(ctx).Exec(`INSERT INTO lg_deliveries (order_id, n, event_id, round, agg, k, at_ns) VALUES (?, 0, ?, ?, ?, ?, ?)`,
			p.Order, e.ID, index, p.Agg, p.K, at).Error
	})
	cfg := logicalRelayConfig()
	cfg.OrderByAggregate = true
	cfg.Lease = freezeLease
	relay, err := ob.Relay(db, cfg)
	if err != nil {
		fail("relay: %v", err)
	}
	go func() {
		if err := relay.Run(context.Background()); err != nil {
			fail("relay: %v", err)
		}
	}()
	fmt.Println("ready")
	select {}
}
