package reliability

// Logical mode under connection faults: connections cut (EOF on the
// replication connection), PostgreSQL stopped and started. Each test owns
// its cluster (logicalCluster).

import (
	"context"
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
)

// TestLogicalRelaySurvivesConnectionCuts cuts every connection of a running
// Logical-mode relay (through the fault proxy; the writer and the handler
// use direct connections) 15 times, each time once it streams again and
// has delivered 10 more events: the replication connection sees EOF. The
// relay must reconnect by itself every time and deliver every committed
// event, with nothing for a transaction that did not commit, and Run must
// return nil when cancelled. Under -race it caught the final status report
// written on a connection pgconn was closing from its own goroutine (fixed
// in 047674b).
func TestLogicalRelaySurvivesConnectionCuts(t *testing.T) {
	long(t, "a cluster of its own, connections cut under load")
	t.Parallel()
	_, dsn := logicalCluster(t)
	direct := openGorm(t, postgres.Open(dsn))
	p := newFaultProxy(t, parseURLDSN(t, dsn).Host)
	u := parseURLDSN(t, dsn)
	u.Host = p.addr()
	const tag = "outbox-cut-relay"
	db := openGorm(t, postgres.Open(withParam(t, u.String(), "application_name", tag)))
	ob := install(t, db, logicalConfig(newLogSink().logger()))
	for _, stmt := range logicalDDL {
		require.NoError(t, direct.Exec(stmt).Error)
	}
	ob.Handle("order.created", recordLogicalDelivery(direct, 0, false))
	install(t, direct, logicalConfig(newLogSink().logger())) // the writer publishes through direct
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan error, 1)
	relay := outboxtest.Relay(t, ob, db, logicalRelayConfig())
	go func() { done <- relay.Run(ctx) }()
	w := startLgWriter(t, direct, "w", false)
	for i := range 15 {
		var before int64
		require.NoError(t, direct.Raw(`SELECT COALESCE(max(seq), 0) FROM lg_deliveries`).Scan(&before).Error)
		eventually(t, 30*time.Second, func() error {
			var n int64
			if err := direct.Raw(`SELECT count(*) FROM lg_deliveries WHERE seq > ?`, before).Scan(&n).Error; err != nil {
				return err
			}
			if n < 10 || slotHolder(t, direct) != tag {
				return fmt.Errorf("cut %d: not streaming yet (%d delivered)", i, n)
			}
			return nil
		})
		p.cut() // the replication connection sees EOF: pgconn closes it asynchronously
	}
	w.stop()
	c := waitAllDelivered(t, direct, 60*time.Second)
	assert.Zero(t, c.phantom, "events delivered whose transaction did not commit")
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(bound(t, 30*time.Second)):
		t.Fatal("Run did not return after its context was cancelled")
	}
	t.Logf("LOGICAL-CUT-RESULT cuts=%d committed_txns=%d events=%d delivered=%d lost=%d phantom=%d duplicated=%d",
		15, c.orders, c.events, c.distinct, c.lost, c.phantom, c.deliveries-c.distinct)
}

// TestLogicalRelaySurvivesPostgresRestarts stops the test's own PostgreSQL
// twice under a running Logical-mode relay and a steady writer: a fast
// shutdown (SIGINT), then an immediate one (SIGQUIT: crash recovery at the
// next start, and the slot's position goes back to the last checkpoint),
// each time keeping it down for a second. The relay must not exit, must
// stream the slot again by itself after each restart, and must deliver
// every committed event, with nothing for a transaction that did not
// commit; no event may end failed or pending in the table. Redundant
// deliveries are reported (after the immediate shutdown they are bounded by
// the WAL since the last checkpoint, not by a batch).
func TestLogicalRelaySurvivesPostgresRestarts(t *testing.T) {
	long(t, "a cluster of its own, restarted under load")
	t.Parallel()
	srv, dsn := logicalCluster(t)
	const tag = "outbox-restart-relay"
	db := openGorm(t, postgres.Open(withParam(t, dsn, "application_name", tag)))
	sink := newLogSink()
	ob := install(t, db, logicalConfig(sink.logger()))
	for _, stmt := range logicalDDL {
		require.NoError(t, db.Exec(stmt).Error)
	}
	ob.Handle("order.created", recordLogicalDelivery(db, 0, false))
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runErr := make(chan error, 1)
	relay := outboxtest.Relay(t, ob, db, logicalRelayConfig())
	go func() { runErr <- relay.Run(ctx) }()
	running := func() {
		t.Helper()
		select {
		case err := <-runErr:
			t.Fatalf("Run returned before it was stopped: %v\n%s", err, sink)
		default:
		}
	}

	// progress waits until the relay streams the slot again and delivers
	// events committed after now.
	progress := func(what string) time.Duration {
		t.Helper()
		began := time.Now()
		var before int64
		require.NoError(t, db.Raw(`SELECT COALESCE(max(seq), 0) FROM lg_deliveries`).Scan(&before).Error)
		eventually(t, 60*time.Second, func() error {
			running()
			var n int64
			if err := db.Raw(`SELECT count(*) FROM lg_deliveries WHERE seq > ?`, before).Scan(&n).Error; err != nil {
				return err
			}
			if n < 20 {
				return fmt.Errorf("%s: %d events delivered since", what, n)
			}
			if h := slotHolder(t, db); h != tag {
				return fmt.Errorf("%s: no relay streams the slot", what)
			}
			return nil
		})
		return time.Since(began)
	}

	w := startLgWriter(t, db, "w", true)
	progress("before the restarts")
	signals := []syscall.Signal{syscall.SIGINT, syscall.SIGQUIT}
	var resumed []time.Duration
	for _, sig := range signals {
		require.NoError(t, srv.Stop(sig))
		timer := time.NewTimer(time.Second) // how long the server stays down
		<-timer.C
		require.NoError(t, srv.Start())
		resumed = append(resumed, progress(fmt.Sprintf("after %v", sig)).Round(time.Millisecond))
	}
	w.stop()
	c := waitAllDelivered(t, db, 60*time.Second)
	running()
	assert.Zero(t, c.phantom, "events delivered whose transaction did not commit")
	assert.Equal(t, tag, slotHolder(t, db), "the relay streams the slot after the restarts")
	// Events whose delivery failed while the server was down went to the
	// table; the relay retries them there.
	eventually(t, 30*time.Second, func() error {
		counts := statusCounts(t, db, ob.Table())
		if counts[outbox.StatusPending] > 0 || counts[outbox.StatusFailed] > 0 {
			return fmt.Errorf("rows not sent: %v", counts)
		}
		return nil
	})
	c, err := readLgCounts(t, db)
	require.NoError(t, err)
	assert.Zero(t, c.lost, "committed events not delivered")
	assert.Zero(t, c.phantom, "events delivered whose transaction did not commit")
	cancel()
	select {
	case err := <-runErr:
		require.NoError(t, err)
	case <-time.After(bound(t, 30*time.Second)):
		t.Fatal("Run did not return after its context was cancelled")
	}
	t.Logf("LOGICAL-RESTART-RESULT restarts=%d (fast, immediate) resumed_after=%v committed_txns=%d events=%d delivered=%d lost=%d phantom=%d duplicated=%d stream_broke_logs=%d",
		len(signals), resumed, c.orders, c.events, c.distinct, c.lost, c.phantom, c.deliveries-c.distinct,
		sink.count("the replication stream broke")+sink.count("cannot stream the replication slot"))
}
