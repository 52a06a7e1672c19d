package outbox

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"time"

	"gorm.io/gorm"
)

// RelayConfig configures a [Relay]. Its zero value is usable; negative
// values are an error from [Outbox.Relay]'s methods.
type RelayConfig struct {
	// BatchSize is how many due events one claim takes. Larger batches
	// amortise the claim and mark statements. Defaults to 100.
	BatchSize int

	// PollInterval is how long an idle relay waits before looking for due
	// events again. Defaults to 500ms.
	PollInterval time.Duration

	// MaxAttempts is how many delivery attempts an event gets before it is
	// marked failed. Defaults to 10.
	MaxAttempts int

	// Backoff returns how long to wait before retrying an event whose
	// attempt number attempt (1 for the first) failed. Defaults to
	// [DefaultBackoff].
	Backoff func(attempt int) time.Duration

	// Lease is how long a claim on a batch lasts. Other relays will not
	// deliver the batch's events while it is live; a relay that dies holding
	// it has its events claimed again once it expires. Handlers get a
	// deadline that ends before the lease does, and the relay stops starting
	// deliveries from a batch whose lease is about to run out, so a live
	// claim is never delivered twice. Defaults to 1 minute.
	Lease time.Duration
}

// Defaults of [RelayConfig].
const (
	DefaultBatchSize    = 100
	DefaultPollInterval = 500 * time.Millisecond
	DefaultMaxAttempts  = 10
	DefaultLease        = time.Minute
)

// maxLastError bounds the last_error column: enough for an error chain and a
// panic's stack, not unbounded.
const maxLastError = 4 << 10

// DefaultBackoff is exponential with jitter: about 1s after the first failed
// attempt, doubling each time, capped at 10 minutes, each value drawn
// uniformly from its upper half so that retries of many events spread out.
func DefaultBackoff(attempt int) time.Duration {
	d := 10 * time.Minute
	if attempt < 1 {
		attempt = 1
	}
	if attempt <= 10 {
		d = min(d, time.Second<<(attempt-1))
	}
	return d/2 + rand.N(d/2+1)
}

// Relay delivers persistent events: it claims due rows, hands them to the
// handlers outside any transaction, and records each outcome. Any number of
// relays, in one process or many, can run against one table.
type Relay struct {
	o   *Outbox
	db  *gorm.DB
	cfg RelayConfig
	err error
}

// Relay returns a relay that delivers the events in db's outbox table to the
// handlers registered with [Outbox.Handle]. db must be the *gorm.DB the
// plugin is installed on (not a transaction). Start it with [Relay.Run], or
// drive it with [Relay.ProcessOnce].
func (o *Outbox) Relay(db *gorm.DB, cfg RelayConfig) *Relay {
	r := &Relay{o: o, db: db, cfg: cfg}
	r.err = r.check()
	r.cfg.BatchSize = cmp.Or(cfg.BatchSize, DefaultBatchSize)
	r.cfg.PollInterval = cmp.Or(cfg.PollInterval, DefaultPollInterval)
	r.cfg.MaxAttempts = cmp.Or(cfg.MaxAttempts, DefaultMaxAttempts)
	r.cfg.Lease = cmp.Or(cfg.Lease, DefaultLease)
	if r.cfg.Backoff == nil {
		r.cfg.Backoff = DefaultBackoff
	}
	return r
}

func (r *Relay) check() error {
	c := r.cfg
	var bad []string
	if c.BatchSize < 0 {
		bad = append(bad, fmt.Sprintf("BatchSize %d", c.BatchSize))
	}
	if c.PollInterval < 0 {
		bad = append(bad, fmt.Sprintf("PollInterval %v", c.PollInterval))
	}
	if c.MaxAttempts < 0 {
		bad = append(bad, fmt.Sprintf("MaxAttempts %d", c.MaxAttempts))
	}
	if c.Lease < 0 {
		bad = append(bad, fmt.Sprintf("Lease %v", c.Lease))
	}
	if len(bad) > 0 {
		return fmt.Errorf("%w: negative RelayConfig values (%s); use 0 for the defaults", ErrInvalidConfig, strings.Join(bad, ", "))
	}
	switch {
	case r.db == nil:
		return fmt.Errorf("%w: Relay needs a *gorm.DB", ErrInvalidConfig)
	case r.o.mode == Memory:
		return ErrMemoryMode
	case fromDB(r.db) != r.o:
		return fmt.Errorf("%w: the *gorm.DB given to Relay does not have this Outbox installed", ErrNotInstalled)
	}
	return nil
}

