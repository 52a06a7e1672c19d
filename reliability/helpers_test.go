package reliability

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

const postgresDSNEnv = "OUTBOX_TEST_POSTGRES_DSN"

// recommendedSQLite is the SQLite DSN suffix the README recommends for
// concurrent use: WAL, a busy timeout, and transactions that take the write
// lock when they begin.
const recommendedSQLite = outbox.SQLiteDSNOptions

// postgresDSN returns OUTBOX_TEST_POSTGRES_DSN, skipping the test when it is
// unset and failing it when the server cannot be reached.
func postgresDSN(t testing.TB) string {
	t.Helper()
	dsn := os.Getenv(postgresDSNEnv)
	if dsn == "" {
		noteSkip(postgresDSNEnv+" is not set", t.Name())
		t.Skipf("%s is not set; set it (e.g. postgres://postgres@127.0.0.1:5432/test?sslmode=disable) to run the PostgreSQL reliability tests", postgresDSNEnv)
	}
	db := openGorm(t, postgres.Open(dsn))
	sqlDB, err := db.DB()
	require.NoError(t, err)
	require.NoError(t, sqlDB.Ping(), "%s is set but PostgreSQL is unreachable", postgresDSNEnv)
	return dsn
}

// postgresSchema creates a schema of its own for the test, dropped at the
// end, and returns a DSN whose search_path points at it.
func postgresSchema(t testing.TB) string {
	t.Helper()
	dsn := postgresDSN(t)
	admin := openGorm(t, postgres.Open(dsn))
	schema := "rel_" + randomHex(6)
	require.NoError(t, admin.Exec("CREATE SCHEMA "+schema).Error)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		_ = admin.WithContext(ctx).Exec("DROP SCHEMA " + schema + " CASCADE").Error
	})
	return withParam(t, dsn, "search_path", schema)
}

// withParam adds a query parameter to a URL-form DSN.
func withParam(t testing.TB, dsn, key, value string) string {
	t.Helper()
	u, err := url.Parse(dsn)
	require.NoError(t, err, "%s must be a URL (postgres://...)", postgresDSNEnv)
	q := u.Query()
	q.Set(key, value)
	u.RawQuery = q.Encode()
	return u.String()
}

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// openGorm opens a database closed at the end of the test, with GORM's
// logger silenced.
func openGorm(t testing.TB, d gorm.Dialector) *gorm.DB {
	t.Helper()
	db, err := gorm.Open(d, &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	return db
}

// sqliteFile returns a fresh SQLite database file path in the test's temp
// directory.
func sqliteFile(t testing.TB) string {
	return filepath.Join(t.TempDir(), "outbox.db")
}

// backend is a database the backend-independent tests run on.
type backend struct {
	name string
	open func(t *testing.T) *gorm.DB
}

// backends returns SQLite (always) and PostgreSQL (skipped in its subtest
// when OUTBOX_TEST_POSTGRES_DSN is unset).
func backends() []backend {
	return []backend{
		{name: "sqlite", open: func(t *testing.T) *gorm.DB {
			return openGorm(t, sqlite.Open("file:"+sqliteFile(t)+recommendedSQLite))
		}},
		{name: "postgres", open: func(t *testing.T) *gorm.DB {
			return openGorm(t, postgres.Open(postgresSchema(t)))
		}},
	}
}

// install creates an outbox in persistent mode on db with cfg, failing the
// test on error.
func install(t testing.TB, db *gorm.DB, cfg outbox.Config) *outbox.Outbox {
	t.Helper()
	ob := outbox.Plugin(cfg)
	require.NoError(t, db.Use(ob))
	return ob
}

// logSink captures everything logged through its loggers, as text, and
// counts records by message.
type logSink struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	msgs []string
}

func newLogSink() *logSink { return &logSink{} }

// logger returns a logger at Debug level writing into the sink.
func (s *logSink) logger() *slog.Logger {
	return slog.New(&sinkHandler{s: s, h: slog.NewTextHandler(lockedWriter{s}, &slog.HandlerOptions{Level: slog.LevelDebug})})
}

