package wal

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gorm-outbox/outbox/internal/engine"
	"github.com/gorm-outbox/outbox/internal/store"
)

// One streamed batch: route each event (deliver now, check its key in the
// table first, or queue it in the table behind its aggregate), deliver with
// Workers, and make every outcome but success durable in the table.

type streamState int

const (
	stDirect   streamState = iota // delivered from the stream; success writes nothing
	stLeased                      // in the table under the stream's lease (key checked)
	stDone                        // written to the table or skipped: not delivered here
	stSent                        // delivered
	stFailed                      // the attempt failed; out holds the outcome
	stDeferred                    // not delivered: held back or handed back
)

type aggKey struct{ typ, id string }

// handled is what became of one streamed batch.
type handled struct {
	handled int   // events handled (duplicates dropped are not)
	sent    int   // delivered
	down    error // a handler's Unavailable error, if one said its destination is down
}

// handleStream handles one batch, by the engine's rules. err means the
// outcomes are not durable and the batch must not be confirmed. stale,
// checked before each delivery, says when the session may be over on the
// server's side (a relay that froze): the rest of the batch is then
// neither delivered nor written to the table, since the relay that took
// the slot over streams it, and the batch ends with that error.
func (r *Relay) handleStream(ctx context.Context, items []walItem, stale func() error) (handled, error) {
	b, err := r.prepare(ctx, items, stale)
	if err != nil {
		return handled{}, err
	}
	down, err := r.Fanout.Process(ctx, b)
	res := handled{handled: len(items) - b.dups, down: down}
	for _, st := range b.states {
		if st == stSent {
			res.sent++
		}
	}
	return res, err
}

// batch is one streamed batch as the engine delivers it: the events to
// deliver now, in stream order, and the state of every event of the
// batch.
type batch struct {
	r          *Relay
	items      []walItem
	states     []streamState
	outs       []store.Outcome
	leased     []bool // in the table under the stream's lease (see prepare)
	sel        []int  // the items delivered, by their index in items
	deliver    []engine.Item
	dups       int // duplicates dropped
	now, lease time.Time
	deadline   time.Time
	stale      func() error
}

// prepare routes each event of a batch: delivered from the stream, checked
// against the table first (written there under the stream's lease), or
// queued in the table behind its aggregate.
func (r *Relay) prepare(ctx context.Context, items []walItem, stale func() error) (*batch, error) {
	lg := r.Logical
	start := time.Now()
	now := r.Now()
	lease := now.Add(r.Lease)
	wctx := context.WithoutCancel(ctx) // outcomes are written even as the relay stops
	states := make([]streamState, len(items))
	outs := make([]store.Outcome, len(items))

	var blocked map[aggKey]bool
	if r.Ordered {
		if err := r.EnsureOrdering(ctx); err != nil {
			return nil, err
		}
		var err error
		if blocked, err = r.blockedAggregates(wctx, lg, items); err != nil {
			return nil, err
		}
	}
	// leased: written to the table under the stream's lease before
	// delivery, in stream order. An event whose ID or key the publisher
	// chose is, to check it against the table; with OrderByAggregate, so
	// is every earlier event of its aggregate in the batch, so that
	// whatever reaches the table later (a failure, an event handed back)
	// never gets a seq below an event that came after it in the stream.
	leased := make([]bool, len(items))
	var precede map[aggKey]int // the index of the aggregate's last checked event
	if r.Ordered {
		precede = map[aggKey]int{}
		for i := range items {
			if e := &items[i].c.Event; items[i].checked && e.AggregateID != "" {
				precede[aggKey{e.AggregateType, e.AggregateID}] = i
			}
		}
	}
	var park []store.ParkRow
	var parkIdx []int
	var dups int                    // duplicates dropped: not counted as handled
	batchIDs := map[string]string{} // ID to idempotency key
	for i := range items {
		it := &items[i]
		e := &it.c.Event
		last, ordered := precede[aggKey{e.AggregateType, e.AggregateID}]
		switch {
		case it.checked && batchIDs[e.ID] != "":
			// The same event ID twice in one batch: one INSERT cannot tell
			// which copy it kept; the first in commit order wins.
			if batchIDs[e.ID] != e.IdempotencyKey {
				r.Dropped(ctx, e)
			}
			states[i] = stDone
			dups++
			continue
		case blocked[aggKey{e.AggregateType, e.AggregateID}] && e.AggregateID != "":
			// An older event of its aggregate waits in the table: this one
			// queues behind it there.
			park = append(park, r.parkDeferred(it, now))
			states[i] = stDone
		case it.checked || (ordered && e.AggregateID != "" && i < last):
			if it.checked {
				batchIDs[e.ID] = e.IdempotencyKey
			}
			park = append(park, store.ParkRow{Event: it.row, Status: "pending", Attempts: 1, Due: lease, Lease: lease, Created: it.c.CreatedAt})
			parkIdx = append(parkIdx, i)
			states[i], leased[i] = stLeased, true
		}
	}
	if len(park) > 0 {
		inserted, err := r.park(wctx, lg, park)
		if err != nil {
			return nil, err
		}
		var skipped []int
		for _, i := range parkIdx {
			seq, ok := inserted[items[i].c.Event.ID]
			items[i].c.Seq = seq
			if !ok {
				// Its key (or ID) is in the table already: a duplicate,
				// first committed wins; or the stream replays an event a
				// crashed relay had written there, which the table's relay
				// delivers once that relay's lease has passed.
				states[i], leased[i] = stDone, false
				dups++
				skipped = append(skipped, i)
			}
		}
		r.reportReusedIDs(wctx, items, skipped)
	}

	b := &batch{
		r: r, items: items, states: states, outs: outs, leased: leased, dups: dups,
		now: now, lease: lease, deadline: start.Add(engine.Budget(r.Lease)), stale: stale,
	}
	for i := range items {
		if states[i] == stDirect || states[i] == stLeased {
			b.sel = append(b.sel, i)
			b.deliver = append(b.deliver, items[i].c)
		}
	}
	return b, nil
}

