package wal

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"crypto/rand"
	"encoding/hex"

	"github.com/gorm-outbox/outbox/internal/engine"
	"github.com/gorm-outbox/outbox/internal/store"
	pgstore "github.com/gorm-outbox/outbox/internal/store/postgres"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The replication session's timing (stream.go, streamLimits): the relay
// asks the server for a short wal_sender_timeout, and delivers no batch
// once the server may have ended the session (a frozen relay whose slot a
// standby took over).

func TestStreamLimits(t *testing.T) {
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
	ts.streamer = &streamer{r: &Relay{BatchSize: 10}, txns: make(chan walTxn, 64), kick: make(chan struct{}, 1),
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
	ts.txns <- walTxn{items: []walItem{{c: engine.Item{Event: engine.Event{ID: "1"}}}, {c: engine.Item{Event: engine.Event{ID: "2"}}}}, end: 100}
	close(ts.txns) // the reader stops after it
	return ts
}

func (ts *staleTestStreamer) dispatch() (int, error) {
	return ts.streamer.dispatch(context.Background(), func(_ context.Context, items []walItem) (handled, error) {
		ts.handed = append(ts.handed, items)
		return handled{handled: len(items)}, nil
	})
}

// at moves the clock to d after the session began, and stamps the last
// report and the last message heard at the given offsets.
func (ts *staleTestStreamer) at(d, sent, heard time.Duration) {
	ts.clock = ts.base.Add(d)
	ts.stamp(&ts.lastSent, ts.base.Add(sent))
	ts.stamp(&ts.lastHeard, ts.base.Add(heard))
}

func TestDispatcherRefusesBatchOfStaleSession(t *testing.T) {
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

func TestReaderStopsReportingAfterGap(t *testing.T) {
	t.Parallel()
	ts := newStaleTestStreamer(replicationTimeout)
	ts.at(0, 0, 0)
	require.NoError(t, ts.expired(ts.base.Add(2500*time.Millisecond)))
	err := ts.expired(ts.base.Add(2600 * time.Millisecond))
	require.ErrorIs(t, err, errSessionStale)
	assert.Contains(t, err.Error(), "wal_sender_timeout")
}

// TestFreezeMidBatchDeliversNoMore: a session that goes stale in
// the middle of a batch (the relay froze while handlers ran) delivers no
// more of it and writes none of the rest to the table: the relay that took
// the slot over streams those events itself. What it did deliver with a
// row in the table is marked sent, so the table's relay does not deliver
// it again; and the batch is not confirmed.
func TestFreezeMidBatchDeliversNoMore(t *testing.T) {
	t.Parallel()
	var (
		mu  sync.Mutex
		got []string
	)
	r, db := newTestRelay(t, func(_ context.Context, it *engine.Item) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, it.Event.ID)
		return nil
	})
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
	res, err := r.handleStream(t.Context(), items, stale)
	require.ErrorIs(t, err, errSessionStale, "the batch must not be confirmed")
	assert.NoError(t, res.down)
	assert.Equal(t, []string{"c1"}, got, "nothing delivered once the session is stale")
	var n int
	var status string
	require.NoError(t, db.QueryRow("SELECT COUNT(*), MIN(status) FROM outbox_events").Scan(&n, &status))
	assert.Equal(t, 1, n, "the rest is not written to the table")
	assert.Equal(t, "sent", status, "what was delivered with a row is marked sent")
}

