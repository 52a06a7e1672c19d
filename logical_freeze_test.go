package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/engine"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The replication session's timing (logical_stream.go, streamLimits): the
// relay asks the server for a short wal_sender_timeout, and delivers no
// batch once the server may have ended the session (a frozen relay whose
// slot a standby took over).

func TestLogicalReplicationConfigSetsWalSenderTimeout(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name, dsn string
		want      string // RuntimeParams["wal_sender_timeout"]; "" for none
		options   string // RuntimeParams["options"]
	}{
		{"the relay's", "postgres://u@h/db", "5000", ""},
		{"the DSN's own, as a parameter", "postgres://u@h/db?wal_sender_timeout=30s", "30s", ""},
		{"the DSN's own, key/value", "host=h user=u dbname=db wal_sender_timeout=0", "0", ""},
		{"the DSN's own, in options", "postgres://u@h/db?options=-c%20wal_sender_timeout%3D20s", "", "-c wal_sender_timeout=20s"},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := &Relay{cfg: RelayConfig{ReplicationDSN: c.dsn}}
			cfg, err := r.replicationConfig()
			require.NoError(t, err)
			assert.Equal(t, "database", cfg.RuntimeParams["replication"])
			got, ok := cfg.RuntimeParams["wal_sender_timeout"]
			assert.Equal(t, c.want != "", ok)
			assert.Equal(t, c.want, got)
			assert.Equal(t, c.options, cfg.RuntimeParams["options"])
		})
	}
}

func TestLogicalStreamLimits(t *testing.T) {
	t.Parallel()
	assert.Equal(t, streamLimits{timeout: 5 * time.Second, status: 500 * time.Millisecond, unreported: 2500 * time.Millisecond, silence: 3750 * time.Millisecond},
		limitsFor(replicationTimeout))
	assert.Equal(t, streamLimits{timeout: time.Minute, status: time.Second, unreported: 30 * time.Second, silence: 45 * time.Second},
		limitsFor(time.Minute))
	assert.Equal(t, streamLimits{status: time.Second, silence: 15 * time.Second}, limitsFor(0), "no timeout on the server: none to keep inside")
	for _, T := range []time.Duration{time.Second, 2 * time.Second, replicationTimeout, 10 * time.Second, time.Minute, time.Hour} {
		l := limitsFor(T)
		assert.LessOrEqual(t, 5*l.status, l.unreported, "T=%v: several reports before the relay presumes the session over", T)
		assert.Greater(t, l.silence, T/2, "T=%v: the server may say nothing for T/2 while it replays a large transaction", T)
		assert.Less(t, l.silence+l.status, T, "T=%v: the relay stops trusting the stream before the server can end the session", T)
	}
}

// staleTestStreamer is a streamer without a connection, whose clock the
// test sets, with one transaction of two events waiting for the
// dispatcher; held answers holdsSlot.
type staleTestStreamer struct {
	*streamer
	clock  time.Time
	held   error // nil: the session holds the slot; errNotHeld: it does not; other: the question fails
	asked  int
	handed [][]walItem
}

var errNotHeld = errors.New("not held")

