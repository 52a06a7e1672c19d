package main

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/google/uuid"
	"github.com/gorm-outbox/outbox"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
)

// sqliteDB is one SQLite file in the benchmark's temporary directory; every
// pool open returns is on that file.
type sqliteDB struct {
	path    string
	maxIdle int
}

func (s sqliteDB) name() string { return "sqlite" }

// open opens a pool with the settings the README recommends for concurrent
// use.
func (s sqliteDB) open() (*gorm.DB, error) {
	db, err := gorm.Open(sqlite.Open("file:"+s.path+outbox.SQLiteDSNOptions), gormCfg())
	if err != nil {
		return nil, fmt.Errorf("open sqlite: %w", err)
	}
	if s.maxIdle > 0 {
		sqlDB(db).SetMaxIdleConns(s.maxIdle)
	}
	return db, nil
}

func (s sqliteDB) clear(ctx context.Context, db *sql.DB, tables ...string) error {
	for _, t := range tables {
		if err := exec(ctx, db, `DELETE FROM "`+t+`"`); err != nil {
			return err
		}
	}
	// Start every measurement from a short WAL, as the first one did.
	return exec(ctx, db, "PRAGMA wal_checkpoint(TRUNCATE)")
}

func (s sqliteDB) quote(table string) string { return `"` + table + `"` }

// floorInsert is the INSERT the library runs for a generated event (InsertRows
// in sqlbuild.go, without its RETURNING seq, which only DeliverAfterCommit
// needs): available_at NULL (due at once, found by seq), created_at NULL
// (= occurred_at), named_id and idempotency_key NULL.
func (s sqliteDB) floorInsert(table string) (string, int) {
	return `INSERT INTO ` + table + ` (id, named_id, event_type, aggregate_type, aggregate_id, idempotency_key, payload,
		headers, available_at, occurred_at, created_at)
		VALUES (?1, NULL, ?2, ?3, ?4, NULL, ?5, NULL, NULL, ?6, NULL)`, 1
}

func (s sqliteDB) idArg(id uuid.UUID) any { return id.String() }

// timeArg: the driver writes a time.Time as the library's text form (UTC,
// "2006-01-02 15:04:05.999999999-07:00").
func (s sqliteDB) timeArg(t time.Time) any { return t }

// sqliteTime is the library's text form of a time given as Unix seconds
// (a real), to the millisecond strftime keeps.
func sqliteTime(unix string) string {
	return "strftime('%Y-%m-%d %H:%M:%f', " + unix + ", 'unixepoch') || '+00:00'"
}

// fill writes its rows with one INSERT ... SELECT over a recursive CTE
// (SQLite's build here has no generate_series). The IDs are UUIDv7s of
// the rows' times (48 bits of milliseconds, the version 7, the variant,
// random bits), as text like the library's.
func (s sqliteDB) fill(ctx context.Context, db *sql.DB, table string, n int, k fillKind) error {
	now := time.Now().UTC()
	ts := "?2 / 1000.0 + g / 1000000.0" // ?2: the first row's time in Unix milliseconds
	ms := "(?2 + g / 1000)"
	id := "printf('%08x-%04x-7%03x-%x%03x-%012x', " + ms + " >> 16, " + ms + " & 65535, random() & 4095, 8 + (random() & 3), random() & 4095, random() & 281474976710655)"
	args := []any{n, now.Add(-24 * time.Hour).UnixMilli()}
	cols := "id, event_type, aggregate_type, aggregate_id, payload, occurred_at"
	vals := id + ", 'order.created', 'order', CAST(g AS TEXT), json_object('order_id', g, 'total', 42), " + sqliteTime(ts)
	switch k {
	case fillSent:
		cols += ", status, attempts, updated_at, sent_at"
		vals += ", 'sent', 1, " + sqliteTime(ts+" + 0.001") + ", " + sqliteTime(ts+" + 0.001")
	case fillBackoff:
		// ?3: an hour from now, ?4: now, in Unix milliseconds.
		cols += ", attempts, last_error, available_at, updated_at"
		vals += ", 1, 'bench: handler failed', " + sqliteTime("?3 / 1000.0 + g / 1000000.0") + ", " + sqliteTime("?4 / 1000.0")
		args = append(args, now.Add(time.Hour).UnixMilli(), now.UnixMilli())
	}
	q := `INSERT INTO "` + table + `" (` + cols + `)
	WITH RECURSIVE s(g) AS (SELECT 1 UNION ALL SELECT g + 1 FROM s WHERE g < ?1)
	SELECT ` + vals + ` FROM s`
	if _, err := db.ExecContext(ctx, q, args...); err != nil {
		return fmt.Errorf("fill %s with %d %s rows: %w", table, n, k, err)
	}
	return exec(ctx, db, `ANALYZE "`+table+`"`)
}
