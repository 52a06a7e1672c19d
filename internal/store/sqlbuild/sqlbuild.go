// Package sqlbuild is the SQL the stores share: a statement builder that
// numbers placeholders in each database's style, the statements that are
// the same text on several databases, parameterised by how each spells the
// parts that differ, and the store methods that run and scan them. A store
// embeds a Syntax, whose methods implement most of the store's roles, and
// overrides what its database does differently.
package sqlbuild

import (
	"context"
	"database/sql"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/gorm-outbox/outbox/internal/store"
)

// Syntax is how a database spells the parts every statement shares.
type Syntax struct {
	Table string // quoted
	// Placeholder returns the n-th (1-based) placeholder.
	Placeholder func(n int) string
	// Arrays: a list of IDs goes as one array argument (= ANY($n)), not as
	// an IN list of one placeholder each.
	Arrays bool
	// TimeArg converts a time to the argument the driver stores correctly.
	TimeArg func(time.Time) any
	// TimeCol wraps a time column read back, when the driver's own
	// conversion cannot be trusted.
	TimeCol func(col string) string
	// Unsent matches the rows p of an aggregate that are not yet sent, in
	// the form the ordering index serves.
	Unsent string
	// IDCol reads the event's ID of a row: the ID the publisher chose
	// (named_id), or the id column as text.
	IDCol string
	// IDArg converts an ID that is a UUID to the id column's argument.
	IDArg func(uuid.UUID) any
	// StatusArg wraps the placeholder of a status written from a
	// parameter, which PostgreSQL's enum needs cast.
	StatusArg func(ph string) string
	// Fresh is true where a new event is written with available_at NULL
	// (due at once) and found by seq, not by an index of due rows.
	Fresh bool
	// Opaque wraps the placeholder of a claim's bound (its watermark, its
	// now) of SQL type typ so that the planner does not see its value; nil
	// leaves it as it is. See opaque.
	Opaque func(ph, typ string) string
	// Dialect is the overview's arithmetic.
	Dialect

	// Lim are the store's limits (store.Store.Limits).
	Lim store.Limits
	// Lock is how a subquery locks the rows it picks (SkipLocked), or "".
	Lock string
	// InsertConflict makes an INSERT of a duplicate a no-op.
	InsertConflict string
	// Returning: INSERT ... RETURNING tells the seqs written; without it,
	// one INSERT of generated events gets consecutive seqs, the driver's
	// LastInsertId the first.
	Returning bool
	// FailedCasts type the due times and seqs of MarkFailed's VALUES list,
	// which are untyped text otherwise.
	FailedCasts [2]string
	// Snapshot: ReadOverview reads in one REPEATABLE READ, read-only
	// transaction (a snapshot that blocks no writer).
	Snapshot bool

	// inserts holds the text of InsertRows by insertShape.
	inserts sync.Map
}

// opaque is ph through Opaque. PostgreSQL keeps one generic plan for a
// prepared statement only when its estimate is no worse than the plans made
// for each call's values; the claim's per-call plan knows that the
// watermark is at the top of the table (a few rows to read) where the
// generic one assumes a third of it, so every claim was planned afresh
// (0.18 ms, more than it runs). Behind a scalar subquery the watermark is
// unknown to both, the estimates agree, and the generic plan is kept; its
// shape is the same index range scan from the watermark. Only the
// watermark is hidden: the retry source's bound (now) leaves both plans an
// ordered scan of the retry index, and hiding it let a generic plan made
// while that index was empty read and sort every due row.
func (s *Syntax) opaque(ph, typ string) string {
	if s.Opaque == nil {
		return ph
	}
	return s.Opaque(ph, typ)
}

// OpaqueSubquery is PostgreSQL's Opaque: (SELECT $n::typ).
func OpaqueSubquery(ph, typ string) string { return "(SELECT " + ph + "::" + typ + ")" }

// Dollar is PostgreSQL's placeholder, Question SQLite's and MySQL's.
func Dollar(n int) string { return "$" + strconv.Itoa(n) }

// Question is the placeholder of SQLite and MySQL.
func Question(int) string { return "?" }

