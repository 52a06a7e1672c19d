package outbox

import (
	"strconv"
	"strings"
)

// statements holds the SQL the library runs, built once per dialect and
// table. Every statement uses numbered placeholders ($n on PostgreSQL, ?n on
// SQLite) so one argument can be referenced twice, and none of them is ever
// built from event data.
type statements struct {
	dialect string
	table   string // quoted

	insertOne    string
	claim        string // due rows, oldest first
	claimOrdered string // the same, at most the oldest undelivered row per aggregate
	markSent     string // PostgreSQL only; SQLite builds per batch size
	release      string // PostgreSQL only
	replay       string // PostgreSQL only
	claimFields  string
}

const insertColumns = "(id, event_type, aggregate_type, aggregate_id, idempotency_key, payload, headers, status, attempts, available_at, occurred_at, created_at, updated_at)"

// insertArgs is the number of arguments per inserted row.
const insertArgs = 9

func buildStatements(dialect, table string) *statements {
	s := &statements{dialect: dialect, table: `"` + table + `"`}
	s.insertOne = s.insert(1)
	s.claimFields = "id, event_type, aggregate_type, aggregate_id, idempotency_key, payload, headers, attempts, occurred_at, created_at"
	s.claim = s.claimSQL(false, 0)
	s.claimOrdered = s.claimSQL(true, 0)
	if dialect == "postgres" {
		s.markSent = "UPDATE " + s.table + " SET status = 'sent', sent_at = $1, updated_at = $1, locked_until = NULL, last_error = NULL" +
			" WHERE id = ANY($3) AND locked_until = $2 AND status = 'pending'"
		s.release = "UPDATE " + s.table + " SET available_at = $1, updated_at = $1, locked_until = NULL, attempts = attempts - 1" +
			" WHERE id = ANY($3) AND locked_until = $2 AND status = 'pending'"
		s.replay = "UPDATE " + s.table + " SET status = 'pending', attempts = 0, available_at = $1, updated_at = $1, locked_until = NULL" +
			" WHERE id = ANY($2) AND status = 'failed'"
	}
	return s
}

// p returns placeholder number i.
// claimSQL builds the claim: move available_at and locked_until to the
// lease's end, count the attempt, return the rows. Claiming moves available_at
// so that a claimed row is not due again until its lease expires, and one
// index range (status = pending, available_at <= now) finds both new rows and
// rows whose relay died. Arguments: lease end, now, limit, then the ids when
// byIDs > 0 (one array argument on PostgreSQL).
func (s *statements) claimSQL(ordered bool, byIDs int) string {
	where := "c.status = 'pending' AND c.available_at <= " + s.p(2)
	if byIDs > 0 {
		ids, _ := s.idList(4, byIDs)
		where += " AND c." + ids
	}
	if ordered {
		// An event waits while an older event of its aggregate is not sent
		// (pending, claimed, or failed). Events without an aggregate ID are
		// not ordered.
		where += " AND (c.aggregate_id = '' OR NOT EXISTS (SELECT 1 FROM " + s.table + " p" +
			" WHERE p.aggregate_type = c.aggregate_type AND p.aggregate_id = c.aggregate_id AND p.status <> 'sent'" +
			" AND (p.created_at, p.id) < (c.created_at, c.id)))"
	}
	lock := ""
	if s.dialect == "postgres" {
		// SKIP LOCKED lets concurrent relays claim disjoint batches instead of
		// queueing on each other's row locks. SQLite has one writer at a time,
		// so the single UPDATE is atomic there without it.
		lock = " FOR UPDATE SKIP LOCKED"
	}
	return "UPDATE " + s.table + " SET available_at = " + s.p(1) + ", locked_until = " + s.p(1) +
		", attempts = attempts + 1, updated_at = " + s.p(2) +
		" WHERE id IN (SELECT c.id FROM " + s.table + " c WHERE " + where +
		" ORDER BY c.available_at, c.id LIMIT " + s.p(3) + lock + ") RETURNING " + s.claimFields
}

// deleteSentSQL deletes up to $2 rows sent before $1: small batches, so
// retention never holds locks on many rows at once.
func (s *statements) deleteSentSQL() string {
	lock := ""
	if s.dialect == "postgres" {
		lock = " FOR UPDATE SKIP LOCKED" // relays sharing the table do not queue on each other
	}
	return "DELETE FROM " + s.table + " WHERE id IN (SELECT id FROM " + s.table +
		" WHERE status = 'sent' AND sent_at < " + s.p(1) + " LIMIT " + s.p(2) + lock + ")"
}

