package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/wal"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The replication session's timing (internal/wal, streamLimits): the
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
			r := &Relay{o: &Outbox{replicationDSN: c.dsn}}
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

// TestLogicalReplicationConnectionTimeout: the server applies the relay's
// wal_sender_timeout to its replication connection, or the DSN's own.
func TestLogicalReplicationConnectionTimeout(t *testing.T) {
	t.Parallel()
	e := setupLogical(t, Config{}) // the server's own is 60 s
	for _, c := range []struct {
		dsn  string
		want time.Duration
	}{
		{e.dsn, 5 * time.Second}, // the relay's
		{e.dsn + "&wal_sender_timeout=7s", 7 * time.Second},
		{e.dsn + "&options=-c%20wal_sender_timeout%3D8000", 8 * time.Second},
	} {
		e.ob.replicationDSN = c.dsn
		r := e.relay(RelayConfig{})
		conn, err := pgconn.ConnectConfig(t.Context(), r.stream.(*wal.Relay).Repl)
		require.NoError(t, err)
		got, err := wal.SessionTimeout(t.Context(), conn)
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
		require.NoError(t, PublishAlone(e.db, Event{ID: fmt.Sprintf("e-%03d", i), Type: "x"}))
	}
	e.ob.replicationDSN = e.dsn + "&wal_sender_timeout=" + timeout.String()
	r := e.relay(RelayConfig{BatchSize: 1, Workers: 1})
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
	assert.NotContains(t, logs.String(), "may be over on the server's side")
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
	e.ob.replicationDSN = e.dsn + "&wal_sender_timeout=2s"
	r := e.relay(RelayConfig{Workers: 1})
	require.NoError(t, PublishAlone(e.db, Event{Type: "slow"}, Event{Type: "slow"}, Event{Type: "slow"}))
	n, err := r.ProcessOnce(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 3, n)
	assert.Equal(t, 3, got.len(), "the whole batch, once")
	n, err = r.ProcessOnce(t.Context())
	require.NoError(t, err)
	assert.Zero(t, n, "the batch was confirmed")
	assert.Equal(t, 3, got.len())
}