// SameTime passes a time to the driver as it is.
func SameTime(t time.Time) any { return t }

// BareCol reads a time column as it is.
func BareCol(col string) string { return col }

// Build starts a statement.
func (s *Syntax) Build() *Builder { return &Builder{s: s} }

// Builder assembles a statement, numbering placeholders in text order.
// Go evaluates the calls in an expression left to right, so
// b.W("a = ", b.Arg(x), ", b = ", b.Arg(y)) numbers x before y.
type Builder struct {
	s    *Syntax
	b    strings.Builder
	args []any
}

// W writes text.
func (b *Builder) W(parts ...string) *Builder {
	for _, p := range parts {
		b.b.WriteString(p)
	}
	return b
}

// Arg adds an argument and returns its placeholder.
func (b *Builder) Arg(v any) string {
	b.args = append(b.args, v)
	return b.s.Placeholder(len(b.args))
}

// Time adds a time argument.
func (b *Builder) Time(t time.Time) string { return b.Arg(b.s.TimeArg(t)) }

// IDs returns a filter on col matching any of ids.
func (b *Builder) IDs(col string, ids []string) string { return anyOf(b, col, ids) }

// Seqs returns a filter on col matching any of seqs.
func (b *Builder) Seqs(col string, seqs []int64) string { return anyOf(b, col, seqs) }

// Limit writes a LIMIT's row count as a literal, not a placeholder: PostgreSQL
// plans a prepared statement once for any argument (a generic plan) only
// when that plan's estimate is no worse than the ones planned for the
// arguments, and an unknown LIMIT (assumed to be a tenth of the rows) makes
// the generic estimate of the claim far worse on a table with history, so
// every claim was planned afresh (0.2 ms each, more than it runs). A row
// count is an int from the configuration: nothing to quote.
func (b *Builder) Limit(n int) string { return strconv.Itoa(n) }

// anyOf is col matching any of vals: one array argument (= ANY) where the
// database has arrays, an IN list of one placeholder each otherwise. One
// value is col = it: PostgreSQL's generic plan of = ANY assumes ten elements
// and so is never chosen for one, the relay's most common case at low rates.
func anyOf[T any](b *Builder, col string, vals []T) string {
	if len(vals) == 1 {
		return col + " = " + b.Arg(vals[0])
	}
	if b.s.Arrays {
		return col + " = ANY(" + b.Arg(vals) + ")"
	}
	var s strings.Builder
	s.WriteString(col + " IN (")
	for i, v := range vals {
		if i > 0 {
			s.WriteString(", ")
		}
		s.WriteString(b.Arg(v))
	}
	s.WriteByte(')')
	return s.String()
}

// Query returns the statement.
func (b *Builder) Query() Query { return Query{SQL: b.b.String(), Args: b.args} }

// SkipLocked locks the rows a subquery picks, skipping those another
// transaction holds.
const SkipLocked = " FOR UPDATE SKIP LOCKED"

// KeyCol reads a row's idempotency key: NULL stands for the ID.
func (s *Syntax) KeyCol() string { return "COALESCE(idempotency_key, " + s.IDCol + ")" }

// CreatedCol reads a row's creation time: NULL stands for occurred_at.
func (s *Syntax) CreatedCol() string { return "COALESCE(created_at, occurred_at)" }

const insertColumns = "(id, named_id, event_type, aggregate_type, aggregate_id, idempotency_key, payload, headers, available_at, occurred_at, created_at)"

// Lean are the values of a row's columns that stand for another's when
// NULL: the ID the publisher chose (NULL when generated), the key (NULL
// when the ID), the due time (NULL, where the store finds new events by
// seq, when due at once) and the creation time (NULL when occurred_at).
func (s *Syntax) Lean(e *store.Event, now time.Time) (named, key, due, created any) {
	if e.NamedID {
		named = e.ID
	}
	key = KeyArg(e)
	if !s.Fresh {
		due = s.TimeArg(now)
	}
	if !e.OccurredAt.Equal(now) {
		created = s.TimeArg(now)
	}
	return named, key, due, created
}