// Run delivers events until ctx is cancelled. It claims a batch whenever one
// is due, waits PollInterval when there is none, and backs off while the
// database is unreachable, logging once per outage rather than per attempt.
//
// When ctx is cancelled, Run stops claiming, lets deliveries in progress
// finish (they are bounded by their lease deadline), hands the batch's
// undelivered events back for other relays, records the outcomes and
// returns nil. It returns an error only for an invalid configuration.
func (r *Relay) Run(ctx context.Context) error {
	if r.err != nil {
		return r.err
	}
	var (
		failing  bool
		retryIn  = r.cfg.PollInterval
		maxRetry = max(30*time.Second, r.cfg.PollInterval)
	)
	for ctx.Err() == nil {
		n, err := r.ProcessOnce(ctx)
		if ctx.Err() != nil {
			break
		}
		if err != nil {
			if !failing {
				r.o.logger.ErrorContext(ctx, "outbox: relay cannot reach the outbox table; retrying with backoff", slog.Any("error", err))
				failing = true
			}
			r.wait(ctx, retryIn)
			retryIn = min(retryIn*2, maxRetry)
			continue
		}
		if failing {
			r.o.logger.InfoContext(ctx, "outbox: relay recovered")
			failing, retryIn = false, r.cfg.PollInterval
		}
		if n < r.cfg.BatchSize {
			r.wait(ctx, r.cfg.PollInterval)
		}
	}
	return nil
}

func (r *Relay) wait(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// claimed is one row a relay holds a lease on.
type claimed struct {
	ev        Event
	attempts  int
	createdAt time.Time
	bad       error // the row could not be decoded; it fails without delivery
}

type outcome struct {
	id     string
	status string
	err    string
	due    time.Time
}

// ProcessOnce claims one batch of due events, delivers them and records the
// outcomes. It returns how many events it claimed; fewer than BatchSize means
// there were no more due. ctx governs the claim; once events are claimed,
// cancelling ctx stops further deliveries (the rest are handed back) but lets
// the one in progress finish within its lease.
func (r *Relay) ProcessOnce(ctx context.Context) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	sqlDB, err := r.db.DB()
	if err != nil {
		return 0, fmt.Errorf("outbox: relay: %w", err)
	}
	start := time.Now()
	now := r.o.now()
	lease := now.Add(r.cfg.Lease)
	batch, err := r.claim(ctx, sqlDB, now, lease)
	if err != nil {
		return 0, fmt.Errorf("outbox: claim events: %w", err)
	}
	if len(batch) == 0 {
		return 0, nil
	}

	// Deliveries must end before the lease does, with room left to record
	// the outcome; past that point another relay may hold the rows.
	budget := r.cfg.Lease - min(r.cfg.Lease/5, 5*time.Second)
	hctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), start.Add(budget))
	defer cancel()

	var (
		sent    []string
		failed  []outcome
		release []string
	)
	for i := range batch {
		c := &batch[i]
		if ctx.Err() != nil || hctx.Err() != nil {
			for _, rest := range batch[i:] {
				release = append(release, rest.ev.ID)
			}
			break
		}
		switch {
		case c.bad != nil:
			failed = append(failed, r.failure(c, Permanent(c.bad)))
		case c.attempts > r.cfg.MaxAttempts:
			// Claimed more often than allowed without an outcome ever being
			// recorded: its relays keep dying while delivering it.
			failed = append(failed, r.failure(c, Permanent(fmt.Errorf("outbox: abandoned after %d claims without an outcome (the relay holding it stopped or lost its lease each time)", c.attempts))))
		default:
			if err := r.o.deliver(hctx, c.ev); err != nil {
				failed = append(failed, r.failure(c, err))
			} else {
				sent = append(sent, c.ev.ID)
			}
		}
	}

	// Outcomes are recorded even when ctx is cancelled: a delivered event
	// left unmarked would be delivered again.
	mctx, mcancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer mcancel()
	var errs []error
	if len(sent) > 0 {
		if err := r.markSent(mctx, sqlDB, sent, lease); err != nil {
			errs = append(errs, fmt.Errorf("outbox: mark %d events sent: %w", len(sent), err))
		}
	}
	if len(failed) > 0 {
		if err := r.markFailed(mctx, sqlDB, failed, lease); err != nil {
			errs = append(errs, fmt.Errorf("outbox: record %d failed deliveries: %w", len(failed), err))
		}
	}
	if len(release) > 0 {
		if err := r.release(mctx, sqlDB, release, lease); err != nil {
			errs = append(errs, fmt.Errorf("outbox: release %d undelivered events: %w", len(release), err))
		}
	}
	return len(batch), errors.Join(errs...)
}

