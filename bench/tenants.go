package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"runtime/metrics"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/pgtest"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// The tenants scenario: one Outbox installed on many databases (PostgreSQL
// schemas, SQLite files), delivered by one RelayGroup against one relay per
// database, in one process, side by side:
//
//   - throughput: every database gets a backlog; events/s until all are
//     delivered;
//   - a quiet database beside a busy one: one database drains a large
//     backlog while another gets one event every 10 ms; commit → handler
//     latency of the quiet one's events (p50, p99);
//   - what the process holds meanwhile, sampled every 20 ms, the peak:
//     goroutines, open connections (summed over the databases' pools),
//     live heap.
//
// PostgreSQL runs on a cluster of the scenario's own (internal/pgtest,
// fsync on), with max_connections for every pool: each database's pool
// holds its connections (the relay's, the writer's, LISTEN's), which the
// shared server's 100 would not fit for 50 databases.
func runTenants(ctx context.Context, e *env, opts options, t *table) error {
	for _, kind := range []string{"postgres", "sqlite"} {
		if !opts.dbs[kind] {
			continue
		}
		dsn := ""
		if kind == "postgres" {
			srv, err := pgtest.Start("fsync=on", "shared_buffers=128MB", fmt.Sprintf("max_connections=%d", 10*opts.tenants+50))
			if err != nil {
				return fmt.Errorf("start a PostgreSQL cluster for the tenants scenario: %w", err)
			}
			defer srv.Close()
			dsn = srv.DSN("postgres")
		}
		if err := tenantsOn(ctx, kind, dsn, opts, t); err != nil {
			return fmt.Errorf("%s: %w", kind, err)
		}
	}
	return nil
}

// tenantSet is n databases of one kind, each its own pool, with one Outbox
// installed on all.
type tenantSet struct {
	dbs   []*gorm.DB
	close func() error
}