// KeyArg is the idempotency_key column's value: NULL when the key is the
// event's ID.
func KeyArg(e *store.Event) any {
	if e.Key == e.ID {
		return nil
	}
	return e.Key
}

// InsertRows builds a multi-row INSERT; conflict is the clause that makes a
// duplicate a no-op, and returning what follows it. Rows whose ID and key
// were both generated (a fresh UUIDv7, the key equal to it) cannot be
// duplicates, and go without it: an INSERT that may conflict is a
// speculative insertion, which costs PostgreSQL a check of every unique
// index before the row and one more WAL record after it. Such a row enters
// no unique index at all: should a generated ID ever repeat, two rows hold
// it, and the event is delivered twice (at least once, as always).
func (s *Syntax) InsertRows(rows []store.Event, now time.Time, conflict, returning string) Query {
	if AllGenerated(rows) {
		conflict = ""
	}
	args := make([]any, 0, insertColumnCount*len(rows))
	for i := range rows {
		e := &rows[i]
		var headers any
		if e.Headers != nil {
			headers = string(e.Headers)
		}
		named, key, due, created := s.Lean(e, now)
		args = append(args, s.IDArg(store.RowID(e.ID)), named, e.Type, e.AggregateType, e.AggregateID,
			key, string(e.Payload), headers, due, s.TimeArg(e.OccurredAt), created)
	}
	return Query{SQL: s.insertSQL(len(rows), conflict, returning), Args: args}
}

// insertColumnCount is the number of columns in insertColumns: the
// arguments of each row of InsertRows, in that order.
var insertColumnCount = strings.Count(insertColumns, ",") + 1

// insertShape is what the text of an InsertRows statement depends on.
type insertShape struct {
	rows                int
	conflict, returning string
}

// maxCachedInsertRows bounds the statements kept: Publish of a few events
// at a time is the common case, and a caller's batch size is unbounded.
const maxCachedInsertRows = 8

// insertSQL is the text of an INSERT of n rows. It depends only on the
// shape, and every Publish needs one: it is built once per shape.
// Building it each time was a third of Store.Insert's CPU time (1.6 µs a
// call on SQLite) and, with the arguments appended one by one, 9 of a
// Publish's 44 allocations there and 19 of 44 on PostgreSQL
// (BenchmarkPublishCall).
func (s *Syntax) insertSQL(n int, conflict, returning string) string {
	shape := insertShape{n, conflict, returning}
	if n <= maxCachedInsertRows {
		if q, ok := s.inserts.Load(shape); ok {
			return q.(string)
		}
	}
	var b strings.Builder
	b.WriteString("INSERT INTO " + s.Table + " " + insertColumns + " VALUES ")
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteByte('(')
		for c := range insertColumnCount {
			if c > 0 {
				b.WriteString(", ")
			}
			b.WriteString(s.Placeholder(i*insertColumnCount + c + 1))
		}
		b.WriteByte(')')
	}
	b.WriteString(conflict + returning)
	q := b.String()
	if n <= maxCachedInsertRows {
		s.inserts.Store(shape, q)
	}
	return q
}

// ReturningSeq is the RETURNING clause of an Insert that tells the seqs
// it wrote (seqs), or none.
func ReturningSeq(seqs bool) string {
	if seqs {
		return " RETURNING seq"
	}
	return ""
}

// AllGenerated reports whether every row's ID and key were generated.
func AllGenerated(rows []store.Event) bool {
	for i := range rows {
		if !rows[i].Generated {
			return false
		}
	}
	return true
}

// Insert implements store.Store, in statements of Lim.InsertRows rows.
// It goes straight to the connection it is given (Publish's transaction),
// not through GORM's logger, which would print the payload arguments of a
// slow statement.
func (s *Syntax) Insert(ctx context.Context, db store.DB, rows []store.Event, now time.Time, seqs bool) (store.Inserted, error) {
	var out store.Inserted
	told := seqs // every statement so far told its seqs
	per := s.PerStatement(s.Lim.InsertRows, insertColumnCount, 0)
	for off := 0; off < len(rows); off += per {
		got, n, err := s.insertChunk(ctx, db, rows[off:min(off+per, len(rows))], now, seqs)
		if err != nil {
			return store.Inserted{}, err
		}
		told = told && got != nil
		if told {
			out.Seqs = append(out.Seqs, got...)
		}
		if n < 0 || out.Written < 0 {
			out.Written = -1
		} else {
			out.Written += n
		}
	}
	if !told {
		// The seqs of every row written, or none: a caller acts on them
		// as the whole.
		out.Seqs = nil
	}
	return out, nil
}