// Write lets the sink be the writer of other loggers (GORM's).
func (s *logSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *logSink) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// count returns how many records' messages contain substr.
func (s *logSink) count(substr string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, m := range s.msgs {
		if strings.Contains(m, substr) {
			n++
		}
	}
	return n
}

type lockedWriter struct{ s *logSink }

// Write is called by the text handler while sinkHandler holds the lock.
func (w lockedWriter) Write(p []byte) (int, error) { return w.s.buf.Write(p) }

type sinkHandler struct {
	s *logSink
	h slog.Handler
}

func (h *sinkHandler) Enabled(ctx context.Context, l slog.Level) bool { return h.h.Enabled(ctx, l) }

func (h *sinkHandler) Handle(ctx context.Context, r slog.Record) error {
	h.s.mu.Lock()
	defer h.s.mu.Unlock()
	h.s.msgs = append(h.s.msgs, r.Message)
	return h.h.Handle(ctx, r)
}

func (h *sinkHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &sinkHandler{s: h.s, h: h.h.WithAttrs(attrs)}
}

func (h *sinkHandler) WithGroup(name string) slog.Handler {
	return &sinkHandler{s: h.s, h: h.h.WithGroup(name)}
}

// deliveries counts deliveries per event ID; its handle method is a
// concurrency-safe outbox.Handler.
type deliveries struct {
	mu sync.Mutex
	n  map[string]int
}

func newDeliveries() *deliveries { return &deliveries{n: map[string]int{}} }

func (d *deliveries) handle(_ context.Context, e outbox.Event) error {
	d.mu.Lock()
	d.n[e.ID]++
	d.mu.Unlock()
	return nil
}

func (d *deliveries) count(id string) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.n[id]
}

// summary returns the number of distinct events delivered and of redundant
// deliveries (every delivery after an event's first).
func (d *deliveries) summary() (distinct, duplicates int) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, n := range d.n {
		distinct++
		duplicates += n - 1
	}
	return distinct, duplicates
}

// statusCounts returns the number of outbox rows per status.
func statusCounts(t testing.TB, db *gorm.DB, table string) map[outbox.Status]int64 {
	t.Helper()
	var rows []struct {
		Status outbox.Status
		N      int64
	}
	require.NoError(t, db.Table(table).Select("status, count(*) AS n").Group("status").Scan(&rows).Error)
	out := map[outbox.Status]int64{}
	for _, r := range rows {
		out[r.Status] = r.N
	}
	return out
}

// drain runs ProcessOnce until no row is pending, within timeout. Claimed
// rows of a dead or cut-off relay become due when their lease expires, so
// timeout must exceed the lease.
func drain(t testing.TB, db *gorm.DB, table string, r *outbox.Relay, timeout time.Duration) {
	t.Helper()
	eventually(t, timeout, func() error {
		for {
			n, err := r.ProcessOnce(context.Background())
			if err != nil {
				return fmt.Errorf("relay: %w", err)
			}
			if n == 0 {
				break
			}
		}
		var pending int64
		if err := db.Table(table).Where("status = ?", outbox.StatusPending).Count(&pending).Error; err != nil {
			return err
		}
		if pending > 0 {
			return fmt.Errorf("%d rows still pending", pending)
		}
		return nil
	})
}

// eventually polls cond in the test's goroutine until it returns nil, and
// fails the test with cond's last error after timeout, scaled by the
// machine's slowdown (bound).
func eventually(t testing.TB, timeout time.Duration, cond func() error) {
	t.Helper()
	start := time.Now()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		err := cond()
		if err == nil {
			return
		}
		if limit := bound(t, timeout); time.Since(start) > limit {
			t.Fatalf("condition not met within %v (%v, slowdown %.1f): %v", limit.Round(time.Millisecond), timeout, slowdown(), err)
		}
		<-tick.C
	}
}

func noBackoff(int) time.Duration { return 0 }
