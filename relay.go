package outbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"gorm.io/gorm"
)

// RelayConfig configures a [Relay]. Its zero value is usable; negative
// values are an error from the Relay's methods.
type RelayConfig struct {
	// BatchSize is how many due events one claim takes. Larger batches
	// amortise the claim and mark statements. Defaults to 100.
	BatchSize int

	// Workers is how many goroutines deliver a claimed batch concurrently;
	// handlers must be safe for concurrent use. Defaults to 4.
	Workers int

	// PollInterval is how long an idle relay waits before looking for due
	// events again. On PostgreSQL a committed event normally wakes the relay
	// at once (LISTEN/NOTIFY), so the poll is only a fallback. Defaults to
	// 500ms.
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
	// it has its events claimed again once it expires. The lease is not
	// extended: handlers get a context deadline that ends before the lease
	// does, and the relay starts no delivery from a batch whose lease is
	// about to run out (the rest are handed back), so a live claim is never
	// delivered twice. Size it above your slowest handler. Defaults to 1
	// minute.
	Lease time.Duration

	// HandlerTimeout bounds one event's delivery (all its handlers), within
	// the lease. Defaults to the time left on the lease.
	HandlerTimeout time.Duration

	// StatementTimeout bounds each statement the relay runs (claim, mark,
	// release, retention), so a connection that went silent (a network
	// partition, a vanished host) fails fast and the relay reconnects
	// instead of hanging until TCP gives up. Defaults to 10 seconds, and
	// never more than Lease: a claim slower than its lease is useless.
	StatementTimeout time.Duration

	// OrderByAggregate delivers the events of one aggregate (same
	// AggregateType and non-empty AggregateID) one at a time, oldest first,
	// across all relays that set it: an event waits while an older event of
	// its aggregate is not yet sent. A failing event holds back only its own
	// aggregate; once it is failed, the rest of that aggregate waits until it
	// is replayed ([Outbox.Replay]) or removed. Events without an
	// AggregateID are not ordered. It costs a NOT EXISTS probe per claimed
	// row and an index (created by the relay unless
	// Config.DisableAutoMigrate is set) that every insert maintains.
	// Defaults to false.
	OrderByAggregate bool

	// RetainSent is how long sent rows are kept before Run deletes them, in
	// small batches. Failed rows are never deleted automatically. Defaults
	// to 72 hours.
	RetainSent time.Duration

	// KeepSent turns retention off: sent rows are kept forever.
	KeepSent bool

	// DisableListen stops Run from listening for PostgreSQL notifications;
	// it then relies on PollInterval (and on wake-ups from writers in its own
	// process). Set it behind a transaction-pooling proxy, where LISTEN
	// cannot work.
	DisableListen bool

	// OnDelivery, if set, is called after every delivery attempt with its
	// outcome and timings, from the delivering goroutine: build metrics or
	// traces on it. It must be fast and safe for concurrent use.
	OnDelivery func(Delivery)
}

// Delivery describes one delivery attempt, for [RelayConfig.OnDelivery].
type Delivery struct {
	// Event is the event as its handlers received it.
	Event Event
	// Attempt is the attempt number, 1 for the first.
	Attempt int
	// Status is the row's status after the attempt: StatusSent,
	// StatusPending (a retry is scheduled) or StatusFailed.
	Status string
	// Err is the handlers' error, nil when delivered.
	Err error
	// Duration is how long the handlers ran.
	Duration time.Duration
	// Latency is the time from the event's INSERT to the end of this
	// attempt (by the relay's clock).
	Latency time.Duration
}

// Defaults of [RelayConfig].
const (
	DefaultBatchSize    = 100
	DefaultWorkers      = 4
	DefaultPollInterval = 500 * time.Millisecond
	DefaultMaxAttempts  = 10
	DefaultLease        = time.Minute
	DefaultRetainSent   = 72 * time.Hour

	DefaultStatementTimeout = 10 * time.Second
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

	orderingOnce sync.Once
	orderingErr  error
	listening    atomic.Bool // a LISTEN connection is up
}

