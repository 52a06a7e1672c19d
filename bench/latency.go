package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/gorm"

	wmsql "github.com/ThreeDotsLabs/watermill-sql/v4/pkg/sql"
)

// stamps holds one monotonic time per event, as nanoseconds since base, 0
// for none yet. Writers and handlers fill different slots concurrently.
type stamps struct {
	base time.Time
	at   []atomic.Int64
}

func (s *stamps) set(i int) {
	if i >= 0 && i < len(s.at) {
		s.at[i].CompareAndSwap(0, int64(time.Since(s.base))+1)
	}
}

// latencyContender publishes event i in a business transaction (publish)
// and delivers to handled while run runs.
type latencyContender struct {
	name    string
	prepare func(ctx context.Context) error
	publish func(ctx context.Context, i int) error
	run     func(ctx context.Context, handled func(i int), ready func()) error
}

const latencyWriters = 4

func runLatency(ctx context.Context, e *env, opts options, t *table) error {
	if e.pg == nil {
		// The push path under test is LISTEN/NOTIFY.
		progress("latency: PostgreSQL only; skipped (PostgreSQL not selected)")
		return nil
	}
	pg := e.pg
	plain, err := pg.open()
	if err != nil {
		return err
	}
	defer closeDB(plain)
	if err := plain.WithContext(ctx).AutoMigrate(&BenchOrder{}); err != nil {
		return fmt.Errorf("migrate business table: %w", err)
	}
	if err := wmCreateTables(ctx, sqlDB(plain), wmLatencyTopic); err != nil {
		return err
	}
	const table = "latency_ours"
	truncate := func(ctx context.Context) error {
		return exec(ctx, sqlDB(plain), `TRUNCATE bench_orders, "`+table+`", "watermill_`+wmLatencyTopic+`", "watermill_offsets_`+wmLatencyTopic+`"`)
	}

	var cs []latencyContender
	for _, v := range []struct {
		name   string
		cfg    outbox.Config
		relay  outbox.RelayConfig
		shared bool // the relay runs on the writers' pool and Outbox
		idle   int  // the pools' idle connections
	}{
		{"ours, push: NOTIFY to a relay on another pool", outbox.Config{}, outbox.RelayConfig{}, false, pg.maxIdle},
		{"ours, polling at defaults (DisableNotify)", outbox.Config{DisableNotify: true}, outbox.RelayConfig{}, false, pg.maxIdle},
		{"ours, DeliverAfterCommit, relay in-process", outbox.Config{DeliverAfterCommit: true}, outbox.RelayConfig{}, true, pg.maxIdle},
		// The same push path on pools left at database/sql's default of
		// two idle connections, as many applications run: the notifier
		// borrows a connection from the writers' pool for every NOTIFY.
		{"ours, push, pools at database/sql's default MaxIdleConns (2)", outbox.Config{}, outbox.RelayConfig{}, false, 0},
	} {
		c, err := oursLatency(pg, table, v.name, v.cfg, v.relay, v.shared, v.idle, truncate, opts.latencyHist)
		if err != nil {
			return err
		}
		defer c.close()
		cs = append(cs, c.latencyContender)
	}
	cs = append(cs, watermillLatency(pg, plain, truncate))
	floor, err := floorLatency(ctx, pg, plain, opts.latencyHist)
	if err != nil {
		return err
	}
	cs = append(cs, floor)

	type key struct{ name, metric string }
	vals := map[key]series{}
	notes := map[string]string{}
	for round := range opts.rounds {
		for _, c := range rotate(cs, round) {
			lat, missing, err := measureLatency(ctx, c, opts.rate, opts.latencyDur)
			if err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			if len(lat) == 0 {
				return fmt.Errorf("%s: no event arrived", c.name)
			}
			p50, p99, mx := percentile(lat, 0.50), percentile(lat, 0.99), lat[len(lat)-1]
			vals[key{c.name, "p50"}] = append(vals[key{c.name, "p50"}], p50)
			vals[key{c.name, "p99"}] = append(vals[key{c.name, "p99"}], p99)
			vals[key{c.name, "max"}] = append(vals[key{c.name, "max"}], mx)
			if missing > 0 {
				notes[c.name] = joinNote(notes[c.name], fmt.Sprintf("r%d: %d events not delivered in time", round+1, missing))
			}
			progress("latency round %d: %-58s p50 %.2f ms  p99 %.2f ms  max %.2f ms (%d events)", round+1, c.name, p50, p99, mx, len(lat))
		}
	}
	scen := fmt.Sprintf("3 commit→handler latency at %d ev/s for %s", opts.rate, opts.latencyDur)
	for i, c := range cs {
		for _, m := range []string{"p50", "p99", "max"} {
			r := t.add(&row{scenario: scen, contender: c.name, metric: m, vals: vals[key{c.name, m}], format: fmtMS})
			if m == "p50" {
				r.note = notes[c.name]
			}
			if i == 0 && m == "p99" {
				r.judge("< 10 ms", r.vals.median() < 10)
			}
		}
	}
	return nil
}

