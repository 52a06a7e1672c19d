package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/google/uuid"
	"gorm.io/driver/mysql"
	"gorm.io/gorm"
)

const mysqlDSNEnv = "OUTBOX_TEST_MYSQL_DSN"

// mysqlServer is the MySQL or MariaDB named by OUTBOX_TEST_MYSQL_DSN, with
// a database of the benchmark's own that close drops.
type mysqlServer struct {
	dsn     string  // the given DSN on the benchmark's database
	db      string  // outbox_bench_<random>
	admin   *sql.DB // on the given DSN; creates and drops the database
	maxIdle int
	flavour string // mariadb or mysql
	version string

	retries, noted atomic.Int64 // floor claims retried after a deadlock or lock wait timeout; how many floorNotes reported
}

// newMySQL connects to the server and creates the benchmark's database. The
// DSN is used as given (GORM's documented form is
// user:pass@tcp(host:3306)/db?charset=utf8mb4&parseTime=True&loc=Local),
// with only the database name replaced.
func newMySQL(ctx context.Context, dsn string, maxIdle int) (*mysqlServer, error) {
	cfg, err := mysqldriver.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", mysqlDSNEnv, err)
	}
	admin, err := sql.Open("mysql", dsn)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", mysqlDSNEnv, err)
	}
	pctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	m := &mysqlServer{admin: admin, maxIdle: maxIdle}
	if err := admin.QueryRowContext(pctx, "SELECT VERSION()").Scan(&m.version); err != nil {
		_ = admin.Close()
		return nil, fmt.Errorf("%s is set but the server does not answer: %w", mysqlDSNEnv, err)
	}
	m.flavour = "mysql"
	if strings.Contains(strings.ToLower(m.version), "mariadb") {
		m.flavour = "mariadb"
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	m.db = "outbox_bench_" + hex.EncodeToString(b)
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+m.db); err != nil {
		_ = admin.Close()
		return nil, fmt.Errorf("create database: %w", err)
	}
	c := cfg.Clone()
	c.DBName = m.db
	m.dsn = c.FormatDSN()
	return m, nil
}

func (m *mysqlServer) close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var err error
	if _, derr := m.admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+m.db); derr != nil {
		err = fmt.Errorf("drop database %s: %w", m.db, derr)
	}
	_ = m.admin.Close()
	return err
}

func (m *mysqlServer) name() string { return m.flavour }

func (m *mysqlServer) open() (*gorm.DB, error) {
	db, err := gorm.Open(mysql.Open(m.dsn), gormCfg())
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", m.flavour, err)
	}
	if m.maxIdle > 0 {
		sqlDB(db).SetMaxIdleConns(m.maxIdle)
	}
	return db, nil
}

func (m *mysqlServer) openSQL() (*sql.DB, error) {
	db, err := sql.Open("mysql", m.dsn)
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", m.flavour, err)
	}
	if m.maxIdle > 0 {
		db.SetMaxIdleConns(m.maxIdle)
	}
	return db, nil
}

func (m *mysqlServer) quote(table string) string { return "`" + table + "`" }

func (m *mysqlServer) clear(ctx context.Context, db *sql.DB, tables ...string) error {
	for _, t := range tables {
		if err := exec(ctx, db, "TRUNCATE TABLE "+m.quote(t)); err != nil {
			return err
		}
	}
	return nil
}

// floorInsert is the INSERT the library runs for a generated event (InsertRows
// in sqlbuild.go): the ID as its 16 bytes, available_at written (MySQL finds
// due rows through its pending index), created_at NULL (= occurred_at),
// named_id and idempotency_key NULL. Two time placeholders: MySQL's ?
// cannot be referred to twice.
func (m *mysqlServer) floorInsert(table string) (string, int) {
	return "INSERT INTO " + m.quote(table) + ` (id, named_id, event_type, aggregate_type, aggregate_id, idempotency_key, payload,
		headers, available_at, occurred_at, created_at)
		VALUES (?, NULL, ?, ?, ?, NULL, ?, NULL, ?, ?, NULL)`, 2
}

func (m *mysqlServer) idArg(id uuid.UUID) any { return id[:] }

// mysqlTimeFormat is DATETIME(6)'s literal form. Times go as UTC text, as
// the library sends them: the driver would shift a time.Time by the DSN's
// loc.
const mysqlTimeFormat = "2006-01-02 15:04:05.000000"

func (m *mysqlServer) timeArg(t time.Time) any { return t.UTC().Format(mysqlTimeFormat) }

