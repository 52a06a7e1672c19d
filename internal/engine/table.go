package engine

import (
	"cmp"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorm-outbox/outbox/internal/store"
)

// Table is the outbox table as a source of batches, claimed under a lease,
// and as the place their outcomes are recorded, guarded by that lease.
type Table struct {
	Store            store.Store
	DB               *sql.DB
	Now              func() time.Time
	Lease            time.Duration
	StatementTimeout time.Duration
	Ordered          bool
	// WalkEvery spaces the watermark's walks while claims are not full
	// (WalkEvery for a relay); zero walks before every claim.
	WalkEvery time.Duration
	// History, when not nil, records each failed attempt in the event
	// history, after the outcome statement that records it on the row,
	// whichever source the attempt came from. It is best effort: an entry
	// that cannot be written is reported to HistoryFailed (no event is at
	// stake) and not retried.
	History       store.History
	HistoryFailed func(error)

	wm watermark
}

// Resweep makes the next claim check the watermark against the whole table
// first, as it does every SweepEvery: for when the database may have
// changed under the relay (a failover to a standby that had not received
// the last rows and hands their seqs out again, below the watermark).
func (t *Table) Resweep() {
	t.wm.mu.Lock()
	defer t.wm.mu.Unlock()
	if !t.wm.swept.IsZero() {
		t.wm.swept = t.wm.swept.Add(-SweepEvery)
	}
}

// Claim leases up to limit due rows (only those at seqs, when given) and
// returns them as a batch, oldest first. It returns nil when none is due.
func (t *Table) Claim(ctx context.Context, seqs []int64, limit int) (*TableBatch, error) {
	start := time.Now()
	now := t.Now()
	lease := now.Add(t.Lease)
	cctx, cancel := context.WithTimeout(ctx, t.StatementTimeout)
	defer cancel()
	spec := store.ClaimSpec{Now: now, Lease: lease, Limit: limit, Seqs: seqs, Ordered: t.Ordered}
	walker, walks := t.Store.(store.Walker)
	walks = walks && len(seqs) == 0 // a claim by seq reads no new rows
	if walks {
		t.wm.mu.Lock()
		defer t.wm.mu.Unlock()
		if err := t.wm.advance(cctx, t.DB, walker, now, limit, t.WalkEvery); err != nil {
			return nil, fmt.Errorf("outbox: claim events: read the table from the watermark: %w", err)
		}
		spec.From, spec.Gaps = t.wm.from, t.wm.gapList()
	}
	rows, err := t.Store.Claim(cctx, t.DB, spec)
	if err != nil {
		return nil, fmt.Errorf("outbox: claim events: %w", err)
	}
	contiguous := false
	if walks {
		contiguous = t.wm.claimed(rows, limit, lease)
	}
	if len(rows) == 0 {
		return nil, nil
	}
	items := make([]Item, len(rows))
	for i := range rows {
		items[i] = FromRow(&rows[i])
	}
	// RETURNING has no order; deliver in write order.
	slices.SortFunc(items, func(a, b Item) int { return cmp.Compare(a.Seq, b.Seq) })
	b := &TableBatch{items: items, deadline: start.Add(Budget(t.Lease)), contiguous: contiguous}
	b.w = t.Writer(ctx, lease, start)
	return b, nil
}

// FromRow is a claimed row as it is delivered; headers that do not decode
// make it fail without delivery.
func FromRow(sc *store.Claimed) Item {
	c := Item{
		Seq: sc.Seq, Attempts: sc.Attempts, CreatedAt: sc.CreatedAt,
		Event: Event{
			ID: sc.ID, Type: sc.Type, AggregateType: sc.AggregateType, AggregateID: sc.AggregateID,
			IdempotencyKey: sc.Key, Payload: json.RawMessage(sc.Payload), OccurredAt: sc.OccurredAt,
		},
	}
	if len(sc.Headers) > 0 {
		// Into a variable of its own: the address of c's field would move
		// every item to the heap, headers or not.
		var h map[string]string
		if err := json.Unmarshal(sc.Headers, &h); err != nil {
			c.Bad = fmt.Errorf("outbox: decode headers of event %s: %w", c.Event.ID, err)
		}
		c.Event.Headers = h
	}
	return c
}

// TableBatch is one claimed batch.
type TableBatch struct {
	items      []Item
	deadline   time.Time
	w          *Writer
	sent       atomic.Int64
	contiguous bool
}

