package engine

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/gorm-outbox/outbox/internal/errs"
)

// Loop is the table source's run loop: it claims and delivers a batch
// whenever one is due and waits when none is, until PollInterval passes or
// a wake-up comes. While the table cannot be reached it backs off, while a
// destination is down it probes with one event at a time, and while the
// standbys lag (a Gate) it waits for them; each condition is logged once
// when it starts and once when it ends.
type Loop struct {
	// Process claims up to limit due events (only those at seqs, when
	// given) and delivers them: n claimed, sent of them delivered.
	Process func(ctx context.Context, seqs []int64, limit int) (n, sent int, err error)
	// Claim and Deliver, when both are set, are Process in two halves for
	// the loop's own claims (Process still serves Fresh): Claim leases up
	// to limit due events, nil when none is due, and Deliver delivers them
	// and makes their outcomes durable. They let the loop claim the next
	// batch while it delivers one through a backlog (after a full batch
	// quicker than Quick, while no other relay claims among its rows:
	// TableBatch.Contiguous): the claim's statement and the delivery overlap,
	// and the next batch's first delivery still waits for this one's
	// outcomes, so a relay killed at any point has at most one batch
	// delivered and not recorded. A batch claimed ahead is handed back
	// when the delivery before it fails or ctx ends.
	Claim        func(ctx context.Context, limit int) (Batch, error)
	Deliver      func(ctx context.Context, b Batch) (sent int, err error)
	BatchSize    int
	PollInterval time.Duration
	// MaxBatch, above BatchSize, lets the claim grow through a backlog of
	// quick deliveries: after a full batch that took less than Quick, the
	// next claim takes twice as many events, up to MaxBatch; after a full
	// one that did not, half as many, and after any other, BatchSize
	// again. Fewer, larger claims and marks drain a backlog faster (each
	// waits for its commit), while a batch stays under 2 Quick.
	MaxBatch int
	Quick    time.Duration
	// Wake and Fresh carry wake-ups: a commit in this process or a
	// notification (Wake), the seqs a commit just wrote
	// (Config.DeliverAfterCommit: Fresh), delivered at once.
	Wake  <-chan struct{}
	Fresh <-chan []int64
	// Recovered is called when the table can be reached again: the
	// database may be another server now (a promoted standby).
	Recovered func()
	Logger    *slog.Logger

	dbDown   Episode // the outbox table cannot be reached
	destDown Episode // a handler reported its destination down
	behind   Episode // the standbys lag
	// A failed attempt is cheap: resume soon after an outage.
	dbRetry Backoff
	probe   Probe
}

// Run runs the loop until ctx ends.
func (l *Loop) Run(ctx context.Context) {
	l.dbRetry = Backoff{Min: l.PollInterval, Max: max(5*time.Second, l.PollInterval)}
	timer := time.NewTimer(0)
	defer timer.Stop()
	<-timer.C
	size := l.BatchSize
	var ahead *claimAhead // the next batch, claimed while this one is delivered
	defer func() { l.handBack(ahead) }()
	quick := false // the last batch was full and quick: claim the next ahead
	for ctx.Err() == nil {
		limit := size
		if l.destDown.On() {
			limit = 1 // probe with one event
		}
		start := time.Now()
		var n, sent int
		var err error
		if l.Claim == nil || l.Deliver == nil {
			n, sent, err = l.Process(ctx, nil, limit)
		} else {
			var b Batch
			if ahead != nil {
				b, limit, err = ahead.wait()
				ahead = nil
			} else {
				b, err = l.Claim(ctx, limit)
			}
			if err == nil && b != nil {
				n = len(b.Items())
				if quick && n >= limit && !l.destDown.On() && alone(b) {
					ahead = l.claimAhead(ctx, size)
				}
				sent, err = l.Deliver(ctx, b)
			}
		}
		if ctx.Err() != nil {
			return
		}
		quick = false
		if err != nil {
			l.handBack(ahead)
			ahead = nil
			size = l.BatchSize
			l.wait(ctx, timer, l.failed(ctx, err), false)
			continue
		}
		l.succeeded(ctx, sent)
		if n >= limit {
			took := time.Since(start)
			quick = took < l.Quick
			if limit == size {
				size = l.next(size, took)
			}
			continue // more may be due right away
		}
		size = l.BatchSize
		l.wait(ctx, timer, l.PollInterval, true)
	}
}

// alone reports whether b says that no other relay claimed among its rows
// (TableBatch.Contiguous); a batch that does not say is taken to.
func alone(b Batch) bool {
	c, ok := b.(interface{ Contiguous() bool })
	return !ok || c.Contiguous()
}

// claimAhead is a claim running while the batch before it is delivered.
type claimAhead struct {
	limit int
	done  chan struct{}
	b     Batch
	err   error
}

