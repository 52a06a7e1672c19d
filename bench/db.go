package main

import (
	"context"
	"database/sql"
	"fmt"
	"sync"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"
)

// database is one database a scenario runs on, with the benchmark's own SQL
// that differs between databases: opening a pool, clearing tables, filling
// them in bulk and the hand-written write floor. The outbox's SQL is always
// the library's. PostgreSQL (pg.go), MySQL/MariaDB (mysql.go) and SQLite
// (sqlite.go) implement it.
type database interface {
	// name labels the database in the table and in progress lines.
	name() string
	// open opens a new GORM pool.
	open() (*gorm.DB, error)
	// clear empties tables and resets their auto-increment counters.
	clear(ctx context.Context, db *sql.DB, tables ...string) error
	// quote quotes a table name.
	quote(table string) string
	// fill inserts n rows of kind k into an outbox-format table with one
	// INSERT ... SELECT, numbered from 1 (the number is the aggregate ID,
	// which the handlers use to check that every event arrives once), 1 µs
	// apart in occurred_at (SQLite's strftime keeps milliseconds), oldest
	// first, like a real backlog, each the row the library leaves (see
	// fillKind), with a UUIDv7 of its time as ID; then it refreshes the
	// planner's statistics.
	fill(ctx context.Context, db *sql.DB, table string, n int, k fillKind) error
	// floorInsert is the write floor's INSERT of one generated event into
	// table: the lean row the library writes for it (schema version 3),
	// the same columns with the same NULLs. Its arguments are the event's
	// ID as idArg gives it, event type, aggregate type, aggregate ID and
	// payload, then times copies of the current time as timeArg gives it.
	floorInsert(table string) (q string, times int)
	// idArg is a UUID as the id column takes it: what the library passes
	// on this database.
	idArg(id uuid.UUID) any
	// timeArg is a time as the hand-written floors pass it: what the
	// library passes on this database.
	timeArg(t time.Time) any
}

// fillKind is the state of the rows fill writes, each as the library
// leaves a generated event in it (schema version 3: named_id and
// idempotency_key NULL, created_at NULL as it equals occurred_at, and on
// PostgreSQL and SQLite available_at NULL while the event is due at once;
// MySQL always writes available_at).
type fillKind int

const (
	// fillPending: published, not yet claimed (updated_at NULL).
	fillPending fillKind = iota
	// fillSent: claimed once and marked sent (attempts 1, sent_at and
	// updated_at set, in the sent index).
	fillSent
	// fillBackoff: one failed attempt, waiting for its retry an hour from
	// now (pending, attempts 1, last_error set, available_at an hour
	// ahead: in the retry index on PostgreSQL and SQLite).
	fillBackoff
)

func (k fillKind) String() string {
	return [...]string{"pending", "sent", "backoff"}[k]
}

// server is a database the relay and scale scenarios run on (PostgreSQL,
// MySQL/MariaDB): one with row locks that concurrent relays can skip. Each
// runs in a schema or database of the benchmark's own, which close drops.
type server interface {
	database
	// openSQL opens a plain database/sql pool, sized like open's.
	openSQL() (*sql.DB, error)

	// floorStart is the watermark the floor's relays start a drain of
	// table from (see floorWM); nil where the floor's claim reads an index
	// of due rows instead (MySQL).
	floorStart(ctx context.Context, db *sql.DB, table string) (*floorWM, error)
	// floorClaim is the library's claim on this database written by hand:
	// it leases up to batch due pending rows of table until lease, oldest
	// first, skipping rows another claim holds, and returns them. wm is
	// floorStart's watermark, which it reads and advances.
	floorClaim(ctx context.Context, db *sql.DB, table string, wm *floorWM, batch int, now, lease time.Time) ([]floorRow, error)
	// floorMark marks the rows at seqs sent, guarded by their lease, as
	// the library does.
	floorMark(ctx context.Context, db *sql.DB, table string, seqs []int64, lease time.Time) error
	// floorOneStep is the unsafe floor: it marks up to batch due rows sent
	// in the transaction that takes them, calls deliver inside that
	// transaction, commits, and returns how many it took.
	floorOneStep(ctx context.Context, db *sql.DB, table string, wm *floorWM, batch int, deliver func([]floorRow)) (int, error)
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

// floorRow is one row a floor claimed, with the columns the library's claim
// returns.
type floorRow struct {
	seq                          int64
	id, typ, aggType, aggID, key string
	payload                      []byte
	headers                      sql.NullString
	attempts                     int
	occurred, created            time.Time
}

// floorColumns are the columns a floor's claim returns, in scanFloor's
// order: the library's (ClaimColumns in sqlbuild.go) with idCol reading
// the event's ID, the key and creation time standing for what their NULL
// means.
func floorColumns(idCol string) string {
	return "seq, " + idCol + ", event_type, aggregate_type, aggregate_id, COALESCE(idempotency_key, " + idCol +
		"), payload, headers, attempts, occurred_at, COALESCE(created_at, occurred_at)"
}

func scanFloor(rows *sql.Rows) ([]floorRow, error) {
	defer rows.Close()
	var out []floorRow
	for rows.Next() {
		var r floorRow
		if err := rows.Scan(&r.seq, &r.id, &r.typ, &r.aggType, &r.aggID, &r.key, &r.payload, &r.headers, &r.attempts, &r.occurred, &r.created); err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

func rowSeqs(rs []floorRow) []int64 {
	seqs := make([]int64, len(rs))
	for i, r := range rs {
		seqs[i] = r.seq
	}
	return seqs
}

// floorWM is the hand-written floor's watermark where new events are found
// by seq (PostgreSQL): every seq below from has been claimed. It is the
// simplest correct one for a benchmark, where no transaction that writes
// an event rolls back, so every seq gets its row: a claim reads new rows
// from from on, skipping rows in flight, and from moves past a seq only
// once a claim took it. A row committed after rows of higher seq (the
// latency floor's writers commit concurrently) is found all the same, which
// "seq > the last seq claimed" would miss. The floor's relays share one
// (they run in one process); the library's each keep their own, and read
// the table to advance it (Walk), which copes with rollbacks too.
type floorWM struct {
	mu   sync.Mutex
	from int64
	took map[int64]bool // seqs ≥ from claimed
}

func newFloorWM(from int64) *floorWM { return &floorWM{from: from, took: map[int64]bool{}} }

// low is where the next claim reads new rows from.
func (w *floorWM) low() int64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.from
}

// claimed records the rows a claim took.
func (w *floorWM) claimed(rs []floorRow) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, r := range rs {
		if r.seq >= w.from {
			w.took[r.seq] = true
		}
	}
	for w.took[w.from] {
		delete(w.took, w.from)
		w.from++
	}
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