func (r *Relay) failure(c *claimed, err error) outcome {
	out := outcome{id: c.ev.ID, status: StatusPending, err: truncate(err.Error(), maxLastError)}
	now := r.o.now()
	if IsPermanent(err) || c.attempts >= r.cfg.MaxAttempts {
		out.status, out.due = StatusFailed, now
		r.o.logger.Error("outbox: event failed for good; it stays in the table until replayed",
			append(eventAttrs(c.ev, err), slog.Int("attempts", c.attempts))...)
		return out
	}
	out.due = now.Add(r.cfg.Backoff(c.attempts)).Truncate(time.Microsecond)
	r.o.logger.Warn("outbox: delivery failed; will retry",
		append(eventAttrs(c.ev, err), slog.Int("attempts", c.attempts), slog.Time("retry_at", out.due))...)
	return out
}

func (r *Relay) claim(ctx context.Context, db *sql.DB, now, lease time.Time) ([]claimed, error) {
	rows, err := db.QueryContext(ctx, r.o.sql.claim, lease, now, r.cfg.BatchSize)
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
		if err := rows.Scan(&c.ev.ID, &c.ev.Type, &c.ev.AggregateType, &c.ev.AggregateID, &c.ev.IdempotencyKey,
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
	if err := rows.Err(); err != nil {
		return nil, err
	}
	// RETURNING has no order; deliver oldest first.
	slices.SortFunc(batch, func(a, b claimed) int {
		return cmp.Or(a.createdAt.Compare(b.createdAt), strings.Compare(a.ev.ID, b.ev.ID))
	})
	return batch, nil
}

func (r *Relay) markSent(ctx context.Context, db *sql.DB, ids []string, lease time.Time) error {
	q, arr := r.o.sql.markSentSQL(len(ids))
	_, err := db.ExecContext(ctx, q, idArgs([]any{r.o.now(), lease}, ids, arr)...)
	return err
}

func (r *Relay) release(ctx context.Context, db *sql.DB, ids []string, lease time.Time) error {
	q, arr := r.o.sql.releaseSQL(len(ids))
	_, err := db.ExecContext(ctx, q, idArgs([]any{r.o.now(), lease}, ids, arr)...)
	return err
}

func (r *Relay) markFailed(ctx context.Context, db *sql.DB, outs []outcome, lease time.Time) error {
	args := make([]any, 0, 2+4*len(outs))
	args = append(args, r.o.now(), lease)
	for _, o := range outs {
		args = append(args, o.id, o.status, o.err, o.due)
	}
	_, err := db.ExecContext(ctx, r.o.sql.markFailedSQL(len(outs)), args...)
	return err
}

// idArgs appends ids to args: as one array argument on PostgreSQL, one
// argument each elsewhere.
func idArgs(args []any, ids []string, asArray bool) []any {
	if asArray {
		return append(args, ids)
	}
	for _, id := range ids {
		args = append(args, id)
	}
	return args
}

// Replay puts failed events back to pending, due now, with their attempts
// reset, and returns how many it changed. IDs that are not failed are
// skipped. db may be a transaction.
func (o *Outbox) Replay(ctx context.Context, db *gorm.DB, ids ...string) (int, error) {
	if o.mode == Memory {
		return 0, ErrMemoryMode
	}
	if o.sql == nil {
		return 0, ErrNotInstalled
	}
	if len(ids) == 0 {
		return 0, nil
	}
	q, arr := o.sql.replaySQL(len(ids))
	res, err := db.Statement.ConnPool.ExecContext(ctx, q, idArgs([]any{o.now()}, ids, arr)...)
	if err != nil {
		return 0, fmt.Errorf("outbox: replay %d events: %w", len(ids), err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		return 0, fmt.Errorf("outbox: replay: %w", err)
	}
	return int(n), nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	// Cut on a rune boundary so the column stays valid UTF-8.
	for n > 0 && n < len(s) && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n] + "…"
}

// dbTime scans a timestamp from either driver: PostgreSQL returns
// time.Time; SQLite may return the stored text.
type dbTime struct{ t time.Time }

var sqliteTimeFormats = []string{
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
	for _, f := range sqliteTimeFormats {
		if t, err := time.Parse(f, s); err == nil {
			d.t = t.UTC()
			return nil
		}
	}
	return fmt.Errorf("outbox: cannot parse time %q", s)
}