// newTestRelay is a Relay on a schema of its own on OUTBOX_TEST_POSTGRES_DSN
// (no slot: what it tests writes to the table only), delivering with one
// worker through attempt.
func newTestRelay(t *testing.T, attempt func(context.Context, *engine.Item) error) (*Relay, *sql.DB) {
	t.Helper()
	dsn := os.Getenv("OUTBOX_TEST_POSTGRES_DSN")
	if dsn == "" {
		t.Skip("OUTBOX_TEST_POSTGRES_DSN is not set; set it to run the tests that write to PostgreSQL")
	}
	admin, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close() })
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	schema := "wal_" + hex.EncodeToString(b)
	_, err = admin.Exec("CREATE SCHEMA " + schema)
	require.NoError(t, err, "OUTBOX_TEST_POSTGRES_DSN is set but PostgreSQL is unreachable")
	t.Cleanup(func() { _, _ = admin.Exec("DROP SCHEMA " + schema + " CASCADE") })
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	db, err := sql.Open("pgx", dsn+sep+"search_path="+schema)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	s := pgstore.New(store.DefaultTable)
	require.NoError(t, s.Migrate(t.Context(), db))
	logger := slog.New(slog.DiscardHandler)
	now := func() time.Time { return time.Now().UTC().Truncate(time.Microsecond) }
	policy := &engine.Policy{MaxAttempts: 3, Backoff: func(int) time.Duration { return time.Second }, Now: now, Logger: logger,
		Attrs: func(*engine.Event, error) []any { return nil }}
	table := &engine.Table{Store: s, DB: db, Now: now, Lease: time.Minute, StatementTimeout: 10 * time.Second}
	r := &Relay{
		Slot: "unused", DB: db, Logical: s, Store: s, Table: table, Logger: logger, Now: now,
		Fanout:    &engine.Fanout{Workers: 1, Policy: policy, Attempt: attempt, Report: func(*engine.Item, engine.Result, error, time.Duration) {}},
		BatchSize: 100, Lease: time.Minute, StatementTimeout: 10 * time.Second, PollInterval: 100 * time.Millisecond,
		EnsureOrdering: func(context.Context) error { return nil },
		Dropped:        func(context.Context, *engine.Event) {},
	}
	return r, db
}

// TestStreamedBatchRules runs the engine's rules over the WAL source, as
// TestTableSource (internal/engine) does over the table: with ordering, a
// failure holds its aggregate back, and whatever reaches the table does so
// in stream order; a generated event delivered from the stream leaves no
// row.
func TestStreamedBatchRules(t *testing.T) {
	t.Parallel()
	var (
		mu  sync.Mutex
		got []string
	)
	r, db := newTestRelay(t, func(_ context.Context, it *engine.Item) error {
		mu.Lock()
		defer mu.Unlock()
		got = append(got, it.Event.ID)
		if it.Event.ID == "a1" {
			return errors.New("a1 fails")
		}
		return nil
	})
	r.Ordered, r.Fanout.Ordered = true, true
	msg, err := json.Marshal([]walEvent{
		{ID: "a1", Type: "x", AggregateType: "o", AggregateID: "a", Payload: json.RawMessage(`1`)},
		{ID: "b1", Type: "x", AggregateType: "o", AggregateID: "b", Payload: json.RawMessage(`2`)},
		{ID: "a2", Type: "x", AggregateType: "o", AggregateID: "a", Payload: json.RawMessage(`3`), Checked: true},
		{ID: "a3", Type: "x", AggregateType: "o", AggregateID: "a", Payload: json.RawMessage(`4`)},
	})
	require.NoError(t, err)
	items, err := decodeWAL(msg, time.Now())
	require.NoError(t, err)
	res, err := r.handleStream(t.Context(), items, func() error { return nil })
	require.NoError(t, err)
	assert.NoError(t, res.down)
	assert.Equal(t, 4, res.handled)
	assert.Equal(t, 1, res.sent)
	assert.ElementsMatch(t, []string{"a1", "b1"}, got, "a2 and a3 are held behind a1")

	// A parked row's ID is in named_id, whoever chose it.
	rows, err := db.Query("SELECT named_id, status, attempts FROM outbox_events ORDER BY seq")
	require.NoError(t, err)
	defer rows.Close()
	var table []string
	for rows.Next() {
		var (
			id, status string
			attempts   int
		)
		require.NoError(t, rows.Scan(&id, &status, &attempts))
		table = append(table, id+":"+status+":"+string(rune('0'+attempts)))
	}
	require.NoError(t, rows.Err())
	assert.Equal(t, []string{"a1:pending:1", "a2:pending:0", "a3:pending:0"}, table,
		"in stream order: a1 (to retry), a2 and a3 (held back); b1, generated and delivered, leaves no row")
}
