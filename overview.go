package outbox

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/gorm-outbox/outbox/internal/store"
	"gorm.io/gorm"
)

// The rollup: the sent rows counted per minute and event type in a table
// beside the outbox table, so that a chart over a week reads ten thousand
// minutes, not a million rows. Relays roll up every rollEvery (Run), and
// Overview rolls up itself when they lag; neither is on the write path.
// A pass counts the rows sent before now-rollMargin that the last one had
// not counted, by their sent_at: a row marked sent with a sent_at further
// in the past than rollMargin (a relay's clock that far behind, or a mark
// statement that took longer) is never counted, which rollMargin, three
// times the relay's default statement timeout, makes rare.
const (
	rollEvery  = 15 * time.Second
	rollMargin = 30 * time.Second
	// rollChunk is the first sent_at range one transaction rolls up, so
	// that the first pass over a table with history takes its lock
	// briefly, many times; a range that held fewer than rollChunkRows rows
	// doubles, up to rollChunkMax, one that held more halves.
	rollChunk     = time.Hour
	rollChunkMax  = 24 * time.Hour
	rollChunkRows = 20000
	// RollupRetention is how long the rollup keeps its minutes: the
	// longest window [Outbox.Overview] can chart.
	RollupRetention = 8 * 24 * time.Hour
	// lowRecheck is how often a pass scans the whole table for the lowest
	// pending row, for the rows of transactions that committed long after
	// they took their seq (below the low mark the counts read from).
	lowRecheck  = 5 * time.Minute
	lowLookback = 1000
	// overviewRollBudget bounds the rollup an Overview call runs itself.
	overviewRollBudget = 3 * time.Second
)

// OverviewParams selects the window of [Outbox.Overview].
type OverviewParams struct {
	// Window is how far back the intervals reach from now. Defaults to an
	// hour; at most [RollupRetention].
	Window time.Duration
	// Step is each interval's length, rounded up to whole minutes (to
	// tens of minutes for a window over a day). Defaults to about
	// Window/60: a minute for an hour, 30 minutes for a day, 3 hours for a
	// week. There are at most 1000 intervals (a shorter Step is
	// lengthened). Intervals start at multiples of Step since the Unix
	// epoch, so the first may start before Now-Window.
	Step time.Duration
}

// Overview is what an operator looks at first: the counts by status and
// event type, and the window's published, delivered and failed events,
// backlog and delivery delay per interval. It reads the pending and failed
// rows through their indexes and the sent ones from the rollup, so it costs
// the same with a million sent rows as with none.
//
// Counting rules: a sent event counts as published in the minute it was
// created and as delivered in the minute it was sent, and stays counted
// after retention or a purge deletes its row (the rollup keeps
// [RollupRetention]); pending and failed events count as they are now, so
// a failed event that was replayed and delivered counts as delivered, not
// as failed, and a purged failed event not at all.
type Overview struct {
	// Now is when it was read; Since is the start of the first interval
	// (at or before Now-Window); Step is each interval's length.
	Now, Since time.Time
	Step       time.Duration
	// Pending and Failed count the rows with those statuses now.
	Pending, Failed int64
	// OldestPending is the age of the oldest pending event, 0 when none is.
	OldestPending time.Duration
	// Published, Delivered and FailedInWindow sum the intervals.
	Published, Delivered, FailedInWindow int64
	// Delay is the delivery delay (created to sent) of the events
	// delivered in the window.
	Delay Delay
	// Types are the counts per event type, by type; a type appears when
	// it has a pending or failed event now, or was published or delivered
	// in the window.
	Types []TypeCount
	// Intervals are the window's intervals, oldest first; the last one
	// holds Now.
	Intervals []Interval
	// RolledUntil is how far the rollup reached: the rows sent before it
	// were counted from the rollup, the later ones from the table.
	RolledUntil time.Time

	// Logical mode only, as in [Stats].
	SlotLagBytes int64
	SlotActive   bool
}

// TypeCount is [Overview]'s counts of one event type.
type TypeCount struct {
	Type string
	// Pending and Failed count the rows now; Published and Delivered count
	// the window's events, as [Overview] says.
	Pending, Failed, Published, Delivered int64
}

// Interval is one interval of [Overview]'s window.
type Interval struct {
	Start time.Time
	// Published counts the events created in it, Delivered those sent in
	// it, Failed those that failed in it and are failed now.
	Published, Delivered, Failed int64
	// Backlog is the number of events pending at the interval's end,
	// worked back from the pending count now: the pending count minus
	// what the later intervals published plus what they delivered or
	// failed.
	Backlog int64
	// Delay is the delivery delay of the events delivered in it.
	Delay Delay
}

