package outbox

import (
	"context"
	"errors"
	"fmt"
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
	if r.stream != nil {
		n, err := r.stream.Once(ctx)
		if err != nil {
			r.life.cycle(err)
			return n, err
		}
		m, _, err := r.process(ctx, nil, r.cfg.BatchSize)
		return n + m, err
	}
	n, _, err := r.process(ctx, nil, r.cfg.BatchSize)
	return n, err
}

// process claims up to limit due events (only those in ids, when given)
// and delivers them: n claimed, sent of them delivered.
func (r *Relay) process(ctx context.Context, ids []int64, limit int) (n, sent int, err error) {
	if r.gate != nil {
		if err := r.gate.acquire(ctx); err != nil {
			return 0, 0, err
		}
		defer r.gate.release()
	}
	b, err := r.lease(ctx, ids, limit)
	if err != nil || b == nil {
		return 0, 0, err
	}
	sent, err = r.deliver(ctx, b)
	return len(b.Items()), sent, err
}

// lease claims up to limit due events (only those in ids, when given);
// nil when none is due.
func (r *Relay) lease(ctx context.Context, ids []int64, limit int) (*engine.TableBatch, error) {
	if err := r.ensureOrdering(ctx); err != nil {
		return nil, err
	}
	b, err := r.table.Claim(ctx, ids, limit)
	if err != nil || b == nil {
		r.life.cycle(err)
		return nil, err
	}
	r.life.claimed()
	return b, nil
}

// deliver delivers a claimed batch and records the outcomes; it returns
// how many events were delivered.
func (r *Relay) deliver(ctx context.Context, b *engine.TableBatch) (sent int, err error) {
	down, err := r.fanout().Process(ctx, b)
	if down != nil {
		// The cause first: the relays' last error is shown cut to a line.
		err = errors.Join(err, fmt.Errorf("%w; batch handed back undelivered", down))
	}
	r.life.cycle(err)
	return b.Sent(), err
}

// fanout is the engine's delivery of a batch for this relay, from either
// source.
func (r *Relay) fanout() *engine.Fanout {
	f := &engine.Fanout{
		Workers: r.cfg.Workers, Ordered: r.cfg.OrderByAggregate, Policy: r.policy,
		Attempt: r.attempt, Report: r.report,
	}
	if r.o.pipelines() {
		f.Wave = r.attemptWave
	}
	if r.cfg.WaitReplicas > 0 {
		f.Gate = (&engine.Standbys{Replicas: r.o.replicas(), DB: r.table.DB, Want: r.cfg.WaitReplicas, Timeout: r.cfg.StatementTimeout}).Wait
	}
	return f
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

// attemptWave runs the handlers of several events at once (the engine's
// Wave): each gets the context attempt would give it, and an
// AsyncHandler's deliveries start in the order of items.
func (r *Relay) attemptWave(bctx context.Context, items []*claimed) []error {
	errs := make([]error, len(items))
	calls := make([]call, 0, len(items))
	at := make([]int, 0, len(items)) // calls[j] is items[at[j]]
	for i, c := range items {
		if c.Bad != nil {
			errs[i] = Permanent(c.Bad)
			continue
		}
		hctx := bctx
		if r.cfg.HandlerTimeout > 0 {
			var cancel context.CancelFunc
			hctx, cancel = context.WithTimeout(bctx, r.cfg.HandlerTimeout)
			defer cancel()
		}
		calls = append(calls, call{ctx: context.WithValue(hctx, attemptKey{}, c.Attempts), e: Event(c.Event)})
		at = append(at, i)
	}
	for j, err := range r.o.deliverWave(calls, r.cfg.Workers) {
		errs[at[j]] = err
	}
	return errs
}

// report records a delivery, and hands one attempt's outcome to the
// Delivered hooks.
func (r *Relay) report(c *claimed, res engine.Result, err error, took time.Duration) {
	if res.Kind == engine.Sent {
		r.life.delivered()
	}
	if !r.o.observesDeliveries() {
		return
	}
	r.o.delivered(Delivery{
		Event: Event(c.Event), Attempt: c.Attempts, Outcome: Outcome(res.Outcome()), Status: Status(res.Status()), Err: err,
		Duration: took, Latency: r.o.now().Sub(c.CreatedAt),
	})
}

type attemptKey struct{}

// Attempt returns the delivery attempt (1 for the first) of the event a
// relay's handler was called for, or 0 outside a relay delivery (memory
// mode). Useful as a header or a log field.
func Attempt(ctx context.Context) int {
	n, _ := ctx.Value(attemptKey{}).(int)
	return n
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
	if err := r.o.store.EnsureOrdering(ctx, sqlDB); err != nil {
		return fmt.Errorf("outbox: create the per-aggregate ordering index: %w", err)
	}
	r.orderingDone = true
	return nil
}

// replicas is the store's standby positions, nil where it has none.
func (o *Outbox) replicas() store.Replicas {
	s, _ := o.store.(store.Replicas)
	return s
}