// fill writes its rows with one INSERT ... SELECT. The numbers come from a
// cross join of ten-row digit tables, as many as n needs (MySQL has no
// generate_series; MariaDB's sequence engine is not in MySQL, and recursive
// CTEs are capped at 1000 levels by default on both); ORDER BY g gives them
// their seqs in that order. The IDs are UUIDv7s of the rows' times: 48 bits
// of milliseconds, the version 7, the variant, random bits from MD5(RAND()).
func (m *mysqlServer) fill(ctx context.Context, db *sql.DB, table string, n int, k fillKind) error {
	now := time.Now().UTC()
	at := func(t time.Time) string { return "CAST('" + t.Format(mysqlTimeFormat) + "' AS DATETIME(6))" }
	start := now.Add(-24 * time.Hour)
	const ts = "t0 + INTERVAL g MICROSECOND"
	id := fmt.Sprintf("UNHEX(CONCAT(LPAD(HEX(%d + g DIV 1000), 12, '0'), '7', SUBSTR(r, 1, 3), SUBSTR('89ab', 1 + FLOOR(RAND() * 4), 1), SUBSTR(r, 4, 15)))",
		start.UnixMilli())
	cols := "id, event_type, aggregate_type, aggregate_id, payload, occurred_at, available_at"
	vals := id + ", 'order.created', 'order', CAST(g AS CHAR), JSON_OBJECT('order_id', g, 'total', 42), " + ts
	switch k {
	case fillPending:
		vals += ", " + ts
	case fillSent:
		cols += ", status, attempts, updated_at, sent_at"
		vals += ", " + ts + ", 'sent', 1, " + ts + " + INTERVAL 1000 MICROSECOND, " + ts + " + INTERVAL 1000 MICROSECOND"
	case fillBackoff:
		cols += ", attempts, last_error, updated_at"
		vals += ", " + at(now.Add(time.Hour)) + " + INTERVAL g MICROSECOND, 1, 'bench: handler failed', " + at(now)
	}
	const digits = "(SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3 UNION ALL SELECT 4" +
		" UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7 UNION ALL SELECT 8 UNION ALL SELECT 9)"
	g := "1"
	var from []string
	for i, mul := 0, 1; i == 0 || mul < n; i, mul = i+1, mul*10 {
		g += fmt.Sprintf(" + %d * d%d.d", mul, i)
		from = append(from, fmt.Sprintf("%s d%d", digits, i))
	}
	q := "INSERT INTO " + m.quote(table) + " (" + cols + ")" + `
	SELECT ` + vals + `
	FROM (SELECT ` + g + ` AS g, MD5(RAND()) AS r FROM ` + strings.Join(from, ", ") + `) s, (SELECT ` + at(start) + ` AS t0) t
	WHERE g <= ` + fmt.Sprint(n) + ` ORDER BY g`
	if _, err := db.ExecContext(ctx, q); err != nil {
		return fmt.Errorf("fill %s with %d %s rows: %w", table, n, k, err)
	}
	// Fresh statistics for the optimizer, as vacuum gives PostgreSQL's.
	return exec(ctx, db, "ANALYZE TABLE "+m.quote(table))
}

// mysqlClaimRetries is the library's claimRetries: how often a claim that
// lost a deadlock or a lock wait is tried again.
const mysqlClaimRetries = 5

// mysqlRetryable reports a deadlock (1213) or a lock wait timeout (1205),
// as the library's does.
func mysqlRetryable(err error) bool {
	var me *mysqldriver.MySQLError
	return errors.As(err, &me) && (me.Number == 1213 || me.Number == 1205)
}

// inList is an IN list of one placeholder per value, and the values as
// arguments.
func inList[T any](xs []T) (string, []any) {
	args := make([]any, len(xs))
	for i, x := range xs {
		args[i] = x
	}
	return "(" + strings.TrimSuffix(strings.Repeat("?, ", len(xs)), ", ") + ")", args
}

// mysqlIDCol reads a row's event ID as the library does (Syntax.IDCol in
// mysql.go: MariaDB has no BIN_TO_UUID).
const mysqlIDCol = "COALESCE(named_id, LOWER(CONCAT_WS('-', HEX(SUBSTR(id, 1, 4)), HEX(SUBSTR(id, 5, 2)), HEX(SUBSTR(id, 7, 2))," +
	" HEX(SUBSTR(id, 9, 2)), HEX(SUBSTR(id, 11, 6)))))"

