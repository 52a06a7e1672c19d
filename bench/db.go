package main

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/gorm-outbox/outbox"
	"gorm.io/gorm"
)

// database is one database a scenario runs on, with the benchmark's own SQL
// that differs between databases: opening a pool, clearing tables and the
// hand-written write floor. The outbox's SQL is always the library's.
// PostgreSQL (pg.go), MySQL/MariaDB (mysql.go) and SQLite (sqlite.go)
// implement it.
type database interface {
	// name labels the database in the table and in progress lines.
	name() string
	// open opens a new GORM pool.
	open() (*gorm.DB, error)
	// clear empties tables and resets their auto-increment counters.
	clear(ctx context.Context, db *sql.DB, tables ...string) error
	// floorInsert is the write floor's INSERT of one pending event into
	// table. Its arguments are the ID, event type, aggregate type,
	// aggregate ID, idempotency key and payload, then times copies of the
	// current time as timeArg gives it.
	floorInsert(table string) (q string, times int)
	// timeArg is a time as the hand-written floors pass it: what the
	// library passes on this database.
	timeArg(t time.Time) any
}

// server is a database the relay and scale scenarios run on (PostgreSQL,
// MySQL/MariaDB): one with row locks that concurrent relays can skip. Each
// runs in a schema or database of the benchmark's own, which close drops.
type server interface {
	database
	// openSQL opens a plain database/sql pool, sized like open's.
	openSQL() (*sql.DB, error)
	// quote quotes a table name.
	quote(table string) string
	// fill inserts n events of the given status into an outbox-format
	// table in bulk, numbered from 1 (the number is the aggregate ID, which
	// the handlers use to check that every event arrives once), 1 µs apart
	// in available_at and created_at, oldest first, like a real backlog;
	// then it refreshes the planner's statistics.
	fill(ctx context.Context, db *sql.DB, table string, n int, status outbox.Status) error

	// floorClaim is the library's claim on this database written by hand:
	// it leases up to batch due pending rows of table until lease, oldest
	// first, skipping rows another claim holds, and returns them.
	floorClaim(ctx context.Context, db *sql.DB, table string, batch int, now, lease time.Time) ([]floorRow, error)
	// floorMark marks ids sent, guarded by their lease, as the library
	// does.
	floorMark(ctx context.Context, db *sql.DB, table string, ids []string, lease time.Time) error
	// floorOneStep is the unsafe floor: it marks up to batch due rows sent
	// in the transaction that takes them, calls deliver inside that
	// transaction, commits, and returns how many it took.
	floorOneStep(ctx context.Context, db *sql.DB, table string, batch int, deliver func([]floorRow)) (int, error)
	// oneStepName describes floorOneStep in the table.
	oneStepName() string
	// floorNotes reports what the floors ran into since the last call
	// (e.g. claims retried after a deadlock); empty when nothing.
	floorNotes() string

	// probeClaim runs the library's claim of batch rows on table several
	// times, each undone, and returns the median time in milliseconds
	// (measured as probeMetric says) and a summary of the plan.
	probeClaim(ctx context.Context, db *sql.DB, table string, batch int) (ms float64, plan string, err error)
	probeMetric() string

	close() error
}

// floorRow is one row a floor claimed.
type floorRow struct {
	id, typ, aggType, aggID, key string
	payload                      []byte
	headers                      sql.NullString
	attempts                     int
	occurred, created            time.Time
}

// floorColumns are the columns a floor's claim returns, in scanFloor's
// order.
const floorColumns = "id, event_type, aggregate_type, aggregate_id, idempotency_key, payload, headers, attempts, occurred_at, created_at"

func scanFloor(rows *sql.Rows) ([]floorRow, error) {
	defer rows.Close()
	var out []floorRow
	for rows.Next() {
		var r floorRow
		if err := rows.Scan(&r.id, &r.typ, &r.aggType, &r.aggID, &r.key, &r.payload, &r.headers, &r.attempts, &r.occurred, &r.created); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

func rowIDs(rs []floorRow) []string {
	ids := make([]string, len(rs))
	for i, r := range rs {
		ids[i] = r.id
	}
	return ids
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
