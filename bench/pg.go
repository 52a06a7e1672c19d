package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/gorm-outbox/outbox"
	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" database/sql driver, as gorm.io/driver/postgres uses
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
)

const pgDSNEnv = "OUTBOX_TEST_POSTGRES_DSN"

// pgServer is the PostgreSQL named by OUTBOX_TEST_POSTGRES_DSN, with a
// schema of the benchmark's own that close drops.
type pgServer struct {
	dsn     string  // the given DSN with search_path set to schema
	schema  string  // outbox_bench_<random>
	admin   *sql.DB // on the given DSN; creates and drops the schema
	maxIdle int     // idle connections each pool keeps; 0: database/sql's default of 2
}

func newPG(ctx context.Context, dsn string, asyncCommit bool, maxIdle int) (*pgServer, error) {
	admin, err := sql.Open("pgx", dsn)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", pgDSNEnv, err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	if err := admin.PingContext(pctx); err != nil {
		_ = admin.Close()
		return nil, fmt.Errorf("%s is set but PostgreSQL does not answer: %w", pgDSNEnv, err)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	p := &pgServer{admin: admin, schema: "outbox_bench_" + hex.EncodeToString(b), maxIdle: maxIdle}
	if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+p.schema); err != nil {
		_ = admin.Close()
		return nil, fmt.Errorf("create schema: %w", err)
	}
	u, err := url.Parse(dsn)
	if err == nil && u.Scheme == "" {
		err = errors.New("no scheme")
	}
	if err != nil {
		_ = p.close()
		return nil, fmt.Errorf("%s must be a URL (postgres://...): %w", pgDSNEnv, err)
	}
	q := u.Query()
	q.Set("search_path", p.schema)
	if asyncCommit {
		// A startup parameter: every session of every pool gets it.
		q.Set("synchronous_commit", "off")
	}
	u.RawQuery = q.Encode()
	p.dsn = u.String()
	return p, nil
}

func (p *pgServer) close() error {
	// A fresh context: the run's may be cancelled (Ctrl-C), and the
	// schema must go all the same.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var err error
	if _, derr := p.admin.ExecContext(ctx, "DROP SCHEMA IF EXISTS "+p.schema+" CASCADE"); derr != nil {
		err = fmt.Errorf("drop schema %s: %w", p.schema, derr)
	}
	_ = p.admin.Close()
	return err
}

func (p *pgServer) name() string { return "postgres" }

func (p *pgServer) open() (*gorm.DB, error) { return p.openIdle(p.maxIdle) }

// openIdle is open with the pool keeping maxIdle idle connections (0:
// database/sql's default of 2). With fewer idle slots than goroutines using
// the pool, every release past the limit closes a connection and the next
// acquire opens one (a new PostgreSQL backend): that churn, not the work
// under test, would dominate.
func (p *pgServer) openIdle(maxIdle int) (*gorm.DB, error) {
	db, err := gorm.Open(postgres.Open(p.dsn), gormCfg())
	if err != nil {
		return nil, fmt.Errorf("open postgres: %w", err)
	}
	if maxIdle > 0 {
		sqlDB(db).SetMaxIdleConns(maxIdle)
	}
	return db, nil
}

func (p *pgServer) openSQL() (*sql.DB, error) {
	db, err := sql.Open("pgx", p.dsn)
	if err != nil {
		return nil, fmt.Errorf("open postgres: %w", err)
	}
	if p.maxIdle > 0 {
		db.SetMaxIdleConns(p.maxIdle)
	}
	return db, nil
}

func (p *pgServer) quote(table string) string { return `"` + table + `"` }

func (p *pgServer) clear(ctx context.Context, db *sql.DB, tables ...string) error {
	q := make([]string, len(tables))
	for i, t := range tables {
		q[i] = p.quote(t)
	}
	return exec(ctx, db, "TRUNCATE "+strings.Join(q, ", ")+" RESTART IDENTITY")
}

func (p *pgServer) floorInsert(table string) (string, int) {
	return `INSERT INTO ` + table + ` (id, event_type, aggregate_type, aggregate_id, idempotency_key, payload,
		status, attempts, available_at, occurred_at, created_at, updated_at)
		VALUES ($1, $2, $3, $4, $5, $6, 'pending', 0, $7, $7, $7, $7)`, 1
}

func (p *pgServer) timeArg(t time.Time) any { return t }