func percentile(sorted []float64, p float64) float64 {
	i := int(p*float64(len(sorted))+0.5) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// measureLatency publishes rate events a second for dur from latencyWriters
// goroutines, each recording its commit time right after Commit returns,
// while the contender's consumer records handler-entry times. It returns
// the latencies in milliseconds, sorted, and how many events never arrived.
func measureLatency(ctx context.Context, c latencyContender, rate int, dur time.Duration) ([]float64, int, error) {
	if err := c.prepare(ctx); err != nil {
		return nil, 0, err
	}
	n := int(float64(rate) * dur.Seconds())
	base := time.Now()
	commits := &stamps{base: base, at: make([]atomic.Int64, n)}
	handled := &stamps{base: base, at: make([]atomic.Int64, n)}
	var arrived atomic.Int64
	all := make(chan struct{})
	onHandled := func(i int) {
		if i < 0 || i >= n || handled.at[i].Load() != 0 {
			return // a duplicate: only the first delivery counts
		}
		handled.set(i)
		if arrived.Add(1) == int64(n) {
			close(all)
		}
	}

	rctx, stopRelay := context.WithCancel(ctx)
	defer stopRelay()
	ready := make(chan struct{})
	runErr := make(chan error, 1)
	go func() { runErr <- c.run(rctx, onHandled, sync.OnceFunc(func() { close(ready) })) }()
	select {
	case <-ready:
	case err := <-runErr:
		return nil, 0, fmt.Errorf("consumer stopped before starting: %w", err)
	}
	// Let the consumer settle (LISTEN connected, first empty poll done).
	time.Sleep(300 * time.Millisecond)

	seq := make(chan int, n)
	go func() {
		defer close(seq)
		start := time.Now()
		interval := time.Second / time.Duration(rate)
		for i := range n {
			// Scheduled send times, not a sleep per event, so the rate does
			// not drift with the writers' own latency.
			if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
				select {
				case <-time.After(d):
				case <-ctx.Done():
					return
				}
			}
			seq <- i
		}
	}()
	var (
		wg   sync.WaitGroup
		mu   sync.Mutex
		werr error
	)
	for range latencyWriters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range seq {
				if err := c.publish(ctx, i); err != nil {
					mu.Lock()
					werr = errors.Join(werr, err)
					mu.Unlock()
					return
				}
				commits.set(i)
			}
		}()
	}
	wg.Wait()
	if werr != nil {
		return nil, 0, werr
	}
	// Allow the slowest contender (polling, about a second) to catch up.
	select {
	case <-all:
	case <-time.After(10 * time.Second):
	case <-ctx.Done():
		return nil, 0, ctx.Err()
	}
	stopRelay()
	if err := <-runErr; err != nil {
		return nil, 0, err
	}
	lat := make([]float64, 0, n)
	missing := 0
	for i := range n {
		h, cm := handled.at[i].Load(), commits.at[i].Load()
		if h == 0 || cm == 0 {
			missing++
			continue
		}
		// With DeliverAfterCommit the handler can start before the
		// writer's Commit call has returned; that is zero latency, not
		// negative.
		lat = append(lat, float64(max(h-cm, 0))/1e6)
	}
	slices.Sort(lat)
	return lat, missing, nil
}

