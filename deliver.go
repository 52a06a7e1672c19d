package outbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/gorm-outbox/outbox/internal/engine"
	"github.com/gorm-outbox/outbox/internal/store"
)

// One relay cycle: claim a batch under a lease, deliver it with Workers
// goroutines outside any transaction, and record each outcome guarded by
// the lease, in chunks as the workers finish.

// claimed is one event of a batch: a row a relay holds a lease on, or an
// event from the stream.
type claimed = engine.Item

type outcome = store.Outcome

// fromStore is a claimed row as the relay delivers it.
func fromStore(sc *store.Claimed) claimed {
	c := claimed{
		Seq: sc.Seq, Attempts: sc.Attempts, CreatedAt: sc.CreatedAt,
		Event: engine.Event{
			ID: sc.ID, Type: sc.Type, AggregateType: sc.AggregateType, AggregateID: sc.AggregateID,
			IdempotencyKey: sc.Key, Payload: json.RawMessage(sc.Payload), OccurredAt: sc.OccurredAt,
		},
	}
	if len(sc.Headers) > 0 {
		if err := json.Unmarshal(sc.Headers, &c.Event.Headers); err != nil {
			c.Bad = fmt.Errorf("outbox: decode headers of event %s: %w", c.Event.ID, err)
		}
	}
	return c
}

// ProcessOnce claims one batch of due events, delivers them and records the
// outcomes. It returns how many events it claimed; fewer than BatchSize means
// there were no more due. ctx governs the claim; once events are claimed,
// cancelling ctx stops further deliveries (the rest are handed back) but lets
// those in progress finish within their lease.
//
// When a handler reports its destination down ([Unavailable]), the batch's
// remaining events are handed back without counting attempts and the error
// returned satisfies [IsUnavailable].
//
// In Logical mode it first delivers one batch of the events committed
// before the call from the replication slot (unless another relay is
// streaming it), then claims one batch from the table; the count is the
// sum. A streamed batch holds whole transactions, so it exceeds BatchSize
// when one transaction published more events than that.
func (r *Relay) ProcessOnce(ctx context.Context) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	if r.o.mode == Logical {
		n, err := r.streamOnce(ctx)
		if err != nil {
			return n, err
		}
		m, err := r.process(ctx, nil, r.cfg.BatchSize)
		return n + m, err
	}
	return r.process(ctx, nil, r.cfg.BatchSize)
}

// process claims up to limit due events (only those in ids, when given)
// and delivers them.
func (r *Relay) process(ctx context.Context, ids []string, limit int) (int, error) {
	if err := r.ensureOrdering(ctx); err != nil {
		return 0, err
	}
	start := time.Now()
	now := r.o.now()
	lease := now.Add(r.cfg.Lease)
	cctx, ccancel := context.WithTimeout(ctx, r.cfg.StatementTimeout)
	batch, err := r.claim(cctx, now, lease, ids, limit)
	ccancel()
	if err != nil {
		return 0, fmt.Errorf("outbox: claim events: %w", err)
	}
	if len(batch) == 0 {
		return 0, nil
	}

	// Deliveries must end before the lease does, with room left to record
	// the outcome; past that point another relay may hold the rows.
	bctx, cancel := context.WithDeadline(context.WithoutCancel(ctx), start.Add(engine.Budget(r.cfg.Lease)))
	defer cancel()

	w := r.newOutcomeWriter(ctx, lease, start)
	down, _ := r.fanout().Deliver(ctx, bctx, batch, nil, func(i int, res engine.Result) {
		switch id := batch[i].Event.ID; res.Kind {
		case engine.Sent:
			w.sent(id)
		case engine.Failed:
			w.failed(res.Out)
		default:
			w.handBack(id)
		}
	})
	if w.nsent > 0 {
		r.delivered.Store(true)
	}
	err = w.close()
	if down != nil {
		err = errors.Join(err, fmt.Errorf("outbox: batch handed back undelivered: %w", down))
	}
	return len(batch), err
}

// fanout is the engine's delivery of a batch for this relay.
func (r *Relay) fanout() *engine.Fanout {
	return &engine.Fanout{
		Workers: r.cfg.Workers, Ordered: r.cfg.OrderByAggregate, Policy: r.policy,
		Attempt: r.attempt, Report: r.report,
	}
}

