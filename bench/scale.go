package main

import (
	"context"
	"database/sql"
	"fmt"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"time"

	"github.com/gorm-outbox/outbox"
)

func runScale(ctx context.Context, e *env, opts options, t *table) error {
	for _, s := range e.servers() {
		if err := scaleOn(ctx, s, opts, t); err != nil {
			return fmt.Errorf("%s: %w", s.name(), err)
		}
	}
	return nil
}

func scaleOn(ctx context.Context, s server, opts options, t *table) error {
	admin, err := s.open()
	if err != nil {
		return err
	}
	defer closeDB(admin)
	adb := sqlDB(admin)
	const empty, full, mem = "scale_empty", "scale_full", "scale_mem"
	for _, tb := range []string{empty, full, mem} {
		if err := createOutboxTable(ctx, admin, tb); err != nil {
			return err
		}
	}
	progress("scale %s: filling %s with %d sent rows", s.name(), full, opts.scaleSent)
	var sentTop int64 // the highest seq of the sent rows
	if opts.scaleSent > 0 {
		start := time.Now()
		if err := s.fill(ctx, adb, full, opts.scaleSent, fillSent); err != nil {
			return err
		}
		if sentTop, err = maxSeq(ctx, s, adb, full); err != nil {
			return err
		}
		progress("scale %s: filled in %s", s.name(), time.Since(start).Round(time.Second))
	}
	cfg := outbox.RelayConfig{} // defaults, what users get
	fills := map[string]func(ctx context.Context, n int) error{
		empty: func(ctx context.Context, n int) error {
			if err := s.clear(ctx, adb, empty); err != nil {
				return err
			}
			return s.fill(ctx, adb, empty, n, fillPending)
		},
		full: func(ctx context.Context, n int) error {
			// Keep the sent rows; drop the previous round's backlog.
			if err := exec(ctx, adb, fmt.Sprintf(`DELETE FROM %s WHERE seq > %d`, s.quote(full), sentTop)); err != nil {
				return err
			}
			return s.fill(ctx, adb, full, n, fillPending)
		},
	}
	label := map[string]string{empty: "empty table", full: fmt.Sprintf("%d sent rows", opts.scaleSent)}
	rates := map[string]series{}
	claims := map[string]series{}
	plans := map[string]string{}
	for round := range opts.rounds {
		for _, tb := range rotate([]string{empty, full}, round) {
			c := relayContender{
				fill: func(ctx context.Context, n int) error {
					if err := fills[tb](ctx, n); err != nil {
						return err
					}
					ms, plan, err := s.probeClaim(ctx, adb, tb, defaultBatchSize)
					if err != nil {
						return err
					}
					claims[tb] = append(claims[tb], ms)
					plans[tb] = plan
					progress("scale %s: claim plan on %s: %s", s.name(), label[tb], plan)
					return nil
				},
				run: func(ctx context.Context, relays int, t *tally) error {
					return runOurs(ctx, s, tb, cfg, relays, t, nil)
				},
			}
			res, err := drain(ctx, c, opts.scaleBacklog, 1, opts.drainTimeout, true)
			if err != nil {
				return fmt.Errorf("scale, %s: %w", label[tb], err)
			}
			rates[tb] = append(rates[tb], res.rate)
			progress("scale %s round %d: %-16s claim %.2f ms, drain %.0f ev/s", s.name(), round+1, label[tb], claims[tb][len(claims[tb])-1], res.rate)
		}
	}
	scen := fmt.Sprintf("4 scale, %s: %d-event backlog, 1 relay at defaults", s.name(), opts.scaleBacklog)
	t.add(&row{scenario: scen, contender: "ours, " + label[empty], metric: "events/s", vals: rates[empty], format: fmtRate})
	r := t.add(&row{scenario: scen, contender: "ours, " + label[full], metric: "events/s", vals: rates[full], format: fmtRate})
	var q series // per-round ratios: the two drains of a round run back to back
	for i := range rates[full] {
		q = append(q, rates[full][i]/rates[empty][i])
	}
	r.judge(fmt.Sprintf("≥ 80%% of the empty table's; got %.0f%% (median of per-round ratios)", 100*q.median()), q.median() >= 0.8)
	for _, tb := range []string{empty, full} {
		t.add(&row{scenario: scen, contender: "claim of 100, " + label[tb], metric: s.probeMetric(),
			vals: claims[tb], format: fmtMS, note: "median of 5 per round, full backlog pending; last round's plan: " + plans[tb]})
	}

	// Memory: the relay must stream, so its peak heap must not grow with
	// the backlog.
	heap := map[int]series{}
	resident := map[int]series{}
	memRates := map[int]series{}
	memNotes := map[int]string{}
	sizes := []int{opts.memSmall, opts.memBig}
	for round := range opts.rounds {
		for _, n := range rotate(sizes, round) {
			var peak memPeak
			c := relayContender{
				fill: func(ctx context.Context, n int) error {
					if err := s.clear(ctx, adb, mem); err != nil {
						return err
					}
					return s.fill(ctx, adb, mem, n, fillPending)
				},
				run: func(ctx context.Context, relays int, t *tally) error {
					// Sample from a clean heap once the relay's pool and
					// Outbox exist, until the drain ends.
					stop := make(chan struct{})
					done := make(chan struct{})
					err := runOurs(ctx, s, mem, cfg, relays, t, func() {
						runtime.GC()
						debug.FreeOSMemory()
						go func() { defer close(done); peak = sampleMemory(stop) }()
					})
					close(stop)
					<-done
					return err
				},
			}
			res, err := drain(ctx, c, n, 1, opts.memTimeout, false)
			if err != nil {
				return fmt.Errorf("memory, %d backlog: %w", n, err)
			}
			heap[n] = append(heap[n], float64(peak.heapInuse))
			resident[n] = append(resident[n], float64(peak.mapped))
			memRates[n] = append(memRates[n], res.rate)
			if res.partial {
				memNotes[n] = joinNote(memNotes[n], fmt.Sprintf("r%d: sampled over the first %d events (%s)", round+1, res.unique, res.elapsed.Round(time.Second)))
			}
			progress("memory %s round %d: backlog %7d: peak HeapInuse %.1f MiB, mapped %.1f MiB, %.0f ev/s", s.name(), round+1, n,
				float64(peak.heapInuse)/(1<<20), float64(peak.mapped)/(1<<20), res.rate)
		}
	}
	scen = fmt.Sprintf("4 scale, %s: relay memory while draining, 1 relay at defaults", s.name())
	for _, n := range sizes {
		r := t.add(&row{scenario: scen, contender: fmt.Sprintf("ours, %d-event backlog", n), metric: "peak HeapInuse",
			vals: heap[n], format: fmtMiB, note: joinNote("drain "+fmtRate(memRates[n].median()), memNotes[n])})
		if n == opts.memBig {
			small := heap[opts.memSmall].median()
			r.judge(fmt.Sprintf("flat: ≤ 1.25 × the %d backlog's %s", opts.memSmall, fmtMiB(small)), r.vals.median() <= 1.25*small)
		}
		t.add(&row{scenario: scen, contender: fmt.Sprintf("ours, %d-event backlog", n), metric: "peak mapped (Sys − released)",
			vals: resident[n], format: fmtMiB})
	}
	return nil
}

