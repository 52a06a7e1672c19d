package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"time"

	"github.com/gorm-outbox/outbox"
)

// claimSQL is the relay's claim as sql.go builds it for PostgreSQL (not
// exported, so copied here; keep the two in step). $1 lease end, $2 now,
// $3 batch size.
const claimSQL = `UPDATE "%[1]s" SET available_at = $1, locked_until = $1, attempts = attempts + 1, updated_at = $2
	WHERE id IN (SELECT c.id FROM "%[1]s" c WHERE c.status = 'pending' AND c.available_at <= $2
		ORDER BY c.available_at, c.id LIMIT $3 FOR UPDATE SKIP LOCKED)
	RETURNING id, event_type, aggregate_type, aggregate_id, idempotency_key, payload, headers, attempts, occurred_at, created_at`

func runScale(ctx context.Context, e *env, opts options, t *table) error {
	admin, err := e.openPG()
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
	progress("scale: filling %s with %d sent rows", full, opts.scaleSent)
	if opts.scaleSent > 0 {
		if err := fillOutbox(ctx, adb, full, opts.scaleSent, outbox.StatusSent); err != nil {
			return err
		}
	}
	cfg := outbox.RelayConfig{} // defaults, what users get
	fills := map[string]func(ctx context.Context, n int) error{
		empty: func(ctx context.Context, n int) error {
			if err := exec(ctx, adb, `TRUNCATE "`+empty+`"`); err != nil {
				return err
			}
			return fillOutbox(ctx, adb, empty, n, outbox.StatusPending)
		},
		full: func(ctx context.Context, n int) error {
			// Keep the sent rows ('s…'); drop the previous round's backlog.
			if err := exec(ctx, adb, `DELETE FROM "`+full+`" WHERE id LIKE 'p%'`); err != nil {
				return err
			}
			return fillOutbox(ctx, adb, full, n, outbox.StatusPending)
		},
	}
	label := map[string]string{empty: "empty table", full: fmt.Sprintf("%d sent rows", opts.scaleSent)}
	rates := map[string]series{}
	claims := map[string]series{}
	for round := range opts.rounds {
		for _, tb := range rotate([]string{empty, full}, round) {
			c := relayContender{
				fill: func(ctx context.Context, n int) error {
					if err := fills[tb](ctx, n); err != nil {
						return err
					}
					ms, err := explainClaim(ctx, adb, tb, outbox.DefaultBatchSize)
					if err != nil {
						return err
					}
					claims[tb] = append(claims[tb], ms)
					return nil
				},
				run: func(ctx context.Context, relays int, t *tally) error {
					return runOurs(ctx, e, tb, cfg, relays, t, nil)
				},
			}
			res, err := drain(ctx, c, opts.scaleBacklog, 1, opts.drainTimeout, true)
			if err != nil {
				return fmt.Errorf("scale, %s: %w", label[tb], err)
			}
			rates[tb] = append(rates[tb], res.rate)
			progress("scale round %d: %-16s claim %.2f ms, drain %.0f ev/s", round+1, label[tb], claims[tb][len(claims[tb])-1], res.rate)
		}
	}
	scen := fmt.Sprintf("4 scale: %d-event backlog, 1 relay at defaults", opts.scaleBacklog)
	t.add(&row{scenario: scen, contender: "ours, " + label[empty], metric: "events/s", vals: rates[empty], format: fmtRate})
	r := t.add(&row{scenario: scen, contender: "ours, " + label[full], metric: "events/s", vals: rates[full], format: fmtRate})
	var q series // per-round ratios: the two drains of a round run back to back
	for i := range rates[full] {
		q = append(q, rates[full][i]/rates[empty][i])
	}
	r.judge(fmt.Sprintf("≥ 80%% of the empty table's; got %.0f%% (median of per-round ratios)", 100*q.median()), q.median() >= 0.8)
	for _, tb := range []string{empty, full} {
		t.add(&row{scenario: scen, contender: "claim of 100, " + label[tb], metric: "EXPLAIN ANALYZE execution time",
			vals: claims[tb], format: fmtMS, note: "median of 5 per round, full backlog pending"})
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
					if err := exec(ctx, adb, `TRUNCATE "`+mem+`"`); err != nil {
						return err
					}
					return fillOutbox(ctx, adb, mem, n, outbox.StatusPending)
				},
				run: func(ctx context.Context, relays int, t *tally) error {
					// Sample from a clean heap once the relay's pool and
					// Outbox exist, until the drain ends.
					stop := make(chan struct{})
					done := make(chan struct{})
					err := runOurs(ctx, e, mem, cfg, relays, t, func() {
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
			progress("memory round %d: backlog %7d: peak HeapInuse %.1f MiB, mapped %.1f MiB, %.0f ev/s", round+1, n,
				float64(peak.heapInuse)/(1<<20), float64(peak.mapped)/(1<<20), res.rate)
		}
	}
	scen = "4 scale: relay memory while draining, 1 relay at defaults"
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

// explainClaim runs the claim under EXPLAIN ANALYZE five times, each in a
// transaction rolled back (the claim is executed, then undone), and returns
// the median execution time in milliseconds.
func explainClaim(ctx context.Context, db *sql.DB, table string, batch int) (float64, error) {
	var times series
	for range 5 {
		ms, err := func() (float64, error) {
			tx, err := db.BeginTx(ctx, nil)
			if err != nil {
				return 0, err
			}
			defer func() { _ = tx.Rollback() }()
			now := time.Now().UTC()
			var plan []byte
			err = tx.QueryRowContext(ctx, "EXPLAIN (ANALYZE, FORMAT JSON) "+fmt.Sprintf(claimSQL, table),
				now.Add(time.Minute), now, batch).Scan(&plan)
			if err != nil {
				return 0, fmt.Errorf("explain claim on %s: %w", table, err)
			}
			var out []struct {
				Execution float64 `json:"Execution Time"`
			}
			if err := json.Unmarshal(plan, &out); err != nil {
				return 0, fmt.Errorf("explain claim on %s: decode plan: %w", table, err)
			}
			if len(out) == 0 {
				return 0, fmt.Errorf("explain claim on %s: empty plan %.200s", table, plan)
			}
			return out[0].Execution, nil
		}()
		if err != nil {
			return 0, err
		}
		times = append(times, ms)
	}
	return times.median(), nil
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