// attempt runs the handlers of one event within HandlerTimeout, with its
// attempt number in the context; an event whose row could not be decoded
// fails without them.
func (r *Relay) attempt(bctx context.Context, c *claimed) error {
	if c.Bad != nil {
		return Permanent(c.Bad)
	}
	hctx := bctx
	if r.cfg.HandlerTimeout > 0 {
		var cancel context.CancelFunc
		hctx, cancel = context.WithTimeout(bctx, r.cfg.HandlerTimeout)
		defer cancel()
	}
	return r.o.deliver(context.WithValue(hctx, attemptKey{}, c.Attempts), Event(c.Event))
}

// report hands one attempt's outcome to RelayConfig.OnDelivery and the
// Delivered hooks.
func (r *Relay) report(c *claimed, res engine.Result, err error, took time.Duration) {
	if res.Kind == engine.Sent {
		r.delivered.Store(true)
	}
	if r.cfg.OnDelivery == nil && !r.o.observesDeliveries() {
		return
	}
	d := Delivery{
		Event: Event(c.Event), Attempt: c.Attempts, Status: res.Status(), Err: err,
		Duration: took, Latency: r.o.now().Sub(c.CreatedAt),
	}
	if r.cfg.OnDelivery != nil {
		r.cfg.OnDelivery(d)
	}
	r.o.delivered(d)
}

type attemptKey struct{}

// Attempt returns the delivery attempt (1 for the first) of the event a
// relay's handler was called for, or 0 outside a relay delivery (memory
// mode). Useful as a header or a log field.
func Attempt(ctx context.Context) int {
	n, _ := ctx.Value(attemptKey{}).(int)
	return n
}

// outcomeFlushAfter is how long a recorded outcome may wait for others to
// share its statement. A batch whose handlers are quick is recorded with
// one statement per kind of outcome at its end; one with slow handlers is
// recorded as it goes, so a crash or a handler that overruns the lease
// redelivers only what was still in flight, not the whole batch.
const outcomeFlushAfter = 50 * time.Millisecond

// outcomeWriter records the outcomes of one batch: in chunks, as the
// workers finish, one write at a time.
type outcomeWriter struct {
	r            *Relay
	ctx          context.Context // the relay's, without its cancellation
	lease, start time.Time

	mu     sync.Mutex
	nsent  int // delivered in this batch; read once the workers are done
	sentID []string
	fails  []outcome
	back   []string
	oldest time.Time // of the outcomes not yet written; zero when none

	write sync.Mutex // one write at a time, in order
	errs  []error

	stop, done chan struct{}
}

func (r *Relay) newOutcomeWriter(ctx context.Context, lease, start time.Time) *outcomeWriter {
	w := &outcomeWriter{
		r: r, ctx: context.WithoutCancel(ctx), lease: lease, start: start,
		stop: make(chan struct{}), done: make(chan struct{}),
	}
	go w.loop()
	return w
}

func (w *outcomeWriter) sent(id string) {
	w.add(func() { w.sentID = append(w.sentID, id); w.nsent++ })
}
func (w *outcomeWriter) failed(o outcome)   { w.add(func() { w.fails = append(w.fails, o) }) }
func (w *outcomeWriter) handBack(id string) { w.add(func() { w.back = append(w.back, id) }) }

func (w *outcomeWriter) add(f func()) {
	w.mu.Lock()
	f()
	if w.oldest.IsZero() {
		w.oldest = time.Now()
	}
	full := len(w.sentID)+len(w.fails)+len(w.back) >= w.r.o.limits.OutcomeRows
	w.mu.Unlock()
	if full {
		w.flush()
	}
}

// loop writes outcomes that have waited outcomeFlushAfter while the
// workers are still busy.
func (w *outcomeWriter) loop() {
	defer close(w.done)
	t := time.NewTicker(outcomeFlushAfter)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
			w.mu.Lock()
			due := !w.oldest.IsZero() && time.Since(w.oldest) >= outcomeFlushAfter
			w.mu.Unlock()
			if due {
				w.flush()
			}
		}
	}
}

// close writes what is left and returns every write's error.
func (w *outcomeWriter) close() error {
	close(w.stop)
	<-w.done
	w.flush()
	w.write.Lock()
	defer w.write.Unlock()
	return errors.Join(w.errs...)
}

