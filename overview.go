package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/gorm-outbox/outbox/internal/maint"
	"github.com/gorm-outbox/outbox/internal/overview"
	"github.com/gorm-outbox/outbox/internal/store"
	"gorm.io/gorm"
)

// RollupRetention is how long the rollup keeps its minutes: the longest
// window [Outbox.Overview] can chart.
const RollupRetention = overview.Retention

// overviewRollBudget bounds the rollup an Overview call runs itself.
const overviewRollBudget = 3 * time.Second

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
	// Stats is the table's state now, as [Outbox.Stats] reads it:
	// Pending, Failed, OldestPending, FailedLastHour, the slot.
	Stats
	// Now is when it was read; Since is the start of the first interval
	// (at or before Now-Window); Step is each interval's length.
	Now, Since time.Time
	Step       time.Duration
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
	ovs, ok := o.store.(store.Overview)
	if !ok {
		return ov, o.unsupported("Overview")
	}
	sqlDB, err := rawDB(db)
	if err != nil {
		return ov, err
	}
	w := overview.Plan(o.now(), p.Window, p.Step)
	st, _, err := ovs.RollState(ctx, sqlDB)
	// The relays keep the rollup within RollMargin+RollEvery of now: roll
	// up here only when they lag (none runs, or none has reached this
	// table yet).
	if err != nil || st.Until.Before(w.Now.Add(-maint.RollMargin-2*maint.RollEvery)) {
		// Bounded: a first pass over a long history is the relays' to
		// finish; what it leaves is read from the table.
		rctx, cancel := context.WithTimeout(ctx, overviewRollBudget)
		_, err := o.rollup(sqlDB, defaultStatementTimeout).Pass(rctx)
		cancel()
		if err != nil && ctx.Err() == nil && !errors.Is(err, context.DeadlineExceeded) {
			o.logger.WarnContext(ctx, "outbox: overview: rolling up the sent events failed; reading them from the table", "error", err)
		}
		if st, _, err = ovs.RollState(ctx, sqlDB); err != nil {
			return ov, fmt.Errorf("outbox: overview: %w", err)
		}
	}
	rows, err := ovs.ReadOverview(ctx, sqlDB, w.Query(st))
	if err != nil {
		return ov, fmt.Errorf("outbox: overview: %w", err)
	}
	ov = publicOverview(overview.Fold(w, rows, st.Until))
	if err := o.statsBeside(ctx, sqlDB, &ov.Stats); err != nil {
		return ov, fmt.Errorf("outbox: overview: %w", err)
	}
	return ov, nil
}

// publicOverview is the fold's overview as this package exports it.
func publicOverview(f overview.Overview) Overview {
	ov := Overview{
		Stats: Stats{Pending: f.Pending, Failed: f.Failed, OldestPending: f.OldestPending},
		Now:   f.Now, Since: f.Since, Step: f.Step,
		Published: f.Published, Delivered: f.Delivered, FailedInWindow: f.FailedInWindow, Delay: Delay(f.Delay),
		RolledUntil: f.RolledUntil, Types: make([]TypeCount, len(f.Types)), Intervals: make([]Interval, len(f.Intervals)),
	}
	for i, t := range f.Types {
		ov.Types[i] = TypeCount(t)
	}
	for i, iv := range f.Intervals {
		ov.Intervals[i] = Interval{Start: iv.Start, Published: iv.Published, Delivered: iv.Delivered, Failed: iv.Failed,
			Backlog: iv.Backlog, Delay: Delay(iv.Delay)}
	}
	return ov
}

// rollup is the rollup of the table on db, its statements bounded by
// timeout.
func (o *Outbox) rollup(db *sql.DB, timeout time.Duration) *maint.Rollup {
	ovs, _ := o.store.(store.Overview)
	w, _ := o.store.(store.Walker)
	return &maint.Rollup{Overview: ovs, Walker: w, DB: db, Now: o.now, StatementTimeout: timeout}
}
