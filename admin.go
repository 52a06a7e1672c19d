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
	// Keys matches these idempotency keys (an event's key is its ID when
	// its publisher set none).
	Keys []string
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
		IDs: f.IDs, Keys: f.Keys, Statuses: statusStrings(f.Statuses), Types: f.Types,
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

// publicRow is a row as the store read it.
func publicRow(r store.Row) Row {
	return Row{
		ID: r.ID, Seq: r.Seq, EventType: r.EventType, AggregateType: r.AggregateType, AggregateID: r.AggregateID,
		IdempotencyKey: r.Key, Payload: r.Payload, Headers: r.Headers, Status: Status(r.Status), Attempts: r.Attempts,
		LastError: r.LastError, AvailableAt: r.AvailableAt, LockedUntil: r.LockedUntil, OccurredAt: r.OccurredAt,
		CreatedAt: r.CreatedAt, UpdatedAt: r.UpdatedAt, SentAt: r.SentAt,
	}
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
	rows, err := o.store.List(ctx, db.Statement.ConnPool, store.Page{Filter: p.filter(), Limit: limit, AfterSeq: p.AfterSeq, BeforeSeq: p.BeforeSeq, Newest: p.Newest})
	if err != nil {
		return nil, fmt.Errorf("outbox: list events: %w", err)
	}
	out := make([]Row, len(rows))
	for i, r := range rows {
		out[i] = publicRow(r)
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
	r, found, err := o.store.Get(ctx, db.Statement.ConnPool, id)
	if err != nil {
		return Row{}, fmt.Errorf("outbox: get event %s: %w", id, err)
	}
	if !found {
		return Row{}, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return publicRow(r), nil
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
	n, err := o.store.Count(ctx, db.Statement.ConnPool, f.filter())
	if err != nil {
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
	n, err := o.store.Replay(ctx, db.Statement.ConnPool, store.Replay{Filter: f.filter(), Now: o.now, Actor: actorFrom(ctx)})
	if err != nil {
		return n, fmt.Errorf("outbox: replay events: %w", err)
	}
	return n, nil
}

// RetryNow makes the pending events matching f that wait for a retry (a
// failed attempt's backoff, a RetryAfter) due now, and returns how many it
// changed: a relay delivers them at once instead of after the wait, for
// instance once a receiver that failed is fixed. Their attempts are kept
// (MaxAttempts still counts them), and each gets an entry in its history
// ([OutcomeRetried], with [WithActor]'s actor). Rows that are not pending,
// new events (already due) and events a relay is delivering right now are
// skipped; a filter whose Statuses leave out pending is
// [ErrInvalidFilter]. It works in batches as [Outbox.Replay] does; db may
// be a transaction, and its context governs the statements. On error, the
// batches before it stay changed and are counted in the result.
func (o *Outbox) RetryNow(db *gorm.DB, f Filter) (int, error) {
	ctx := dbContext(db)
	if err := o.usable(db); err != nil {
		return 0, err
	}
	if err := f.validate(); err != nil {
		return 0, err
	}
	if len(f.Statuses) > 0 && !slices.Contains(f.Statuses, StatusPending) {
		return 0, fmt.Errorf("%w: retry now changes only pending events waiting for a retry; statuses %v leave them out", ErrInvalidFilter, f.Statuses)
	}
	f.Statuses = []Status{StatusPending}
	n, err := o.store.RetryNow(ctx, db.Statement.ConnPool, store.Replay{Filter: f.filter(), Now: o.now, Actor: actorFrom(ctx)})
	if err != nil {
		return n, fmt.Errorf("outbox: retry events now: %w", err)
	}
	return n, nil
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
	n, err := o.store.Purge(ctx, db.Statement.ConnPool, f.filter())
	if err != nil {
		return n, fmt.Errorf("outbox: purge events: %w", err)
	}
	return n, nil
}

// IDColumn is the SQL expression, over the outbox table's own columns, that
// reads an event's ID: COALESCE(named_id, id::text) on PostgreSQL, where id
// is a UUID column and named_id the ID a publisher chose (schema version 3,
// docs/schema.md). Select it from the table, unqualified, for SQL of your
// own: SELECT <IDColumn> AS event_id FROM <Table>.
func (o *Outbox) IDColumn() string { return o.store.IDColumn() }