// Contiguous reports whether the batch's rows were the new rows from the
// watermark on, one after the other: no other relay claimed rows among
// them. Never on a store without a watermark (not a store.Walker: MySQL),
// which cannot tell. The loop claims ahead only of such a batch
// (Loop.Claim): relays that share a backlog would each hold two batches,
// and each claim reads past the batches the others hold.
func (b *TableBatch) Contiguous() bool { return b.contiguous }

// Sent is how many of the batch's items were delivered.
func (b *TableBatch) Sent() int { return int(b.sent.Load()) }

// Items implements Batch.
func (b *TableBatch) Items() []Item { return b.items }

// Deadline implements Batch.
func (b *TableBatch) Deadline() time.Time { return b.deadline }

// Stale implements Batch: a lease lives until it expires.
func (b *TableBatch) Stale() error { return nil }

// Record implements Batch: outcomes are written as the workers finish.
func (b *TableBatch) Record(i int, r Result) {
	switch seq := b.items[i].Seq; r.Kind {
	case Sent:
		b.sent.Add(1)
		b.w.Sent(seq)
	case Failed:
		b.w.Failed(r.Out)
	default:
		b.w.HandBack(seq)
	}
}

// Close implements Batch: what is left is written.
func (b *TableBatch) Close(context.Context, error) error { return b.w.Close() }

// MarkSent records the rows at seqs delivered under lease.
func (t *Table) MarkSent(ctx context.Context, seqs []int64, lease time.Time) error {
	_, err := t.Store.MarkSent(ctx, t.DB, seqs, t.Now(), lease)
	return err
}

// Release hands the rows at seqs back undelivered.
func (t *Table) Release(ctx context.Context, seqs []int64, lease time.Time) error {
	_, err := t.Store.Release(ctx, t.DB, seqs, t.Now(), lease)
	return err
}

// MarkFailed records failed attempts, and each in the event history.
func (t *Table) MarkFailed(ctx context.Context, outs []store.Outcome, lease time.Time) error {
	now := t.Now()
	if _, err := t.Store.MarkFailed(ctx, t.DB, outs, now, lease); err != nil {
		return err
	}
	seqs := make([]int64, len(outs))
	for i, o := range outs {
		seqs[i] = o.Seq
	}
	t.recordAttempts(ctx, seqs, now)
	return nil
}

// Park writes events of a stream to the table (store.Logical.Park): a
// failed attempt among them gets its history entry as one the table's
// relay recorded would. It returns the seq of each row written, by ID.
func (t *Table) Park(ctx context.Context, lg store.Logical, rows []store.ParkRow) (map[string]int64, error) {
	now := t.Now()
	inserted, err := lg.Park(ctx, t.DB, rows, now)
	if err != nil {
		return nil, err
	}
	var failed []int64
	for i := range rows {
		// A failed attempt: counted, and not leased to the stream.
		if seq, ok := inserted[rows[i].Event.ID]; ok && rows[i].Attempts > 0 && rows[i].Lease.IsZero() {
			failed = append(failed, seq)
		}
	}
	t.recordAttempts(ctx, failed, now)
	return inserted, nil
}

// recordAttempts writes the history entries of the failed attempts an
// outcome statement at now just recorded on the rows at seqs.
func (t *Table) recordAttempts(ctx context.Context, seqs []int64, now time.Time) {
	if t.History == nil || len(seqs) == 0 {
		return
	}
	if _, err := t.History.RecordAttempts(ctx, t.DB, seqs, now); err != nil && t.HistoryFailed != nil {
		t.HistoryFailed(err)
	}
}

// FlushAfter is how long a recorded outcome may wait for others to share
// its statement. A batch whose handlers are quick is recorded with one
// statement per kind of outcome at its end; one with slow handlers is
// recorded as it goes, so a crash or a handler that overruns the lease
// redelivers only what was still in flight, not the whole batch.
const FlushAfter = 50 * time.Millisecond

// Writer records the outcomes of one batch's leased rows: in chunks, as
// the workers finish, one write at a time; what is left at Close.
type Writer struct {
	t            *Table
	ctx          context.Context // the relay's, without its cancellation
	lease, start time.Time

	mu     sync.Mutex
	sentID []int64
	fails  []store.Outcome
	back   []int64
	oldest time.Time // of the outcomes not yet written; zero when none

	write sync.Mutex // one write at a time, in order
	errs  []error

	stop, done chan struct{}
}

