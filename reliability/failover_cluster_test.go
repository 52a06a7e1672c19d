package reliability

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/pgtest"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// failoverNodeSettings are every node's: a primary that streams WAL to a
// hot standby, and a standby that can be promoted to one. A standby whose
// primary went away retries streaming every wal_retrieve_retry_interval
// (default 5s), and a promotion requested just as it starts that wait was
// seen to wait it out (PostgreSQL 15 logged "received promote request" 5s
// after pg_ctl promote): a short interval keeps the promotions of the rig
// quick and their time steady.
var failoverNodeSettings = []string{"wal_level=replica", "max_wal_senders=10", "hot_standby=on", "synchronous_commit=on",
	"wal_retrieve_retry_interval=250ms"}

// pgCluster is a primary and a streaming standby owned by one test, in two
// slots whose ports never change: a multi-host DSN names both, and a node
// rebuilt in a slot takes its port. synchronous_standby_names is set with
// ALTER SYSTEM (not on the command line, which would win over it), so
// that each new primary can name its standby.
type pgCluster struct {
	sync     bool
	settings []string // every node's
	nodes    [2]*pgtest.Server
	names    [2]string // application_name of each slot's node
	primary  int       // the slot of the primary
	gen      int       // nodes made so far
}

// startPgCluster starts a primary and a standby made with pg_basebackup
// -R, every node with failoverNodeSettings; with sync, the primary waits
// for the standby's flush at every commit. Without the server binaries it
// skips, except under CI.
func startPgCluster(t *testing.T, sync bool) *pgCluster {
	return startPgClusterWith(t, sync, failoverNodeSettings)
}

// startPgClusterWith is startPgCluster with settings for every node.
func startPgClusterWith(t *testing.T, sync bool, settings []string) *pgCluster {
	t.Helper()
	primary, err := pgtest.Start(settings...)
	if errors.Is(err, pgtest.ErrNoBinaries) && !strict() {
		noteSkip("no PostgreSQL server binaries", t.Name())
		t.Skipf("the failover tests need a PostgreSQL installation: %v", err)
	}
	require.NoError(t, err)
	c := &pgCluster{sync: sync, settings: settings}
	c.nodes[0], c.names[0], c.gen = primary, "node0", 1
	t.Cleanup(func() {
		for _, n := range c.nodes {
			if n != nil {
				n.Close()
			}
		}
	})
	c.addStandby(t, 1, 0)
	return c
}

func (c *pgCluster) standby() int { return 1 - c.primary }

// dsn is the multi-host DSN clients use: they find the primary by
// themselves (target_session_attrs=read-write).
func (c *pgCluster) dsn(app string) string {
	return fmt.Sprintf("host=127.0.0.1,127.0.0.1 port=%d,%d user=postgres dbname=postgres sslmode=disable target_session_attrs=read-write connect_timeout=5 application_name=%s",
		c.nodes[0].Port(), c.nodes[1].Port(), app)
}

// primaryDSN is a DSN for the current primary alone.
func (c *pgCluster) primaryDSN() string { return c.nodes[c.primary].DSN("postgres") }

// addStandby makes a standby of the primary in slot (on port, 0 for a
// free one), waits until it streams and, in a synchronous cluster, names
// it in synchronous_standby_names and waits until it is the synchronous
// standby, then until it has flushed everything written so far.
func (c *pgCluster) addStandby(t *testing.T, slot, port int) {
	t.Helper()
	name := fmt.Sprintf("node%d", c.gen)
	c.gen++
	st, err := c.nodes[c.primary].Standby(name, port, c.settings...)
	require.NoError(t, err)
	c.nodes[slot], c.names[slot] = st, name
	if c.sync {
		c.exec(t, fmt.Sprintf("ALTER SYSTEM SET synchronous_standby_names TO '%s'", name))
		c.exec(t, "SELECT pg_reload_conf()")
	}
	want := "async"
	if c.sync {
		want = "sync"
	}
	eventually(t, 30*time.Second, func() error {
		var state, syncState string
		err := c.queryRowArgs(`SELECT state, sync_state FROM pg_stat_replication WHERE application_name = $1`, []any{name}, &state, &syncState)
		if err != nil {
			return fmt.Errorf("standby %s: %w", name, err)
		}
		if state != "streaming" || syncState != want {
			return fmt.Errorf("standby %s: state %s, sync_state %s (want streaming, %s)", name, state, syncState, want)
		}
		return nil
	})
	c.caughtUp(t)
}