// Items implements engine.Batch.
func (b *batch) Items() []engine.Item { return b.deliver }

// Deadline implements engine.Batch.
func (b *batch) Deadline() time.Time { return b.deadline }

// Stale implements engine.Batch.
func (b *batch) Stale() error { return b.stale() }

// Record implements engine.Batch; workers record distinct items.
func (b *batch) Record(k int, res engine.Result) {
	i := b.sel[k]
	switch res.Kind {
	case engine.Sent:
		b.states[i] = stSent
	case engine.Failed:
		b.states[i], b.outs[i] = stFailed, res.Out
	default:
		b.states[i] = stDeferred
	}
}

// Close implements engine.Batch: the outcomes are made durable
// (recordStreamed), or, when the session's hold is gone, only the leased
// rows of events delivered are marked sent: the stream's new owner skips
// them as already in the table, and the table's relay would deliver them
// again once the lease passed.
func (b *batch) Close(ctx context.Context, gone error) error {
	r := b.r
	wctx := context.WithoutCancel(ctx)
	if gone == nil {
		return r.recordStreamed(wctx, r.Logical, b.items, b.leased, b.states, b.outs, b.now, b.lease)
	}
	var sent []int64
	for i := range b.items {
		if b.leased[i] && b.states[i] == stSent {
			sent = append(sent, b.items[i].c.Seq)
		}
	}
	if len(sent) > 0 {
		sctx, cancel := context.WithTimeout(wctx, r.StatementTimeout)
		err := r.Table.MarkSent(sctx, sent, b.lease)
		cancel()
		if err != nil {
			gone = errors.Join(gone, fmt.Errorf("outbox: mark %d events sent: %w", len(sent), err))
		}
	}
	return gone
}

// parkDeferred is an event written to the table undelivered: due now, no
// attempt counted.
func (r *Relay) parkDeferred(it *walItem, now time.Time) store.ParkRow {
	return store.ParkRow{Event: it.row, Status: "pending", Due: now, Created: it.c.CreatedAt}
}