// maxSeq is the highest seq in table, 0 when it is empty.
func maxSeq(ctx context.Context, d database, db *sql.DB, table string) (int64, error) {
	var top int64
	if err := db.QueryRowContext(ctx, "SELECT COALESCE(MAX(seq), 0) FROM "+d.quote(table)).Scan(&top); err != nil {
		return 0, fmt.Errorf("highest seq of %s: %w", table, err)
	}
	return top, nil
}

type memPeak struct{ heapInuse, mapped uint64 }

// sampleMemory reads the runtime's memory metrics every 5 ms until stop
// closes and returns the peaks. runtime/metrics does not stop the world, so
// sampling this often does not slow the relay down the way ReadMemStats
// would.
func sampleMemory(stop <-chan struct{}) memPeak {
	samples := []metrics.Sample{
		{Name: "/memory/classes/heap/objects:bytes"},
		{Name: "/memory/classes/heap/unused:bytes"},
		{Name: "/memory/classes/total:bytes"},
		{Name: "/memory/classes/heap/released:bytes"},
	}
	var p memPeak
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		metrics.Read(samples)
		// HeapInuse is live-and-unswept objects plus the unused part of
		// in-use spans; mapped is everything the runtime holds from the OS
		// minus what it has returned.
		inuse := samples[0].Value.Uint64() + samples[1].Value.Uint64()
		mapped := samples[2].Value.Uint64() - samples[3].Value.Uint64()
		p.heapInuse = max(p.heapInuse, inuse)
		p.mapped = max(p.mapped, mapped)
		select {
		case <-stop:
			return p
		case <-tick.C:
		}
	}
}
