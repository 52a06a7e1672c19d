package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"gorm.io/gorm"
)

// Errors of the operating functions ([Outbox.List], [Outbox.Get],
// [Outbox.Count], [Outbox.ReplayFilter], [Outbox.Purge]).
var (
	// ErrNotFound is returned by [Outbox.Get] for an ID the table does not
	// hold.
	ErrNotFound = errors.New("outbox: event not found")

	// ErrInvalidFilter is wrapped by errors about a [Filter] or
	// [ListParams] value: an unknown status, a negative limit, a purge that
	// asks for pending rows.
	ErrInvalidFilter = errors.New("outbox: invalid filter")
)

// Filter selects rows of the outbox table, for the operating functions
// that list, count, replay and purge them. Its zero value matches every
// row; each field that is set narrows the selection (the fields are ANDed,
// the values within a list ORed).
type Filter struct {
	// IDs matches these event IDs.
	IDs []string
	// Statuses matches these statuses: [StatusPending], [StatusSent],
	// [StatusFailed]. Anything else is [ErrInvalidFilter].
	Statuses []string
	// Types matches these event types.
	Types []string
	// AggregateType and AggregateID match the event's aggregate.
	AggregateType string
	AggregateID   string
	// CreatedSince matches rows created at or after it, when not zero.
	CreatedSince time.Time
	// CreatedUntil matches rows created before it, when not zero.
	CreatedUntil time.Time
	// ErrorContains matches rows whose last error contains this text,
	// ignoring case (on SQLite, case is ignored for ASCII letters only).
	ErrorContains string
}

// ListParams selects one page of [Outbox.List].
type ListParams struct {
	Filter
	// Limit is the page size. Defaults to 50; at most 1000 (a larger value
	// is lowered to 1000).
	Limit int
	// AfterSeq returns rows with Seq > AfterSeq. Oldest first, pass the
	// last row's Seq for the next page. Defaults to 0: from the start.
	AfterSeq int64
	// Newest lists newest first (by Seq, the order rows were written)
	// instead of oldest first. Defaults to false.
	Newest bool
	// BeforeSeq returns rows with Seq < BeforeSeq, when not 0. Newest
	// first, pass the last row's Seq for the next page.
	BeforeSeq int64
}

const (
	defaultListLimit = 50
	maxListLimit     = 1000
	// adminBatch bounds the rows one statement of ReplayFilter or Purge
	// touches, so that neither holds many row locks at once.
	adminBatch = 1000
	// adminScan is how many IDs one SELECT of ReplayFilter or Purge reads
	// for its batches: the SELECT may scan the table (PostgreSQL has no
	// index on seq, nor on most filter columns), so it runs once per ten
	// batches rather than once per batch.
	adminScan = 10 * adminBatch
)

// validate checks the values a filter holds.
func (f *Filter) validate() error {
	for _, s := range f.Statuses {
		switch s {
		case StatusPending, StatusSent, StatusFailed:
		default:
			return fmt.Errorf("%w: unknown status %q (use %s, %s or %s)", ErrInvalidFilter, s, StatusPending, StatusSent, StatusFailed)
		}
	}
	return nil
}

// usable reports why the operating functions cannot run on db, if they
// cannot.
func (o *Outbox) usable(db *gorm.DB) error {
	if o.mode == Memory {
		return ErrMemoryMode
	}
	if o.dialect == nil || fromDB(db) != o {
		return ErrNotInstalled
	}
	return nil
}