// recordStreamed makes the batch's outcomes durable: failed attempts and
// deferred events of the stream go to the table in one INSERT, in stream
// order; the leased rows get the outcome statements of the table path.
// It retries until it succeeds or ctx ends.
func (r *Relay) recordStreamed(ctx context.Context, lg store.Logical, items []walItem, leased []bool, states []streamState, outs []store.Outcome, now, lease time.Time) error {
	var (
		park       []store.ParkRow
		sent, back []int64
		fails      []store.Outcome
	)
	for i := range items {
		it := &items[i]
		inTable := leased[i]
		switch states[i] {
		case stSent:
			if inTable {
				sent = append(sent, it.c.Seq)
			}
		case stFailed:
			if inTable {
				fails = append(fails, outs[i])
				continue
			}
			o := outs[i]
			park = append(park, store.ParkRow{Event: it.row, Status: o.Status, Attempts: 1, LastErr: o.Err, Due: o.Due, Created: it.c.CreatedAt})
		case stDeferred, stLeased, stDirect:
			if inTable {
				back = append(back, it.c.Seq)
				continue
			}
			park = append(park, r.parkDeferred(it, now))
		}
	}
	// Each statement is bounded: a connection gone silent must fail the
	// write (and the session, which reconnects), not hang it.
	bounded := func(ctx context.Context, f func(context.Context) error) error {
		sctx, cancel := context.WithTimeout(ctx, r.StatementTimeout)
		defer cancel()
		return f(sctx)
	}
	write := func(ctx context.Context) error {
		if len(park) > 0 {
			if _, err := r.park(ctx, lg, park); err != nil {
				return err
			}
			park = nil
		}
		if len(sent) > 0 {
			if err := bounded(ctx, func(ctx context.Context) error { return r.Table.MarkSent(ctx, sent, lease) }); err != nil {
				return fmt.Errorf("outbox: mark %d events sent: %w", len(sent), err)
			}
			sent = nil
		}
		if len(fails) > 0 {
			if err := bounded(ctx, func(ctx context.Context) error { return r.Table.MarkFailed(ctx, fails, lease) }); err != nil {
				return fmt.Errorf("outbox: record %d failed attempts: %w", len(fails), err)
			}
			fails = nil
		}
		if len(back) > 0 {
			if err := bounded(ctx, func(ctx context.Context) error { return r.Table.Release(ctx, back, lease) }); err != nil {
				return fmt.Errorf("outbox: hand back %d events: %w", len(back), err)
			}
			back = nil
		}
		return nil
	}
	// Not durable means not confirmed, and the batch delivered again by the
	// next session: worth trying a while.
	return engine.Retry(ctx, time.Now().Add(recordWindow), 4*r.StatementTimeout, write)
}

// recordWindow is how long a streamed batch's outcome writes are tried
// again before the session gives up (and the batch is streamed again).
const recordWindow = 5 * time.Second

// park writes rows to the table, through the engine's table (which
// records the history of the failed attempts among them), within the
// statement timeout.
func (r *Relay) park(ctx context.Context, lg store.Logical, rows []store.ParkRow) (map[string]int64, error) {
	sctx, cancel := context.WithTimeout(ctx, r.StatementTimeout)
	defer cancel()
	inserted, err := r.Table.Park(sctx, lg, rows)
	if err != nil {
		return nil, fmt.Errorf("outbox: write %d streamed events to the table: %w", len(rows), err)
	}
	return inserted, nil
}

// blockedAggregates returns the batch's aggregates that have an unsent
// row in the table.
func (r *Relay) blockedAggregates(ctx context.Context, lg store.Logical, items []walItem) (map[aggKey]bool, error) {
	var aggs []store.Aggregate
	seen := map[aggKey]bool{}
	for i := range items {
		e := &items[i].c.Event
		k := aggKey{e.AggregateType, e.AggregateID}
		if e.AggregateID == "" || seen[k] {
			continue
		}
		seen[k] = true
		aggs = append(aggs, store.Aggregate{Type: k.typ, ID: k.id})
	}
	if len(aggs) == 0 {
		return nil, nil
	}
	sctx, cancel := context.WithTimeout(ctx, r.StatementTimeout)
	defer cancel()
	got, err := lg.Blocked(sctx, r.DB, aggs)
	if err != nil {
		return nil, fmt.Errorf("outbox: look for held-back aggregates: %w", err)
	}
	blocked := make(map[aggKey]bool, len(got))
	for a := range got {
		blocked[aggKey{a.Type, a.ID}] = true
	}
	return blocked, nil
}

// reportReusedIDs logs the skipped events whose ID is taken in the table by
// an event with another idempotency key: a different event, which
// Persistent mode would have refused at Publish. In Logical mode the
// publisher's transaction has committed by now; the later event cannot be
// stored under its ID, and an error log is what is left to say so.
func (r *Relay) reportReusedIDs(ctx context.Context, items []walItem, skipped []int) {
	if len(skipped) == 0 {
		return
	}
	ids := make([]string, len(skipped))
	for k, i := range skipped {
		ids[k] = items[i].c.Event.ID
	}
	sctx, cancel := context.WithTimeout(ctx, r.StatementTimeout)
	defer cancel()
	held, err := r.Store.Held(sctx, r.DB, ids, nil)
	if err != nil {
		return // a diagnostic only: the outcome does not depend on it
	}
	for _, i := range skipped {
		e := &items[i].c.Event
		if h, ok := held[e.ID]; ok && h.Key != e.IdempotencyKey {
			r.Dropped(ctx, e)
		}
	}
}