// Delay is a distribution of delivery delays (from an event's creation to
// its delivery), from a histogram with bins from 1 ms to 30 min: each
// percentile is interpolated within its bin, so it is exact to the bin's
// width (a value past 30 min reads as 30 min). All are 0 when N is.
type Delay struct {
	N             int64
	P50, P90, P99 time.Duration
}

// Overview reads the outbox table's counts and charts for the window p
// selects. It errs with [ErrMemoryMode] in Memory mode. In Logical mode the
// table holds no events: the counts are those of the rows it holds (none),
// and the slot's lag is read as [Outbox.Stats] does.
//
// It first brings the rollup up to date when the relays have not (none
// runs, or the rollup table was created just now), for up to 3 s: the first
// pass over a table's history (a few seconds per million sent rows) is the
// relays' to finish. A failure there is logged; the rows sent after the
// rollup's end are read from the table, which is slower but exact.
func (o *Outbox) Overview(db *gorm.DB, p OverviewParams) (Overview, error) {
	ctx := dbContext(db)
	var ov Overview
	if o.noTable != nil {
		return ov, o.noTable
	}
	if err := o.usable(db); err != nil {
		return ov, err
	}
	sqlDB, err := rawDB(db)
	if err != nil {
		return ov, err
	}
	now := o.now()
	window := min(cmp.Or(p.Window, time.Hour), RollupRetention)
	stepMin, span := overviewStep(window, p.Step)
	step := time.Duration(stepMin) * time.Minute
	nowMin := minuteOf(now)
	// Intervals start at multiples of the step since the epoch, so that
	// each of the rollup's spans falls in one.
	sinceMin := (minuteOf(now.Add(-window)) / stepMin) * stepMin
	n := int((nowMin-sinceMin)/stepMin) + 1
	ov.Now, ov.Since, ov.Step = now, time.Unix(sinceMin*60, 0).UTC(), step
	ov.Intervals = make([]Interval, n)
	for i := range ov.Intervals {
		ov.Intervals[i].Start = ov.Since.Add(time.Duration(i) * step)
	}
	at := func(minute int64) int { // the interval of a minute, -1 outside
		if minute < sinceMin {
			return -1
		}
		return min(int((minute-sinceMin)/stepMin), n-1)
	}

	st, err := o.rollState(ctx, sqlDB)
	// The relays keep the rollup within rollMargin+rollEvery of now: roll
	// up here only when they lag (none runs, or none has reached this
	// table yet).
	if err != nil || st.until.Before(now.Add(-rollMargin-2*rollEvery)) {
		// Bounded: a first pass over a long history is the relays' to
		// finish; what it leaves is read from the table.
		rctx, cancel := context.WithTimeout(ctx, overviewRollBudget)
		err := o.rollup(rctx, sqlDB, defaultStatementTimeout)
		cancel()
		if err != nil && ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
			o.logger.WarnContext(ctx, "outbox: overview: rolling up the sent events failed; reading them from the table", "error", err)
		}
		if st, err = o.rollState(ctx, sqlDB); err != nil {
			return ov, fmt.Errorf("outbox: overview: %w", err)
		}
	}
	ov.RolledUntil = st.until

	types := map[string]*TypeCount{}
	typ := func(name string) *TypeCount {
		t := types[name]
		if t == nil {
			t = &TypeCount{Type: name}
			types[name] = t
		}
		return t
	}
	hists := make([][]int64, n)
	for i := range hists {
		hists[i] = make([]int64, len(store.DelayBounds)+1)
	}

	// One snapshot for the reads, so that a row the relay moves between
	// them is counted once. Not on SQLite: its transaction would be BEGIN
	// IMMEDIATE with the DSN the outbox advises (_txlock=immediate), the
	// database's write lock held for the whole overview; each read there
	// is its own snapshot, and a row moving between two of them can be
	// counted in both or neither, once.
	var tx store.Querier = sqlDB
	if o.store.Name() != "sqlite" {
		rtx, err := sqlDB.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
		if err != nil {
			return ov, fmt.Errorf("outbox: overview: %w", err)
		}
		defer func() { _ = rtx.Rollback() }()
		tx = rtx
	}

	q := o.store.RollupRead(span, sinceMin, stepMin)
	if err := eachRow(ctx, tx, q, func(rows *sql.Rows) error {
		var (
			i        int
			name     string
			pub, del int64
		)
		bins := make([]int64, len(store.DelayBounds)+1)
		dest := []any{&i, &name, &pub, &del}
		for j := range bins {
			dest = append(dest, &bins[j])
		}
		if err := rows.Scan(dest...); err != nil {
			return err
		}
		i = min(i, n-1)
		t := typ(name)
		t.Published += pub
		t.Delivered += del
		ov.Intervals[i].Published += pub
		ov.Intervals[i].Delivered += del
		for j, c := range bins {
			hists[i][j] += c
		}
		return nil
	}); err != nil {
		return ov, fmt.Errorf("outbox: overview: read the rollup: %w", err)
	}

	// The rows sent since the rollup's end, from the table.
	if err := o.eachSentBin(ctx, tx, st.until, now.Add(time.Minute), func(name string, sent, created int64, bin int, c int64) {
		if i := at(sent); i >= 0 {
			typ(name).Delivered += c
			ov.Intervals[i].Delivered += c
			hists[i][bin] += c
		}
		if i := at(created); i >= 0 {
			typ(name).Published += c
			ov.Intervals[i].Published += c
		}
	}); err != nil {
		return ov, fmt.Errorf("outbox: overview: read the sent events: %w", err)
	}

	var oldest time.Time
	q = o.store.PendingGroups(st.low)
	if err := eachRow(ctx, tx, q, func(rows *sql.Rows) error {
		var (
			name       string
			created, c int64
			first      store.DBTime
		)
		if err := rows.Scan(&name, &created, &c, &first); err != nil {
			return err
		}
		ov.Pending += c
		typ(name).Pending += c
		if i := at(created); i >= 0 {
			typ(name).Published += c
			ov.Intervals[i].Published += c
		}
		if oldest.IsZero() || first.T.Before(oldest) {
			oldest = first.T
		}
		return nil
	}); err != nil {
		return ov, fmt.Errorf("outbox: overview: count the pending events: %w", err)
	}
	if !oldest.IsZero() {
		ov.OldestPending = max(now.Sub(oldest), 0)
	}

	q = o.store.FailedGroups()
	if err := eachRow(ctx, tx, q, func(rows *sql.Rows) error {
		var (
			name                 string
			failedAt, created, c int64
		)
		if err := rows.Scan(&name, &failedAt, &created, &c); err != nil {
			return err
		}
		ov.Failed += c
		typ(name).Failed += c
		if i := at(failedAt); i >= 0 {
			ov.Intervals[i].Failed += c
		}
		if i := at(created); i >= 0 {
			typ(name).Published += c
			ov.Intervals[i].Published += c
		}
		return nil
	}); err != nil {
		return ov, fmt.Errorf("outbox: overview: count the failed events: %w", err)
	}

	if o.wal != nil {
		q := o.wal.SlotStats(o.slot)
		switch err := tx.QueryRowContext(ctx, q.SQL, q.Args...).Scan(&ov.SlotActive, &ov.SlotLagBytes); {
		case err == sql.ErrNoRows:
			return ov, fmt.Errorf("outbox: overview: %w: slot %s", ErrNoSlot, o.slot)
		case err != nil:
			return ov, fmt.Errorf("outbox: overview: stats of slot %s: %w", o.slot, err)
		}
	}

	total := make([]int64, len(store.DelayBounds)+1)
	backlog := ov.Pending
	for i := n - 1; i >= 0; i-- {
		iv := &ov.Intervals[i]
		iv.Backlog = max(backlog, 0)
		backlog += -iv.Published + iv.Delivered + iv.Failed
		iv.Delay = delayOf(hists[i])
		for j, c := range hists[i] {
			total[j] += c
		}
		ov.Published += iv.Published
		ov.Delivered += iv.Delivered
		ov.FailedInWindow += iv.Failed
	}
	ov.Delay = delayOf(total)
	for _, t := range types {
		ov.Types = append(ov.Types, *t)
	}
	slices.SortFunc(ov.Types, func(a, b TypeCount) int { return cmp.Compare(a.Type, b.Type) })
	return ov, nil
}