// where writes the WHERE clause of f (and of the extra conditions, which
// come first); it writes nothing when nothing is selected.
func (s *sqlSyntax) where(b *builder, f Filter, extra ...string) {
	conds := append([]string(nil), extra...)
	add := func(c string) { conds = append(conds, c) }
	if len(f.IDs) > 0 {
		add(b.ids("id", f.IDs))
	}
	if len(f.Statuses) > 0 {
		add(b.ids("status", f.Statuses))
	}
	if len(f.Types) > 0 {
		add(b.ids("event_type", f.Types))
	}
	if f.AggregateType != "" {
		add("aggregate_type = " + b.arg(f.AggregateType))
	}
	if f.AggregateID != "" {
		add("aggregate_id = " + b.arg(f.AggregateID))
	}
	if !f.CreatedSince.IsZero() {
		add("created_at >= " + b.time(f.CreatedSince))
	}
	if !f.CreatedUntil.IsZero() {
		add("created_at < " + b.time(f.CreatedUntil))
	}
	if f.ErrorContains != "" {
		// '!' escapes, not backslash: MySQL reads a backslash in a
		// literal as an escape itself, unless NO_BACKSLASH_ESCAPES is set.
		add("LOWER(last_error) LIKE LOWER(" + b.arg(likeContains(f.ErrorContains)) + ") ESCAPE '!'")
	}
	if len(conds) > 0 {
		b.w(" WHERE ", strings.Join(conds, " AND "))
	}
}

// likeContains is the LIKE pattern matching text anywhere, with LIKE's
// wildcards in text taken literally.
func likeContains(text string) string {
	r := strings.NewReplacer("!", "!!", "%", "!%", "_", "!_")
	return "%" + r.Replace(text) + "%"
}

// rowColumns are the columns scanRows reads, in its order.
func (s *sqlSyntax) rowColumns() string {
	return "seq, id, event_type, aggregate_type, aggregate_id, idempotency_key, payload, headers, status, attempts, last_error, " +
		s.timeCol("available_at") + ", " + s.timeCol("locked_until") + ", " + s.timeCol("occurred_at") + ", " +
		s.timeCol("created_at") + ", " + s.timeCol("updated_at") + ", " + s.timeCol("sent_at")
}

func scanRows(rows *sql.Rows) ([]Row, error) {
	defer rows.Close()
	var out []Row
	for rows.Next() {
		var (
			r                                 Row
			payload                           []byte
			headers, lastErr                  sql.NullString
			avail, locked, occ, added, upd, s dbTime
		)
		if err := rows.Scan(&r.Seq, &r.ID, &r.EventType, &r.AggregateType, &r.AggregateID, &r.IdempotencyKey,
			&payload, &headers, &r.Status, &r.Attempts, &lastErr, &avail, &locked, &occ, &added, &upd, &s); err != nil {
			return nil, err
		}
		r.Payload = string(payload)
		if headers.Valid {
			r.Headers = &headers.String
		}
		if lastErr.Valid {
			r.LastError = &lastErr.String
		}
		r.AvailableAt, r.OccurredAt, r.CreatedAt, r.UpdatedAt = avail.t, occ.t, added.t, upd.t
		r.LockedUntil, r.SentAt = optTime(locked.t), optTime(s.t)
		out = append(out, r)
	}
	return out, rows.Err()
}

