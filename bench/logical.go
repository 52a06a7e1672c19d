package main

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/pgtest"
	"gorm.io/gorm"
)

// The logical scenario: Logical mode against the table path (Persistent
// mode), side by side on one PostgreSQL cluster the benchmark starts for
// itself, since Logical mode needs wal_level=logical (a restart to change)
// and the shared server runs with replica. The cluster runs with fsync on:
// the commit's flush is part of what both paths cost.

const logicalSlot = "bench_logical_slot"

func runLogical(ctx context.Context, _ *env, opts options, t *table) error {
	progress("logical: starting a PostgreSQL cluster with wal_level=logical")
	srv, err := pgtest.Start("wal_level=logical", "fsync=on", "shared_buffers=128MB", "max_wal_size=4GB",
		"max_replication_slots=10", "max_wal_senders=10")
	if err != nil {
		return err
	}
	defer srv.Close()
	pg, err := newPG(ctx, srv.DSN("postgres"), opts.asyncCommit, opts.maxIdle)
	if err != nil {
		return err
	}
	defer func() { _ = pg.close() }()
	open := func(cfg outbox.Config) (*gorm.DB, *outbox.Outbox, error) {
		db, err := pg.open()
		if err != nil {
			return nil, nil, err
		}
		cfg.Logger = warnLogger
		ob := outbox.Plugin(cfg)
		if err := db.Use(ob); err != nil {
			closeDB(db)
			return nil, nil, fmt.Errorf("install outbox (%v): %w", cfg.Mode, err)
		}
		return db, ob, nil
	}
	plain, err := pg.open()
	if err != nil {
		return err
	}
	defer closeDB(plain)
	if err := plain.WithContext(ctx).AutoMigrate(&BenchOrder{}); err != nil {
		return err
	}
	table, _, err := open(outbox.Config{Table: "table_events"})
	if err != nil {
		return err
	}
	defer closeDB(table)
	logical, _, err := open(outbox.Config{Table: "logical_events", Mode: outbox.Logical, Logical: outbox.LogicalConfig{Slot: logicalSlot}})
	if err != nil {
		return err
	}
	defer closeDB(logical)

	if err := logicalWrite(ctx, pg, plain, table, logical, opts, t); err != nil {
		return err
	}
	if err := logicalRelay(ctx, pg, opts, t); err != nil {
		return err
	}
	return logicalLatency(ctx, pg, opts, t)
}

// logicalWrite: the business transaction alone, + Publish in Persistent
// mode, + Publish in Logical mode, interleaved as the write scenario does.
func logicalWrite(ctx context.Context, pg *pgServer, plain, table, logical *gorm.DB, opts options, t *table) error {
	contenders := []writeContender{
		{name: "business insert alone", db: plain},
		{name: "+ outbox.Publish, Persistent (table)", db: table, extra: publishOurs},
		{name: "+ outbox.Publish, Logical (WAL)", db: logical, extra: publishOurs},
	}
	sql := sqlDB(plain)
	for _, writers := range opts.writers {
		rates, ratios, _, err := writeRounds(ctx, contenders, writers, opts, "logical write", func(ctx context.Context) error {
			// The slot keeps the WAL of every emitted message until a relay
			// confirms it; advance it so that the rounds run alike.
			if _, err := sql.ExecContext(ctx, "SELECT pg_replication_slot_advance($1, pg_current_wal_lsn())", logicalSlot); err != nil {
				return fmt.Errorf("advance the slot: %w", err)
			}
			return pg.clear(ctx, sql, "bench_orders", "table_events", "logical_events")
		})
		if err != nil {
			return err
		}
		scen := fmt.Sprintf("L1 write overhead, PostgreSQL wal_level=logical, %d writer(s)", writers)
		for i, c := range contenders {
			if i == 0 {
				t.add(&row{scenario: scen, contender: c.name, metric: "tx/s", vals: rates[c.name], format: fmtRate})
				continue
			}
			r := t.add(&row{scenario: scen, contender: c.name, metric: "ratio to alone", vals: ratios[c.name], format: fmtRatio,
				note: "≈ " + fmtRate(rates[c.name].median())})
			if i == 2 {
				m := ratios[c.name].median()
				r.judge(fmt.Sprintf("≥ 0.90 of the business transaction alone, got %.2f", m), m >= 0.90)
			}
		}
	}
	return nil
}

// logicalRelay drains a backlog in each mode with one relay at BatchSize
// 100 (the default) and 1000.
func logicalRelay(ctx context.Context, pg *pgServer, opts options, t *table) error {
	type result struct {
		name  string
		rates series
	}
	var results []*result
	best := map[outbox.Mode]float64{}
	for _, mode := range []outbox.Mode{outbox.Persistent, outbox.Logical} {
		for _, batch := range []int{100, 1000} {
			res := &result{name: fmt.Sprintf("%v mode, 1 relay, BatchSize %d, Workers 4", mode, batch)}
			for round := range opts.rounds {
				rate, err := logicalDrain(ctx, pg, mode, batch, opts.backlog, opts.drainTimeout)
				if err != nil {
					return fmt.Errorf("%s: %w", res.name, err)
				}
				progress("logical relay round %d: %-50s %8.0f events/s", round+1, res.name, rate)
				res.rates = append(res.rates, rate)
			}
			best[mode] = max(best[mode], res.rates.median())
			results = append(results, res)
		}
	}
	scen := fmt.Sprintf("L2 relay throughput, %d backlog, PostgreSQL wal_level=logical", opts.backlog)
	for _, res := range results {
		r := t.add(&row{scenario: scen, contender: res.name, metric: "events/s", vals: res.rates, format: fmtRate})
		if res == results[len(results)-1] {
			lb, pb := best[outbox.Logical], best[outbox.Persistent]
			r.judge(fmt.Sprintf("Logical's best ≥ 50k events/s, got %.0f", lb), lb >= 50000)
			r.judge(fmt.Sprintf("Logical's best ≥ 1.5× the table path's best, got %.2f×", lb/pb), lb >= 1.5*pb)
		}
	}
	return nil
}