// Relay returns a relay that delivers the events in db's outbox table to the
// handlers registered with [Outbox.Handle]. db must be the *gorm.DB the
// plugin is installed on (not a transaction). Start it with [Relay.Run], or
// drive it with [Relay.ProcessOnce].
func (o *Outbox) Relay(db *gorm.DB, cfg RelayConfig) *Relay {
	r := &Relay{o: o, db: db, cfg: cfg}
	r.err = r.check()
	r.cfg.BatchSize = cmp.Or(cfg.BatchSize, DefaultBatchSize)
	r.cfg.Workers = cmp.Or(cfg.Workers, DefaultWorkers)
	r.cfg.PollInterval = cmp.Or(cfg.PollInterval, DefaultPollInterval)
	r.cfg.MaxAttempts = cmp.Or(cfg.MaxAttempts, DefaultMaxAttempts)
	r.cfg.Lease = cmp.Or(cfg.Lease, DefaultLease)
	r.cfg.RetainSent = cmp.Or(cfg.RetainSent, DefaultRetainSent)
	r.cfg.StatementTimeout = min(cmp.Or(cfg.StatementTimeout, DefaultStatementTimeout), r.cfg.Lease)
	if r.cfg.Backoff == nil {
		r.cfg.Backoff = DefaultBackoff
	}
	return r
}

func (r *Relay) check() error {
	c := r.cfg
	var bad []string
	for _, f := range []struct {
		name string
		neg  bool
		v    any
	}{
		{"BatchSize", c.BatchSize < 0, c.BatchSize},
		{"Workers", c.Workers < 0, c.Workers},
		{"PollInterval", c.PollInterval < 0, c.PollInterval},
		{"MaxAttempts", c.MaxAttempts < 0, c.MaxAttempts},
		{"Lease", c.Lease < 0, c.Lease},
		{"HandlerTimeout", c.HandlerTimeout < 0, c.HandlerTimeout},
		{"StatementTimeout", c.StatementTimeout < 0, c.StatementTimeout},
		{"RetainSent", c.RetainSent < 0, c.RetainSent},
	} {
		if f.neg {
			bad = append(bad, fmt.Sprintf("%s %v", f.name, f.v))
		}
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
// is due and waits when there is none, until PollInterval passes or a
// committed event wakes it: from a writer in the same process, or on
// PostgreSQL through LISTEN/NOTIFY. While the database is unreachable it
// backs off, logging once per outage rather than per attempt. It also
// deletes sent rows older than RetainSent.
//
// When ctx is cancelled, Run stops claiming, lets deliveries in progress
// finish (they are bounded by their lease deadline), hands the batch's
// undelivered events back for other relays, records the outcomes and
// returns nil. It returns an error only for an invalid configuration.
func (r *Relay) Run(ctx context.Context) error {
	if r.err != nil {
		return r.err
	}
	w := r.o.wakers.add()
	defer r.o.wakers.remove(w)

	var bg sync.WaitGroup
	defer bg.Wait()
	bgCtx, stopBG := context.WithCancel(ctx)
	defer stopBG()
	if r.o.dialect.notifies() && !r.cfg.DisableListen {
		bg.Add(1)
		go func() { defer bg.Done(); r.listen(bgCtx, w) }()
	}
	if !r.cfg.KeepSent {
		bg.Add(1)
		go func() { defer bg.Done(); r.retain(bgCtx) }()
	}

	var (
		failing  bool
		retryIn  = r.cfg.PollInterval
		maxRetry = max(5*time.Second, r.cfg.PollInterval) // a failed attempt is cheap; resume soon after an outage
		timer    = time.NewTimer(0)
	)
	defer timer.Stop()
	<-timer.C
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
			timer.Reset(retryIn)
			retryIn = min(retryIn*2, maxRetry)
			select {
			case <-ctx.Done():
			case <-timer.C:
			}
			continue
		}
		if failing {
			r.o.logger.InfoContext(ctx, "outbox: relay recovered")
			failing, retryIn = false, r.cfg.PollInterval
		}
		if n >= r.cfg.BatchSize {
			continue // more may be due right away
		}
		timer.Reset(r.cfg.PollInterval)
		select {
		case <-ctx.Done():
		case <-timer.C:
		case <-w.wake:
		case ids := <-r.o.fresh:
			r.deliverFresh(ctx, ids)
		}
		if !timer.Stop() {
			select {
			case <-timer.C:
			default:
			}
		}
	}
	return nil
}

