package outbox

import (
	"time"
)

// The statements Logical mode adds on PostgreSQL: the stream writes to the
// table only what is not delivered at once.

// parkRow is a streamed event written to the table: a failed attempt (to
// retry or failed for good), an event held back behind its aggregate or
// handed back, or, leased to the stream, an event whose idempotency key
// must be checked against the table before it is delivered.
type parkRow struct {
	e        *encoded
	status   string
	attempts int
	lastErr  any // string or nil
	due      time.Time
	lease    any // time.Time or nil
	created  time.Time
}

const parkColumns = "(id, event_type, aggregate_type, aggregate_id, idempotency_key, payload, headers, status, attempts, last_error, available_at, locked_until, occurred_at, created_at, updated_at)"

// park inserts rows in the order given (seq follows it, which ordering by
// aggregate relies on) and returns the IDs it inserted: a row whose ID or
// idempotency key is already in the table is skipped, as Publish skips it
// in Persistent mode.
func (d *postgresDialect) park(rows []parkRow, now time.Time) query {
	b := d.build()
	b.w("INSERT INTO ", d.table, " ", parkColumns, " VALUES ")
	for i := range rows {
		p := &rows[i]
		var headers any
		if p.e.headers != nil {
			headers = string(p.e.headers)
		}
		if i > 0 {
			b.w(", ")
		}
		b.w("(", b.arg(p.e.ID), ", ", b.arg(p.e.Type), ", ", b.arg(p.e.AggregateType), ", ", b.arg(p.e.AggregateID),
			", ", b.arg(p.e.IdempotencyKey), ", ", b.arg(string(p.e.payload)), ", ", b.arg(headers),
			", ", b.arg(p.status), ", ", b.arg(p.attempts), ", ", b.arg(p.lastErr), ", ", b.time(p.due),
			", ", b.arg(p.lease), "::timestamptz, ", b.time(p.e.OccurredAt), ", ", b.time(p.created), ", ", b.time(now), ")")
	}
	b.w(" ON CONFLICT DO NOTHING RETURNING id")
	return b.query()
}

// blocked returns the aggregates among types/ids (pairwise) that have an
// unsent row in the table, through the ordering index.
func (d *postgresDialect) blocked(types, ids []string) query {
	b := d.build()
	return b.w("SELECT DISTINCT aggregate_type, aggregate_id FROM ", d.table,
		" WHERE status <> 'sent' AND (aggregate_type, aggregate_id) IN (SELECT * FROM unnest(",
		b.arg(types), "::text[], ", b.arg(ids), "::text[]))").query()
}

// slotStatsQuery reads the slot's lag (WAL kept for it, in bytes) and whether
// a relay streams it.
func slotStatsQuery(slot string) query {
	return query{
		sql:  "SELECT active, COALESCE(pg_current_wal_lsn() - confirmed_flush_lsn, 0)::bigint FROM pg_replication_slots WHERE slot_name = $1",
		args: []any{slot},
	}
}