func (p *pgServer) fill(ctx context.Context, db *sql.DB, table string, n int, status outbox.Status) error {
	sentAt := "NULL"
	if status == outbox.StatusSent {
		sentAt = "t0 + g * interval '1 microsecond'"
	}
	prefix := string(status)[:1]
	q := `INSERT INTO "` + table + `" (id, event_type, aggregate_type, aggregate_id, idempotency_key, payload, headers,
		status, attempts, available_at, occurred_at, created_at, updated_at, sent_at)
	SELECT '` + prefix + `' || lpad(g::text, 10, '0'), 'order.created', 'order', g::text, '` + prefix + `' || lpad(g::text, 10, '0'),
		jsonb_build_object('order_id', g, 'total', 42), NULL,
		'` + string(status) + `', 0, t0 + g * interval '1 microsecond', t0, t0 + g * interval '1 microsecond', t0, ` + sentAt + `
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

// The floors' SQL. The claim is the library's PostgreSQL claim (built by
// claimUpdate in dialect.go; not exported, so copied here: keep the two in
// step), returning the columns the floor uses (the library's also returns
// seq). $1 lease end, $2 now, $3 batch size.
const (
	pgClaim = `UPDATE "%[1]s" SET locked_until = $1, attempts = attempts + 1, updated_at = $2
		WHERE id IN (SELECT c.id FROM "%[1]s" c WHERE c.status = 'pending' AND c.available_at <= $2
			AND (c.locked_until IS NULL OR c.locked_until <= $2) ORDER BY c.available_at, c.seq LIMIT $3 FOR UPDATE SKIP LOCKED)
		RETURNING ` + floorColumns
	pgMark = `UPDATE "%[1]s" SET status = 'sent', sent_at = $1, updated_at = $1, locked_until = NULL, last_error = NULL
		WHERE id = ANY($3) AND locked_until = $2 AND status = 'pending'`
	pgOneStep = `UPDATE "%[1]s" SET status = 'sent', sent_at = $1, updated_at = $1, attempts = attempts + 1
		WHERE id IN (SELECT c.id FROM "%[1]s" c WHERE c.status = 'pending' AND c.available_at <= $1
			ORDER BY c.available_at, c.seq LIMIT $2 FOR UPDATE SKIP LOCKED)
		RETURNING ` + floorColumns
)

func (p *pgServer) floorClaim(ctx context.Context, db *sql.DB, table string, batch int, now, lease time.Time) ([]floorRow, error) {
	rows, err := db.QueryContext(ctx, fmt.Sprintf(pgClaim, table), lease, now, batch)
	if err != nil {
		return nil, err
	}
	return scanFloor(rows)
}

func (p *pgServer) floorMark(ctx context.Context, db *sql.DB, table string, ids []string, lease time.Time) error {
	_, err := db.ExecContext(ctx, fmt.Sprintf(pgMark, table), time.Now().UTC(), lease, ids)
	return err
}

func (p *pgServer) floorOneStep(ctx context.Context, db *sql.DB, table string, batch int, deliver func([]floorRow)) (int, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback() }() // after Commit: a no-op
	rows, err := tx.QueryContext(ctx, fmt.Sprintf(pgOneStep, table), time.Now().UTC(), batch)
	if err != nil {
		return 0, err
	}
	rs, err := scanFloor(rows)
	if err != nil {
		return 0, err
	}
	deliver(rs)
	return len(rs), tx.Commit()
}

func (p *pgServer) oneStepName() string { return "one-step UPDATE…RETURNING, deliver in tx" }

func (p *pgServer) floorNotes() string { return "" }

func (p *pgServer) probeMetric() string { return "EXPLAIN ANALYZE execution time" }

// probeClaim runs the claim under EXPLAIN ANALYZE five times, each in a
// transaction rolled back (the claim is executed, then undone), and returns
// the median execution time and the indexes the plan read.
func (p *pgServer) probeClaim(ctx context.Context, db *sql.DB, table string, batch int) (float64, string, error) {
	var (
		times series
		plan  string
	)
	for range 5 {
		ms, idx, err := func() (float64, string, error) {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return 0, "", err
			}
			defer func() { _ = tx.Rollback() }()
			now := time.Now().UTC()
			var raw []byte
			err = tx.QueryRowContext(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+fmt.Sprintf(pgClaim, table),
				now.Add(time.Minute), now, batch).Scan(&raw)
			if err != nil {
				return 0, "", fmt.Errorf("explain claim on %s: %w", table, err)
			}
			var out []struct {
				Plan      any     `json:"Plan"`
				Execution float64 `json:"Execution Time"`
			}
			if err := json.Unmarshal(raw, &out); err != nil {
				return 0, "", fmt.Errorf("explain claim on %s: decode plan: %w", table, err)
			}
			if len(out) == 0 {
				return 0, "", fmt.Errorf("explain claim on %s: empty plan %.200s", table, raw)
			}
			var idx []string
			planIndexes(out[0].Plan, &idx)
			slices.Sort(idx)
			return out[0].Execution, "indexes read: " + strings.Join(idx, ", "), nil
		}()
		if err != nil {
			return 0, "", err
		}
		times = append(times, ms)
		plan = idx
	}
	return times.median(), plan, nil
}

// planIndexes collects the distinct "Index Name"s of a JSON plan.
func planIndexes(node any, out *[]string) {
	switch n := node.(type) {
	case map[string]any:
		if s, ok := n["Index Name"].(string); ok && !slices.Contains(*out, s) {
			*out = append(*out, s)
		}
		for _, v := range n {
			planIndexes(v, out)
		}
	case []any:
		for _, v := range n {
			planIndexes(v, out)
		}
	}
}
