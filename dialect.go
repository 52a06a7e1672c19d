package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"gorm.io/gorm"
)

// dialect is everything about the outbox that differs between databases:
// the text of every statement, and the protocol steps that are one
// statement on some databases and several on others. Each database is one
// file (postgres.go, sqlite.go, mysql.go) that registers its dialect under
// the name of GORM's dialector; the relay and the publisher hold no SQL.
//
// Builders return a query (text and arguments), built anew for each call:
// statements never contain event data, only placeholders.
type dialect interface {
	// check inspects the database when the plugin is installed in
	// Persistent mode and refuses settings that would fail later, with an
	// error that names the setting to change.
	check(ctx context.Context, db *gorm.DB, o *Outbox) error
	// schema is the DDL that creates the table and its indexes, as
	// SchemaSQL shows it.
	schema() string
	// exists reports whether the table or index named name exists.
	exists(ctx context.Context, db *sql.DB, name string) (bool, error)

	// version reports the schema version of the table: 0 when there is
	// none, 1 for the first release's shape, 2 for the current one.
	version(ctx context.Context, db querier) (int, error)
	// upgrade is the script that turns a version 1 table into version 2
	// (schema/*-upgrade-2.sql), "" when the database never had version 1.
	upgrade() string

	// insert writes rows as pending events; a row whose ID or idempotency
	// key is already in the table is skipped (the first write wins; the
	// publisher then tells a duplicate from an ID reused by another event).
	insert(rows []encoded, now time.Time) query
	// keysOf reads the idempotency keys and creation times of the rows
	// with the given IDs.
	keysOf(ids []string) query
	// claim takes up to c.limit due pending rows, oldest first, moves
	// their available_at and locked_until to c.lease, counts an attempt,
	// and returns them. Concurrent claims never return the same row while
	// its lease is live.
	claim(ctx context.Context, db *sql.DB, c claimSpec) ([]claimed, error)

	// The outcome statements. Each touches only pending rows whose
	// locked_until is still lease: a relay that lost its lease must not
	// overwrite a row another relay has claimed since.
	markSent(ids []string, now, lease time.Time) query
	markFailed(outs []outcome, now, lease time.Time) query
	release(ids []string, now, lease time.Time) query

	replay(ids []string, now time.Time) query
	deleteSent(before time.Time, limit int) query
	stats() query
	// orderingIndex returns the index OrderByAggregate's probe reads: its
	// name, and the statements that build it without blocking writers
	// where the database can.
	orderingIndex() (name string, ddl []string)

	// notifies reports whether relays in other processes can be woken
	// through the database (PostgreSQL's LISTEN/NOTIFY).
	notifies() bool

	// syntax is how the database spells statements, for the operating
	// functions of admin.go, which differ only in that.
	syntax() *sqlSyntax
}

// querier runs queries: a *sql.DB or a *sql.Tx.
type querier interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// query is one statement and its arguments.
type query struct {
	sql  string
	args []any
}

// claimSpec is what one claim asks for.
type claimSpec struct {
	now, lease time.Time
	limit      int
	ids        []string // only these rows, when set (DeliverAfterCommit)
	ordered    bool     // RelayConfig.OrderByAggregate
}

// dialects maps GORM dialector names to their dialect; each database's
// file adds itself.
var dialects = map[string]func(table string) dialect{}

func newDialect(name, table string) (dialect, error) {
	f, ok := dialects[name]
	if !ok {
		return nil, fmt.Errorf("%w: %q (supported: mysql, postgres, sqlite)", ErrUnsupportedDialect, name)
	}
	return f(table), nil
}

