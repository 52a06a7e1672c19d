package maint

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/gorm-outbox/outbox/internal/store"
)

// The rollup: the sent rows counted per minute and event type in a table
// beside the outbox table, so that a chart over a week reads ten thousand
// minutes, not a million rows. Relays roll up every RollEvery, and the
// overview rolls up itself when they lag; neither is on the write path. A
// pass counts the rows sent before now-RollMargin that the last one had
// not counted, by their sent_at: a row marked sent with a sent_at further
// in the past than RollMargin (a relay's clock that far behind, or a mark
// statement that took longer) is never counted, which RollMargin, three
// times the relay's default statement timeout, makes rare.
const (
	RollEvery  = 15 * time.Second
	RollMargin = 30 * time.Second
	// rollChunk is the first sent_at range one transaction rolls up, so
	// that the first pass over a table with history takes its lock
	// briefly, many times; a range that held fewer than rollChunkRows rows
	// doubles, up to rollChunkMax, one that held more halves.
	rollChunk     = time.Hour
	rollChunkMax  = 24 * time.Hour
	rollChunkRows = 20000
	// lowRecheck is how often a pass scans the whole table for the lowest
	// pending row, for the rows of transactions that committed long after
	// they took their seq (below the low mark the counts read from), and
	// lowLookback how far below the highest seq the mark stays.
	lowRecheck  = 5 * time.Minute
	lowLookback = 1000
)

// Rollup keeps the rollup of one table.
type Rollup struct {
	Overview store.Overview
	// Walker is the store's, nil when it has none: then there is no low
	// mark to keep (its pending index holds every pending row).
	Walker           store.Walker
	DB               *sql.DB
	Now              func() time.Time
	StatementTimeout time.Duration
}

// Service is the rollup as a relay's periodic work.
func (r *Rollup) Service() Service {
	return Service{Name: "rolling up the sent events for the overview", Every: RollEvery, Pass: r.Pass}
}

// Pass brings the rollup up to date, one chunk of sent_at a transaction,
// and returns how many sent rows it counted.
func (r *Rollup) Pass(ctx context.Context) (int64, error) {
	chunk := rollChunk
	var total int64
	for ctx.Err() == nil {
		done, n, err := r.once(ctx, chunk)
		total += n
		if err != nil || done {
			return total, err
		}
		switch {
		case n < rollChunkRows/2:
			chunk = min(2*chunk, rollChunkMax)
		case n > 2*rollChunkRows:
			chunk = max(chunk/2, time.Minute)
		}
	}
	return total, ctx.Err()
}

// once rolls up at most chunk of sent_at in one transaction: done when it
// reached the margin, n the rows it counted.
func (r *Rollup) once(ctx context.Context, chunk time.Duration) (done bool, n int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, r.StatementTimeout)
	defer cancel()
	now := r.Now()
	fail := func(err error) (bool, int64, error) {
		return false, 0, fmt.Errorf("roll up the sent events: %w", err)
	}
	tx, err := r.DB.BeginTx(ctx, nil)
	if err != nil {
		return fail(err)
	}
	defer func() { _ = tx.Rollback() }()
	st, err := r.Overview.RollBegin(ctx, tx, now.Add(-RollMargin))
	if err != nil {
		return fail(err)
	}
	to := now.Add(-RollMargin)
	done = true
	if to.After(st.Until.Add(chunk)) {
		to, done = st.Until.Add(chunk), false
	}
	var rows []store.RollRow
	if to.After(st.Until) {
		bins, err := r.Overview.SentBins(ctx, tx, st.Until, to)
		if err != nil {
			return fail(err)
		}
		rows, n = Accumulate(bins)
	} else {
		to = st.Until
	}
	next := store.RollState{Until: to, Low: st.Low, Checked: st.Checked}
	if r.Walker != nil {
		if next.Low, next.Checked, err = r.lowMark(ctx, tx, st, now); err != nil {
			return fail(err)
		}
	}
	if err := r.Overview.RollCommit(ctx, tx, rows, now, next); err != nil {
		return fail(err)
	}
	if err := tx.Commit(); err != nil {
		return fail(err)
	}
	return done, n, nil
}

// lowMark is the seq from which the overview reads new pending rows by seq
// (below it, only the retry index holds pending rows): the lowest new
// pending row (leased or not), through the watermark's scan
// (store.Walker.LowOpen), from the last mark, and from the whole table
// every lowRecheck; with none, lowLookback below the highest seq, leaving
// room for the transactions that took seqs and have not committed.
func (r *Rollup) lowMark(ctx context.Context, tx *sql.Tx, st store.RollState, now time.Time) (int64, time.Time, error) {
	full := now.Sub(st.Checked) > lowRecheck || st.Low == 0
	from := st.Low
	if full {
		from = 0
	}
	// A leased row is still pending: zero now counts it.
	lowest, highest, err := r.Walker.LowOpen(ctx, tx, from, time.Time{})
	if err != nil {
		return 0, time.Time{}, err
	}
	low, checked := st.Low, st.Checked
	switch {
	case highest == 0:
		low = 0 // an empty table
	case lowest > 0:
		low = lowest
	case highest < low:
		// The table was emptied and its seqs started again: scan it all
		// next time.
		low, checked = 0, time.Time{}
	default:
		low = max(low, highest-lowLookback, 1)
	}
	if full && low != 0 {
		checked = now
	}
	return low, checked, nil
}

// Accumulate adds sent rows' counts up per span of the rollup: each row
// counts as delivered (with its delay) in the minute it was sent and as
// published in the minute it was created. n is how many rows it counted.
func Accumulate(bins []store.SentBin) (rows []store.RollRow, n int64) {
	type key struct {
		span, minute int64
		typ          string
	}
	acc := map[key]*store.RollRow{}
	add := func(minute int64, typ string, fn func(*store.RollRow)) {
		for _, s := range store.RollSpans {
			k := key{s.Minutes, minute / s.Minutes * s.Minutes, typ}
			r := acc[k]
			if r == nil {
				r = &store.RollRow{Span: k.span, Minute: k.minute, Type: typ, Delay: make([]int64, len(store.DelayBounds)+1)}
				acc[k] = r
			}
			fn(r)
		}
	}
	for _, b := range bins {
		n += b.N
		add(b.Sent, b.Type, func(r *store.RollRow) { r.Delivered += b.N; r.Delay[b.Bin] += b.N })
		add(b.Created, b.Type, func(r *store.RollRow) { r.Published += b.N })
	}
	rows = make([]store.RollRow, 0, len(acc))
	for _, r := range acc {
		rows = append(rows, *r)
	}
	return rows, n
}