// deliverFresh claims and delivers events this process just committed
// (Config.DeliverAfterCommit), through the same claim as any batch.
func (r *Relay) deliverFresh(ctx context.Context, ids []string) {
	for len(ids) > 0 {
		n := min(len(ids), r.cfg.BatchSize)
		if _, err := r.process(ctx, ids[:n]); err != nil && ctx.Err() == nil {
			// The regular claim picks these events up; nothing is lost.
			r.o.logger.WarnContext(ctx, "outbox: delivering right after commit failed; the relay will retry", slog.Any("error", err))
			return
		}
		ids = ids[n:]
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
// those in progress finish within their lease.
func (r *Relay) ProcessOnce(ctx context.Context) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	return r.process(ctx, nil)
}

// process claims due events (only those in ids, when given) and delivers
// them.
func (r *Relay) process(ctx context.Context, ids []string) (int, error) {
	if err := r.ensureOrdering(ctx); err != nil {
		return 0, err
	}
	start := time.Now()
	now := r.o.now()
	lease := now.Add(r.cfg.Lease)
	cctx, ccancel := context.WithTimeout(ctx, r.cfg.StatementTimeout)
	batch, err := r.claim(cctx, now, lease, ids)
	ccancel()
	if err != nil {
		return 0, fmt.Errorf("outbox: claim events: %w", err)
	}
	if len(batch) == 0 {
		return 0, nil
	}

	// Deliveries must end before the lease does, with room left to record
	// the outcome; past that point another relay may hold the rows.
	budget := r.cfg.Lease - min(r.cfg.Lease/5, 5*time.Second)
	bctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), start.Add(budget))
	defer cancel()

	res := r.deliverBatch(ctx, bctx, batch)

	// Outcomes are recorded even when ctx is cancelled: a delivered event
	// left unmarked would be delivered again.
	var errs []error
	record := func(what string, n int, f func(context.Context) error) {
		if n == 0 {
			return
		}
		// The outcome statements are guarded by the lease, so repeating one
		// is safe; retrying a dropped connection a couple of times saves a
		// whole batch from being delivered again.
		var err error
		for attempt, pause := range []time.Duration{0, 50 * time.Millisecond, 250 * time.Millisecond} {
			if attempt > 0 {
				time.Sleep(pause)
			}
			mctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.StatementTimeout)
			err = f(mctx)
			cancel()
			if err == nil || time.Since(start) > r.cfg.Lease {
				break // done, or the lease is gone and the row belongs to whoever claims it next
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("outbox: %s %d events: %w", what, n, err))
		}
	}
	record("mark sent", len(res.sent), func(c context.Context) error { return r.markSent(c, res.sent, lease) })
	record("record failed deliveries of", len(res.failed), func(c context.Context) error { return r.markFailed(c, res.failed, lease) })
	record("release undelivered", len(res.release), func(c context.Context) error { return r.release(c, res.release, lease) })
	return len(batch), errors.Join(errs...)
}

type batchResult struct {
	mu      sync.Mutex
	sent    []string
	failed  []outcome
	release []string
}

// deliverBatch hands the batch to Workers goroutines. A worker takes the
// next row only while ctx is live and the lease budget (bctx) is not spent;
// rows never started are handed back.
func (r *Relay) deliverBatch(ctx, bctx context.Context, batch []claimed) *batchResult {
	res := &batchResult{}
	var next atomic.Int64
	work := func() {
		for {
			i := int(next.Add(1)) - 1
			if i >= len(batch) {
				return
			}
			c := &batch[i]
			if ctx.Err() != nil || bctx.Err() != nil {
				res.mu.Lock()
				res.release = append(res.release, c.ev.ID)
				res.mu.Unlock()
				continue
			}
			r.deliverOne(bctx, c, res)
		}
	}
	workers := min(r.cfg.Workers, len(batch))
	if workers <= 1 {
		work()
		return res
	}
	var wg sync.WaitGroup
	for range workers {
		wg.Add(1)
		go func() { defer wg.Done(); work() }()
	}
	wg.Wait()
	return res
}

func (r *Relay) deliverOne(bctx context.Context, c *claimed, res *batchResult) {
	var (
		err   error
		began = time.Now()
	)
	switch {
	case c.bad != nil:
		err = Permanent(c.bad)
	case c.attempts > r.cfg.MaxAttempts:
		// Claimed more often than allowed without an outcome ever being
		// recorded: its relays keep dying or losing the lease while
		// delivering it.
		err = Permanent(fmt.Errorf("outbox: abandoned after %d claims without an outcome (the relay holding it stopped or lost its lease each time)", c.attempts))
	default:
		hctx := bctx
		if r.cfg.HandlerTimeout > 0 {
			var cancel context.CancelFunc
			hctx, cancel = context.WithTimeout(bctx, r.cfg.HandlerTimeout)
			defer cancel()
		}
		err = r.o.deliver(context.WithValue(hctx, attemptKey{}, c.attempts), c.ev)
	}
	took := time.Since(began)
	status := StatusSent
	res.mu.Lock()
	if err == nil {
		res.sent = append(res.sent, c.ev.ID)
	} else {
		out := r.failure(c, err)
		status = out.status
		res.failed = append(res.failed, out)
	}
	res.mu.Unlock()
	if r.cfg.OnDelivery != nil {
		r.cfg.OnDelivery(Delivery{
			Event: c.ev, Attempt: c.attempts, Status: status, Err: err,
			Duration: took, Latency: r.o.now().Sub(c.createdAt),
		})
	}
}