// insertChunk runs one INSERT and returns the seqs of the rows it wrote
// (nil when not wanted or when the store cannot say) and how many it wrote
// (-1 when unknown). Only DeliverAfterCommit wants the seqs: reading them
// back costs the writer a result set.
func (s *Syntax) insertChunk(ctx context.Context, db store.DB, rows []store.Event, now time.Time, want bool) ([]int64, int, error) {
	if want && s.Returning {
		q := s.InsertRows(rows, now, s.InsertConflict, ReturningSeq(true))
		seqs, err := s.seqList(ctx, db, q)
		if seqs == nil {
			seqs = []int64{}
		}
		return seqs, len(seqs), err
	}
	q := s.InsertRows(rows, now, s.InsertConflict, "")
	if err := s.check(q); err != nil {
		return nil, 0, err
	}
	res, err := db.ExecContext(ctx, q.SQL, q.Args...)
	if err != nil {
		return nil, 0, err
	}
	n64, err := res.RowsAffected()
	if err != nil {
		return nil, -1, nil
	}
	n := int(n64)
	if !want || n != len(rows) || !AllGenerated(rows) {
		// A conflict clause makes the row count and the first seq say
		// nothing exact about which rows were written.
		return nil, n, nil
	}
	first, err := res.LastInsertId()
	if err != nil {
		return nil, n, nil
	}
	seqs := make([]int64, n)
	for i := range seqs {
		seqs[i] = first + int64(i)
	}
	return seqs, n, nil
}

// ClaimColumns are the columns a claim returns, in QueryClaimed's order.
func (s *Syntax) ClaimColumns() string {
	return "seq, " + s.IDCol + ", event_type, aggregate_type, aggregate_id, idempotency_key, payload, headers, attempts, " +
		s.TimeCol("occurred_at") + ", " + s.TimeCol(s.CreatedCol()) + ", CASE WHEN available_at IS NULL THEN 1 ELSE 0 END"
}

