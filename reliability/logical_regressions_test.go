package reliability

// Regressions of two defects of Logical mode found by the reliability
// tests (RELIABILITY.md, "Logical mode", bugs 3 and 4):
//
//   - the stream's outcome statements (markSent, markFailed, release) ran
//     without a deadline: on a blackholed pool connection the dispatcher
//     waited forever and the relay never streamed again;
//   - a broken replication connection went on delivering what the reader
//     had buffered (up to 64 transactions), which could no longer be
//     confirmed and was delivered again by the next session.

import (
	"context"
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxtest"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
)

// TestLogicalRelayRecoversFromSilentlyDeadStream blackholes every connection
// of a running Logical-mode relay (the fault proxy drops their bytes both
// ways and closes nothing; new connections work), with the server's
// wal_sender_timeout at 5 s, under a steady writer. The relay must stream
// again and deliver within 60 s.
func TestLogicalRelayRecoversFromSilentlyDeadStream(t *testing.T) {
	long(t, "a cluster of its own, a stream partitioned")
	t.Parallel()
	_, dsn := logicalCluster(t, "wal_sender_timeout=5s")
	direct := openGorm(t, postgres.Open(dsn))
	p := newFaultProxy(t, parseURLDSN(t, dsn).Host)
	u := parseURLDSN(t, dsn)
	u.Host = p.addr()
	const tag = "outbox-silent-relay"
	db := openGorm(t, postgres.Open(withParam(t, u.String(), "application_name", tag)))
	sink := newLogSink()
	ob := install(t, db, logicalConfig(sink.logger()))

	install(t, direct, logicalConfig(newLogSink().logger()))
	for _, stmt := range logicalDDL {
		require.NoError(t, direct.Exec(stmt).Error)
	}
	ob.Handle("order.created", recordLogicalDelivery(direct, 0, false))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	relay := outboxtest.Relay(t, ob, db, logicalRelayConfig())
	go func() { done <- relay.Run(ctx) }()
	t.Cleanup(func() { cancel(); p.close(); <-done })
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("relay's log:\n%s", sink)
			buf := make([]byte, 1<<22)
			buf = buf[:runtime.Stack(buf, true)]
			for _, g := range strings.Split(string(buf), "\n\n") {
				if strings.Contains(g, "outbox.(*") {
					t.Logf("%s", g)
				}
			}
		}
	})
	w := startLgWriter(t, direct, "w", false)
	delivered := func(since int64, atLeast int64) func() error {
		return func() error {
			var n int64
			if err := direct.Raw(`SELECT count(*) FROM lg_deliveries WHERE seq > ? AND event_id NOT LIKE 'x:%'`, since).Scan(&n).Error; err != nil {
				return err
			}
			if n < atLeast {
				return fmt.Errorf("%d streamed deliveries (slot held by %q)", n, slotHolder(t, direct))
			}
			return nil
		}
	}
	eventually(t, 30*time.Second, delivered(0, 20))
	p.blackhole()
	began := time.Now()
	var mark int64
	require.NoError(t, direct.Raw(`SELECT COALESCE(max(seq), 0) FROM lg_deliveries`).Scan(&mark).Error)
	eventually(t, 60*time.Second, delivered(mark, 20))
	t.Logf("resumed streaming %v after its connections went silent", time.Since(began).Round(time.Millisecond))
	w.stop()
	waitAllDelivered(t, direct, 60*time.Second)
}

// TestLogicalBrokenStreamRedeliversBufferedTransactions: a backlog in the
// slot (a handler taking 2 ms), one cut of every connection, and the
// events delivered again must be at most what a break can leave
// unconfirmed: the two batches a kill can (maxUnconfirmed) and the batch
// the dispatcher finishes after the break, which a kill would not. Before
// the fix the buffer of up to 64 transactions was delivered too: 85.
func TestLogicalBrokenStreamRedeliversBufferedTransactions(t *testing.T) {
	long(t, "a cluster of its own, a stream broken")
	_, dsn := logicalCluster(t)
	direct := openGorm(t, postgres.Open(dsn))
	p := newFaultProxy(t, parseURLDSN(t, dsn).Host)
	u := parseURLDSN(t, dsn)
	u.Host = p.addr()
	const tag = "outbox-buffer-relay"
	db := openGorm(t, postgres.Open(withParam(t, u.String(), "application_name", tag)))
	ob := install(t, db, logicalConfig(newLogSink().logger()))
	install(t, direct, logicalConfig(newLogSink().logger()))
	for _, stmt := range logicalDDL {
		require.NoError(t, direct.Exec(stmt).Error)
	}
	record := recordLogicalDelivery(direct, 0, false)
	ob.Handle("order.created", func(ctx context.Context, e outbox.Event) error {
		time.Sleep(2 * time.Millisecond) // a slow destination: a backlog builds in the slot
		return record(ctx, e)
	})
	// The backlog, committed before the relay starts; generated IDs only
	// (seq 0 modulo 3), so that the stream alone delivers them.
	for i := range 600 {
		require.NoError(t, writeOrder(direct, fmt.Sprintf("b-%06d", i*3), 0, 0, false))
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	relay := outboxtest.Relay(t, ob, db, logicalRelayConfig())
	go func() { done <- relay.Run(ctx) }()
	eventually(t, 30*time.Second, func() error {
		n, err := streamedIn(t, direct, 0)
		if err == nil && n < 100 {
			err = fmt.Errorf("%d delivered", n)
		}
		return err
	})
	p.cut()
	c := waitAllDelivered(t, direct, 60*time.Second)
	cancel()
	require.NoError(t, <-done)
	dup := c.deliveries - c.distinct
	t.Logf("events=%d delivered=%d duplicated=%d after one cut", c.events, c.distinct, dup)
	require.LessOrEqual(t, dup, int64(maxUnconfirmed+logicalStreamBatch), "one stream break delivered more events again than three streamed batches")
}
