package reliability

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
)

// standbyLog is what a relay logs when it finds the slot streamed by another.
const standbyLog = "another relay streams the slot; standing by"

// maxTakeover bounds how long a standby takes to stream the slot after the
// active relay is SIGKILLed: PostgreSQL ends the dead relay's walsender when
// its connection drops, and a standby retries every 0.5–1 s.
const maxTakeover = 5 * time.Second

// lgWriter commits orders in a loop (every fifth rolled back on purpose)
// until stop is called, which returns how many it committed.
type lgWriter struct {
	stop func() (committed int)
}

func startLgWriter(t *testing.T, db *gorm.DB, prefix string, tolerateErrors bool) *lgWriter {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	errs := make(chan error, 1)
	go func() {
		committed := 0
		defer func() { done <- committed }()
		for seq := 0; ctx.Err() == nil; seq++ {
			id := fmt.Sprintf("%s-%06d", prefix, seq)
			rollback := seq%5 == 4
			if rollback {
				id = "rb-" + id
			}
			err := writeOrder(db, id, seq, 0, rollback)
			switch {
			case err != nil && tolerateErrors:
				// The server is down: try again shortly (an outcome of
				// COMMIT lost with the connection is settled by lg_orders,
				// which the checks read).
				sleepOrDone(ctx, 20*time.Millisecond)
			case err != nil:
				errs <- err
				return
			case !rollback:
				committed++
				sleepOrDone(ctx, 2*time.Millisecond) // a steady writer, not a flood
			}
		}
	}()
	var stopped bool
	w := &lgWriter{}
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
	t.Cleanup(func() { w.stop() })
	return w
}

func sleepOrDone(ctx context.Context, d time.Duration) {
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-ctx.Done():
	case <-timer.C:
	}
}

// lgCounts reads the figures every Logical test checks: committed orders,
// their events, those never delivered, deliveries for transactions that did
// not commit, and deliveries in all.
type lgCounts struct {
	orders, events, lost, phantom, deliveries, distinct int64
}

func readLgCounts(t testing.TB, db *gorm.DB) (c lgCounts, err error) {
	t.Helper()
	err = db.Raw(`SELECT
		(SELECT count(*) FROM lg_orders),
		(SELECT COALESCE(sum(events), 0) FROM lg_orders),
		(SELECT count(*) FROM lg_orders o, generate_series(0, o.events - 1) AS g(i)
			WHERE NOT EXISTS (SELECT 1 FROM lg_deliveries d WHERE d.order_id = o.id AND d.n = g.i)),
		(SELECT count(*) FROM lg_deliveries d WHERE NOT EXISTS (SELECT 1 FROM lg_orders o WHERE o.id = d.order_id AND d.n < o.events)),
		(SELECT count(*) FROM lg_deliveries),
		(SELECT count(DISTINCT (order_id, n)) FROM lg_deliveries)`).Row().
		Scan(&c.orders, &c.events, &c.lost, &c.phantom, &c.deliveries, &c.distinct)
	return c, err
}

// waitAllDelivered waits until every event of every committed order has
// been delivered, failing when the count of those not yet delivered has
// not gone down for stall (scaled by the machine's slowdown): a backlog a
// slow machine drains slowly is waited for, one that does not drain fails.
func waitAllDelivered(t *testing.T, db *gorm.DB, stall time.Duration) lgCounts {
	t.Helper()
	var c lgCounts
	waitDrained(t, stall, func() (int64, error) {
		var err error
		if c, err = readLgCounts(t, db); err != nil {
			return -1, err
		}
		if c.lost > 0 {
			return c.lost, fmt.Errorf("%d of %d committed events not delivered", c.lost, c.events)
		}
		return 0, nil
	})
	assert.Equal(t, c.events, c.distinct+c.phantom, "the two counts of events delivered disagree")
	return c
}

// streamedIn counts the events with a generated ID relay round delivered:
// only the stream delivers those (an explicit-ID event may come from the
// table, after the lease of a dead relay's row).
func streamedIn(t testing.TB, db *gorm.DB, round int) (n int64, err error) {
	t.Helper()
	err = db.Raw(`SELECT count(*) FROM lg_deliveries WHERE round = ? AND event_id NOT LIKE 'x:%'`, round).Scan(&n).Error
	return n, err
}