// Held implements store.Store: both lookups are the unique indexes. A
// generated ID is held by no other row, so only chosen ones are looked up.
func (s *Syntax) Held(ctx context.Context, db store.DB, ids, keys []string) (map[string]store.Held, error) {
	held := make(map[string]store.Held, len(ids))
	per := s.PerStatement(5000, 1, 0)
	for len(ids) > 0 || len(keys) > 0 {
		a := min(len(ids), per)
		b := min(len(keys), per-a)
		q := s.held(ids[:a], keys[:b])
		ids, keys = ids[a:], keys[b:]
		err := s.Each(ctx, db, q, func(rows *sql.Rows) error {
			var (
				id, key string
				added   DBTime
			)
			if err := rows.Scan(&id, &key, &added); err != nil {
				return err
			}
			held[id] = store.Held{Key: key, Created: added.T}
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return held, nil
}

func (s *Syntax) held(ids, keys []string) Query {
	b := s.Build()
	b.W("SELECT ", s.IDCol, ", ", s.KeyCol(), ", ", s.TimeCol(s.CreatedCol()), " FROM ", s.Table, " WHERE ")
	var conds []string
	if len(ids) > 0 {
		conds = append(conds, b.IDs("named_id", ids))
	}
	if len(keys) > 0 {
		conds = append(conds, b.IDs("idempotency_key", keys))
	}
	return b.W(strings.Join(conds, " OR ")).Query()
}

// Due writes the claim's filter on the table aliased c: pending, its lease
// (if any) passed, and with ordering, not behind an unsent event of its
// aggregate written before it (seq is the database's write order, not a
// writer's clock). Events without an aggregate ID are not ordered.
func (s *Syntax) Due(b *Builder, c store.ClaimSpec) {
	b.W("c.status = 'pending' AND (c.locked_until IS NULL OR c.locked_until <= ", b.Time(c.Now), ")")
	if c.Ordered {
		b.W(" AND (c.aggregate_id = '' OR NOT EXISTS (SELECT 1 FROM ", s.Table, " p",
			" WHERE p.aggregate_type = c.aggregate_type AND p.aggregate_id = c.aggregate_id AND ", s.Unsent,
			" AND p.seq < c.seq))")
	}
}

// Claim implements store.Store in one statement (ClaimUpdate).
func (s *Syntax) Claim(ctx context.Context, db *sql.DB, c store.ClaimSpec) ([]store.Claimed, error) {
	return s.QueryClaimed(ctx, db, s.ClaimUpdate(c), c.Limit)
}

// ClaimUpdate is the one-statement claim of databases with UPDATE ...
// RETURNING, for a store whose new events are Fresh: the subqueries pick
// the due rows (Lock skips rows another claim holds), the UPDATE leases
// them. Three sources, each one index range: the rows waiting for a retry
// that are due (the retry index), the new rows from the relay's watermark
// on (the primary key; done rows between are skipped on the way, at most
// the relays' batches in flight), and the rows at the seqs the watermark
// passed while they were not yet committed. The lease is locked_until.
// The claim changes no indexed column (it leaves updated_at, the failed
// index's key, to the outcome): on PostgreSQL, whose table keeps room on
// every page (fillfactor 50), it is a HOT update, with no new entry in
// any index; a claim that set updated_at made none HOT.
func (s *Syntax) ClaimUpdate(c store.ClaimSpec) Query {
	b := s.Build()
	lock := s.Lock
	var srcs []string
	src := func(name string, where func()) {
		sep := ", "
		if len(srcs) == 0 {
			sep = "WITH "
		}
		b.W(sep, name, " AS (SELECT c.seq FROM ", s.Table, " c WHERE ")
		where()
		b.W(" AND ")
		s.Due(b, c)
		srcs = append(srcs, name)
	}
	if len(c.Seqs) > 0 {
		src("s", func() {
			b.W(b.Seqs("c.seq", c.Seqs), " AND (c.available_at IS NULL OR c.available_at <= ", b.Time(c.Now), ")")
		})
		b.W(lock, ")")
	} else {
		src("r", func() { b.W("c.available_at <= ", b.Time(c.Now)) })
		b.W(" ORDER BY c.available_at LIMIT ", b.Limit(c.Limit), lock, ")")
		if len(c.Gaps) > 0 {
			src("g", func() { b.W(b.Seqs("c.seq", c.Gaps), " AND c.available_at IS NULL") })
			b.W(lock, ")")
		}
		src("f", func() { b.W("c.seq >= ", s.opaque(b.Arg(c.From), "bigint"), " AND c.available_at IS NULL") })
		b.W(" ORDER BY c.seq LIMIT ", b.Limit(c.Limit), lock, ")")
	}
	b.W(" UPDATE ", s.Table, " SET locked_until = ", b.Time(c.Lease),
		", attempts = attempts + 1 WHERE seq IN (SELECT seq FROM (")
	for i, name := range srcs {
		if i > 0 {
			b.W(" UNION ALL ")
		}
		b.W("SELECT seq FROM ", name)
	}
	b.W(") u LIMIT ", b.Limit(c.Limit), ") RETURNING ", s.ClaimColumns())
	return b.Query()
}

// Walking is the store.Walker of a store whose new rows are Fresh: only
// such a store embeds it, so that the others are no Walker.
type Walking struct{ S *Syntax }

// Walk implements store.Walker: from seq from on, up to limit rows' seq,
// whether each is open (new and pending) and whether it is leased at now:
// the relay's watermark advances over the rest. The rows at the seqs gaps
// (below from) come first, as the same columns, in the same statement.
func (w Walking) Walk(ctx context.Context, db store.DB, from int64, limit int, gaps []int64, now time.Time) ([]store.WalkRow, error) {
	s := w.S
	b := s.Build()
	if len(gaps) > 0 {
		b.W("SELECT ", s.walkColumns(b, now), " FROM ", s.Table, " WHERE ", b.Seqs("seq", gaps), " UNION ALL ")
	}
	q := b.W("SELECT * FROM (SELECT ", s.walkColumns(b, now), " FROM ", s.Table,
		" WHERE seq >= ", b.Arg(from), " ORDER BY seq LIMIT ", b.Limit(limit), ") w").Query()
	var out []store.WalkRow
	err := s.Each(ctx, db, q, func(rows *sql.Rows) error {
		var (
			r            store.WalkRow
			open, leased int
			end          DBTime
		)
		if err := rows.Scan(&r.Seq, &open, &leased, &end); err != nil {
			return err
		}
		r.Open, r.Leased, r.LeaseEnd = open == 1, leased == 1, end.T
		out = append(out, r)
		return nil
	})
	return out, err
}

func (s *Syntax) walkColumns(b *Builder, now time.Time) string {
	return "seq, CASE WHEN status = 'pending' AND available_at IS NULL THEN 1 ELSE 0 END," +
		" CASE WHEN locked_until > " + b.Time(now) + " THEN 1 ELSE 0 END, " + s.TimeCol("locked_until")
}

// Defer implements store.Walker: new rows the watermark is passing, not
// leased, go to the rows waiting for a retry, due now: a claim passed them
// over (they wait behind their aggregate), and the retry index finds them
// from now on.
func (w Walking) Defer(ctx context.Context, db store.DB, seqs []int64, now time.Time) (int64, error) {
	s := w.S
	// Rows another claim holds right now are skipped, not waited for: it
	// is leasing them.
	return s.ExecChunks(ctx, db, len(seqs), s.PerStatement(len(seqs), 1, 2), func(i, j int) Query {
		b := s.Build()
		return b.W("UPDATE ", s.Table, " SET available_at = ", b.Time(now), " WHERE seq IN (SELECT seq FROM ", s.Table, " WHERE ", b.Seqs("seq", seqs[i:j]),
			" AND status = 'pending' AND available_at IS NULL AND (locked_until IS NULL OR locked_until <= ", b.Time(now), ")", s.Lock, ")").Query()
	})
}

// LowOpen implements store.Walker, in one statement: where a watermark
// starts, the periodic sweep that lowers it to the rows of transactions
// that committed long after they took their seq, and the overview's low
// mark of pending rows.
func (w Walking) LowOpen(ctx context.Context, db store.DB, from int64, now time.Time) (low, high int64, err error) {
	s := w.S
	b := s.Build()
	b.W("SELECT (SELECT MIN(seq) FROM ", s.Table, " WHERE seq >= ", b.Arg(from), " AND status = 'pending' AND available_at IS NULL")
	if !now.IsZero() {
		b.W(" AND (locked_until IS NULL OR locked_until <= ", b.Time(now), ")")
	}
	q := b.W("), (SELECT MAX(seq) FROM ", s.Table, ")").Query()
	var l, h sql.NullInt64
	err = s.Row(ctx, db, q, &l, &h)
	return l.Int64, h.Int64, err
}

// seqChunk is how many seqs one outcome statement takes.
func (s *Syntax) seqChunk() int { return s.PerStatement(s.Lim.OutcomeRows, 1, 8) }

// MarkSent implements store.Store.
func (s *Syntax) MarkSent(ctx context.Context, db store.DB, seqs []int64, now, lease time.Time) (int64, error) {
	return s.ExecChunks(ctx, db, len(seqs), s.seqChunk(), func(i, j int) Query {
		b := s.Build()
		b.W("UPDATE ", s.Table, " SET status = 'sent', sent_at = ", b.Time(now), ", updated_at = ", b.Time(now))
		if s.SentRange != "" {
			// The column the overview's range of sent rows reads.
			b.W(", ", s.SentRange, " = ", b.Time(now))
		}
		return b.W(", locked_until = NULL, last_error = NULL WHERE ", b.Seqs("seq", seqs[i:j]),
			" AND locked_until = ", b.Time(lease), " AND status = 'pending'").Query()
	})
}

// Release implements store.Store.
func (s *Syntax) Release(ctx context.Context, db store.DB, seqs []int64, now, lease time.Time) (int64, error) {
	return s.ExecChunks(ctx, db, len(seqs), s.seqChunk(), func(i, j int) Query {
		b := s.Build()
		return b.W("UPDATE ", s.Table, " SET available_at = ", b.Time(now), ", updated_at = ", b.Time(now),
			", locked_until = NULL, attempts = attempts - 1 WHERE ", b.Seqs("seq", seqs[i:j]),
			" AND locked_until = ", b.Time(lease), " AND status = 'pending'").Query()
	})
}

// FailedChunk is how many outcomes one MarkFailed statement takes (4
// parameters each).
func (s *Syntax) FailedChunk() int { return s.PerStatement(s.Lim.OutcomeRows, 4, 2) }

// MarkFailed implements store.Store in one statement per chunk joined to a
// VALUES list: each row gets its own status, error and next due time.
func (s *Syntax) MarkFailed(ctx context.Context, db store.DB, outs []store.Outcome, now, lease time.Time) (int64, error) {
	return s.ExecChunks(ctx, db, len(outs), s.FailedChunk(), func(i, j int) Query {
		return s.markFailedValues(outs[i:j], now, lease)
	})
}

func (s *Syntax) markFailedValues(outs []store.Outcome, now, lease time.Time) Query {
	timeCast, seqCast := s.FailedCasts[0], s.FailedCasts[1]
	b := s.Build()
	b.W("UPDATE ", s.Table, " AS o SET status = v.column2, last_error = v.column3, available_at = v.column4,",
		" locked_until = NULL, updated_at = ", b.Time(now), " FROM (VALUES ")
	for i, o := range outs {
		if i > 0 {
			b.W(", ")
		}
		b.W("(", b.Arg(o.Seq), seqCast, ", ", s.StatusArg(b.Arg(o.Status)), ", ", b.Arg(o.Err), ", ", b.Time(o.Due), timeCast, ")")
	}
	b.W(") AS v WHERE o.seq = v.column1 AND o.locked_until = ", b.Time(lease), " AND o.status = 'pending'")
	return b.Query()
}

// DeleteSent implements store.Store: up to limit rows sent before before,
// picked by a subquery (Lock lets relays sharing the table skip each
// other's rows).
func (s *Syntax) DeleteSent(ctx context.Context, db store.DB, before time.Time, limit int) (int64, error) {
	b := s.Build()
	return s.Exec(ctx, db, b.W("DELETE FROM ", s.Table, " WHERE seq IN (SELECT seq FROM ", s.Table,
		" WHERE status = 'sent' AND sent_at < ", b.Time(before), " LIMIT ", b.Limit(limit), s.Lock, ")").Query())
}

// Stats implements store.Store.
func (s *Syntax) Stats(ctx context.Context, db store.DB) ([]store.StatusCount, error) {
	q := Query{SQL: "SELECT status, COUNT(*), " + s.TimeCol("MIN("+s.CreatedCol()+")") + " FROM " + s.Table + " GROUP BY status"}
	var out []store.StatusCount
	err := s.Each(ctx, db, q, func(rows *sql.Rows) error {
		var (
			c      store.StatusCount
			oldest DBTime
		)
		if err := rows.Scan(&c.Status, &c.N, &oldest); err != nil {
			return err
		}
		c.Oldest = oldest.T
		out = append(out, c)
		return nil
	})
	return out, err
}

// FailedSince implements store.Store.
func (s *Syntax) FailedSince(ctx context.Context, db store.DB, since time.Time) (int64, error) {
	b := s.Build()
	var n int64
	err := s.Row(ctx, db, b.W("SELECT COUNT(*) FROM ", s.Table, " WHERE status = 'failed' AND updated_at >= ", b.Time(since)).Query(), &n)
	return n, err
}

// IDColumn implements store.Store.
func (s *Syntax) IDColumn() string { return s.IDCol }

// Limits implements store.Store.
func (s *Syntax) Limits() store.Limits { return s.Lim }