// Writer starts the writer of a batch leased until lease, claimed at
// start; Close ends it.
func (t *Table) Writer(ctx context.Context, lease, start time.Time) *Writer {
	w := &Writer{
		t: t, ctx: context.WithoutCancel(ctx), lease: lease, start: start,
		stop: make(chan struct{}), done: make(chan struct{}),
	}
	go w.loop()
	return w
}

// Sent records a delivery.
func (w *Writer) Sent(seq int64) { w.add(func() { w.sentID = append(w.sentID, seq) }) }

// Failed records a failed attempt.
func (w *Writer) Failed(o store.Outcome) { w.add(func() { w.fails = append(w.fails, o) }) }

// HandBack records an event handed back undelivered.
func (w *Writer) HandBack(seq int64) { w.add(func() { w.back = append(w.back, seq) }) }

func (w *Writer) add(f func()) {
	w.mu.Lock()
	f()
	if w.oldest.IsZero() {
		w.oldest = time.Now()
	}
	full := len(w.sentID)+len(w.fails)+len(w.back) >= w.t.Store.Limits().OutcomeRows
	w.mu.Unlock()
	if full {
		w.flush()
	}
}

// loop writes outcomes that have waited FlushAfter while the workers are
// still busy.
func (w *Writer) loop() {
	defer close(w.done)
	t := time.NewTicker(FlushAfter)
	defer t.Stop()
	for {
		select {
		case <-w.stop:
			return
		case <-t.C:
			w.mu.Lock()
			due := !w.oldest.IsZero() && time.Since(w.oldest) >= FlushAfter
			w.mu.Unlock()
			if due {
				w.flush()
			}
		}
	}
}

// Close writes what is left and returns every write's error.
func (w *Writer) Close() error {
	close(w.stop)
	<-w.done
	w.flush()
	w.write.Lock()
	defer w.write.Unlock()
	return errors.Join(w.errs...)
}

func (w *Writer) flush() {
	w.write.Lock()
	defer w.write.Unlock()
	w.mu.Lock()
	sent, fails, back := w.sentID, w.fails, w.back
	w.sentID, w.fails, w.back, w.oldest = nil, nil, nil, time.Time{}
	w.mu.Unlock()

	t := w.t
	w.record("mark sent", len(sent), func(c context.Context) error { return t.MarkSent(c, sent, w.lease) })
	w.record("record failed deliveries of", len(fails), func(c context.Context) error { return t.MarkFailed(c, fails, w.lease) })
	w.record("hand back", len(back), func(c context.Context) error { return t.Release(c, back, w.lease) })
}

// RecordWindow is how long the writer tries an outcome statement again:
// long enough to ride out a dropped connection, short enough that a
// database outage does not hold the relay (and its shutdown) up; the rows
// are then delivered again once their lease passes.
const RecordWindow = 400 * time.Millisecond

// record runs one outcome write, with Retry. Outcomes are written even
// when the relay's ctx is cancelled: a delivered event left unmarked would
// be delivered again. The statements are guarded by the lease, so
// repeating one is safe. Past the lease the rows belong to whoever claims
// them next.
func (w *Writer) record(what string, n int, f func(context.Context) error) {
	if n == 0 {
		return
	}
	until := time.Now().Add(RecordWindow)
	if end := w.start.Add(w.t.Lease); end.Before(until) {
		until = end
	}
	err := Retry(w.ctx, until, w.t.StatementTimeout, f)
	if err != nil {
		w.errs = append(w.errs, fmt.Errorf("outbox: %s %d events: %w", what, n, err))
	}
}

// Retry runs f, each try bounded by timeout, until it succeeds, ctx ends
// or until passes: the one retry rule of every outcome write, with the
// relay's backoff family from 50 ms (tries at 0, 50, 150, 350 ms, ...).
func Retry(ctx context.Context, until time.Time, timeout time.Duration, f func(context.Context) error) error {
	b := Backoff{Min: 50 * time.Millisecond, Max: time.Second}
	for {
		tctx, cancel := context.WithTimeout(ctx, timeout)
		err := f(tctx)
		cancel()
		if err == nil || ctx.Err() != nil {
			return err
		}
		wait := b.Next()
		if time.Now().Add(wait).After(until) {
			return err
		}
		Sleep(ctx, wait)
	}
}