// mysqlSelectDue is the library's selectDue (mysql.go), copied: keep the
// two in step. MySQL keeps its pending index (status, available_at, seq),
// which the claim reads as one range. It returns the library's columns,
// but reads the times as DATETIME (the library reads them as text).
// Arguments: now, now, batch size.
var mysqlSelectDue = "SELECT " + floorColumns(mysqlIDCol) + " FROM %s c WHERE c.available_at <= ? AND c.status = 'pending'" +
	" AND (c.locked_until IS NULL OR c.locked_until <= ?) ORDER BY c.available_at, c.seq LIMIT ? FOR UPDATE SKIP LOCKED"

// claimTx is the library's claim transaction (claimTx in mysql.go) by hand:
// at READ COMMITTED, lock the due rows skipping those another claim holds,
// then lease them by seq. The caller commits or rolls back.
func (m *mysqlServer) claimTx(ctx context.Context, tx *sql.Tx, table string, batch int, now, lease time.Time) ([]floorRow, error) {
	rows, err := tx.QueryContext(ctx, fmt.Sprintf(mysqlSelectDue, m.quote(table)), m.timeArg(now), m.timeArg(now), batch)
	if err != nil {
		return nil, err
	}
	rs, err := scanFloor(rows)
	if err != nil || len(rs) == 0 {
		return nil, err
	}
	in, seqs := inList(rowSeqs(rs))
	args := append([]any{m.timeArg(lease), m.timeArg(now)}, seqs...)
	if _, err := tx.ExecContext(ctx, "UPDATE "+m.quote(table)+
		" SET locked_until = ?, attempts = attempts + 1, updated_at = ? WHERE seq IN "+in, args...); err != nil {
		return nil, err
	}
	for i := range rs {
		rs[i].attempts++
	}
	return rs, nil
}

// retry runs f again after a deadlock or lock wait timeout, as the
// library's claim does, counting the retries.
func (m *mysqlServer) retry(ctx context.Context, f func() (int, error)) (int, error) {
	for attempt := 1; ; attempt++ {
		n, err := f()
		if err == nil || attempt == mysqlClaimRetries || !mysqlRetryable(err) || ctx.Err() != nil {
			return n, err
		}
		m.retries.Add(1)
	}
}

// floorStart: the floor's claim reads the pending index, not a watermark.
func (m *mysqlServer) floorStart(context.Context, *sql.DB, string) (*floorWM, error) { return nil, nil }

func (m *mysqlServer) floorClaim(ctx context.Context, db *sql.DB, table string, _ *floorWM, batch int, now, lease time.Time) ([]floorRow, error) {
	var rs []floorRow
	_, err := m.retry(ctx, func() (int, error) {
		tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
		if err != nil {
			return 0, err
		}
		defer func() { _ = tx.Rollback() }() // after Commit: a no-op
		if rs, err = m.claimTx(ctx, tx, table, batch, now, lease); err != nil {
			return 0, err
		}
		return len(rs), tx.Commit()
	})
	if err != nil {
		return nil, err
	}
	return rs, nil
}

func (m *mysqlServer) floorMark(ctx context.Context, db *sql.DB, table string, seqs []int64, lease time.Time) error {
	now := m.timeArg(time.Now())
	in, args := inList(seqs)
	args = append(append([]any{now, now}, args...), m.timeArg(lease))
	_, err := db.ExecContext(ctx, "UPDATE "+m.quote(table)+
		" SET status = 'sent', sent_at = ?, updated_at = ?, locked_until = NULL, last_error = NULL WHERE seq IN "+in+
		" AND locked_until = ? AND status = 'pending'", args...)
	return err
}

func (m *mysqlServer) floorOneStep(ctx context.Context, db *sql.DB, table string, _ *floorWM, batch int, deliver func([]floorRow)) (int, error) {
	return m.retry(ctx, func() (int, error) {
		tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
		if err != nil {
			return 0, err
		}
		defer func() { _ = tx.Rollback() }() // after Commit: a no-op
		now := m.timeArg(time.Now())
		rows, err := tx.QueryContext(ctx, fmt.Sprintf(mysqlSelectDue, m.quote(table)), now, now, batch)
		if err != nil {
			return 0, err
		}
		rs, err := scanFloor(rows)
		if err != nil || len(rs) == 0 {
			return 0, err
		}
		in, seqs := inList(rowSeqs(rs))
		if _, err := tx.ExecContext(ctx, "UPDATE "+m.quote(table)+
			" SET status = 'sent', sent_at = ?, updated_at = ?, attempts = attempts + 1 WHERE seq IN "+in,
			append([]any{now, now}, seqs...)...); err != nil {
			return 0, err
		}
		deliver(rs)
		return len(rs), tx.Commit()
	})
}