func (s *statements) statsSQL() string {
	return "SELECT status, COUNT(*), MIN(created_at) FROM " + s.table + " GROUP BY status"
}

// orderingIndexSQL is the index per-aggregate ordering needs; only relays
// with ordering on create it, so unordered users do not pay for it on every
// insert.
func (s *statements) orderingIndexSQL(table string) string {
	return "CREATE INDEX IF NOT EXISTS " + `"` + table + `_aggregate_idx"` + " ON " + s.table +
		" (aggregate_type, aggregate_id, created_at, id) WHERE status <> 'sent'"
}

func (s *statements) p(i int) string {
	if s.dialect == "postgres" {
		return "$" + strconv.Itoa(i)
	}
	return "?" + strconv.Itoa(i)
}

// insert builds an INSERT of n rows. ON CONFLICT DO NOTHING makes a
// duplicate idempotency key (or ID) a no-op: the first write wins, and on
// PostgreSQL the caller's transaction is not aborted by a unique violation.
func (s *statements) insert(n int) string {
	var b strings.Builder
	b.WriteString("INSERT INTO " + s.table + " " + insertColumns + " VALUES ")
	for r := range n {
		if r > 0 {
			b.WriteString(", ")
		}
		base := r * insertArgs
		b.WriteByte('(')
		for c := 1; c <= 7; c++ {
			b.WriteString(s.p(base + c))
			b.WriteString(", ")
		}
		// status, attempts, then available_at = created_at = updated_at = now.
		now := s.p(base + 9)
		b.WriteString("'pending', 0, " + now + ", " + s.p(base+8) + ", " + now + ", " + now + ")")
	}
	b.WriteString(" ON CONFLICT DO NOTHING")
	return b.String()
}

// idList returns the id filter for n ids starting at placeholder first, and
// whether the ids go as one array argument (PostgreSQL) or one each.
func (s *statements) idList(first, n int) (string, bool) {
	if s.dialect == "postgres" {
		return "id = ANY(" + s.p(first) + ")", true
	}
	var b strings.Builder
	b.WriteString("id IN (")
	for i := range n {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(s.p(first + i))
	}
	b.WriteByte(')')
	return b.String(), false
}

// markSentSQL marks a batch sent, guarded by the lease that claimed it: a row
// whose lease expired and was claimed by another relay is left to that relay.
func (s *statements) markSentSQL(n int) (string, bool) {
	if s.markSent != "" {
		return s.markSent, true
	}
	ids, arr := s.idList(3, n)
	return "UPDATE " + s.table + " SET status = 'sent', sent_at = ?1, updated_at = ?1, locked_until = NULL, last_error = NULL" +
		" WHERE " + ids + " AND locked_until = ?2 AND status = 'pending'", arr
}

// releaseSQL hands claimed rows back undelivered: due now, and the attempt
// the claim counted is taken back.
func (s *statements) releaseSQL(n int) (string, bool) {
	if s.release != "" {
		return s.release, true
	}
	ids, arr := s.idList(3, n)
	return "UPDATE " + s.table + " SET available_at = ?1, updated_at = ?1, locked_until = NULL, attempts = attempts - 1" +
		" WHERE " + ids + " AND locked_until = ?2 AND status = 'pending'", arr
}

func (s *statements) replaySQL(n int) (string, bool) {
	if s.replay != "" {
		return s.replay, true
	}
	ids, arr := s.idList(2, n)
	return "UPDATE " + s.table + " SET status = 'pending', attempts = 0, available_at = ?1, updated_at = ?1, locked_until = NULL" +
		" WHERE " + ids + " AND status = 'failed'", arr
}

// markFailedSQL records n failed attempts in one statement: each row gets its
// own status (pending for a retry, failed when out of attempts), error and
// next due time. Arguments: now, lease, then (id, status, error, due) per row.
func (s *statements) markFailedSQL(n int) string {
	var b strings.Builder
	b.WriteString("UPDATE " + s.table + " AS o SET status = v.column2, last_error = v.column3, available_at = v.column4," +
		" locked_until = NULL, updated_at = " + s.p(1) + " FROM (VALUES ")
	ts := ""
	if s.dialect == "postgres" {
		ts = "::timestamptz" // VALUES parameters are untyped text otherwise
	}
	for r := range n {
		if r > 0 {
			b.WriteString(", ")
		}
		base := 2 + r*4
		b.WriteString("(" + s.p(base+1) + ", " + s.p(base+2) + ", " + s.p(base+3) + ", " + s.p(base+4) + ts + ")")
	}
	b.WriteString(") AS v WHERE o.id = v.column1 AND o.locked_until = " + s.p(2) + " AND o.status = 'pending'")
	return b.String()
}
