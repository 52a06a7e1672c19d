package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/gorm-outbox/outbox"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver, as gorm.io/driver/postgres uses
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// env is where the benchmark runs: a PostgreSQL schema of its own and a
// temporary directory for SQLite files, both removed by close.
type env struct {
	baseDSN string
	dsn     string // baseDSN with search_path set to schema
	schema  string
	admin   *sql.DB // on baseDSN; creates and drops the schema
	dir     string
	sqliteN int
	maxIdle int // idle connections each pool keeps; 0: database/sql's default of 2
}

func newEnv(ctx context.Context, dsn string, asyncCommit bool, maxIdle int) (*env, error) {
	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", dsnEnv, err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := admin.PingContext(pctx); err != nil {
		_ = admin.Close()
		return nil, fmt.Errorf("%s is set but PostgreSQL does not answer: %w", dsnEnv, err)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	e := &env{baseDSN: dsn, admin: admin, schema: "outbox_bench_" + hex.EncodeToString(b), maxIdle: maxIdle}
	if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+e.schema); err != nil {
		_ = admin.Close()
		return nil, fmt.Errorf("create schema: %w", err)
	}
	u, err := url.Parse(dsn)
	if err == nil && u.Scheme == "" {
		err = errors.New("no scheme")
	}
	if err != nil {
		_ = e.close()
		return nil, fmt.Errorf("%s must be a URL (postgres://...): %w", dsnEnv, err)
	}
	q := u.Query()
	q.Set("search_path", e.schema)
	if asyncCommit {
		// A startup parameter: every session of every pool gets it.
		q.Set("synchronous_commit", "off")
	}
	u.RawQuery = q.Encode()
	e.dsn = u.String()
	if e.dir, err = os.MkdirTemp("", "outbox-bench-"); err != nil {
		_ = e.close()
		return nil, fmt.Errorf("temp dir: %w", err)
	}
	return e, nil
}

func (e *env) close() error {
	var err error
	if e.admin != nil {
		// A fresh context: the run's may be cancelled (Ctrl-C), and the
		// schema must go all the same.
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if _, derr := e.admin.ExecContext(ctx, "DROP SCHEMA IF EXISTS "+e.schema+" CASCADE"); derr != nil {
			err = fmt.Errorf("drop schema %s: %w", e.schema, derr)
		}
		_ = e.admin.Close()
	}
	if e.dir != "" {
		_ = os.RemoveAll(e.dir)
	}
	return err
}

// gormCfg returns a new config for every pool: gorm.Open keeps the pointer
// and registers plugins in it, so a shared one would install a plugin on
// every pool at once.
func gormCfg() *gorm.Config { return &gorm.Config{Logger: logger.Discard} }

// warnLogger is what the outbox logs to here: only warnings and errors, to
// stderr with the progress, so a failing contender is visible.
var warnLogger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

// openPG opens a new connection pool on the benchmark's schema.
func (e *env) openPG() (*gorm.DB, error) {
	return e.openPGIdle(e.maxIdle)
}

// openPGIdle is openPG with the pool keeping maxIdle idle connections (0:
// database/sql's default of 2). With fewer idle slots than goroutines using
// the pool, every release past the limit closes a connection and the next
// acquire opens one (a new PostgreSQL backend): that churn, not the work
// under test, would dominate.
func (e *env) openPGIdle(maxIdle int) (*gorm.DB, error) {
	db, err := gorm.Open(postgres.Open(e.dsn), gormCfg())
	if err != nil {
		return nil, fmt.Errorf("open postgres: %w", err)
	}
	if maxIdle > 0 {
		sqlDB(db).SetMaxIdleConns(maxIdle)
	}
	return db, nil
}

// openSQL opens a plain database/sql pool on the benchmark's schema, sized
// like openPG's.
func (e *env) openSQL() (*sql.DB, error) {
	db, err := sql.Open("pgx", e.dsn)
	if err != nil {
		return nil, fmt.Errorf("open postgres: %w", err)
	}
	if e.maxIdle > 0 {
		db.SetMaxIdleConns(e.maxIdle)
	}
	return db, nil
}