func openTenants(ctx context.Context, kind, dsn string, n int) (*tenantSet, error) {
	ts := &tenantSet{}
	var cleanups []func() error
	ts.close = func() error {
		var errs []error
		for _, db := range ts.dbs {
			closeDB(db)
		}
		for _, c := range slices.Backward(cleanups) {
			errs = append(errs, c())
		}
		return errors.Join(errs...)
	}
	b := make([]byte, 4)
	_, _ = rand.Read(b)
	prefix := "outbox_tenant_" + hex.EncodeToString(b) + "_"
	switch kind {
	case "postgres":
		admin, err := sql.Open("pgx", dsn)
		if err != nil {
			return nil, err
		}
		cleanups = append(cleanups, admin.Close)
		u, err := url.Parse(dsn)
		if err != nil {
			return nil, err
		}
		for i := range n {
			schema := fmt.Sprintf("%s%d", prefix, i)
			if _, err := admin.ExecContext(ctx, "CREATE SCHEMA "+schema); err != nil {
				return nil, errors.Join(err, ts.close())
			}
			cleanups = append(cleanups, func() error {
				_, err := admin.ExecContext(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
				return err
			})
			q := u.Query()
			q.Set("search_path", schema)
			v := *u
			v.RawQuery = q.Encode()
			db, err := gorm.Open(postgres.Open(v.String()), &gorm.Config{Logger: logger.Discard})
			if err != nil {
				return nil, errors.Join(err, ts.close())
			}
			ts.dbs = append(ts.dbs, db)
		}
	case "sqlite":
		dir, err := os.MkdirTemp("", prefix)
		if err != nil {
			return nil, err
		}
		cleanups = append(cleanups, func() error { return os.RemoveAll(dir) })
		for i := range n {
			dsn := "file:" + filepath.Join(dir, fmt.Sprintf("t%d.db", i)) + "?_journal_mode=WAL&_busy_timeout=5000&_txlock=immediate"
			db, err := gorm.Open(sqlite.Open(dsn), &gorm.Config{Logger: logger.Discard})
			if err != nil {
				return nil, errors.Join(err, ts.close())
			}
			ts.dbs = append(ts.dbs, db)
		}
	}
	return ts, nil
}

// tenantRun is one contender's relays over a tenant set.
type tenantRun struct {
	name  string
	start func(ctx context.Context, ob *outbox.Outbox, dbs []*gorm.DB) (wait func() error, err error)
}

func tenantContenders(opts options) []tenantRun {
	cfg := outbox.RelayConfig{} // defaults, what users get
	return []tenantRun{
		{name: fmt.Sprintf("one RelayGroup (MaxActive %d)", opts.tenantMaxActive), start: func(ctx context.Context, ob *outbox.Outbox, dbs []*gorm.DB) (func() error, error) {
			g, err := ob.RelayGroup(outbox.RelayGroupConfig{MaxActive: opts.tenantMaxActive, Relay: cfg})
			if err != nil {
				return nil, err
			}
			for i, db := range dbs {
				if err := g.Add(fmt.Sprint(i), db); err != nil {
					return nil, err
				}
			}
			errc := make(chan error, 1)
			go func() { errc <- g.Run(ctx) }()
			return func() error { return <-errc }, nil
		}},
		{name: fmt.Sprintf("%d separate relays", len0(opts)), start: func(ctx context.Context, ob *outbox.Outbox, dbs []*gorm.DB) (func() error, error) {
			var wg sync.WaitGroup
			errs := make([]error, len(dbs))
			for i, db := range dbs {
				r, err := ob.Relay(db, cfg)
				if err != nil {
					return nil, err
				}
				wg.Add(1)
				go func() { defer wg.Done(); errs[i] = r.Run(ctx) }()
			}
			return func() error { wg.Wait(); return errors.Join(errs...) }, nil
		}},
	}
}

func len0(opts options) int { return opts.tenants }

func tenantsOn(ctx context.Context, kind, dsn string, opts options, t *table) error {
	if opts.tenants < 2 {
		return fmt.Errorf("-tenants %d: the scenario needs a busy and a quiet database", opts.tenants)
	}
	contenders := tenantContenders(opts)
	rate := map[string]series{}
	p50, p99 := map[string]series{}, map[string]series{}
	gor, conns, heap := map[string]series{}, map[string]series{}, map[string]series{}
	for round := range opts.rounds {
		for _, c := range rotate(contenders, round) {
			progress("tenants %s: %s, round %d", kind, c.name, round+1)
			r, peak, err := tenantThroughput(ctx, kind, dsn, opts, c)
			if err != nil {
				return fmt.Errorf("%s: throughput: %w", c.name, err)
			}
			rate[c.name] = append(rate[c.name], r)
			gor[c.name] = append(gor[c.name], float64(peak.goroutines))
			conns[c.name] = append(conns[c.name], float64(peak.conns))
			heap[c.name] = append(heap[c.name], float64(peak.heap))
			l50, l99, err := tenantQuiet(ctx, kind, dsn, opts, c)
			if err != nil {
				return fmt.Errorf("%s: quiet beside busy: %w", c.name, err)
			}
			p50[c.name] = append(p50[c.name], l50)
			p99[c.name] = append(p99[c.name], l99)
		}
	}
	scenario := fmt.Sprintf("tenants (%s, %d databases)", kind, opts.tenants)
	for _, c := range contenders {
		t.add(&row{scenario: scenario, contender: c.name, metric: fmt.Sprintf("throughput, %d events each", opts.tenantEvents), vals: rate[c.name], format: fmtRate})
		t.add(&row{scenario: scenario, contender: c.name, metric: fmt.Sprintf("quiet database's latency p50 beside a %d backlog", opts.tenantBusy), vals: p50[c.name], format: fmtMS})
		t.add(&row{scenario: scenario, contender: c.name, metric: "… p99", vals: p99[c.name], format: fmtMS})
		t.add(&row{scenario: scenario, contender: c.name, metric: "peak goroutines", vals: gor[c.name], format: fmtCount})
		t.add(&row{scenario: scenario, contender: c.name, metric: "peak open connections (all pools)", vals: conns[c.name], format: fmtCount})
		t.add(&row{scenario: scenario, contender: c.name, metric: "peak live heap", vals: heap[c.name], format: fmtMiB})
	}
	return nil
}

func fmtCount(v float64) string { return fmt.Sprintf("%.0f", v) }

// peak is the most the process held at once while a contender ran.
type peak struct {
	goroutines, conns int
	heap              uint64
}

// sample records the peak every 20 ms until stop is called.
func sample(dbs []*gorm.DB) (stop func() peak) {
	var (
		p    peak
		mu   sync.Mutex
		done = make(chan struct{})
		wg   sync.WaitGroup
	)
	s := []metrics.Sample{{Name: "/memory/classes/heap/objects:bytes"}}
	take := func() {
		metrics.Read(s)
		n := 0
		for _, db := range dbs {
			n += sqlDB(db).Stats().OpenConnections
		}
		mu.Lock()
		p.goroutines = max(p.goroutines, runtime.NumGoroutine())
		p.conns = max(p.conns, n)
		p.heap = max(p.heap, s[0].Value.Uint64())
		mu.Unlock()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		tk := time.NewTicker(20 * time.Millisecond)
		defer tk.Stop()
		for {
			select {
			case <-done:
				return
			case <-tk.C:
				take()
			}
		}
	}()
	return func() peak {
		close(done)
		wg.Wait()
		take()
		mu.Lock()
		defer mu.Unlock()
		return p
	}
}

func newTenantOutbox(dbs []*gorm.DB) (*outbox.Outbox, error) {
	ob := outbox.Plugin(outbox.Config{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	for _, db := range dbs {
		if err := db.Use(ob); err != nil {
			return nil, err
		}
	}
	return ob, nil
}

func publishBacklog(ctx context.Context, db *gorm.DB, n int, typ string) error {
	const chunk = 500
	evs := make([]outbox.Event, 0, chunk)
	for off := 0; off < n; off += chunk {
		evs = evs[:0]
		for range min(chunk, n-off) {
			evs = append(evs, outbox.Event{Type: typ, Payload: struct{}{}})
		}
		if err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error { return outbox.Publish(tx, evs...) }); err != nil {
			return err
		}
	}
	return nil
}

// tenantThroughput gives each database opts.tenantEvents events and
// measures how fast c's relays deliver them all.
func tenantThroughput(ctx context.Context, kind, dsn string, opts options, c tenantRun) (float64, peak, error) {
	ts, err := openTenants(ctx, kind, dsn, opts.tenants)
	if err != nil {
		return 0, peak{}, err
	}
	defer func() { _ = ts.close() }()
	ob, err := newTenantOutbox(ts.dbs)
	if err != nil {
		return 0, peak{}, err
	}
	for _, db := range ts.dbs {
		if err := publishBacklog(ctx, db, opts.tenantEvents, "bulk"); err != nil {
			return 0, peak{}, err
		}
	}
	total := int64(opts.tenants * opts.tenantEvents)
	var got atomic.Int64
	all := make(chan struct{})
	ob.Handle("bulk", func(context.Context, outbox.Event) error {
		if got.Add(1) == total {
			close(all)
		}
		return nil
	})
	rctx, cancel := context.WithCancel(ctx)
	stop := sample(ts.dbs)
	start := time.Now()
	wait, err := c.start(rctx, ob, ts.dbs)
	if err != nil {
		cancel()
		return 0, peak{}, err
	}
	select {
	case <-all:
	case <-time.After(10 * time.Minute):
		err = fmt.Errorf("only %d of %d events delivered in 10 minutes", got.Load(), total)
	case <-ctx.Done():
		err = ctx.Err()
	}
	elapsed := time.Since(start)
	p := stop()
	cancel()
	if werr := wait(); err == nil {
		err = werr
	}
	return float64(total) / elapsed.Seconds(), p, err
}

// tenantQuiet drains opts.tenantBusy events from database 0 while database
// 1 gets an event every 10 ms, and returns the quiet events' commit →
// handler latency, p50 and p99 in milliseconds.
func tenantQuiet(ctx context.Context, kind, dsn string, opts options, c tenantRun) (p50, p99 float64, err error) {
	ts, err := openTenants(ctx, kind, dsn, opts.tenants)
	if err != nil {
		return 0, 0, err
	}
	defer func() { _ = ts.close() }()
	ob, err := newTenantOutbox(ts.dbs)
	if err != nil {
		return 0, 0, err
	}
	if err := publishBacklog(ctx, ts.dbs[0], opts.tenantBusy, "busy"); err != nil {
		return 0, 0, err
	}
	var busy atomic.Int64
	busyDone := make(chan struct{})
	ob.Handle("busy", func(context.Context, outbox.Event) error {
		if busy.Add(1) == int64(opts.tenantBusy) {
			close(busyDone)
		}
		return nil
	})
	var (
		mu        sync.Mutex
		committed = map[string]time.Time{}
		lat       []float64
	)
	ob.Handle("quiet", func(_ context.Context, e outbox.Event) error {
		now := time.Now()
		mu.Lock()
		if at, ok := committed[e.ID]; ok {
			lat = append(lat, float64(now.Sub(at))/float64(time.Millisecond))
		}
		mu.Unlock()
		return nil
	})
	rctx, cancel := context.WithCancel(ctx)
	defer cancel()
	wait, err := c.start(rctx, ob, ts.dbs)
	if err != nil {
		return 0, 0, err
	}
	// Past the start (every relay's first claim, its pool's first
	// connections): the busy database is draining.
	for warm := int64(opts.tenantBusy / 10); busy.Load() < warm; {
		select {
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		case <-time.After(5 * time.Millisecond): // polling a counter, bounded by the drain
		}
	}
	tk := time.NewTicker(10 * time.Millisecond)
	n := 0
loop:
	for {
		select {
		case <-busyDone:
			break loop
		case <-ctx.Done():
			err = ctx.Err()
			break loop
		case <-tk.C:
			id := fmt.Sprintf("quiet-%d", n)
			n++
			// From the Publish call (its commit included: outside a
			// transaction it commits at once) to the handler: taken
			// before, since the relay may deliver before Publish returns.
			mu.Lock()
			committed[id] = time.Now()
			mu.Unlock()
			if perr := outbox.PublishAlone(ts.dbs[1], outbox.Event{ID: id, Type: "quiet", Payload: struct{}{}}); perr != nil {
				err = perr
				break loop
			}
		}
	}
	tk.Stop()
	// Let the last quiet events arrive.
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		mu.Lock()
		k := len(lat)
		mu.Unlock()
		if k >= n || err != nil {
			break
		}
		time.Sleep(10 * time.Millisecond) // a bounded drain, not synchronisation of a result
	}
	cancel()
	if werr := wait(); err == nil {
		err = werr
	}
	mu.Lock()
	defer mu.Unlock()
	if len(lat) == 0 {
		return 0, 0, errors.Join(err, errors.New("no quiet event was delivered"))
	}
	slices.Sort(lat)
	return lat[len(lat)/2], lat[min(len(lat)-1, len(lat)*99/100)], err
}