// logicalDrain publishes n events (1000 per transaction) with no relay
// running, then times one relay's Run until its handler has seen them all.
func logicalDrain(ctx context.Context, pg *pgServer, mode outbox.Mode, batch, n int, timeout time.Duration) (float64, error) {
	tableName := "drain_" + mode.String()
	cfg := outbox.Config{Table: tableName, Mode: mode, Logger: warnLogger, RetainSent: outbox.RetainForever}
	if mode == outbox.Logical {
		cfg.Logical.Slot = "bench_drain_slot"
	}
	db, err := pg.open()
	if err != nil {
		return 0, err
	}
	defer closeDB(db)
	ob := outbox.Plugin(cfg)
	if err := db.Use(ob); err != nil {
		return 0, err
	}
	if mode == outbox.Logical {
		// Start from an empty stream: skip what earlier rounds left.
		if err := db.WithContext(ctx).Exec("SELECT pg_replication_slot_advance(?, pg_current_wal_lsn())", cfg.Logical.Slot).Error; err != nil {
			return 0, err
		}
	}
	if err := pg.clear(ctx, sqlDB(db), tableName); err != nil {
		return 0, err
	}
	events := make([]outbox.Event, 1000)
	for done := 0; done < n; {
		k := min(len(events), n-done)
		for i := range k {
			events[i] = outbox.Event{Type: "order.created", AggregateType: "order", AggregateID: strconv.Itoa(done + i),
				Payload: orderCreated{OrderID: uint(done + i), Total: 42}}
		}
		if err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error { return outbox.Publish(tx, events[:k]...) }); err != nil {
			return 0, err
		}
		done += k
	}
	var seen atomic.Int64
	all := make(chan struct{})
	ob.Handle("order.created", func(context.Context, outbox.Event) error {
		if seen.Add(1) == int64(n) {
			close(all)
		}
		return nil
	})
	rctx, stop := context.WithCancel(ctx)
	defer stop()
	errc := make(chan error, 1)
	start := time.Now()
	relay, err := ob.Relay(db, outbox.RelayConfig{BatchSize: batch, Workers: 4})
	if err != nil {
		return 0, err
	}
	go func() {
		errc <- relay.Run(rctx)
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-all:
	case <-timer.C:
		stop()
		return 0, fmt.Errorf("drained %d of %d events in %v", seen.Load(), n, timeout)
	case err := <-errc:
		return 0, fmt.Errorf("relay stopped: %v", err)
	}
	elapsed := time.Since(start)
	stop()
	if err := <-errc; err != nil {
		return 0, err
	}
	return float64(n) / elapsed.Seconds(), nil
}

// logicalLatency: commit→handler at opts.rate events/s, the relay in its
// own pool and Outbox (woken through PostgreSQL, not in-process), in each
// mode.
func logicalLatency(ctx context.Context, pg *pgServer, opts options, t *table) error {
	contenders := []struct {
		name string
		cfg  outbox.Config
	}{
		{"Persistent mode, LISTEN/NOTIFY relay", outbox.Config{}},
		{"Logical mode, streaming relay", outbox.Config{Mode: outbox.Logical, Logical: outbox.LogicalConfig{Slot: "bench_latency_slot"}}},
	}
	scen := fmt.Sprintf("L3 commit→handler latency, %d events/s, PostgreSQL wal_level=logical", opts.rate)
	sql, err := pg.openSQL()
	if err != nil {
		return err
	}
	defer sql.Close()
	for i, c := range contenders {
		tableName := fmt.Sprintf("latency_%d", i)
		var p50, p99 series
		for round := range opts.rounds {
			lc, err := oursLatency(pg, tableName, c.name, c.cfg, outbox.RelayConfig{}, false, pg.maxIdle,
				func(ctx context.Context) error { return pg.clear(ctx, sql, tableName) }, 0)
			if err != nil {
				return err
			}
			lat, missing, err := measureLatency(ctx, lc.latencyContender, opts.rate, opts.latencyDur)
			lc.close()
			if err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			if missing > 0 || len(lat) == 0 {
				return fmt.Errorf("%s: %d events not delivered within the wait", c.name, missing)
			}
			p50, p99 = append(p50, percentile(lat, 0.50)), append(p99, percentile(lat, 0.99))
			progress("logical latency round %d: %-40s p50 %.2f ms p99 %.2f ms", round+1, c.name, p50[len(p50)-1], p99[len(p99)-1])
		}
		t.add(&row{scenario: scen, contender: c.name, metric: "p50", vals: p50, format: fmtMS})
		r := t.add(&row{scenario: scen, contender: c.name, metric: "p99", vals: p99, format: fmtMS})
		if c.cfg.Mode == outbox.Logical {
			m := p99.median()
			r.judge(fmt.Sprintf("p99 < 5 ms, got %.2f ms", m), m < 5)
		}
	}
	return nil
}