func (m *mysqlServer) oneStepName() string {
	return "one-step: SELECT…FOR UPDATE SKIP LOCKED, UPDATE to sent, deliver in tx"
}

func (m *mysqlServer) floorNotes() string {
	n := m.retries.Load()
	d := n - m.noted.Swap(n)
	if d == 0 {
		return ""
	}
	return fmt.Sprintf("%d floor claims retried after a deadlock or lock wait", d)
}

func (m *mysqlServer) probeMetric() string {
	return "claim time, client-side (SELECT…FOR UPDATE SKIP LOCKED + UPDATE at READ COMMITTED, rolled back)"
}

// probeClaim times the claim transaction's two statements from the client
// five times, each rolled back, and summarises the SELECT's plan: EXPLAIN's
// access type, key and estimated rows and, on MariaDB, what ANALYZE saw it
// read.
func (m *mysqlServer) probeClaim(ctx context.Context, db *sql.DB, table string, batch int) (float64, string, error) {
	var times series
	for range 5 {
		ms, err := func() (float64, error) {
			tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
			if err != nil {
				return 0, err
			}
			defer func() { _ = tx.Rollback() }()
			now := time.Now()
			start := time.Now()
			rs, err := m.claimTx(ctx, tx, table, batch, now, now.Add(time.Minute))
			if err != nil {
				return 0, fmt.Errorf("claim on %s: %w", table, err)
			}
			if len(rs) != batch {
				return 0, fmt.Errorf("claim on %s: %d rows, want %d", table, len(rs), batch)
			}
			return float64(time.Since(start)) / 1e6, nil
		}()
		if err != nil {
			return 0, "", err
		}
		times = append(times, ms)
	}
	plan, err := m.explainClaim(ctx, db, table, batch)
	return times.median(), plan, err
}

// explainClaim summarises the claim's SELECT plan.
func (m *mysqlServer) explainClaim(ctx context.Context, db *sql.DB, table string, batch int) (string, error) {
	tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelReadCommitted})
	if err != nil {
		return "", err
	}
	defer func() { _ = tx.Rollback() }()
	q := fmt.Sprintf(mysqlSelectDue, m.quote(table))
	now := m.timeArg(time.Now())
	rows, err := tx.QueryContext(ctx, "EXPLAIN "+q, now, now, batch)
	if err != nil {
		return "", fmt.Errorf("explain claim on %s: %w", table, err)
	}
	defer rows.Close()
	cols, err := rows.Columns()
	if err != nil {
		return "", err
	}
	var lines []string
	for rows.Next() {
		vals := make([]sql.NullString, len(cols))
		ptrs := make([]any, len(cols))
		for i := range vals {
			ptrs[i] = &vals[i]
		}
		if err := rows.Scan(ptrs...); err != nil {
			return "", err
		}
		var parts []string
		for i, c := range cols {
			if c == "type" || c == "key" || c == "key_len" || c == "rows" || c == "Extra" {
				parts = append(parts, c+"="+vals[i].String)
			}
		}
		lines = append(lines, "EXPLAIN "+strings.Join(parts, " "))
	}
	if err := rows.Err(); err != nil {
		return "", err
	}
	if m.flavour == "mariadb" {
		// ANALYZE runs the statement (locks taken, then rolled back) and
		// reports what it read.
		var raw string
		if err := tx.QueryRowContext(ctx, "ANALYZE FORMAT=JSON "+q, now, now, batch).Scan(&raw); err != nil {
			return "", fmt.Errorf("analyze claim on %s: %w", table, err)
		}
		var a struct {
			QueryBlock struct {
				Time       float64 `json:"r_total_time_ms"`
				NestedLoop []struct {
					Table struct {
						Key    string  `json:"key"`
						Access string  `json:"access_type"`
						Rows   float64 `json:"r_rows"`
						Engine struct {
							Pages float64 `json:"pages_accessed"`
						} `json:"r_engine_stats"`
					} `json:"table"`
				} `json:"nested_loop"`
			} `json:"query_block"`
		}
		if err := json.Unmarshal([]byte(raw), &a); err != nil {
			return "", fmt.Errorf("analyze claim on %s: decode: %w", table, err)
		}
		for _, n := range a.QueryBlock.NestedLoop {
			lines = append(lines, fmt.Sprintf("ANALYZE %s on %s: r_rows=%.0f, pages_accessed=%.0f, r_total_time_ms=%.2f",
				n.Table.Access, n.Table.Key, n.Table.Rows, n.Table.Engine.Pages, a.QueryBlock.Time))
		}
	}
	return strings.Join(lines, "; "), nil
}
