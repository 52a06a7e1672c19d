package outbox

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/gorm-outbox/outbox/internal/store"
	"gorm.io/gorm"
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
	Statuses []Status
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

// dbContext is the context the operating functions run under: db's,
// which db.WithContext sets; a nil db gets one so that usable can refuse it.
func dbContext(db *gorm.DB) context.Context {
	if db == nil || db.Statement == nil || db.Statement.Context == nil {
		return context.Background()
	}
	return db.Statement.Context
}

// usable reports why the operating functions cannot run on db, if they
// cannot.
func (o *Outbox) usable(db *gorm.DB) error {
	if db == nil {
		return fmt.Errorf("%w: the *gorm.DB is nil", ErrNotInstalled)
	}
	if o.noTable != nil {
		return o.noTable
	}
	if o.store == nil || fromDB(db) != o {
		return ErrNotInstalled
	}
	return nil
}

// filter is f as the store takes it.
func (f *Filter) filter() store.Filter {
	return store.Filter{
		IDs: f.IDs, Statuses: statusStrings(f.Statuses), Types: f.Types,
		AggregateType: f.AggregateType, AggregateID: f.AggregateID,
		CreatedSince: f.CreatedSince, CreatedUntil: f.CreatedUntil, ErrorContains: f.ErrorContains,
	}
}

// statusStrings is ss as the store takes them.
func statusStrings(ss []Status) []string {
	if ss == nil {
		return nil
	}
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = string(s)
	}
	return out
}

// queryRows runs a query of rows in the store's row order.
func queryRows(ctx context.Context, pool gorm.ConnPool, q store.Query) ([]Row, error) {
	rows, err := pool.QueryContext(ctx, q.SQL, q.Args...)
	if err != nil {
		return nil, err
	}
	got, err := store.ScanRows(rows)
	if err != nil {
		return nil, err
	}
	out := make([]Row, len(got))
	for i, r := range got {
		out[i] = Row{
			ID: r.ID, Seq: r.Seq, EventType: r.EventType, AggregateType: r.AggregateType, AggregateID: r.AggregateID,
			IdempotencyKey: r.Key, Payload: r.Payload, Headers: r.Headers, Status: Status(r.Status), Attempts: r.Attempts,
			LastError: r.LastError, AvailableAt: r.AvailableAt, LockedUntil: r.LockedUntil, OccurredAt: r.OccurredAt,
			CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, SentAt: r.SentAt,
		}
	}
	return out, nil
}

// List returns one page of the rows matching p.Filter, oldest first (or
// newest first with p.Newest), ordered by Seq so that paging with AfterSeq
// or BeforeSeq is stable while rows are added. Times are UTC on every
// database. db may be a transaction; its context governs the query
// (db.WithContext(ctx)).
func (o *Outbox) List(db *gorm.DB, p ListParams) ([]Row, error) {
	ctx := dbContext(db)
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
	q := o.store.List(store.Page{Filter: p.filter(), Limit: limit, AfterSeq: p.AfterSeq, BeforeSeq: p.BeforeSeq, Newest: p.Newest})
	out, err := queryRows(ctx, db.Statement.ConnPool, q)
	if err != nil {
		return nil, fmt.Errorf("outbox: list events: %w", err)
	}
	return out, nil
}