type attemptKey struct{}

// Attempt returns the delivery attempt (1 for the first) of the event a
// relay's handler was called for, or 0 outside a relay delivery (memory
// mode). Useful as a header or a log field.
func Attempt(ctx context.Context) int {
	n, _ := ctx.Value(attemptKey{}).(int)
	return n
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
	delay, ok := retryDelay(err)
	if !ok {
		delay = r.cfg.Backoff(c.attempts)
	}
	out.due = now.Add(delay).Truncate(time.Microsecond)
	r.o.logger.Warn("outbox: delivery failed; will retry",
		append(eventAttrs(c.ev, err), slog.Int("attempts", c.attempts), slog.Time("retry_at", out.due))...)
	return out
}

// ensureOrdering creates the index per-aggregate ordering needs, once per
// relay, unless the team runs its own migrations.
func (r *Relay) ensureOrdering(ctx context.Context) error {
	if !r.cfg.OrderByAggregate || !r.o.migrate {
		return nil
	}
	r.orderingOnce.Do(func() {
		name, ddl := r.o.dialect.orderingIndex()
		if err := ensure(ctx, r.db, r.o.dialect, name, ddl); err != nil {
			r.orderingErr = fmt.Errorf("outbox: create the per-aggregate ordering index: %w", err)
		}
	})
	return r.orderingErr
}

// claim leases up to BatchSize due events (only those in ids, when given)
// until lease and returns them oldest first.
func (r *Relay) claim(ctx context.Context, now, lease time.Time, ids []string) ([]claimed, error) {
	db, err := rawDB(r.db)
	if err != nil {
		return nil, err
	}
	batch, err := r.o.dialect.claim(ctx, db, claimSpec{
		now: now, lease: lease, limit: r.cfg.BatchSize, ids: ids, ordered: r.cfg.OrderByAggregate,
	})
	if err != nil {
		return nil, err
	}
	// RETURNING has no order; deliver oldest first.
	slices.SortFunc(batch, func(a, b claimed) int {
		return cmp.Or(a.createdAt.Compare(b.createdAt), strings.Compare(a.ev.ID, b.ev.ID))
	})
	return batch, nil
}

func (r *Relay) markSent(ctx context.Context, ids []string, lease time.Time) error {
	now := r.o.now()
	return r.execChunks(ctx, len(ids), func(i, j int) query { return r.o.dialect.markSent(ids[i:j], now, lease) })
}

func (r *Relay) release(ctx context.Context, ids []string, lease time.Time) error {
	now := r.o.now()
	return r.execChunks(ctx, len(ids), func(i, j int) query { return r.o.dialect.release(ids[i:j], now, lease) })
}

func (r *Relay) markFailed(ctx context.Context, outs []outcome, lease time.Time) error {
	now := r.o.now()
	return r.execChunks(ctx, len(outs), func(i, j int) query { return r.o.dialect.markFailed(outs[i:j], now, lease) })
}

// outcomeChunk bounds the rows of one outcome statement, keeping its
// arguments far below every database's limit (SQLite allows 32766).
const outcomeChunk = 1000

// execChunks runs the statements build returns for n rows, outcomeChunk
// rows at a time.
func (r *Relay) execChunks(ctx context.Context, n int, build func(i, j int) query) error {
	db, err := rawDB(r.db)
	if err != nil {
		return err
	}
	for i := 0; i < n; i += outcomeChunk {
		q := build(i, min(i+outcomeChunk, n))
		if _, err := db.ExecContext(ctx, q.sql, q.args...); err != nil {
			return err
		}
	}
	return nil
}

// Replay puts failed events back to pending, due now, with their attempts
// reset, and returns how many it changed. IDs that are not failed are
// skipped. db may be a transaction.
func (o *Outbox) Replay(ctx context.Context, db *gorm.DB, ids ...string) (int, error) {
	if o.mode == Memory {
		return 0, ErrMemoryMode
	}
	if o.dialect == nil {
		return 0, ErrNotInstalled
	}
	total := 0
	now := o.now()
	for chunk := range slices.Chunk(ids, outcomeChunk) {
		q := o.dialect.replay(chunk, now)
		res, err := db.Statement.ConnPool.ExecContext(ctx, q.sql, q.args...)
		if err != nil {
			return total, fmt.Errorf("outbox: replay %d events: %w", len(ids), err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return total, fmt.Errorf("outbox: replay: %w", err)
		}
		total += int(n)
	}
	return total, nil
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