// sqlSyntax is how a database spells the parts every statement shares.
type sqlSyntax struct {
	table string // quoted
	// placeholder returns the n-th (1-based) placeholder.
	placeholder func(n int) string
	// arrays: a list of IDs goes as one array argument (= ANY($n)), not as
	// an IN list of one placeholder each.
	arrays bool
	// timeArg converts a time to the argument the driver stores correctly.
	timeArg func(time.Time) any
	// timeCol wraps a time column read back, when the driver's own
	// conversion cannot be trusted.
	timeCol func(col string) string
	// unsent matches the rows of an aggregate that are not yet sent, in the
	// form the ordering index serves.
	unsent string
}

func (s *sqlSyntax) build() *builder { return &builder{s: s} }

// builder assembles a statement, numbering placeholders in text order.
// Go evaluates the calls in an expression left to right, so
// b.w("a = ", b.arg(x), ", b = ", b.arg(y)) numbers x before y.
type builder struct {
	s    *sqlSyntax
	b    strings.Builder
	args []any
}

func (b *builder) w(parts ...string) *builder {
	for _, p := range parts {
		b.b.WriteString(p)
	}
	return b
}

func (b *builder) arg(v any) string {
	b.args = append(b.args, v)
	return b.s.placeholder(len(b.args))
}

func (b *builder) time(t time.Time) string { return b.arg(b.s.timeArg(t)) }

// ids returns a filter on col matching any of ids.
func (b *builder) ids(col string, ids []string) string {
	if b.s.arrays {
		return col + " = ANY(" + b.arg(ids) + ")"
	}
	var s strings.Builder
	s.WriteString(col + " IN (")
	for i, id := range ids {
		if i > 0 {
			s.WriteString(", ")
		}
		s.WriteString(b.arg(id))
	}
	s.WriteByte(')')
	return s.String()
}

func (b *builder) query() query { return query{sql: b.b.String(), args: b.args} }

func dollar(n int) string       { return "$" + strconv.Itoa(n) }
func question(int) string       { return "?" }
func sameTime(t time.Time) any  { return t }
func bareCol(col string) string { return col }

const insertColumns = "(id, event_type, aggregate_type, aggregate_id, idempotency_key, payload, headers, status, attempts, available_at, occurred_at, created_at, updated_at)"

// insertRows builds a multi-row INSERT; conflict is the clause that makes a
// duplicate a no-op. Rows whose ID and key were both generated (a fresh
// UUIDv7, the key equal to it) cannot be duplicates, and go without it:
// an INSERT that may conflict is a speculative insertion, which costs
// PostgreSQL a check of every unique index before the row and one more WAL
// record after it. Should a generated ID ever repeat, the INSERT fails and
// with it the caller's transaction: nothing is lost.
func (s *sqlSyntax) insertRows(rows []encoded, now time.Time, conflict string) query {
	if allGenerated(rows) {
		conflict = ""
	}
	b := s.build()
	b.w("INSERT INTO ", s.table, " ", insertColumns, " VALUES ")
	for i := range rows {
		e := &rows[i]
		var headers any
		if e.headers != nil {
			headers = string(e.headers)
		}
		if i > 0 {
			b.w(", ")
		}
		b.w("(", b.arg(e.ID), ", ", b.arg(e.Type), ", ", b.arg(e.AggregateType), ", ", b.arg(e.AggregateID),
			", ", b.arg(e.IdempotencyKey), ", ", b.arg(string(e.payload)), ", ", b.arg(headers),
			", 'pending', 0, ", b.time(now), ", ", b.time(e.OccurredAt), ", ", b.time(now), ", ", b.time(now), ")")
	}
	b.w(conflict)
	return b.query()
}

func allGenerated(rows []encoded) bool {
	for i := range rows {
		if !rows[i].generated {
			return false
		}
	}
	return true
}

// claimColumns are the columns a claim returns, in queryClaimed's order.
func (s *sqlSyntax) claimColumns() string {
	return "seq, id, event_type, aggregate_type, aggregate_id, idempotency_key, payload, headers, attempts, " +
		s.timeCol("occurred_at") + ", " + s.timeCol("created_at")
}

