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

	"github.com/google/uuid"
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

// floorInsert is the INSERT the library runs for a generated event (InsertRows
// in sqlbuild.go, without its RETURNING seq, which only DeliverAfterCommit
// needs): the ID as a uuid, available_at NULL (due at once, found by seq),
// created_at NULL (= occurred_at), named_id and idempotency_key NULL.
func (p *pgServer) floorInsert(table string) (string, int) {
	return `INSERT INTO ` + table + ` (id, named_id, event_type, aggregate_type, aggregate_id, idempotency_key, payload,
		headers, available_at, occurred_at, created_at)
		VALUES ($1::uuid, NULL, $2, $3, $4, NULL, $5, NULL, NULL, $6, NULL)`, 1
}

func (p *pgServer) idArg(id uuid.UUID) any { return id.String() }

func (p *pgServer) timeArg(t time.Time) any { return t }

// pgUUIDv7 is a UUIDv7 of the time ts (a timestamptz expression) in SQL:
// PostgreSQL 15 has no uuidv7(). The first 48 bits are the Unix time in
// milliseconds, the version nibble is turned from gen_random_uuid's 4 into
// 7 (bits 52 and 53), the rest stays random.
func pgUUIDv7(ts string) string {
	return "encode(set_bit(set_bit(overlay(uuid_send(gen_random_uuid()) placing substring(int8send(floor(extract(epoch from " + ts +
		") * 1000)::bigint) from 3) from 1 for 6), 52, 1), 53, 1), 'hex')::uuid"
}