// caughtUp waits until every standby has flushed the WAL the primary has
// written so far.
func (c *pgCluster) caughtUp(t *testing.T) {
	t.Helper()
	var target string
	require.NoError(t, c.queryRow(`SELECT pg_current_wal_lsn()::text`, &target))
	eventually(t, 30*time.Second, func() error {
		var flushed bool
		if err := c.queryRowArgs(`SELECT COALESCE(bool_and(flush_lsn >= $1::pg_lsn), false) FROM pg_stat_replication`, []any{target}, &flushed); err != nil {
			return err
		}
		if !flushed {
			return fmt.Errorf("the standbys have not flushed %s yet", target)
		}
		return nil
	})
}

// kill stops the primary with an immediate shutdown (SIGQUIT, as pg_ctl
// stop -m immediate): no checkpoint, WAL senders end at once.
func (c *pgCluster) kill(t *testing.T) {
	t.Helper()
	require.NoError(t, c.nodes[c.primary].Stop(syscall.SIGQUIT))
}

// promote promotes the standby (pg_ctl promote), which becomes the
// primary, with no synchronous standby until rebuild names one.
func (c *pgCluster) promote(t *testing.T) {
	t.Helper()
	c.primary = c.standby()
	require.NoError(t, c.nodes[c.primary].Promote())
	if c.sync {
		c.exec(t, "ALTER SYSTEM RESET synchronous_standby_names")
		c.exec(t, "SELECT pg_reload_conf()")
	}
}

// rebuild replaces the dead old primary with a new standby of the new
// primary, in the same slot and on the same port: pg_basebackup into a
// fresh directory (the old one is removed).
func (c *pgCluster) rebuild(t *testing.T) {
	t.Helper()
	slot := c.standby()
	port := c.nodes[slot].Port()
	c.nodes[slot].Close()
	c.nodes[slot] = nil
	c.addStandby(t, slot, port)
}

func (c *pgCluster) exec(t *testing.T, sql string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.primaryDSN())
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, sql)
	require.NoError(t, err, "%s", sql)
}

// queryRow runs a query on the primary and scans its one row into dest;
// queryRowArgs, the same with arguments.
func (c *pgCluster) queryRow(sql string, dest ...any) error {
	return c.queryRowArgs(sql, nil, dest...)
}

func (c *pgCluster) queryRowArgs(sql string, args []any, dest ...any) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.primaryDSN())
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	return conn.QueryRow(ctx, sql, args...).Scan(dest...)
}

// timedLog records the message and time of every log record, for the
// moments a relay logged an outage's start and end.
type timedLog struct {
	mu   sync.Mutex
	recs []timedRecord
}

type timedRecord struct {
	at    time.Time
	level slog.Level
	msg   string
	attrs string
}

func (l *timedLog) logger() *slog.Logger { return slog.New(timedHandler{l}) }

// firstAfter returns the time of the first record after t whose message
// contains substr.
func (l *timedLog) firstAfter(t time.Time, substr string) (time.Time, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, r := range l.recs {
		if r.at.After(t) && strings.Contains(r.msg, substr) {
			return r.at, true
		}
	}
	return time.Time{}, false
}

// count returns how many records' messages contain substr.
func (l *timedLog) count(substr string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, r := range l.recs {
		if strings.Contains(r.msg, substr) {
			n++
		}
	}
	return n
}

// errors returns the messages of the records at Error level or above, but
// those containing one of allowed.
func (l *timedLog) errors(allowed ...string) []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []string
next:
	for _, r := range l.recs {
		if r.level < slog.LevelError {
			continue
		}
		for _, a := range allowed {
			if strings.Contains(r.msg, a) {
				continue next
			}
		}
		out = append(out, r.msg)
	}
	return out
}

type timedHandler struct{ l *timedLog }

func (h timedHandler) Enabled(context.Context, slog.Level) bool { return true }

func (h timedHandler) Handle(_ context.Context, r slog.Record) error {
	h.l.mu.Lock()
	var attrs strings.Builder
	r.Attrs(func(a slog.Attr) bool {
		fmt.Fprintf(&attrs, " %s=%v", a.Key, a.Value)
		return true
	})
	h.l.recs = append(h.l.recs, timedRecord{at: time.Now(), level: r.Level, msg: r.Message, attrs: attrs.String()})
	h.l.mu.Unlock()
	return nil
}

func (h timedHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h timedHandler) WithGroup(string) slog.Handler      { return h }
