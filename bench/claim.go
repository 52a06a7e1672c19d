package main

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/gorm-outbox/outbox"
	"gorm.io/gorm"
)

// The claim scenario: what one relay cycle costs the library (claim a batch
// of new events, deliver them to a handler that does nothing, mark them
// sent), on an empty table, beside a million sent rows, and beside those
// and events waiting on backoff. Schema version 3 finds new events by seq
// from a watermark on PostgreSQL and SQLite (no index of pending rows) and
// retries through a partial index; MySQL reads its pending index. Either
// way the cycle should cost the same in all three states.

const (
	// claimBatch is the events published before, and claimed by, each
	// cycle: the default BatchSize.
	claimBatch = defaultBatchSize
	// claimBackoff is how many events wait on backoff in the third state.
	claimBackoff = 10000
)

// claimState is one table state the cycle is measured in.
type claimState struct {
	table, label   string
	sent, backoff  int
	db             *gorm.DB
	ob             *outbox.Outbox
	top            int64 // the highest seq the fill wrote: rows above are the cycles'
	medians, means series
	all            series // every cycle's time, all rounds
}

func runClaim(ctx context.Context, e *env, opts options, t *table) error {
	for _, d := range e.databases() {
		if err := claimOn(ctx, d, opts, t); err != nil {
			return fmt.Errorf("%s: %w", d.name(), err)
		}
	}
	return nil
}

func claimOn(ctx context.Context, d database, opts options, t *table) error {
	states := []*claimState{
		{table: "claim_empty", label: "empty table"},
		{table: "claim_sent", label: fmt.Sprintf("%d sent rows", opts.claimSent), sent: opts.claimSent},
		{table: "claim_backoff", label: fmt.Sprintf("%d sent rows + %d on backoff", opts.claimSent, claimBackoff),
			sent: opts.claimSent, backoff: claimBackoff},
	}
	for _, st := range states {
		db, err := d.open()
		if err != nil {
			return err
		}
		defer closeDB(db)
		// No NOTIFY: nothing listens, and a notification sent after a
		// Publish's commit would run beside the measured cycle.
		ob := outbox.Plugin(outbox.Config{Table: st.table, Logger: warnLogger, DisableNotify: true})
		if err := db.Use(ob); err != nil {
			return fmt.Errorf("install outbox on %s: %w", st.table, err)
		}
		ob.Handle("order.created", func(context.Context, outbox.Event) error { return nil })
		st.db, st.ob = db, ob
		adb := sqlDB(db)
		for _, f := range []struct {
			n int
			k fillKind
		}{{st.sent, fillSent}, {st.backoff, fillBackoff}} {
			if f.n == 0 {
				continue
			}
			start := time.Now()
			if err := d.fill(ctx, adb, st.table, f.n, f.k); err != nil {
				return err
			}
			progress("claim %s: %s: %d %s rows in %s", d.name(), st.table, f.n, f.k, time.Since(start).Round(time.Millisecond))
		}
		if st.top, err = maxSeq(ctx, d, adb, st.table); err != nil {
			return err
		}
	}

	for round := range opts.rounds {
		for _, st := range rotate(states, round) {
			times, err := claimCycles(ctx, d, st, opts.claimCycles)
			if err != nil {
				return fmt.Errorf("%s: %w", st.label, err)
			}
			st.all = append(st.all, times...)
			med, mean := times.median(), mean(times)
			st.medians = append(st.medians, med)
			st.means = append(st.means, mean)
			progress("claim %s round %d: %-40s median %.2f ms, mean %.2f ms, max %.2f ms per cycle (%d cycles)",
				d.name(), round+1, st.label, med, mean, times.max(), len(times))
		}
	}

	scen := fmt.Sprintf("5 claim cost, %s: one relay cycle (ProcessOnce: claim %d new events, no-op handler, mark sent), %d cycles per round",
		d.name(), claimBatch, opts.claimCycles)
	empty := states[0]
	for _, st := range states {
		sorted := slices.Clone(st.all)
		slices.Sort(sorted)
		note := fmt.Sprintf("median of each round's cycles; over all cycles: mean %s, p90 %s, max %s",
			fmtMS(mean(st.all)), fmtMS(percentile(sorted, 0.90)), fmtMS(sorted[len(sorted)-1]))
		t.add(&row{scenario: scen, contender: "ours, " + st.label, metric: "ms per claim+mark cycle", vals: st.medians, format: fmtMS, note: note})
		if st == empty {
			continue
		}
		// Per round: the states of a round run back to back.
		var q series
		for i := range st.medians {
			q = append(q, st.medians[i]/empty.medians[i])
		}
		t.add(&row{scenario: scen, contender: "ours, " + st.label, metric: "ratio to empty table", vals: q, format: fmtRatio,
			note: "per-round ratio of the medians"})
	}
	return nil
}

// claimCycles resets st's table to its state (the rows earlier cycles sent
// are deleted, not timed), starts a relay on it and runs one warm-up cycle
// (its watermark's first sweep reads the whole table once, as every relay's
// start does), then n measured cycles: each publishes claimBatch events
// with outbox.Publish in one transaction (not timed) and times one
// ProcessOnce, which must claim and mark all of them.
func claimCycles(ctx context.Context, d database, st *claimState, n int) (series, error) {
	adb := sqlDB(st.db)
	if st.top == 0 {
		if err := d.clear(ctx, adb, st.table); err != nil {
			return nil, err
		}
	} else if err := exec(ctx, adb, fmt.Sprintf("DELETE FROM %s WHERE seq > %d", d.quote(st.table), st.top)); err != nil {
		return nil, err
	}
	relay, err := st.ob.Relay(st.db, outbox.RelayConfig{BatchSize: claimBatch})
	if err != nil {
		return nil, err
	}
	events := make([]outbox.Event, claimBatch)
	publish := func(cycle int) error {
		for i := range events {
			id := cycle*claimBatch + i + 1
			events[i] = outbox.Event{Type: "order.created", AggregateType: "order", AggregateID: strconv.Itoa(id),
				Payload: orderCreated{OrderID: uint(id), Total: 42}}
		}
		return st.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error { return outbox.Publish(tx, events...) })
	}
	var times series
	for cycle := range n + 1 {
		if err := publish(cycle); err != nil {
			return nil, fmt.Errorf("publish: %w", err)
		}
		start := time.Now()
		got, err := relay.ProcessOnce(ctx)
		elapsed := time.Since(start)
		if err != nil {
			return nil, fmt.Errorf("cycle %d: %w", cycle, err)
		}
		if got != claimBatch {
			return nil, fmt.Errorf("cycle %d claimed %d events, want the %d just published", cycle, got, claimBatch)
		}
		if cycle > 0 { // cycle 0 is the warm-up
			times = append(times, float64(elapsed)/1e6)
		}
	}
	return times, nil
}

func mean(s series) float64 {
	var sum float64
	for _, v := range s {
		sum += v
	}
	return sum / float64(len(s))
}