// keysOf reads the idempotency keys and creation times of the rows with
// the given IDs.
func (s *sqlSyntax) keysOf(ids []string) query {
	b := s.build()
	return b.w("SELECT id, idempotency_key, ", s.timeCol("created_at"), " FROM ", s.table, " WHERE ", b.ids("id", ids)).query()
}

// due writes the claim's filter on the table aliased c: pending and due,
// and with ordering, not behind an unsent event of its aggregate written
// before it (seq is the database's write order, not a writer's clock).
// Events without an aggregate ID are not ordered.
func (s *sqlSyntax) due(b *builder, c claimSpec) {
	b.w("c.status = 'pending' AND c.available_at <= ", b.time(c.now),
		" AND (c.locked_until IS NULL OR c.locked_until <= ", b.time(c.now), ")")
	if len(c.ids) > 0 {
		b.w(" AND ", b.ids("c.id", c.ids))
	}
	if c.ordered {
		b.w(" AND (c.aggregate_id = '' OR NOT EXISTS (SELECT 1 FROM ", s.table, " p",
			" WHERE p.aggregate_type = c.aggregate_type AND p.aggregate_id = c.aggregate_id AND ", s.unsent,
			" AND p.seq < c.seq))")
	}
}

// claimUpdate is the one-statement claim of databases with UPDATE ...
// RETURNING: the subquery picks the due rows (lock skips rows another claim
// holds), the UPDATE leases them. The lease is locked_until alone: the claim
// changes no indexed column, so on PostgreSQL it can be a HOT update when
// the page has room, and one index range (pending, available_at <= now)
// still finds new rows and rows whose relay died (their lease expired); the
// rows in flight, at most the relays' batches, are skipped on the way.
func (s *sqlSyntax) claimUpdate(c claimSpec, lock string) query {
	b := s.build()
	b.w("UPDATE ", s.table, " SET locked_until = ", b.time(c.lease),
		", attempts = attempts + 1, updated_at = ", b.time(c.now),
		" WHERE id IN (SELECT c.id FROM ", s.table, " c WHERE ")
	s.due(b, c)
	b.w(" ORDER BY c.available_at, c.seq LIMIT ", b.arg(c.limit), lock, ") RETURNING ", s.claimColumns())
	return b.query()
}

func (s *sqlSyntax) markSent(ids []string, now, lease time.Time) query {
	b := s.build()
	return b.w("UPDATE ", s.table, " SET status = 'sent', sent_at = ", b.time(now), ", updated_at = ", b.time(now),
		", locked_until = NULL, last_error = NULL WHERE ", b.ids("id", ids),
		" AND locked_until = ", b.time(lease), " AND status = 'pending'").query()
}

// release hands claimed rows back undelivered: due now, and the attempt the
// claim counted is taken back.
func (s *sqlSyntax) release(ids []string, now, lease time.Time) query {
	b := s.build()
	return b.w("UPDATE ", s.table, " SET available_at = ", b.time(now), ", updated_at = ", b.time(now),
		", locked_until = NULL, attempts = attempts - 1 WHERE ", b.ids("id", ids),
		" AND locked_until = ", b.time(lease), " AND status = 'pending'").query()
}

func (s *sqlSyntax) replay(ids []string, now time.Time) query {
	b := s.build()
	return b.w("UPDATE ", s.table, " SET status = 'pending', attempts = 0, available_at = ", b.time(now),
		", updated_at = ", b.time(now), ", locked_until = NULL WHERE ", b.ids("id", ids),
		" AND status = 'failed'").query()
}