// TestLogicalStandbyTakeover runs relays in child processes on one slot
// under a steady writer: the first streams it, the next stands by. It
// SIGKILLs the active relay twice, each time with a fresh standby waiting,
// and measures how long the standby takes to deliver (from the kill to its
// first recorded delivery of an event with a generated ID, which only the
// stream delivers; polled every 20 ms), which must be under
// maxTakeover. Nothing may be lost or delivered for a transaction that did
// not commit, and the redundant deliveries must stay within what one kill
// can leave in flight (maxUnconfirmed and a claimed batch).
func TestLogicalStandbyTakeover(t *testing.T) {
	long(t, "clusters of its own, a standby taking over")
	t.Parallel()
	_, dsn := logicalCluster(t)
	db := openGorm(t, postgres.Open(dsn))
	install(t, db, logicalConfig(newLogSink().logger()))
	for _, stmt := range logicalDDL {
		require.NoError(t, db.Exec(stmt).Error)
	}
	const kills = 2
	relay := func(i int) *crashChild {
		tag := fmt.Sprintf("outbox-lrelay-%s-%d", randomHex(4), i)
		c := startLogicalChild(t, tag, "TestLogicalRelayChild", childRoleEnv+"=logical-relay",
			logicalDSNEnv+"="+withParam(t, dsn, "application_name", tag), logicalRoundEnv+"="+strconv.Itoa(i))
		c.waitReady(t)
		return c
	}
	streaming := func(c *crashChild) {
		eventually(t, 30*time.Second, func() error {
			if h := slotHolder(t, db); h != c.tag {
				return fmt.Errorf("the slot is streamed by %q, not by %s", h, c.tag)
			}
			return nil
		})
	}
	standingBy := func(c *crashChild) {
		eventually(t, 30*time.Second, func() error {
			if !strings.Contains(c.output(), standbyLog) {
				return fmt.Errorf("relay %s has not found the slot busy", c.tag)
			}
			return nil
		})
	}
	delivering := func(round int, atLeast int64) {
		eventually(t, 30*time.Second, func() error {
			n, err := streamedIn(t, db, round)
			if err == nil && n < atLeast {
				err = fmt.Errorf("relay %d delivered %d events, waiting for %d", round, n, atLeast)
			}
			return err
		})
	}

	active := relay(0)
	streaming(active)
	w := startLgWriter(t, db, "w", false)
	delivering(0, 50)
	var takeovers []time.Duration
	for k := 1; k <= kills; k++ {
		standby := relay(k)
		standingBy(standby)
		delivering(k-1, 50) // the active relay still delivers with a standby waiting
		killedAt := time.Now()
		active.kill(t)
		delivering(k, 1)
		took := time.Since(killedAt)
		takeovers = append(takeovers, took.Round(time.Millisecond))
		assert.Less(t, took, maxTakeover, "takeover %d: the standby took %v to deliver", k, took)
		assert.Equal(t, standby.tag, slotHolder(t, db), "takeover %d: the standby streams the slot", k)
		delivering(k, 50)
		active = standby
	}
	committed := w.stop()
	c := waitAllDelivered(t, db, 60*time.Second)
	require.Positive(t, committed)
	assert.Zero(t, c.phantom, "events delivered whose transaction did not commit")
	var withinLife int64
	require.NoError(t, db.Raw(`SELECT count(*) FROM (SELECT 1 FROM lg_deliveries GROUP BY order_id, n, round HAVING count(*) > 1) x`).Scan(&withinLife).Error)
	assert.Zero(t, withinLife, "an event was delivered twice by one relay")
	dup := c.deliveries - c.distinct
	assert.LessOrEqual(t, dup, int64(kills*(maxUnconfirmed+logicalBatch)), "more redundant deliveries than the kills could leave in flight")
	active.kill(t)

	t.Logf("LOGICAL-TAKEOVER-RESULT kills=%d takeover=%v bound=%v committed_txns=%d events=%d delivered=%d lost=%d phantom=%d duplicated=%d",
		kills, takeovers, maxTakeover, c.orders, c.events, c.distinct, c.lost, c.phantom, dup)
}

// TestLogicalRelayChild is a relay child of TestLogicalStandbyTakeover: a
// relay in Logical mode whose handler records each delivery under its
// index. It runs until it is killed, or until its parent goes away.
func TestLogicalRelayChild(t *testing.T) {
	if os.Getenv(childRoleEnv) != "logical-relay" {
		t.Skip("helper process of TestLogicalStandbyTakeover; runs only when re-executed by it")
	}
	db, ob, index, fail := logicalChild()
	ob.Handle("order.created", recordLogicalDelivery(db, index, false))
	relay, err := ob.Relay(db, logicalRelayConfig())
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