// newSQLitePath names a new SQLite file in the temporary directory.
func (e *env) newSQLitePath() string {
	e.sqliteN++
	return filepath.Join(e.dir, fmt.Sprintf("bench%d.db", e.sqliteN))
}

// openSQLite opens a pool on the SQLite file at path with the settings the
// README recommends for concurrent use.
func openSQLite(path string, maxIdle int) (*gorm.DB, error) {
	db, err := gorm.Open(sqlite.Open("file:"+path+"?_journal_mode=WAL&_busy_timeout=10000&_txlock=immediate"), gormCfg())
	if err != nil {
		return nil, fmt.Errorf("open sqlite: %w", err)
	}
	if maxIdle > 0 {
		sqlDB(db).SetMaxIdleConns(maxIdle)
	}
	return db, nil
}

func closeDB(db *gorm.DB) {
	if sqlDB, err := db.DB(); err == nil {
		_ = sqlDB.Close()
	}
}

func sqlDB(db *gorm.DB) *sql.DB {
	s, err := db.DB()
	if err != nil {
		// Only a *gorm.DB without a pool fails here, which none of ours is.
		panic(err)
	}
	return s
}

// createOutboxTable creates a table in the outbox's own format (the shipped
// DDL), so the hand-written floors pay for exactly the same columns and
// indexes.
func createOutboxTable(ctx context.Context, db *gorm.DB, table string) error {
	ddl, err := outbox.SchemaSQL(db.Dialector.Name(), table)
	if err != nil {
		return fmt.Errorf("schema for %s: %w", table, err)
	}
	for _, stmt := range strings.Split(ddl, ";") {
		if strings.TrimSpace(stripComments(stmt)) == "" {
			continue
		}
		if err := db.WithContext(ctx).Exec(stmt).Error; err != nil {
			return fmt.Errorf("create %s: %w", table, err)
		}
	}
	return nil
}

func stripComments(s string) string {
	var b strings.Builder
	for _, line := range strings.Split(s, "\n") {
		if i := strings.Index(line, "--"); i >= 0 {
			line = line[:i]
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}

// exec runs statements one by one on db.
func exec(ctx context.Context, db *sql.DB, stmts ...string) error {
	for _, s := range stmts {
		if _, err := db.ExecContext(ctx, s); err != nil {
			short := s
			if len(short) > 80 {
				short = short[:80] + "..."
			}
			return fmt.Errorf("%s: %w", short, err)
		}
	}
	return nil
}

// fillOutbox inserts n pending events into an outbox-format table in one
// statement, numbered from 1 (the number is the aggregate ID, which the
// handlers use to check that every event arrives once). Rows are 1 µs apart
// in available_at and created_at, oldest first, like a real backlog.
func fillOutbox(ctx context.Context, db *sql.DB, table string, n int, status string) error {
	sentAt := "NULL"
	if status == outbox.StatusSent {
		sentAt = "t0 + g * interval '1 microsecond'"
	}
	prefix := status[:1]
	q := `INSERT INTO "` + table + `" (id, event_type, aggregate_type, aggregate_id, idempotency_key, payload, headers,
		status, attempts, available_at, occurred_at, created_at, updated_at, sent_at)
	SELECT '` + prefix + `' || lpad(g::text, 10, '0'), 'order.created', 'order', g::text, '` + prefix + `' || lpad(g::text, 10, '0'),
		jsonb_build_object('order_id', g, 'total', 42), NULL,
		'` + status + `', 0, t0 + g * interval '1 microsecond', t0, t0 + g * interval '1 microsecond', t0, ` + sentAt + `
	FROM generate_series(1, $1::int) g, (SELECT now() - interval '1 day' AS t0) t`
	if _, err := db.ExecContext(ctx, q, n); err != nil {
		return fmt.Errorf("fill %s with %d %s rows: %w", table, n, status, err)
	}
	return vacuum(ctx, db, table)
}

// vacuum gives every contender the same starting point after a bulk fill:
// statistics for the planner and hint bits set, as autovacuum would soon.
func vacuum(ctx context.Context, db *sql.DB, tables ...string) error {
	for _, t := range tables {
		if _, err := db.ExecContext(ctx, `VACUUM ANALYZE "`+t+`"`); err != nil {
			return fmt.Errorf("vacuum %s: %w", t, err)
		}
	}
	return nil
}