// markFailedValues records failed attempts in one statement joined to a
// VALUES list: each row gets its own status (pending for a retry, failed
// when out of attempts), error and next due time. cast types the due
// times, which are untyped text in VALUES otherwise.
func (s *sqlSyntax) markFailedValues(outs []outcome, now, lease time.Time, cast string) query {
	b := s.build()
	b.w("UPDATE ", s.table, " AS o SET status = v.column2, last_error = v.column3, available_at = v.column4,",
		" locked_until = NULL, updated_at = ", b.time(now), " FROM (VALUES ")
	for i, o := range outs {
		if i > 0 {
			b.w(", ")
		}
		b.w("(", b.arg(o.id), ", ", b.arg(o.status), ", ", b.arg(o.err), ", ", b.time(o.due), cast, ")")
	}
	b.w(") AS v WHERE o.id = v.column1 AND o.locked_until = ", b.time(lease), " AND o.status = 'pending'")
	return b.query()
}

// deleteSentIn deletes up to limit rows sent before before, picked by a
// subquery (lock lets relays sharing the table skip each other's rows).
func (s *sqlSyntax) deleteSentIn(before time.Time, limit int, lock string) query {
	b := s.build()
	return b.w("DELETE FROM ", s.table, " WHERE id IN (SELECT id FROM ", s.table,
		" WHERE status = 'sent' AND sent_at < ", b.time(before), " LIMIT ", b.arg(limit), lock, ")").query()
}

func (s *sqlSyntax) stats() query {
	return query{sql: "SELECT status, COUNT(*), " + s.timeCol("MIN(created_at)") + " FROM " + s.table + " GROUP BY status"}
}

// queryClaimed runs a claim statement and scans what it returns.
func queryClaimed(ctx context.Context, q interface {
	QueryContext(context.Context, string, ...any) (*sql.Rows, error)
}, stmt query) ([]claimed, error) {
	rows, err := q.QueryContext(ctx, stmt.sql, stmt.args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var batch []claimed
	for rows.Next() {
		var (
			c          claimed
			payload    []byte
			headers    sql.NullString
			occ, added dbTime
		)
		if err := rows.Scan(&c.seq, &c.ev.ID, &c.ev.Type, &c.ev.AggregateType, &c.ev.AggregateID, &c.ev.IdempotencyKey,
			&payload, &headers, &c.attempts, &occ, &added); err != nil {
			return nil, err
		}
		c.ev.Payload = json.RawMessage(payload)
		c.ev.OccurredAt = occ.t
		c.createdAt = added.t
		if headers.Valid && headers.String != "" {
			if err := json.Unmarshal([]byte(headers.String), &c.ev.Headers); err != nil {
				c.bad = fmt.Errorf("outbox: decode headers of event %s: %w", c.ev.ID, err)
			}
		}
		batch = append(batch, c)
	}
	return batch, rows.Err()
}

// dbTime scans a timestamp whatever form the driver returns it in:
// PostgreSQL's time.Time, SQLite's stored text, MySQL's text of a
// DATETIME(6) read with CAST. Text carries no zone and is UTC, as every
// time this package writes.
type dbTime struct{ t time.Time }

var textTimeFormats = []string{
	"2006-01-02 15:04:05.999999999-07:00",
	"2006-01-02T15:04:05.999999999-07:00",
	"2006-01-02 15:04:05.999999999",
	"2006-01-02T15:04:05.999999999",
	time.RFC3339Nano,
}

func (d *dbTime) Scan(v any) error {
	var s string
	switch x := v.(type) {
	case time.Time:
		d.t = x.UTC()
		return nil
	case nil:
		d.t = time.Time{}
		return nil
	case string:
		s = x
	case []byte:
		s = string(x)
	default:
		return fmt.Errorf("outbox: cannot scan %T as a time", v)
	}
	for _, f := range textTimeFormats {
		if t, err := time.Parse(f, s); err == nil {
			d.t = t.UTC()
			return nil
		}
	}
	return fmt.Errorf("outbox: cannot parse time %q", s)
}

var _ sql.Scanner = (*dbTime)(nil)

// rawDB returns the *sql.DB behind db.
func rawDB(db *gorm.DB) (*sql.DB, error) {
	d, err := db.DB()
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	return d, nil
}