type oursLatencyContender struct {
	latencyContender
	close func()
}

func oursLatency(pg *pgServer, table, name string, cfg outbox.Config, rcfg outbox.RelayConfig, shared bool, idle int, truncate func(context.Context) error, hist int) (oursLatencyContender, error) {
	writer, err := pg.openIdle(idle)
	if err != nil {
		return oursLatencyContender{}, err
	}
	cfg.Table, cfg.Logger = table, warnLogger
	wob := outbox.Plugin(cfg)
	if err := writer.Use(wob); err != nil {
		closeDB(writer)
		return oursLatencyContender{}, fmt.Errorf("install outbox: %w", err)
	}
	c := oursLatencyContender{close: func() { closeDB(writer) }}
	c.name = name
	c.prepare = func(ctx context.Context) error {
		if err := truncate(ctx); err != nil {
			return err
		}
		return seedHistory(ctx, writer, table, hist, func(tx *gorm.DB, i int) error {
			return outbox.Publish(tx, outbox.Event{Type: "order.created", AggregateType: "order", AggregateID: strconv.Itoa(i), Payload: orderCreated{Total: 42}})
		})
	}
	c.publish = func(ctx context.Context, i int) error {
		return writer.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			o := BenchOrder{Customer: "customer-42", Total: 42}
			if err := tx.Create(&o).Error; err != nil {
				return fmt.Errorf("insert order: %w", err)
			}
			return outbox.Publish(tx, outbox.Event{
				Type: "order.created", AggregateType: "order", AggregateID: strconv.Itoa(i),
				Payload: orderCreated{OrderID: o.ID, Total: o.Total},
			})
		})
	}
	var handler atomic.Pointer[func(int)]
	h := func(_ context.Context, ev outbox.Event) error {
		i, _ := strconv.Atoi(ev.AggregateID)
		(*handler.Load())(i)
		return nil
	}
	if shared {
		// DeliverAfterCommit hands the IDs to a relay of the same Outbox.
		wob.Handle("order.created", h)
		c.run = func(ctx context.Context, handled func(int), ready func()) error {
			handler.Store(&handled)
			ready()
			relay, err := wob.Relay(writer, rcfg)
			if err != nil {
				return err
			}
			return relay.Run(ctx)
		}
		return c, nil
	}
	// A second pool and a second Outbox: the writers' commits cannot wake
	// this relay in-process, only through PostgreSQL (or its poll).
	c.run = func(ctx context.Context, handled func(int), ready func()) error {
		relayDB, err := pg.openIdle(idle)
		if err != nil {
			return err
		}
		defer closeDB(relayDB)
		rob := outbox.Plugin(outbox.Config{Table: table, Logger: warnLogger, DisableNotify: cfg.DisableNotify, Mode: cfg.Mode, Logical: cfg.Logical})
		if err := relayDB.Use(rob); err != nil {
			return fmt.Errorf("install outbox: %w", err)
		}
		handler.Store(&handled)
		rob.Handle("order.created", h)
		ready()
		relay, err := rob.Relay(relayDB, rcfg)
		if err != nil {
			return err
		}
		return relay.Run(ctx)
	}
	return c, nil
}

const wmLatencyTopic = "latency"

// watermillLatency publishes through watermill-sql in the business
// transaction and consumes with one Subscriber at its defaults.
func watermillLatency(pg *pgServer, plain *gorm.DB, truncate func(context.Context) error) latencyContender {
	return latencyContender{
		name:    "watermill-sql at defaults",
		prepare: truncate,
		publish: func(ctx context.Context, i int) error {
			return plain.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
				o := BenchOrder{Customer: "customer-42", Total: 42}
				if err := tx.Create(&o).Error; err != nil {
					return fmt.Errorf("insert order: %w", err)
				}
				// The UUID carries i to the subscriber.
				return watermillPublish(tx, &o, wmLatencyTopic, "wm"+strconv.Itoa(i))
			})
		},
		run: func(ctx context.Context, handled func(int), ready func()) error {
			db, err := pg.openSQL()
			if err != nil {
				return fmt.Errorf("open: %w", err)
			}
			defer db.Close()
			sub, err := wmsql.NewSubscriber(wmsql.BeginnerFromStdSQL(db), wmsql.SubscriberConfig{
				ConsumerGroup:  "bench",
				SchemaAdapter:  wmsql.DefaultPostgreSQLSchema{},
				OffsetsAdapter: wmsql.DefaultPostgreSQLOffsetsAdapter{},
			}, newWMLogger())
			if err != nil {
				return fmt.Errorf("watermill subscriber: %w", err)
			}
			ch, err := sub.Subscribe(ctx, wmLatencyTopic)
			if err != nil {
				return fmt.Errorf("watermill subscribe: %w", err)
			}
			ready()
			for msg := range ch {
				i, _ := strconv.Atoi(msg.UUID[2:])
				handled(i)
				msg.Ack()
			}
			return sub.Close()
		},
	}
}