func newStaleTestStreamer(timeout time.Duration) *staleTestStreamer {
	ts := &staleTestStreamer{clock: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
	ts.streamer = &streamer{r: &Relay{cfg: RelayConfig{BatchSize: 10}}, txns: make(chan walTxn, 64), kick: make(chan struct{}, 1),
		lim: limitsFor(timeout), now: func() time.Time { return ts.clock }, base: ts.clock}
	ts.holdsSlot = func(context.Context) (bool, error) {
		ts.asked++
		switch ts.held {
		case nil:
			return true, nil
		case errNotHeld:
			return false, nil
		default:
			return false, ts.held
		}
	}
	ts.txns <- walTxn{items: []walItem{{c: claimed{Event: engine.Event{ID: "1"}}}, {c: claimed{Event: engine.Event{ID: "2"}}}}, end: 100}
	close(ts.txns) // the reader stops after it
	return ts
}

func (ts *staleTestStreamer) dispatch() (int, error) {
	return ts.streamer.dispatch(context.Background(), func(_ context.Context, items []walItem) (int, error, error) {
		ts.handed = append(ts.handed, items)
		return len(items), nil, nil
	})
}

// at moves the clock to d after the session began, and stamps the last
// report and the last message heard at the given offsets.
func (ts *staleTestStreamer) at(d, sent, heard time.Duration) {
	ts.clock = ts.base.Add(d)
	ts.stamp(&ts.lastSent, ts.base.Add(sent))
	ts.stamp(&ts.lastHeard, ts.base.Add(heard))
}

func TestLogicalDispatcherRefusesBatchOfStaleSession(t *testing.T) {
	t.Parallel()
	t.Run("fresh", func(t *testing.T) {
		ts := newStaleTestStreamer(replicationTimeout)
		ts.at(10*time.Second, 9*time.Second, 9*time.Second)
		n, err := ts.dispatch()
		require.NoError(t, err)
		assert.Equal(t, 2, n)
		require.Len(t, ts.handed, 1)
		assert.Len(t, ts.handed[0], 2)
		assert.EqualValues(t, 100, ts.done.Load(), "delivered and confirmable")
		assert.Zero(t, ts.asked, "heard recently: no question to the server")
	})
	t.Run("no report for longer than half the timeout", func(t *testing.T) {
		// A relay resuming from SIGSTOP: what it reads is old, and it has
		// not reported for 3 s; the server gives up after 5 s.
		ts := newStaleTestStreamer(replicationTimeout)
		ts.at(10*time.Second, 7*time.Second, 10*time.Second)
		n, err := ts.dispatch()
		require.ErrorIs(t, err, errSessionStale)
		assert.Contains(t, err.Error(), "no position report for 3s")
		assert.Zero(t, n)
		assert.Empty(t, ts.handed, "nothing delivered")
		assert.Zero(t, ts.done.Load(), "nothing confirmed: the next session receives it again")
		assert.Zero(t, ts.asked, "the server cannot vouch for a session it may have ended")
	})
	t.Run("just inside", func(t *testing.T) {
		ts := newStaleTestStreamer(replicationTimeout)
		ts.at(10*time.Second, 7500*time.Millisecond, 10*time.Second)
		_, err := ts.dispatch()
		require.NoError(t, err)
		assert.Len(t, ts.handed, 1)
	})
	t.Run("silent server, the session still holds the slot", func(t *testing.T) {
		// The dispatcher was busy: the reader reported but read nothing.
		ts := newStaleTestStreamer(replicationTimeout)
		ts.at(10*time.Second, 9800*time.Millisecond, 6*time.Second)
		_, err := ts.dispatch()
		require.NoError(t, err)
		assert.Equal(t, 1, ts.asked)
		assert.Len(t, ts.handed, 1)
		// Its answer counts as word from the server: the next batches
		// do not ask again, until the silence limit passes once more.
		ts.clock = ts.clock.Add(3 * time.Second)
		ts.stamp(&ts.lastSent, ts.clock)
		require.NoError(t, ts.deliverable(context.Background()))
		assert.Equal(t, 1, ts.asked)
		ts.clock = ts.clock.Add(time.Second)
		ts.stamp(&ts.lastSent, ts.clock)
		require.NoError(t, ts.deliverable(context.Background()))
		assert.Equal(t, 2, ts.asked)
	})
	t.Run("silent server, the slot is another session's", func(t *testing.T) {
		ts := newStaleTestStreamer(replicationTimeout)
		ts.held = errNotHeld
		ts.at(10*time.Second, 9800*time.Millisecond, 6*time.Second)
		_, err := ts.dispatch()
		require.ErrorIs(t, err, errSessionStale)
		assert.Contains(t, err.Error(), "no longer holds the slot")
		assert.Empty(t, ts.handed)
		assert.Zero(t, ts.done.Load())
	})
	t.Run("silent server, unreachable through the pool too", func(t *testing.T) {
		ts := newStaleTestStreamer(replicationTimeout)
		ts.held = errors.New("i/o timeout")
		ts.at(10*time.Second, 9800*time.Millisecond, 6*time.Second)
		_, err := ts.dispatch()
		require.ErrorIs(t, err, errSessionStale)
		assert.Contains(t, err.Error(), "i/o timeout")
		assert.Empty(t, ts.handed)
	})
	t.Run("no timeout on the server", func(t *testing.T) {
		// wal_sender_timeout=0: the server never ends the session for
		// silence, so a late report is no sign of a takeover.
		ts := newStaleTestStreamer(0)
		ts.at(time.Hour, 0, time.Hour-time.Second)
		_, err := ts.dispatch()
		require.NoError(t, err)
		assert.Len(t, ts.handed, 1)
	})
}

func TestLogicalReaderStopsReportingAfterGap(t *testing.T) {
	t.Parallel()
	ts := newStaleTestStreamer(replicationTimeout)
	ts.at(0, 0, 0)
	require.NoError(t, ts.expired(ts.base.Add(2500*time.Millisecond)))
	err := ts.expired(ts.base.Add(2600 * time.Millisecond))
	require.ErrorIs(t, err, errSessionStale)
	assert.Contains(t, err.Error(), "wal_sender_timeout")
}

// TestLogicalReplicationConnectionTimeout: the server applies the relay's
// wal_sender_timeout to its replication connection, or the DSN's own.
func TestLogicalReplicationConnectionTimeout(t *testing.T) {
	t.Parallel()
	e := setupLogical(t, Config{}) // the server's own is 60 s
	for _, c := range []struct {
		dsn  string
		want time.Duration
	}{
		{e.dsn, replicationTimeout},
		{e.dsn + "&wal_sender_timeout=7s", 7 * time.Second},
		{e.dsn + "&options=-c%20wal_sender_timeout%3D8000", 8 * time.Second},
	} {
		r := e.relay(RelayConfig{ReplicationDSN: c.dsn})
		conn, err := pgconn.ConnectConfig(t.Context(), r.repl)
		require.NoError(t, err)
		got, err := walSenderTimeout(t.Context(), conn, e.ob.logical())
		_ = conn.Close(context.Background())
		require.NoError(t, err)
		assert.Equal(t, c.want, got, "%s", c.dsn)
	}
}

// TestLogicalBusyDispatcherKeepsSession: a handler that takes longer than
// the session's wal_sender_timeout, with more transactions waiting than the
// reader buffers. The reader keeps reporting while it waits on the
// dispatcher, so the server keeps the session; the dispatcher, having heard
// nothing fresh meanwhile, asks whether the session still holds the slot
// and goes on. Everything is delivered once, in one session.
func TestLogicalBusyDispatcherKeepsSession(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	e := setupLogical(t, Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	const timeout = 6 * time.Second // a report every 600 ms; the stream given up after 3 s without one
	var (
		got   collector
		first = make(chan struct{})
	)
	e.ob.Handle("x", func(ctx context.Context, ev Event) error {
		if ev.ID == "e-000" {
			close(first)
			time.Sleep(timeout + time.Second) // the slow destination itself
		}
		return got.handle(ctx, ev)
	})
	const n = 100 // more than the reader buffers (64)
	for i := range n {
		require.NoError(t, Publish(e.db, Event{ID: fmt.Sprintf("e-%03d", i), Type: "x"}))
	}
	r := e.relay(RelayConfig{BatchSize: 1, Workers: 1, ReplicationDSN: e.dsn + "&wal_sender_timeout=" + timeout.String()})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	<-first
	waitUntil(t, 30*time.Second, "every event delivered", func() bool { return got.len() >= n })
	cancel()
	require.NoError(t, <-done)
	ids := got.ids()
	assert.Len(t, ids, n, "each event once")
	for i, id := range ids {
		assert.Equal(t, fmt.Sprintf("e-%03d", i), id, "in commit order")
	}
	assert.NotContains(t, logs.String(), "replication stream broke")
	assert.NotContains(t, logs.String(), errSessionStale.Error())
}

// TestLogicalFreezeMidBatchDeliversNoMore: a session that goes stale in
// the middle of a batch (the relay froze while handlers ran) delivers no
// more of it and writes none of the rest to the table: the relay that took
// the slot over streams those events itself. What it did deliver with a
// row in the table is marked sent, so the table's relay does not deliver
// it again; and the batch is not confirmed.
func TestLogicalFreezeMidBatchDeliversNoMore(t *testing.T) {
	t.Parallel()
	e := setupLogical(t, Config{})
	var got collector
	e.ob.Handle(AnyEvent, got.handle)
	r := e.relay(RelayConfig{Workers: 1})
	msg, err := json.Marshal([]walEvent{
		{ID: "c1", Type: "x", Payload: json.RawMessage(`1`), Checked: true},
		{ID: "g2", Type: "x", Payload: json.RawMessage(`2`)},
		{ID: "g3", Type: "x", Payload: json.RawMessage(`3`)},
	})
	require.NoError(t, err)
	items, err := decodeWAL(msg, time.Now())
	require.NoError(t, err)
	checks := 0
	stale := func() error {
		if checks++; checks > 1 {
			return errSessionStale
		}
		return nil
	}
	_, down, err := r.handleStream(t.Context(), items, stale)
	require.ErrorIs(t, err, errSessionStale, "the batch must not be confirmed")
	assert.NoError(t, down)
	assert.Equal(t, []string{"c1"}, got.ids(), "nothing delivered once the session is stale")
	assert.EqualValues(t, 1, e.count(""), "the rest is not written to the table")
	assert.Equal(t, StatusSent, e.record("c1").Status)
}

// TestLogicalProcessOnceSlowBatch: ProcessOnce's reader has everything
// committed before the call once it hands the batch over, but must go on
// reporting while the batch is delivered: a batch that takes longer than
// half the session's timeout is delivered once, whole, and confirmed,
// not given up as a stale session and delivered again at every call.
func TestLogicalProcessOnceSlowBatch(t *testing.T) {
	t.Parallel()
	e := setupLogical(t, Config{})
	var got collector
	e.ob.Handle("slow", func(ctx context.Context, ev Event) error {
		time.Sleep(600 * time.Millisecond) // the handler's work, not synchronisation
		return got.handle(ctx, ev)
	})
	// wal_sender_timeout 2s: the session may go 1s without a report.
	r := e.relay(RelayConfig{Workers: 1, ReplicationDSN: e.dsn + "&wal_sender_timeout=2s"})
	require.NoError(t, Publish(e.db, Event{Type: "slow"}, Event{Type: "slow"}, Event{Type: "slow"}))
	n, err := r.ProcessOnce(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 3, n)
	assert.Equal(t, 3, got.len(), "the whole batch, once")
	n, err = r.ProcessOnce(t.Context())
	require.NoError(t, err)
	assert.Zero(t, n, "the batch was confirmed")
	assert.Equal(t, 3, got.len())
}