func minuteOf(t time.Time) int64 { return t.Unix() / 60 }

// overviewStep is the step of a window, in minutes, and the rollup span
// it reads: by default about 60 intervals, of whole minutes up to 10, of
// tens of minutes up to an hour, of whole hours beyond; a window longer
// than the minute rows are kept (a day) reads at least 10-minute rows.
func overviewStep(window, asked time.Duration) (step, span int64) {
	min1 := func(d time.Duration) int64 { return int64((d + time.Minute - 1) / time.Minute) }
	step = max(min1(cmp.Or(asked, window/60)), min1(window/1000), 1)
	roundUp := func(n, m int64) int64 { return (n + m - 1) / m * m }
	if asked == 0 {
		switch {
		case step > 60:
			step = roundUp(step, 60)
		case step > 10:
			step = roundUp(step, 10)
		}
	}
	if window > store.RollSpans[0].Keep-time.Hour {
		step = roundUp(step, 10)
	}
	span = 1
	for _, s := range store.RollSpans {
		if step%s.Minutes == 0 {
			span = s.Minutes
		}
	}
	return step, span
}

// delayOf reads the percentiles off a histogram of store.DelayBounds' bins.
func delayOf(bins []int64) Delay {
	var d Delay
	for _, c := range bins {
		d.N += c
	}
	if d.N == 0 {
		return d
	}
	pct := func(q float64) time.Duration {
		rank := q * float64(d.N)
		var seen float64
		for j, c := range bins {
			if c == 0 || seen+float64(c) < rank {
				seen += float64(c)
				continue
			}
			lo, hi := 0.0, 0.0
			if j > 0 {
				lo = store.DelayBounds[j-1]
			}
			if j < len(store.DelayBounds) {
				hi = store.DelayBounds[j]
			} else {
				hi = lo
			}
			ms := lo + (hi-lo)*(rank-seen)/float64(c)
			return time.Duration(ms * float64(time.Millisecond))
		}
		return time.Duration(store.DelayBounds[len(store.DelayBounds)-1] * float64(time.Millisecond))
	}
	d.P50, d.P90, d.P99 = pct(0.50), pct(0.90), pct(0.99)
	return d
}

