package engine

import (
	"cmp"
	"context"
	"database/sql"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/gorm-outbox/outbox/internal/store"
)

// The watermark is how a relay finds new events without an index that every
// INSERT would enter (store.Walker): new rows are due at once and read by
// seq, the primary key, from a low watermark below which every row is done,
// waits for a retry (the retry index finds it), is in flight with a relay,
// or is a gap.
//
// Seqs are taken at INSERT and become visible at commit, so a row can
// appear below rows already seen: the seqs the walk passes that hold no
// row yet are gaps, looked at by every walk until their row appears or they
// are older than SweepEvery (a rolled-back transaction's seq never fills);
// a row in flight the walk passed is looked at the same way once its lease
// has passed (its relay may have died). A sweep every SweepEvery lowers the
// watermark to the lowest new row no relay holds, one scan of the table,
// which finds the rows of transactions that took longer than that between
// their INSERT and their commit.
const (
	// SweepEvery is how often the watermark is checked against the whole
	// table, and how long a gap is looked at.
	SweepEvery = 30 * time.Second
	// WalkBatches is how many claims' worth of rows one walk reads: enough
	// to pass the batches every relay has in flight (measured: a fixed 1000
	// rows left 4 relays at batch 1000 scanning each other's batches at
	// 42k events/s; 5000 let them reach 75k but cost 4 relays at batch 100
	// a third of their 46k).
	WalkBatches = 5
	// WalkEvery is how often a relay's watermark walks while its claims
	// are not full (Table.WalkEvery); a claim that took a full batch walks
	// before the next one.
	WalkEvery = 100 * time.Millisecond
	// MaxGaps bounds the gaps, and the rows in flight, looked at; past it
	// the sweep finds the rows.
	MaxGaps = 10000
	// MaxWalkRows bounds one walk, whatever the batch size.
	MaxWalkRows = 10000
	// SweepLookback is how far below the highest seq a sweep that finds no
	// open row puts the watermark, so that the walk registers the gaps of
	// the transactions in flight.
	SweepLookback = 1000
)

type watermark struct {
	mu       sync.Mutex
	from     int64               // every row below is done, retried, in flight, or a gap
	frontier int64               // the highest seq of a new row a claim took from the watermark
	gaps     map[int64]time.Time // seq → when the walk passed it
	held     map[int64]time.Time // seq → lease end of a row in flight the walk passed
	swept    time.Time           // zero before the first sweep
	walked   time.Time           // the last walk
	full     bool                // the last claim took as many rows as it could
	unknown  bool                // the first sweep found no row: from is a guess
}

func (w *watermark) gapList() []int64 {
	if len(w.gaps) == 0 {
		return nil
	}
	return slices.Sorted(maps.Keys(w.gaps))
}

// claimed notes what a claim of up to limit rows, leased until lease,
// took: the gaps it filled, and how far its read of new rows from the
// watermark got. When the claim's new rows are the seqs from the watermark
// on, one after the other, the watermark moves past them at once, the rows
// in flight as a walk would have passed them, and the next claim needs no
// walk even after a full one: a single relay draining a backlog, whose
// walks read its own batch back after every claim (a fifth of a batch's
// time in a measured drain). It reports whether the claim took only such
// rows: no other relay took rows between them.
func (w *watermark) claimed(rows []store.Claimed, limit int, lease time.Time) (contiguous bool) {
	var fresh []int64
	for i := range rows {
		delete(w.gaps, rows[i].Seq)
		if rows[i].Fresh && rows[i].Seq >= w.from {
			w.frontier = max(w.frontier, rows[i].Seq)
			fresh = append(fresh, rows[i].Seq)
		}
	}
	slices.Sort(fresh)
	run := 0
	for run < len(fresh) && fresh[run] == w.from+int64(run) {
		run++
	}
	for _, seq := range fresh[:run] {
		if len(w.held) < MaxGaps {
			w.held[seq] = lease
		}
	}
	w.from += int64(run)
	w.full = len(rows) >= limit && run < len(rows)
	return run > 0 && run == len(rows)
}

// advance moves the watermark up to the first open row, not leased, that
// the last claim did not reach; open rows the claim passed over, not leased
// (behind their aggregate), are deferred to the retry index, so that
// nothing holds the watermark back: not a backoff, not an aggregate, not
// the batches other relays have in flight (several relays would otherwise
// each scan every other's batches).
func (w *watermark) advance(ctx context.Context, db *sql.DB, s store.Walker, now time.Time, limit int, every time.Duration) error {
	if w.gaps == nil {
		w.gaps, w.held = map[int64]time.Time{}, map[int64]time.Time{}
	}
	if w.swept.IsZero() || now.Sub(w.swept) >= SweepEvery {
		if err := w.sweep(ctx, db, s, now); err != nil {
			return err
		}
	}
	if !w.full && now.Sub(w.walked) < every {
		// Few events: the watermark may lag the few rows written since
		// the last walk (the claim reads them on its way), and a cycle
		// that delivers one event does not wait for a walk.
		return nil
	}
	w.walked = now
	w.expire(now)
	rows, err := s.Walk(ctx, db, w.from, min(max(WalkBatches*limit, 100), MaxWalkRows), w.gapList(), now)
	if err != nil {
		return err
	}
	next, deferred := w.walk(w.filled(rows), now)
	if len(deferred) > 0 {
		if _, err := s.Defer(ctx, db, deferred, now); err != nil {
			return err
		}
	}
	w.from = next
	return nil
}