func (p *pgServer) fill(ctx context.Context, db *sql.DB, table string, n int, k fillKind) error {
	const ts = "t0 + g * interval '1 microsecond'"
	cols := "id, event_type, aggregate_type, aggregate_id, payload, occurred_at"
	vals := pgUUIDv7(ts) + ", 'order.created', 'order', g::text, jsonb_build_object('order_id', g, 'total', 42), " + ts
	switch k {
	case fillSent:
		cols += ", status, attempts, updated_at, sent_at"
		vals += ", 'sent', 1, " + ts + " + interval '1 millisecond', " + ts + " + interval '1 millisecond'"
	case fillBackoff:
		cols += ", attempts, last_error, available_at, updated_at"
		vals += ", 1, 'bench: handler failed', now() + interval '1 hour' + g * interval '1 microsecond', now()"
	}
	q := `INSERT INTO "` + table + `" (` + cols + `)
	SELECT ` + vals + `
	FROM (SELECT now() - interval '1 day' AS t0) t, generate_series(1, $1::int) g`
	if _, err := db.ExecContext(ctx, q, n); err != nil {
		return fmt.Errorf("fill %s with %d %s rows: %w", table, n, k, err)
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

// pgIDCol reads a row's event ID as the library does (Syntax.IDCol in
// postgres.go).
const pgIDCol = "COALESCE(named_id, id::text)"

// The floors' SQL. The claim is the library's PostgreSQL claim (ClaimUpdate
// in sqlbuild.go; internal, so copied here: keep the two in step), without
// the sources the floor has no use for (the seqs of a watermark's gaps:
// floorWM has none): the rows waiting for a retry that are due (the retry
// index), then the new rows from the watermark on (the primary key), at
// most batch of both together. $1 lease end, $2 now, $3 the watermark;
// the batch size is a literal. Like the library's, the claim sets only the
// lease and the attempt, no indexed column, so that it can be a HOT update.
const (
	// The row count is a literal (%[3]d) and the watermark ($3) sits behind
	// a scalar subquery, as the library writes them, so that PostgreSQL
	// keeps one generic plan instead of planning every claim
	// (BENCHMARKS.md, the lean row).
	pgClaim = `WITH r AS (SELECT c.seq FROM "%[1]s" c WHERE c.available_at <= $2
			AND c.status = 'pending' AND (c.locked_until IS NULL OR c.locked_until <= $2)
			ORDER BY c.available_at LIMIT %[3]d FOR UPDATE SKIP LOCKED),
		f AS (SELECT c.seq FROM "%[1]s" c WHERE c.seq >= (SELECT $3::bigint) AND c.available_at IS NULL
			AND c.status = 'pending' AND (c.locked_until IS NULL OR c.locked_until <= $2)
			ORDER BY c.seq LIMIT %[3]d FOR UPDATE SKIP LOCKED)
		UPDATE "%[1]s" SET locked_until = $1, attempts = attempts + 1
		WHERE seq IN (SELECT seq FROM (SELECT seq FROM r UNION ALL SELECT seq FROM f) u LIMIT %[3]d)
		RETURNING ` + "%[2]s"
	// %[2]s is "= ANY($3)", or "= $3" for one row (a generic plan of
	// = ANY assumes ten elements, so one row's mark was planned per call).
	pgMark = `UPDATE "%[1]s" SET status = 'sent', sent_at = $1, updated_at = $1, locked_until = NULL, last_error = NULL
		WHERE seq %[2]s AND locked_until = $2 AND status = 'pending'`
	// $1 now, $2 batch size, $3 the watermark.
	pgOneStep = `WITH r AS (SELECT c.seq FROM "%[1]s" c WHERE c.available_at <= $1 AND c.status = 'pending'
			ORDER BY c.available_at LIMIT $2 FOR UPDATE SKIP LOCKED),
		f AS (SELECT c.seq FROM "%[1]s" c WHERE c.seq >= $3 AND c.available_at IS NULL AND c.status = 'pending'
			ORDER BY c.seq LIMIT $2 FOR UPDATE SKIP LOCKED)
		UPDATE "%[1]s" SET status = 'sent', sent_at = $1, updated_at = $1, attempts = attempts + 1
		WHERE seq IN (SELECT seq FROM (SELECT seq FROM r UNION ALL SELECT seq FROM f) u LIMIT $2)
		RETURNING ` + "%[2]s"
)

// floorStart is where a library relay's first sweep puts its watermark
// (LowOpen in sqlbuild.go, one scan of the table): the lowest new pending
// row, else past the highest seq.
func (p *pgServer) floorStart(ctx context.Context, db *sql.DB, table string) (*floorWM, error) {
	var from int64
	err := db.QueryRowContext(ctx, `SELECT COALESCE(MIN(seq) FILTER (WHERE status = 'pending' AND available_at IS NULL), MAX(seq) + 1, 1) FROM "`+table+`"`).Scan(&from)
	if err != nil {
		return nil, fmt.Errorf("floor watermark of %s: %w", table, err)
	}
	return newFloorWM(from), nil
}

func (p *pgServer) floorClaim(ctx context.Context, db *sql.DB, table string, wm *floorWM, batch int, now, lease time.Time) ([]floorRow, error) {
	rows, err := db.QueryContext(ctx, fmt.Sprintf(pgClaim, table, floorColumns(pgIDCol), batch), lease, now, wm.low())
	if err != nil {
		return nil, err
	}
	rs, err := scanFloor(rows)
	if err != nil {
		return nil, err
	}
	wm.claimed(rs)
	return rs, nil
}

func (p *pgServer) floorMark(ctx context.Context, db *sql.DB, table string, seqs []int64, lease time.Time) error {
	if len(seqs) == 1 {
		_, err := db.ExecContext(ctx, fmt.Sprintf(pgMark, table, "= $3"), time.Now().UTC(), lease, seqs[0])
		return err
	}
	_, err := db.ExecContext(ctx, fmt.Sprintf(pgMark, table, "= ANY($3)"), time.Now().UTC(), lease, seqs)
	return err
}

func (p *pgServer) floorOneStep(ctx context.Context, db *sql.DB, table string, wm *floorWM, batch int, deliver func([]floorRow)) (int, error) {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return 0, err
	}
	defer func() { _ = tx.Rollback() }() // after Commit: a no-op
	rows, err := tx.QueryContext(ctx, fmt.Sprintf(pgOneStep, table, floorColumns(pgIDCol)), time.Now().UTC(), batch, wm.low())
	if err != nil {
		return 0, err
	}
	rs, err := scanFloor(rows)
	if err != nil {
		return 0, err
	}
	deliver(rs)
	if err := tx.Commit(); err != nil {
		return 0, err
	}
	wm.claimed(rs)
	return len(rs), nil
}

func (p *pgServer) oneStepName() string { return "one-step UPDATE…RETURNING, deliver in tx" }

func (p *pgServer) floorNotes() string { return "" }

func (p *pgServer) probeMetric() string { return "EXPLAIN ANALYZE execution time" }

// probeClaim runs the claim under EXPLAIN ANALYZE five times, each in a
// transaction rolled back (the claim is executed, then undone), and returns
// the median execution time and the indexes the plan read. The watermark
// is where a relay's sweep would put it, read first (not timed).
func (p *pgServer) probeClaim(ctx context.Context, db *sql.DB, table string, batch int) (float64, string, error) {
	var (
		times series
		plan  string
	)
	wm, err := p.floorStart(ctx, db, table)
	if err != nil {
		return 0, "", err
	}
	for range 5 {
		ms, idx, err := func() (float64, string, error) {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return 0, "", err
			}
			defer func() { _ = tx.Rollback() }()
			now := time.Now().UTC()
			var raw []byte
			err = tx.QueryRowContext(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+fmt.Sprintf(pgClaim, table, floorColumns(pgIDCol), batch),
				now.Add(time.Minute), now, wm.low()).Scan(&raw)
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

// The range floor's SQL: a lease per batch instead of per row, for a schema
// this release does not have (BENCHMARKS.md, "The database's part"). A
// counter row hands each claim the next range of batch seqs, and a row of
// the leases table holds the range while it is delivered; the events' rows
// are read, not updated, and updated once, by the mark, which drops the
// lease in the same statement. It assumes what a benchmark's backlog gives:
// every seq below the counter committed. A real design would also have to
// find the seqs of transactions that commit late, and ranges whose lease
// expired. %[1]s is the events' table, %[2]d the batch size.
const (
	pgRangeCursor = `CREATE TABLE IF NOT EXISTS "%[1]s_cursor" (one int PRIMARY KEY, next bigint NOT NULL)`
	pgRangeLeases = `CREATE TABLE IF NOT EXISTS "%[1]s_leases" (lo bigint PRIMARY KEY, until timestamptz NOT NULL)`
	// $1 the first seq.
	pgRangeStart = `INSERT INTO "%[1]s_cursor" VALUES (1, $1) ON CONFLICT (one) DO UPDATE SET next = $1`
	// $1 the lease's end.
	pgRangeLease = `WITH k AS (UPDATE "%[1]s_cursor" SET next = next + %[2]d WHERE one = 1 RETURNING next - %[2]d AS lo)
		INSERT INTO "%[1]s_leases" SELECT lo, $1 FROM k RETURNING lo`
	// $1 the range's first seq; %[3]s the columns.
	pgRangeRead = `SELECT %[3]s FROM "%[1]s" WHERE seq BETWEEN $1 AND $1 + %[2]d - 1 AND status = 'pending' ORDER BY seq`
	// $1 now, $2 the range's first seq.
	pgRangeMark = `WITH m AS (UPDATE "%[1]s" SET status = 'sent', sent_at = $1, updated_at = $1, attempts = attempts + 1, last_error = NULL
		WHERE seq BETWEEN $2 AND $2 + %[2]d - 1 AND status = 'pending' RETURNING 1)
		DELETE FROM "%[1]s_leases" WHERE lo = $2`
)

// rangeFloorRelay is floor c: each relay leases the next range of batch
// seqs, reads its pending rows, delivers them and marks them sent, until a
// range has no pending row (the backlog's seqs are 1..n). PostgreSQL only.
func rangeFloorRelay(p *pgServer, admin *sql.DB, table string, batch int) relayContender {
	loop := func(ctx context.Context, db *sql.DB, t *tally) error {
		lease := fmt.Sprintf(pgRangeLease, table, batch)
		read := fmt.Sprintf(pgRangeRead, table, batch, floorColumns(pgIDCol))
		mark := fmt.Sprintf(pgRangeMark, table, batch)
		for ctx.Err() == nil {
			var lo int64
			if err := db.QueryRowContext(ctx, lease, time.Now().UTC().Add(time.Minute)).Scan(&lo); err != nil {
				return err
			}
			rows, err := db.QueryContext(ctx, read, lo)
			if err != nil {
				return err
			}
			rs, err := scanFloor(rows)
			if err != nil || len(rs) == 0 {
				return err
			}
			floorDeliver(t, rs)
			if _, err := db.ExecContext(ctx, mark, time.Now().UTC(), lo); err != nil {
				return err
			}
		}
		return nil
	}
	return relayContender{
		name:  fmt.Sprintf("floor c, another schema: a lease per batch's seq range, deliver, mark (batch %d)", batch),
		batch: batch,
		kind:  "floor-range",
		fill: func(ctx context.Context, n int) error {
			for _, q := range []string{pgRangeCursor, pgRangeLeases} {
				if _, err := admin.ExecContext(ctx, fmt.Sprintf(q, table)); err != nil {
					return fmt.Errorf("range floor tables: %w", err)
				}
			}
			if err := p.clear(ctx, admin, table, table+"_leases"); err != nil {
				return err
			}
			return p.fill(ctx, admin, table, n, fillPending)
		},
		run: func(ctx context.Context, relays int, t *tally) error {
			start := func(ctx context.Context, db *sql.DB, wm *floorWM) error {
				if _, err := db.ExecContext(ctx, fmt.Sprintf(pgRangeStart, table), wm.low()); err != nil {
					return fmt.Errorf("range floor start: %w", err)
				}
				return nil
			}
			return runFloor(ctx, p, table, relays, start, func(ctx context.Context, db *sql.DB, _ *floorWM) error {
				return loop(ctx, db, t)
			})
		},
		notes: p.floorNotes,
	}
}
