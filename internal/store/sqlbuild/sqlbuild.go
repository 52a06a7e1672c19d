// Package sqlbuild is the SQL the stores share: a statement builder that
// numbers placeholders in each database's style, and the statements that
// are the same text on several databases, parameterised by how each spells
// the parts that differ. A store embeds a Syntax and overrides what its
// database says differently.
package sqlbuild

import (
	"strconv"
	"strings"
	"time"

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
}

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
func (b *Builder) IDs(col string, ids []string) string {
	if b.s.Arrays {
		return col + " = ANY(" + b.Arg(ids) + ")"
	}
	var s strings.Builder
	s.WriteString(col + " IN (")
	for i, id := range ids {
		if i > 0 {
			s.WriteString(", ")
		}
		s.WriteString(b.Arg(id))
	}
	s.WriteByte(')')
	return s.String()
}

// Query returns the statement.
func (b *Builder) Query() store.Query { return store.Query{SQL: b.b.String(), Args: b.args} }

// SkipLocked locks the rows a subquery picks, skipping those another
// transaction holds.
const SkipLocked = " FOR UPDATE SKIP LOCKED"

const insertColumns = "(id, event_type, aggregate_type, aggregate_id, idempotency_key, payload, headers, status, attempts, available_at, occurred_at, created_at, updated_at)"

// InsertRows builds a multi-row INSERT; conflict is the clause that makes a
// duplicate a no-op. Rows whose ID and key were both generated (a fresh
// UUIDv7, the key equal to it) cannot be duplicates, and go without it:
// an INSERT that may conflict is a speculative insertion, which costs
// PostgreSQL a check of every unique index before the row and one more WAL
// record after it. Should a generated ID ever repeat, the INSERT fails and
// with it the caller's transaction: nothing is lost.
func (s *Syntax) InsertRows(rows []store.Event, now time.Time, conflict string) store.Query {
	if allGenerated(rows) {
		conflict = ""
	}
	b := s.Build()
	b.W("INSERT INTO ", s.Table, " ", insertColumns, " VALUES ")
	for i := range rows {
		e := &rows[i]
		var headers any
		if e.Headers != nil {
			headers = string(e.Headers)
		}
		if i > 0 {
			b.W(", ")
		}
		b.W("(", b.Arg(e.ID), ", ", b.Arg(e.Type), ", ", b.Arg(e.AggregateType), ", ", b.Arg(e.AggregateID),
			", ", b.Arg(e.Key), ", ", b.Arg(string(e.Payload)), ", ", b.Arg(headers),
			", 'pending', 0, ", b.Time(now), ", ", b.Time(e.OccurredAt), ", ", b.Time(now), ", ", b.Time(now), ")")
	}
	b.W(conflict)
	return b.Query()
}

func allGenerated(rows []store.Event) bool {
	for i := range rows {
		if !rows[i].Generated {
			return false
		}
	}
	return true
}

// ClaimColumns are the columns a claim returns, in store.QueryClaimed's
// order.
func (s *Syntax) ClaimColumns() string {
	return "seq, id, event_type, aggregate_type, aggregate_id, idempotency_key, payload, headers, attempts, " +
		s.TimeCol("occurred_at") + ", " + s.TimeCol("created_at")
}

// KeysOf reads the idempotency keys and creation times of the rows with
// the given IDs.
func (s *Syntax) KeysOf(ids []string) store.Query {
	b := s.Build()
	return b.W("SELECT id, idempotency_key, ", s.TimeCol("created_at"), " FROM ", s.Table, " WHERE ", b.IDs("id", ids)).Query()
}

// Due writes the claim's filter on the table aliased c: pending and due,
// and with ordering, not behind an unsent event of its aggregate written
// before it (seq is the database's write order, not a writer's clock).
// Events without an aggregate ID are not ordered.
func (s *Syntax) Due(b *Builder, c store.ClaimSpec) {
	b.W("c.status = 'pending' AND c.available_at <= ", b.Time(c.Now),
		" AND (c.locked_until IS NULL OR c.locked_until <= ", b.Time(c.Now), ")")
	if len(c.IDs) > 0 {
		b.W(" AND ", b.IDs("c.id", c.IDs))
	}
	if c.Ordered {
		b.W(" AND (c.aggregate_id = '' OR NOT EXISTS (SELECT 1 FROM ", s.Table, " p",
			" WHERE p.aggregate_type = c.aggregate_type AND p.aggregate_id = c.aggregate_id AND ", s.Unsent,
			" AND p.seq < c.seq))")
	}
}