// expire forgets the gaps older than SweepEvery (a rolled-back
// transaction's seq never fills; the sweep finds a late commit), and looks
// at a row in flight whose lease has passed as a gap is: its relay may
// have died; a claim takes it if it is still new.
func (w *watermark) expire(now time.Time) {
	for seq, seen := range w.gaps {
		if now.Sub(seen) >= SweepEvery {
			delete(w.gaps, seq)
		}
	}
	for seq, end := range w.held {
		if !end.After(now) {
			delete(w.held, seq)
			if len(w.gaps) < MaxGaps {
				w.gaps[seq] = now
			}
		}
	}
}

// filled takes the rows at the gaps out of a walk's rows, and the gaps
// that filled out of the list: a row no longer new, or leased (its relay
// has it), leaves it; a new one, unleased, the claim takes through Gaps.
// It returns the rest, from the watermark on, in seq order.
func (w *watermark) filled(rows []store.WalkRow) []store.WalkRow {
	rows = slices.DeleteFunc(rows, func(r store.WalkRow) bool {
		if r.Seq < w.from && (!r.Open || r.Leased) {
			delete(w.gaps, r.Seq)
			if r.Open && len(w.held) < MaxGaps {
				w.held[r.Seq] = r.LeaseEnd
			}
		}
		return r.Seq < w.from
	})
	slices.SortFunc(rows, func(a, b store.WalkRow) int { return cmp.Compare(a.Seq, b.Seq) })
	return rows
}

// walk moves over rows from the watermark up to the first open row, not
// leased, that the last claim did not reach: the seqs it passes that hold
// no row are gaps, the rows in flight are held, and the open rows the
// claim passed over are returned to be deferred.
func (w *watermark) walk(rows []store.WalkRow, now time.Time) (next int64, deferred []int64) {
	next = w.from
	if w.unknown && len(rows) > 0 {
		// No row to go by yet (the first sweep found an empty table): the
		// seqs below the first row are not gaps, whatever the sequence
		// gave out before (a table emptied by retention or TRUNCATE).
		next, w.unknown = rows[0].Seq, false
	}
	for _, r := range rows {
		for g := next; g < r.Seq && len(w.gaps) < MaxGaps; g++ {
			w.gaps[g] = now
		}
		switch {
		case r.Open && r.Leased:
			// In flight: its relay marks it, or hands it back to the retry
			// index. Should that relay die, the row is looked at once its
			// lease has passed (and, past MaxGaps such rows, the next sweep
			// finds it).
			if len(w.held) < MaxGaps {
				w.held[r.Seq] = r.LeaseEnd
			}
		case r.Open && r.Seq >= w.frontier:
			return r.Seq, deferred
		case r.Open:
			deferred = append(deferred, r.Seq)
		}
		next = r.Seq + 1
	}
	return next, deferred
}

// sweep lowers the watermark to the lowest open row not leased (one scan of
// the table: a row a dead relay held, or one committed long after it took
// its seq), or, with none, to SweepLookback below the highest seq. The
// first sweep counts the leased rows too: they were leased before this
// relay walked, so only a walk that passes them looks at them once their
// lease has passed (their relay may have died: a relay restarted after a
// crash found its own former batch only at its next sweep, 30 s on).
func (w *watermark) sweep(ctx context.Context, db *sql.DB, s store.Walker, now time.Time) error {
	first := w.swept.IsZero()
	leasedToo := now
	if first {
		leasedToo = time.Time{}
	}
	low, high, err := s.LowOpen(ctx, db, 0, leasedToo)
	if err != nil {
		return err
	}
	w.swept = now
	if first {
		w.unknown = high == 0
		w.from = high + 1
	}
	w.from = lowMark(w.from, low, high, SweepLookback)
	return nil
}

// lowMark is the sweep's rule: below the mark now, at the lowest open row
// when there is one (low), and never higher than lookback below the
// highest seq (high), so that the transactions that took seqs and have not
// committed yet are not passed over; 0 stands for none.
func lowMark(mark, low, high, lookback int64) int64 {
	if high > 0 {
		mark = min(mark, max(high+1-lookback, 0))
	}
	if low > 0 {
		mark = min(mark, low)
	}
	return mark
}