// floorLatency is push delivery written by hand, as a reference for what
// this machine allows at the moment: the writer sends NOTIFY right after
// each commit (no debounce); a dedicated connection LISTENs and, on every
// notification, runs the floor's claim-with-lease, deliver and mark until
// nothing is due.
func floorLatency(ctx context.Context, pg *pgServer, plain *gorm.DB, hist int) (latencyContender, error) {
	const table, channel = "latency_floor", "latency_floor_wakeup"
	if err := createOutboxTable(ctx, plain, table); err != nil {
		return latencyContender{}, err
	}
	insert := floorInsertInto(table, pg)
	return latencyContender{
		name: "floor: NOTIFY per commit, LISTEN, claim+lease, deliver, mark (hand-written)",
		prepare: func(ctx context.Context) error {
			// RESTART IDENTITY: the floor's watermark starts at seq 1 on
			// an empty table.
			if err := exec(ctx, sqlDB(plain), `TRUNCATE bench_orders, "`+table+`" RESTART IDENTITY`); err != nil {
				return err
			}
			return seedHistory(ctx, plain, table, hist, func(tx *gorm.DB, i int) error {
				return insert(tx, strconv.Itoa(i), &BenchOrder{Customer: "customer-42", Total: 42})
			})
		},
		publish: func(ctx context.Context, i int) error {
			err := plain.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
				o := BenchOrder{Customer: "customer-42", Total: 42}
				if err := tx.Create(&o).Error; err != nil {
					return fmt.Errorf("insert order: %w", err)
				}
				return insert(tx, strconv.Itoa(i), &o)
			})
			if err != nil {
				return err
			}
			if _, err := sqlDB(plain).ExecContext(ctx, "SELECT pg_notify($1, '')", channel); err != nil {
				return fmt.Errorf("notify: %w", err)
			}
			return nil
		},
		run: func(ctx context.Context, handled func(int), ready func()) error {
			db, err := pg.openSQL()
			if err != nil {
				return fmt.Errorf("open: %w", err)
			}
			defer db.Close()
			conn, err := db.Conn(ctx)
			if err != nil {
				return fmt.Errorf("listen connection: %w", err)
			}
			defer conn.Close()
			wm, err := pg.floorStart(ctx, db, table)
			if err != nil {
				return err
			}
			drainDue := func() error {
				for {
					now := time.Now().UTC().Truncate(time.Microsecond)
					lease := now.Add(time.Minute)
					rs, err := pg.floorClaim(ctx, db, table, wm, defaultBatchSize, now, lease)
					if err != nil || len(rs) == 0 {
						return err
					}
					for _, r := range rs {
						i, _ := strconv.Atoi(r.aggID)
						handled(i)
					}
					if err := pg.floorMark(ctx, db, table, rowSeqs(rs), lease); err != nil {
						return err
					}
				}
			}
			err = conn.Raw(func(dc any) error {
				pc := dc.(*stdlib.Conn).Conn()
				if _, err := pc.Exec(ctx, "LISTEN "+channel); err != nil {
					return err
				}
				ready()
				for {
					if _, err := pc.WaitForNotification(ctx); err != nil {
						return err
					}
					if err := drainDue(); err != nil {
						return err
					}
				}
			})
			if ctx.Err() != nil {
				return nil // stopped
			}
			return err
		},
	}, nil
}