// Get returns the row of the event with the given ID, or an error wrapping
// [ErrNotFound]. db may be a transaction; its context governs the query.
func (o *Outbox) Get(db *gorm.DB, id string) (Row, error) {
	ctx := dbContext(db)
	if err := o.usable(db); err != nil {
		return Row{}, err
	}
	out, err := queryRows(ctx, db.Statement.ConnPool, o.store.Get(id))
	if err != nil {
		return Row{}, fmt.Errorf("outbox: get event %s: %w", id, err)
	}
	if len(out) == 0 {
		return Row{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return out[0], nil
}

// Count returns how many rows match f: what a dry run of Replay (with
// Statuses set to failed) or Purge would touch. It scans the matching
// rows, so a dashboard should not call it per request on a large table
// without a narrow filter. db may be a transaction; its context governs
// the query.
func (o *Outbox) Count(db *gorm.DB, f Filter) (int64, error) {
	ctx := dbContext(db)
	if err := o.usable(db); err != nil {
		return 0, err
	}
	if err := f.validate(); err != nil {
		return 0, err
	}
	q := o.store.Count(f.filter())
	var n int64
	if err := db.Statement.ConnPool.QueryRowContext(ctx, q.SQL, q.Args...).Scan(&n); err != nil {
		return 0, fmt.Errorf("outbox: count events: %w", err)
	}
	return n, nil
}

// Replay puts the failed rows matching f back to pending, due now, with
// their attempts reset, and returns how many it changed: a relay delivers
// them again as if new. Replay(db, Filter{IDs: ids}) replays those events;
// a filter with no field set replays every failed row. Rows that are not
// failed are skipped; a filter whose Statuses leave out failed is
// [ErrInvalidFilter]. It works in batches of at most 1000 rows, each an
// UPDATE of rows read beforehand in Seq order that still match, so it never
// holds many row locks at once and a row that fails again while it runs is
// not replayed twice. db may be a transaction (the batches then share it);
// its context governs the statements. On error, the batches before it stay
// replayed and are counted in the result.
func (o *Outbox) Replay(db *gorm.DB, f Filter) (int, error) {
	ctx := dbContext(db)
	if err := o.usable(db); err != nil {
		return 0, err
	}
	if err := f.validate(); err != nil {
		return 0, err
	}
	if len(f.Statuses) > 0 && !slices.Contains(f.Statuses, StatusFailed) {
		return 0, fmt.Errorf("%w: replay changes only failed rows; statuses %v leave them out", ErrInvalidFilter, f.Statuses)
	}
	f.Statuses = []Status{StatusFailed}
	sf := f.filter()
	pool := db.Statement.ConnPool
	lim := o.limits
	total := 0
	var after int64
	for {
		ids, last, err := selectSeqs(ctx, pool, o.store.ReplaySelect(sf, after, lim.AdminScan))
		if err != nil {
			return total, fmt.Errorf("outbox: replay events: %w", err)
		}
		for batch := range slices.Chunk(ids, lim.AdminBatch) {
			now := o.now()
			n, err := execCount(ctx, pool, o.store.ReplayUpdate(sf, batch, now))
			if err != nil {
				return total, fmt.Errorf("outbox: replay %d events: %w", len(batch), err)
			}
			total += n
			if n > 0 {
				// In the replay's transaction when db is one; on its own
				// otherwise, after the replay (the entry, not the event,
				// is what a failure here loses: it is reported).
				if _, err := execCount(ctx, pool, o.store.RecordReplays(batch, now, actorFrom(ctx))); err != nil {
					return total, fmt.Errorf("outbox: replayed %d events but could not record it in their history: %w", n, err)
				}
			}
		}
		if len(ids) < lim.AdminScan {
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
// row replayed while it runs is not deleted. Purge(db, Filter{Statuses:
// []Status{StatusSent}, CreatedUntil: t}) deletes the sent events created
// before t (RelayConfig.RetainSent deletes sent rows by the time they were
// sent, in the background). db may be a
// transaction; its context governs the statements. On error, the batches
// before it stay deleted and are counted in the result.
func (o *Outbox) Purge(db *gorm.DB, f Filter) (int, error) {
	ctx := dbContext(db)
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
		f.Statuses = []Status{StatusSent, StatusFailed}
	}
	sf := f.filter()
	pool := db.Statement.ConnPool
	lim := o.limits
	total := 0
	for {
		ids, _, err := selectSeqs(ctx, pool, o.store.PurgeSelect(sf, lim.AdminScan))
		if err != nil {
			return total, fmt.Errorf("outbox: purge events: %w", err)
		}
		deleted := 0
		for batch := range slices.Chunk(ids, lim.AdminBatch) {
			n, err := execCount(ctx, pool, o.store.PurgeDelete(sf, batch))
			if err != nil {
				return total, fmt.Errorf("outbox: purge %d events: %w", len(batch), err)
			}
			deleted += n
			if n > 0 {
				if _, err := execCount(ctx, pool, o.store.PurgeAttempts(batch)); err != nil {
					return total + deleted, fmt.Errorf("outbox: purged %d events but not their history: %w", n, err)
				}
			}
		}
		total += deleted
		// deleted == 0: every row selected changed under us; stop rather
		// than select them again.
		if len(ids) < lim.AdminScan || deleted == 0 {
			return total, nil
		}
	}
}

// IDColumn is the SQL expression, over the outbox table's own columns, that
// reads an event's ID: COALESCE(named_id, id::text) on PostgreSQL, where id
// is a UUID column and named_id the ID a publisher chose (schema version 3,
// docs/schema.md). Select it from the table, unqualified, for SQL of your
// own: SELECT <IDColumn> AS event_id FROM <Table>.
func (o *Outbox) IDColumn() string { return o.store.IDExpr() }

// selectSeqs reads a query's seqs, and the last one.
func selectSeqs(ctx context.Context, pool gorm.ConnPool, q store.Query) ([]int64, int64, error) {
	rows, err := pool.QueryContext(ctx, q.SQL, q.Args...)
	if err != nil {
		return nil, 0, err
	}
	defer rows.Close()
	var (
		seqs []int64
		last int64
	)
	for rows.Next() {
		if err := rows.Scan(&last); err != nil {
			return nil, 0, err
		}
		seqs = append(seqs, last)
	}
	return seqs, last, rows.Err()
}

func execCount(ctx context.Context, pool gorm.ConnPool, q store.Query) (int, error) {
	res, err := pool.ExecContext(ctx, q.SQL, q.Args...)
	if err != nil {
		return 0, err
	}
	n, err := res.RowsAffected()
	return int(n), err
}