func eachRow(ctx context.Context, q store.Querier, qq store.Query, fn func(*sql.Rows) error) error {
	rows, err := q.QueryContext(ctx, qq.SQL, qq.Args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := fn(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

type rollState struct {
	until, checked time.Time
	low            int64
}

// rollState reads the rollup's state; a zero state when there is none yet.
func (o *Outbox) rollState(ctx context.Context, q store.Querier) (rollState, error) {
	var (
		st             rollState
		until, checked store.DBTime
	)
	qq := o.store.RollState()
	err := q.QueryRowContext(ctx, qq.SQL, qq.Args...).Scan(&until, &st.low, &checked)
	if err == sql.ErrNoRows {
		return st, nil
	}
	st.until, st.checked = until.T, checked.T
	return st, err
}

// rollLoop keeps the rollup up to date while the relay runs. The relays of
// one table take turns through the rollup's state row: each pass finds
// what the others left.
func (r *Relay) rollLoop(ctx context.Context) {
	r.periodically(ctx, rollEvery, "outbox: rolling up the sent events for the overview failed; will retry (no event is at stake)", func(ctx context.Context) error {
		sqlDB, err := rawDB(r.db)
		if err != nil {
			return err
		}
		return r.o.rollup(ctx, sqlDB, r.cfg.StatementTimeout)
	})
}

// rollup brings the rollup up to date, one chunk a transaction.
func (o *Outbox) rollup(ctx context.Context, db *sql.DB, stmtTimeout time.Duration) error {
	chunk := rollChunk
	for ctx.Err() == nil {
		done, n, err := o.rollOnce(ctx, db, stmtTimeout, chunk)
		if err != nil || done {
			return err
		}
		switch {
		case n < rollChunkRows/2:
			chunk = min(2*chunk, rollChunkMax)
		case n > 2*rollChunkRows:
			chunk = max(chunk/2, time.Minute)
		}
	}
	return ctx.Err()
}

// rollOnce rolls up at most chunk of sent_at in one transaction: done when
// it reached the margin, n the rows it counted.
func (o *Outbox) rollOnce(ctx context.Context, db *sql.DB, stmtTimeout, chunk time.Duration) (done bool, n int64, err error) {
	ctx, cancel := context.WithTimeout(ctx, stmtTimeout)
	defer cancel()
	now := o.now()
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return false, 0, fmt.Errorf("outbox: roll up the sent events: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	exec := func(q store.Query) (int64, error) {
		res, err := tx.ExecContext(ctx, q.SQL, q.Args...)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	}
	fail := func(err error) (bool, int64, error) {
		return false, 0, fmt.Errorf("outbox: roll up the sent events: %w", err)
	}

	locked, err := exec(o.store.RollLock())
	if err != nil {
		return fail(err)
	}
	if locked == 0 {
		// The first pass: from the oldest sent row on.
		var first store.DBTime
		q := o.store.FirstSent()
		if err := tx.QueryRowContext(ctx, q.SQL, q.Args...).Scan(&first); err != nil {
			return fail(err)
		}
		from := cmp.Or(first.T, now.Add(-rollMargin))
		if _, err := exec(o.store.RollInit(from)); err != nil {
			return fail(err)
		}
		if _, err := exec(o.store.RollLock()); err != nil {
			return fail(err)
		}
	}
	st, err := o.rollState(ctx, tx)
	if err != nil {
		return fail(err)
	}
	to := now.Add(-rollMargin)
	done = true
	if to.After(st.until.Add(chunk)) {
		to, done = st.until.Add(chunk), false
	}
	if to.After(st.until) {
		if n, err = o.rollRange(ctx, tx, st.until, to); err != nil {
			return fail(err)
		}
	} else {
		to = st.until
	}

	low, checked := st.low, st.checked
	if _, fresh := o.store.(store.Walker); fresh {
		full := now.Sub(checked) > lowRecheck || low == 0
		from := low
		if full {
			from = 0
		}
		var lowest, highest sql.NullInt64
		q := o.store.LowScan(from)
		if err := tx.QueryRowContext(ctx, q.SQL, q.Args...).Scan(&lowest, &highest); err != nil {
			return fail(err)
		}
		switch {
		case !highest.Valid:
			low = 0 // an empty table
		case lowest.Valid:
			low = lowest.Int64
		case highest.Int64 < low:
			// The table was emptied and its seqs started again: scan it
			// all next time.
			low, checked = 0, time.Time{}
		default:
			// Nothing pending from low on: move up, leaving room for the
			// transactions that took seqs and have not committed.
			low = max(low, highest.Int64-lowLookback, 1)
		}
		if full && low != 0 {
			checked = now
		}
	}
	for _, s := range store.RollSpans {
		if _, err := exec(o.store.RollTrim(s.Minutes, minuteOf(now.Add(-s.Keep)))); err != nil {
			return fail(err)
		}
	}
	if _, err := exec(o.store.RollSet(to, low, checked)); err != nil {
		return fail(err)
	}
	if err := tx.Commit(); err != nil {
		return fail(err)
	}
	return done, n, nil
}

// eachSentBin calls fn with each count of the rows sent in [from, to) by
// type, minute sent, minute created and delay bin.
func (o *Outbox) eachSentBin(ctx context.Context, q store.Querier, from, to time.Time, fn func(typ string, sent, created int64, bin int, n int64)) error {
	return eachRow(ctx, q, o.store.SentBins(from, to), func(rows *sql.Rows) error {
		var (
			name             string
			sent, created, c int64
			bin              int
		)
		if err := rows.Scan(&name, &sent, &created, &bin, &c); err != nil {
			return err
		}
		fn(name, sent, created, bin, c)
		return nil
	})
}

// rollRange adds the rows sent in [from, to) to the rollup and returns
// how many it counted.
func (o *Outbox) rollRange(ctx context.Context, tx *sql.Tx, from, to time.Time) (int64, error) {
	var total int64
	type key struct {
		span, minute int64
		typ          string
	}
	acc := map[key]*store.RollRow{}
	// add adds to the row of each span that holds minute.
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
	if err := o.eachSentBin(ctx, tx, from, to, func(name string, sent, created int64, bin int, c int64) {
		total += c
		add(sent, name, func(r *store.RollRow) { r.Delivered += c; r.Delay[bin] += c })
		add(created, name, func(r *store.RollRow) { r.Published += c })
	}); err != nil {
		return 0, err
	}
	rows := make([]store.RollRow, 0, len(acc))
	for _, r := range acc {
		rows = append(rows, *r)
	}
	// A fixed order: two passes adding to the same minutes lock them in
	// the same order (they cannot overlap today: the state row serialises
	// them; MySQL's gap locks make the order matter all the same).
	slices.SortFunc(rows, func(a, b store.RollRow) int {
		return cmp.Or(cmp.Compare(a.Span, b.Span), cmp.Compare(a.Minute, b.Minute), cmp.Compare(a.Type, b.Type))
	})
	for chunk := range slices.Chunk(rows, 500) {
		q := o.store.RollAdd(chunk)
		if _, err := tx.ExecContext(ctx, q.SQL, q.Args...); err != nil {
			return 0, err
		}
	}
	return total, nil
}