// ClaimUpdate is the one-statement claim of databases with UPDATE ...
// RETURNING: the subquery picks the due rows (lock skips rows another claim
// holds), the UPDATE leases them. The lease is locked_until alone: the claim
// changes no indexed column, so on PostgreSQL it can be a HOT update when
// the page has room, and one index range (pending, available_at <= now)
// still finds new rows and rows whose relay died (their lease expired); the
// rows in flight, at most the relays' batches, are skipped on the way.
func (s *Syntax) ClaimUpdate(c store.ClaimSpec, lock string) store.Query {
	b := s.Build()
	b.W("UPDATE ", s.Table, " SET locked_until = ", b.Time(c.Lease),
		", attempts = attempts + 1, updated_at = ", b.Time(c.Now),
		" WHERE id IN (SELECT c.id FROM ", s.Table, " c WHERE ")
	s.Due(b, c)
	b.W(" ORDER BY c.available_at, c.seq LIMIT ", b.Arg(c.Limit), lock, ") RETURNING ", s.ClaimColumns())
	return b.Query()
}

// MarkSent implements store.Claimer.
func (s *Syntax) MarkSent(ids []string, now, lease time.Time) store.Query {
	b := s.Build()
	return b.W("UPDATE ", s.Table, " SET status = 'sent', sent_at = ", b.Time(now), ", updated_at = ", b.Time(now),
		", locked_until = NULL, last_error = NULL WHERE ", b.IDs("id", ids),
		" AND locked_until = ", b.Time(lease), " AND status = 'pending'").Query()
}

// Release implements store.Claimer.
func (s *Syntax) Release(ids []string, now, lease time.Time) store.Query {
	b := s.Build()
	return b.W("UPDATE ", s.Table, " SET available_at = ", b.Time(now), ", updated_at = ", b.Time(now),
		", locked_until = NULL, attempts = attempts - 1 WHERE ", b.IDs("id", ids),
		" AND locked_until = ", b.Time(lease), " AND status = 'pending'").Query()
}

// MarkFailedValues records failed attempts in one statement joined to a
// VALUES list: each row gets its own status (pending for a retry, failed
// when out of attempts), error and next due time. cast types the due
// times, which are untyped text in VALUES otherwise.
func (s *Syntax) MarkFailedValues(outs []store.Outcome, now, lease time.Time, cast string) store.Query {
	b := s.Build()
	b.W("UPDATE ", s.Table, " AS o SET status = v.column2, last_error = v.column3, available_at = v.column4,",
		" locked_until = NULL, updated_at = ", b.Time(now), " FROM (VALUES ")
	for i, o := range outs {
		if i > 0 {
			b.W(", ")
		}
		b.W("(", b.Arg(o.ID), ", ", b.Arg(o.Status), ", ", b.Arg(o.Err), ", ", b.Time(o.Due), cast, ")")
	}
	b.W(") AS v WHERE o.id = v.column1 AND o.locked_until = ", b.Time(lease), " AND o.status = 'pending'")
	return b.Query()
}

// DeleteSentIn deletes up to limit rows sent before before, picked by a
// subquery (lock lets relays sharing the table skip each other's rows).
func (s *Syntax) DeleteSentIn(before time.Time, limit int, lock string) store.Query {
	b := s.Build()
	return b.W("DELETE FROM ", s.Table, " WHERE id IN (SELECT id FROM ", s.Table,
		" WHERE status = 'sent' AND sent_at < ", b.Time(before), " LIMIT ", b.Arg(limit), lock, ")").Query()
}

// Stats implements store.Admin.
func (s *Syntax) Stats() store.Query {
	return store.Query{SQL: "SELECT status, COUNT(*), " + s.TimeCol("MIN(created_at)") + " FROM " + s.Table + " GROUP BY status"}
}

// FailedSince counts the rows marked failed at or after since (a failed
// row's updated_at is when it failed, or was last touched by an operator).
func (s *Syntax) FailedSince(since time.Time) store.Query {
	b := s.Build()
	return b.W("SELECT COUNT(*) FROM ", s.Table, " WHERE status = 'failed' AND updated_at >= ", b.Time(since)).Query()
}