func (w *outcomeWriter) flush() {
	w.write.Lock()
	defer w.write.Unlock()
	w.mu.Lock()
	sent, fails, back := w.sentID, w.fails, w.back
	w.sentID, w.fails, w.back, w.oldest = nil, nil, nil, time.Time{}
	w.mu.Unlock()

	r := w.r
	w.record("mark sent", len(sent), func(c context.Context) error { return r.markSent(c, sent, w.lease) })
	w.record("record failed deliveries of", len(fails), func(c context.Context) error { return r.markFailed(c, fails, w.lease) })
	w.record("hand back", len(back), func(c context.Context) error { return r.release(c, back, w.lease) })
}

// record runs one outcome write. Outcomes are written even when the
// relay's ctx is cancelled: a delivered event left unmarked would be
// delivered again. The statements are guarded by the lease, so repeating
// one is safe; retrying a dropped connection a couple of times saves the
// events from being delivered again.
func (w *outcomeWriter) record(what string, n int, f func(context.Context) error) {
	if n == 0 {
		return
	}
	var err error
	for attempt, pause := range []time.Duration{0, 50 * time.Millisecond, 250 * time.Millisecond} {
		if attempt > 0 {
			time.Sleep(pause)
		}
		mctx, cancel := context.WithTimeout(w.ctx, w.r.cfg.StatementTimeout)
		err = f(mctx)
		cancel()
		if err == nil || time.Since(w.start) > w.r.cfg.Lease {
			break // done, or the lease is gone and the rows belong to whoever claims them next
		}
	}
	if err != nil {
		w.errs = append(w.errs, fmt.Errorf("outbox: %s %d events: %w", what, n, err))
	}
}

// ensureOrdering creates the index per-aggregate ordering needs, once per
// relay, unless the team runs its own migrations. A failure is tried again
// on the next cycle.
func (r *Relay) ensureOrdering(ctx context.Context) error {
	if !r.cfg.OrderByAggregate || !r.o.migrate {
		return nil
	}
	r.orderingMu.Lock()
	defer r.orderingMu.Unlock()
	if r.orderingDone {
		return nil
	}
	sqlDB, err := rawDB(r.db)
	if err != nil {
		return err
	}
	name, ddl := r.o.store.OrderingIndex()
	if err := store.Ensure(ctx, sqlDB, r.o.store, name, ddl...); err != nil {
		return fmt.Errorf("outbox: create the per-aggregate ordering index: %w", err)
	}
	r.orderingDone = true
	return nil
}

// claim leases up to limit due events (only those in ids, when given)
// until lease and returns them oldest first.
func (r *Relay) claim(ctx context.Context, now, lease time.Time, ids []string, limit int) ([]claimed, error) {
	db, err := rawDB(r.db)
	if err != nil {
		return nil, err
	}
	rows, err := r.o.store.Claim(ctx, db, store.ClaimSpec{
		Now: now, Lease: lease, Limit: limit, IDs: ids, Ordered: r.cfg.OrderByAggregate,
	})
	if err != nil {
		return nil, err
	}
	batch := make([]claimed, len(rows))
	for i := range rows {
		batch[i] = fromStore(&rows[i])
	}
	// RETURNING has no order; deliver in write order.
	slices.SortFunc(batch, func(a, b claimed) int { return cmp.Compare(a.Seq, b.Seq) })
	return batch, nil
}

func (r *Relay) markSent(ctx context.Context, ids []string, lease time.Time) error {
	now := r.o.now()
	return r.execChunks(ctx, len(ids), func(i, j int) store.Query { return r.o.store.MarkSent(ids[i:j], now, lease) })
}

func (r *Relay) release(ctx context.Context, ids []string, lease time.Time) error {
	now := r.o.now()
	return r.execChunks(ctx, len(ids), func(i, j int) store.Query { return r.o.store.Release(ids[i:j], now, lease) })
}

func (r *Relay) markFailed(ctx context.Context, outs []outcome, lease time.Time) error {
	now := r.o.now()
	return r.execChunks(ctx, len(outs), func(i, j int) store.Query { return r.o.store.MarkFailed(outs[i:j], now, lease) })
}

// execChunks runs the statements build returns for n rows, as many rows
// at a time as the store's outcome statements take.
func (r *Relay) execChunks(ctx context.Context, n int, build func(i, j int) store.Query) error {
	db, err := rawDB(r.db)
	if err != nil {
		return err
	}
	chunk := r.o.limits.OutcomeRows
	for i := 0; i < n; i += chunk {
		q := build(i, min(i+chunk, n))
		if _, err := db.ExecContext(ctx, q.SQL, q.Args...); err != nil {
			return err
		}
	}
	return nil
}