func (l *Loop) claimAhead(ctx context.Context, limit int) *claimAhead {
	a := &claimAhead{limit: limit, done: make(chan struct{})}
	go func() {
		defer close(a.done)
		a.b, a.err = l.Claim(ctx, limit)
	}()
	return a
}

func (a *claimAhead) wait() (Batch, int, error) {
	<-a.done
	return a.b, a.limit, a.err
}

// handBack hands a batch claimed ahead back undelivered, without counting
// an attempt (its events are due again at once); nil does nothing. The
// outcomes are written even when the relay is stopping; should that fail,
// the events wait for their lease to pass.
func (l *Loop) handBack(a *claimAhead) {
	if a == nil {
		return
	}
	b, _, err := a.wait()
	if err != nil || b == nil {
		return
	}
	if err := HandBack(context.Background(), b, nil); err != nil {
		l.Logger.Warn("outbox: handing back a batch claimed ahead failed; its events are delivered once their lease passes", slog.Int("events", len(b.Items())), slog.Any("error", err))
	}
}

// next is the claim's size after a full batch of size that took took.
func (l *Loop) next(size int, took time.Duration) int {
	if l.MaxBatch <= l.BatchSize {
		return l.BatchSize
	}
	if took < l.Quick {
		return min(2*size, l.MaxBatch)
	}
	return max(size/2, l.BatchSize)
}

// failed logs the condition a cycle's error starts, once, and returns how
// long to wait before the next.
func (l *Loop) failed(ctx context.Context, err error) time.Duration {
	switch {
	case errs.IsUnavailable(err):
		if l.destDown.Begin() {
			l.Logger.WarnContext(ctx, "outbox: destination unavailable; delivery paused, probing with one event at a time with backoff (attempts are not counted)", slog.Any("error", err))
		}
		return l.probe.Pause(err)
	case errors.Is(err, errs.ErrReplicasBehind):
		if l.behind.Begin() {
			l.Logger.WarnContext(ctx, "outbox: delivery paused until the standbys RelayConfig.WaitReplicas asks for have flushed the events (attempts are not counted)", slog.Any("error", err))
		}
		return l.dbRetry.Next()
	}
	if l.dbDown.Begin() {
		l.Logger.ErrorContext(ctx, "outbox: relay cannot reach the outbox table; retrying with backoff", slog.Any("error", err))
	}
	return l.dbRetry.Next()
}

// succeeded ends the conditions a cycle that went through ends.
func (l *Loop) succeeded(ctx context.Context, sent int) {
	if was, _ := l.behind.End(); was {
		l.Logger.InfoContext(ctx, "outbox: the standbys caught up; delivering")
		l.dbRetry.Reset()
	}
	if was, _ := l.dbDown.End(); was {
		l.Logger.InfoContext(ctx, "outbox: relay recovered")
		l.dbRetry.Reset()
		if l.Recovered != nil {
			l.Recovered()
		}
	}
	// Resumed once a delivery went through: a probe that failed for
	// another reason says nothing about the destination.
	if sent > 0 {
		if was, paused := l.destDown.End(); was {
			l.Logger.InfoContext(ctx, "outbox: destination available again; delivery resumed", slog.Duration("paused", paused))
		}
		l.probe.Reset()
	}
}

// wait waits d, or, when wakeable, until a wake-up; the seqs of a fresh
// commit are delivered at once (unless a destination is down: the probes
// find these events).
func (l *Loop) wait(ctx context.Context, timer *time.Timer, d time.Duration, wakeable bool) {
	timer.Reset(d)
	var wake <-chan struct{}
	var fresh <-chan []int64
	if wakeable {
		wake, fresh = l.Wake, l.Fresh
	}
	select {
	case <-ctx.Done():
	case <-timer.C:
	case <-wake:
	case seqs := <-fresh:
		if !l.destDown.On() {
			l.deliverFresh(ctx, seqs)
		}
	}
	if !timer.Stop() {
		select {
		case <-timer.C:
		default:
		}
	}
}

// deliverFresh claims and delivers events this process just committed,
// through the same claim as any batch.
func (l *Loop) deliverFresh(ctx context.Context, seqs []int64) {
	for len(seqs) > 0 {
		n := min(len(seqs), l.BatchSize)
		if _, _, err := l.Process(ctx, seqs[:n], n); err != nil {
			if ctx.Err() == nil && !errs.IsUnavailable(err) {
				// The regular claim picks these events up; nothing is lost.
				l.Logger.WarnContext(ctx, "outbox: delivering right after commit failed; the relay will retry", slog.Any("error", err))
			}
			return
		}
		seqs = seqs[n:]
	}
}