func optTime(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// List returns one page of the rows matching p.Filter, oldest first (or
// newest first with p.Newest), ordered by Seq so that paging with AfterSeq
// or BeforeSeq is stable while rows are added. Times are UTC on every
// database. db may be a transaction; ctx governs the query.
func (o *Outbox) List(ctx context.Context, db *gorm.DB, p ListParams) ([]Row, error) {
	if err := o.usable(db); err != nil {
		return nil, err
	}
	if err := p.validate(); err != nil {
		return nil, err
	}
	if p.Limit < 0 {
		return nil, fmt.Errorf("%w: negative Limit %d", ErrInvalidFilter, p.Limit)
	}
	limit := min(p.Limit, maxListLimit)
	if limit == 0 {
		limit = defaultListLimit
	}
	s := o.dialect.syntax()
	b := s.build()
	b.w("SELECT ", s.rowColumns(), " FROM ", s.table)
	var page []string
	if p.AfterSeq > 0 {
		page = append(page, "seq > "+b.arg(p.AfterSeq))
	}
	if p.BeforeSeq > 0 {
		page = append(page, "seq < "+b.arg(p.BeforeSeq))
	}
	s.where(b, p.Filter, page...)
	order := " ORDER BY seq"
	if p.Newest {
		order += " DESC"
	}
	b.w(order, " LIMIT ", b.arg(limit))
	q := b.query()
	rows, err := db.Statement.ConnPool.QueryContext(ctx, q.sql, q.args...)
	if err != nil {
		return nil, fmt.Errorf("outbox: list events: %w", err)
	}
	out, err := scanRows(rows)
	if err != nil {
		return nil, fmt.Errorf("outbox: list events: %w", err)
	}
	return out, nil
}

// Get returns the row of the event with the given ID, or an error wrapping
// [ErrNotFound]. db may be a transaction.
func (o *Outbox) Get(ctx context.Context, db *gorm.DB, id string) (Row, error) {
	if err := o.usable(db); err != nil {
		return Row{}, err
	}
	s := o.dialect.syntax()
	b := s.build()
	q := b.w("SELECT ", s.rowColumns(), " FROM ", s.table, " WHERE id = ", b.arg(id)).query()
	rows, err := db.Statement.ConnPool.QueryContext(ctx, q.sql, q.args...)
	if err != nil {
		return Row{}, fmt.Errorf("outbox: get event %s: %w", id, err)
	}
	out, err := scanRows(rows)
	if err != nil {
		return Row{}, fmt.Errorf("outbox: get event %s: %w", id, err)
	}
	if len(out) == 0 {
		return Row{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return out[0], nil
}

// Count returns how many rows match f: what a dry run of ReplayFilter
// (with Statuses set to failed) or Purge would touch. It scans the
// matching rows, so a dashboard should not call it per request on a large
// table without a narrow filter. db may be a transaction.
func (o *Outbox) Count(ctx context.Context, db *gorm.DB, f Filter) (int64, error) {
	if err := o.usable(db); err != nil {
		return 0, err
	}
	if err := f.validate(); err != nil {
		return 0, err
	}
	s := o.dialect.syntax()
	b := s.build()
	b.w("SELECT COUNT(*) FROM ", s.table)
	s.where(b, f)
	q := b.query()
	var n int64
	if err := db.Statement.ConnPool.QueryRowContext(ctx, q.sql, q.args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox: count events: %w", err)
	}
	return n, nil
}

// ReplayFilter puts the failed rows matching f back to pending, due now,
// with their attempts reset, as [Outbox.Replay] does, and returns how many
// it changed. Rows that are not failed are skipped; a filter whose
// Statuses leave out failed is [ErrInvalidFilter]. It works in batches of
// at most 1000 rows, each an UPDATE of rows read beforehand in Seq order
// that still match, so it never holds many row locks at once and a row
// that fails again while it runs is not replayed twice.
// db may be a transaction (the batches then share it); on error, the
// batches before it stay replayed and are counted in the result.
func (o *Outbox) ReplayFilter(ctx context.Context, db *gorm.DB, f Filter) (int, error) {
	if err := o.usable(db); err != nil {
		return 0, err
	}
	if err := f.validate(); err != nil {
		return 0, err
	}
	if len(f.Statuses) > 0 && !slices.Contains(f.Statuses, StatusFailed) {
		return 0, fmt.Errorf("%w: replay changes only failed rows; statuses %v leave them out", ErrInvalidFilter, f.Statuses)
	}
	f.Statuses = []string{StatusFailed}
	s := o.dialect.syntax()
	pool := db.Statement.ConnPool
	total := 0
	var after int64
	for {
		b := s.build()
		b.w("SELECT seq, id FROM ", s.table)
		s.where(b, f, "seq > "+b.arg(after))
		b.w(" ORDER BY seq LIMIT ", b.arg(adminScan))
		ids, last, err := selectIDs(ctx, pool, b.query())
		if err != nil {
			return total, fmt.Errorf("outbox: replay events: %w", err)
		}
		for batch := range slices.Chunk(ids, adminBatch) {
			now := o.now()
			u := s.build()
			u.w("UPDATE ", s.table, " SET status = 'pending', attempts = 0, available_at = ", u.time(now),
				", updated_at = ", u.time(now), ", locked_until = NULL")
			s.where(u, f, u.ids("id", batch))
			n, err := execCount(ctx, pool, u.query())
			if err != nil {
				return total, fmt.Errorf("outbox: replay %d events: %w", len(batch), err)
			}
			total += n
		}
		if len(ids) < adminScan {
			return total, nil
		}
		after = last
	}
}

// Purge deletes the sent and failed rows matching f and returns how many it
// deleted. It never deletes pending rows: a filter whose Statuses include
// pending is [ErrInvalidFilter], and with no Statuses it matches sent and
// failed rows. Deleting a failed row is how to skip a poison event that
// holds back the later events of its aggregate (RelayConfig.OrderByAggregate).
// It works in batches of at most 1000 rows, each a DELETE of rows read
// beforehand that still match, so it never holds many row locks at once; a
// row replayed while it runs is not deleted. db may be a transaction; on
// error, the batches before it stay deleted and are counted in the result.
func (o *Outbox) Purge(ctx context.Context, db *gorm.DB, f Filter) (int, error) {
	if err := o.usable(db); err != nil {
		return 0, err
	}
	if err := f.validate(); err != nil {
		return 0, err
	}
	if slices.Contains(f.Statuses, StatusPending) {
		return 0, fmt.Errorf("%w: purge never deletes pending rows (replay or wait for them instead)", ErrInvalidFilter)
	}
	if len(f.Statuses) == 0 {
		f.Statuses = []string{StatusSent, StatusFailed}
	}
	s := o.dialect.syntax()
	pool := db.Statement.ConnPool
	total := 0
	for {
		// No ORDER BY: deleted rows leave the selection, so each round
		// takes whichever matching rows the database finds first (through
		// the sent index, on PostgreSQL and SQLite, for sent rows).
		b := s.build()
		b.w("SELECT seq, id FROM ", s.table)
		s.where(b, f)
		b.w(" LIMIT ", b.arg(adminScan))
		ids, _, err := selectIDs(ctx, pool, b.query())
		if err != nil {
			return total, fmt.Errorf("outbox: purge events: %w", err)
		}
		deleted := 0
		for batch := range slices.Chunk(ids, adminBatch) {
			d := s.build()
			d.w("DELETE FROM ", s.table)
			s.where(d, f, d.ids("id", batch))
			n, err := execCount(ctx, pool, d.query())
			if err != nil {
				return total, fmt.Errorf("outbox: purge %d events: %w", len(batch), err)
			}
			deleted += n
		}
		total += deleted
		// deleted == 0: every row selected changed under us; stop rather
		// than select them again.
		if len(ids) < adminScan || deleted == 0 {
			return total, nil
		}
	}
}

// selectIDs runs a SELECT seq, id and returns the IDs and the last seq.
func selectIDs(ctx context.Context, pool gorm.ConnPool, q query) ([]string, int64, error) {
	rows, err := pool.QueryContext(ctx, q.sql, q.args...)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	var (
		ids  []string
		last int64
	)
	for rows.Next() {
		var id string
		if err := rows.Scan(&last, &id); err != nil {
			return nil, 0, err
		}
		ids = append(ids, id)
	}
	return ids, last, rows.Err()
}

func execCount(ctx context.Context, pool gorm.ConnPool, q query) (int, error) {
	res, err := pool.ExecContext(ctx, q.sql, q.args...)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	return int(n), err
}

// failedSince counts the rows marked failed at or after since (a failed
// row's updated_at is when it failed, or was last touched by an operator).
func (s *sqlSyntax) failedSince(since time.Time) query {
	b := s.build()
	return b.w("SELECT COUNT(*) FROM ", s.table, " WHERE status = 'failed' AND updated_at >= ", b.time(since)).query()
}

// syntax returns the statement syntax the operating functions build with;
// every dialect embeds one.
func (s *sqlSyntax) syntax() *sqlSyntax { return s }
