package main

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/wire"
)

// The broker scenario (issue 36, "the last mile"): how fast a relay moves
// a backlog from PostgreSQL into a broker, against what the broker's own Go
// client can do with the same messages. For each broker, each round runs,
// in an order rotated from round to round:
//
//	(a) floor-async: the client's pipelined publish of n messages, every
//	    acknowledgement awaited (NATS PublishMsgAsync, a franz-go Produce
//	    of every record then Flush, RabbitMQ publishes in confirm mode
//	    then every confirm, Redis XADDs in pipelines);
//	(b) floor-sync: one publish and its acknowledgement at a time from 4
//	    goroutines, what a relay with Workers 4 could do at best with a
//	    Handler;
//	(c) relay-async: one relay at defaults (RelayConfig{}) with the
//	    adapter's AsyncHandler, draining a backlog of n events;
//	(d) relay-async-4: 4 such relays;
//	(e) relay-handler: one relay at defaults with the adapter's Handler;
//	(f) relay-noop: one relay at defaults with an AsyncHandler that sends
//	    nothing, the relay's own ceiling on this database at that moment
//	    (context: a relay cannot deliver faster than it claims and marks);
//	(g) relay-async-b1000: one relay with BatchSize 1000 (Workers at their
//	    default) and the AsyncHandler: what a batch ten times the default
//	    does to the relay's claim and mark per event (context).
//
// The floors send what the adapter sends for the same events (the same
// headers, the same payload), built with package wire as the adapter
// builds them, before the clock starts. Every measurement gets a fresh
// destination (a NATS stream, a kfake cluster with its topic, a RabbitMQ
// exchange and queue, a Redis stream), removed after it, and the
// destination's count is checked against n.
const (
	natsURLEnv     = "OUTBOX_TEST_NATS_URL"
	rabbitmqURLEnv = "OUTBOX_TEST_RABBITMQ_URL"
	redisAddrEnv   = "OUTBOX_TEST_REDIS_ADDR"

	// syncFloorGoroutines publish one message at a time each in the
	// synchronous floor: the relay's default Workers.
	syncFloorGoroutines = defaultWorkers
	// brokerTable is the relay's outbox table in the PostgreSQL schema.
	brokerTable = "broker_ours"
	// brokerEventType is the type of every event: the relay fill's.
	brokerEventType = "order.created"
)

// The contenders of the broker scenario, by their -broker-runs names.
const (
	bFloorAsync   = "floor-async"
	bFloorSync    = "floor-sync"
	bRelayAsync   = "relay-async"
	bRelayAsync4  = "relay-async-4"
	bRelayHandler = "relay-handler"
	bRelayNoop    = "relay-noop"
	bRelayBig     = "relay-async-b1000"
	bFloorDB      = "floor-db"
)

var brokerRuns = []string{bFloorAsync, bFloorSync, bRelayAsync, bRelayAsync4, bRelayHandler, bRelayNoop, bRelayBig, bFloorDB}

var brokerNames = []string{"nats", "kafka", "rabbitmq", "redis"}

// brokerClient is one broker's side of the scenario: the floors with its
// Go client, and the adapter the relays deliver with.
type brokerClient interface {
	// label names the broker in the table, with its version when known.
	label() string
	// fresh creates a destination for one measurement.
	fresh(ctx context.Context) (brokerDest, error)
	close()
}

// brokerDest is one measurement's destination.
type brokerDest interface {
	// floorAsync prepares the pipelined floor of evs (connection and
	// messages) and returns the timed part: publish every message and
	// await every acknowledgement.
	floorAsync(ctx context.Context, evs []outbox.Event) (run func(context.Context) error, err error)
	// floorSync prepares the synchronous floor: goroutines publishing one
	// message and awaiting its acknowledgement at a time.
	floorSync(ctx context.Context, evs []outbox.Event, goroutines int) (run func(context.Context) error, err error)
	// adapter returns the adapter's Handler and AsyncHandler (nil when the
	// adapter has none) for this destination, connected, and a func that
	// releases them.
	adapter(ctx context.Context) (h outbox.Handler, ah outbox.AsyncHandler, release func(), err error)
	// stored is how many messages the destination holds.
	stored(ctx context.Context) (int64, error)
	// remove deletes the destination.
	remove(ctx context.Context) error
}

func randHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// brokerEvents are n events as a relay receives them from the fill of the
// relay's table (pg.go's fill, pending rows): the same fields, the same
// payload, as PostgreSQL's jsonb gives it back, no headers.
func brokerEvents(n int) []outbox.Event {
	t0 := time.Now().UTC().Add(-24 * time.Hour).Truncate(time.Microsecond)
	evs := make([]outbox.Event, n)
	for i := range evs {
		g := i + 1
		id := uuid.Must(uuid.NewV7()).String()
		evs[i] = outbox.Event{
			ID:             id,
			Type:           brokerEventType,
			AggregateType:  "order",
			AggregateID:    strconv.Itoa(g),
			IdempotencyKey: id,
			Payload:        []byte(fmt.Sprintf(`{"total": 42, "order_id": %d}`, g)),
			OccurredAt:     t0.Add(time.Duration(g) * time.Microsecond),
		}
	}
	return evs
}

// brokerOf connects to the named broker, or says why it is skipped.
func brokerOf(ctx context.Context, name string) (brokerClient, string) {
	env := map[string]string{"nats": natsURLEnv, "rabbitmq": rabbitmqURLEnv, "redis": redisAddrEnv}[name]
	var addr string
	if env != "" {
		if addr = os.Getenv(env); addr == "" {
			return nil, env + " is not set"
		}
	}
	var (
		b   brokerClient
		err error
	)
	switch name {
	case "nats":
		b, err = newNATSBroker(ctx, addr)
	case "kafka":
		b, err = newKafkaBroker()
	case "rabbitmq":
		b, err = newRabbitBroker(ctx, addr)
	case "redis":
		b, err = newRedisBroker(ctx, addr)
	}
	if err != nil {
		return nil, err.Error()
	}
	return b, ""
}

func runBroker(ctx context.Context, e *env, opts options, t *table) error {
	if e.pg == nil {
		progress("broker scenario skipped: it drains from PostgreSQL, which -db leaves out")
		return nil
	}
	admin, err := e.pg.open()
	if err != nil {
		return err
	}
	defer closeDB(admin)
	// The relays' table, through the plugin's own migration.
	if err := admin.Use(outbox.Plugin(outbox.Config{Table: brokerTable, Logger: warnLogger})); err != nil {
		return fmt.Errorf("install outbox: %w", err)
	}
	for _, name := range brokerNames {
		if !opts.brokers[name] {
			continue
		}
		b, why := brokerOf(ctx, name)
		if b == nil {
			progress("broker %s skipped: %s", name, why)
			continue
		}
		err := brokerOn(ctx, e.pg, b, opts, t)
		b.close()
		if err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	return nil
}

// brokerResult is one measurement.
type brokerResult struct {
	rate    float64
	busy    float64       // the share of the drain with a delivery in flight; -1: not measured
	first   time.Duration // from the relays' start to their first delivery
	partial bool
	note    string
	// cpu is what the machine and the bench process spent on the CPU in
	// the timed part; elapsed is that part's length.
	cpu     cpuTimes
	elapsed time.Duration
}

func brokerOn(ctx context.Context, pg *pgServer, b brokerClient, opts options, t *table) error {
	n := opts.brokerEvents
	evs := brokerEvents(n)
	adb, err := pg.openSQL()
	if err != nil {
		return err
	}
	defer adb.Close()
	progress("broker %s: %d events, %d round(s)", b.label(), n, opts.rounds)

	var runs []string
	for _, r := range brokerRuns {
		if opts.brokerRuns[r] {
			runs = append(runs, r)
		}
	}
	rates := map[string]series{}
	notes := map[string]string{}
	busy := map[string]series{}
	firsts := map[string]series{}
	cpuMachine, cpuSelf, cpuBusy := map[string]series{}, map[string]series{}, map[string]series{}
	unavailable := map[string]string{}
	for round := range opts.rounds {
		for _, run := range rotate(runs, round) {
			if unavailable[run] != "" {
				continue
			}
			res, err := brokerMeasure(ctx, pg, adb, b, run, evs, opts)
			if errors.Is(err, errNoAsyncHandler) {
				unavailable[run] = err.Error()
				progress("broker %s %s: not available: %v", b.label(), run, err)
				continue
			}
			if err != nil {
				return fmt.Errorf("%s round %d: %w", run, round+1, err)
			}
			rates[run] = append(rates[run], res.rate)
			if res.cpu.ok && !res.partial {
				perEvent := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) / float64(n) }
				cpuMachine[run] = append(cpuMachine[run], perEvent(res.cpu.machine))
				cpuSelf[run] = append(cpuSelf[run], perEvent(res.cpu.self))
				cpuBusy[run] = append(cpuBusy[run], float64(res.cpu.machine)/float64(res.elapsed)/float64(runtime.NumCPU()))
			}
			if res.busy >= 0 {
				busy[run] = append(busy[run], res.busy)
				firsts[run] = append(firsts[run], float64(res.first)/float64(time.Millisecond))
			}
			if res.note != "" {
				notes[run] = joinNote(notes[run], fmt.Sprintf("r%d: %s", round+1, res.note))
			}
			var at string
			if res.busy >= 0 {
				at = fmt.Sprintf("at the broker %.0f%% of the drain, the first delivery after %s", 100*res.busy, res.first.Round(time.Millisecond))
			}
			progress("broker %s round %d: %-17s %8.0f ev/s %s", b.label(), round+1, run, res.rate, joinNote(at, res.note))
		}
	}

	scen := fmt.Sprintf("B relay to broker, %s, %d events", b.label(), n)
	desc := map[string]string{
		bFloorAsync:   "(a) floor: " + asyncFloorName(b),
		bFloorSync:    fmt.Sprintf("(b) floor: one publish and its ack at a time, %d goroutines", syncFloorGoroutines),
		bRelayAsync:   "(c) relay at defaults, AsyncHandler, 1 relay",
		bRelayAsync4:  "(d) relay at defaults, AsyncHandler, 4 relays",
		bRelayHandler: "(e) relay at defaults, Handler, 1 relay",
		bRelayNoop:    "(f) relay at defaults, no-op AsyncHandler (sends nothing), 1 relay",
		bRelayBig:     "(g) relay with BatchSize 1000, AsyncHandler, 1 relay",
		bFloorDB:      fmt.Sprintf("(h) the database's part alone: the hand-written claim and mark (the relay scenario's floor a, batch %d), nothing sent", defaultBatchSize),
	}
	for _, run := range runs {
		note := notes[run]
		if u := unavailable[run]; u != "" {
			note = joinNote("not available: "+u, note)
		}
		if bs := busy[run]; len(bs) > 0 {
			f := firsts[run]
			note = joinNote(fmt.Sprintf("a delivery in flight %.0f%% of the drain (%.0f–%.0f%%); the first %.0f ms after the start (%.0f–%.0f)",
				100*bs.median(), 100*bs.min(), 100*bs.max(), f.median(), f.min(), f.max()), note)
		}
		t.add(&row{scenario: scen, contender: desc[run], metric: "events/s", vals: rates[run], format: fmtRate, note: note})
	}
	addBrokerCPURows(t, scen, runs, desc, cpuMachine, cpuSelf, cpuBusy)
	floor := rates[bFloorAsync]
	if len(floor) == 0 {
		return nil
	}
	for _, run := range []string{bRelayAsync, bRelayAsync4, bRelayHandler, bRelayNoop, bRelayBig} {
		if !opts.brokerRuns[run] {
			continue
		}
		r := &row{scenario: scen, contender: desc[run][:3] + " / (a)", metric: "ratio", format: fmtRatio}
		if unavailable[run] != "" {
			r.note = "not available"
		}
		// Per round: the two measured minutes apart at most.
		for i, v := range rates[run] {
			if i < len(floor) {
				r.vals = append(r.vals, v/floor[i])
			}
		}
		t.add(r)
		switch run {
		case bRelayHandler:
			r.note = joinNote(r.note, "the old path, for contrast")
		case bRelayNoop:
			r.note = joinNote(r.note, "the relay with nothing to send: (c) cannot do better, but for noise")
		case bRelayBig:
			r.note = joinNote(r.note, "context: not at defaults")
		default:
			q := r.vals.median()
			r.judge(fmt.Sprintf("≥ 0.5 of the async floor (median of per-round ratios); got %.2f", q), len(r.vals) > 0 && q >= 0.5)
		}
	}
	return nil
}

// addBrokerCPURows adds, per contender, the machine's CPU per event (every
// process's: PostgreSQL's, the broker's, the bench's, the kernel's) and the
// bench process's share of it, with how busy the machine was. They bound
// what a relay can reach on this machine whatever its adapter does: a relay
// that delivers costs at least what the no-op relay (f) costs plus what the
// floor (a) costs for the same messages, and the machine has NumCPU cores
// to spend, so (c) ≤ NumCPU / ((f) + (a)) events per second of CPU time.
// With floor-db's (h), the hand-written claim and mark, less the bench
// process's share of it, the same bound holds for any relay that leases
// each row in PostgreSQL, however little its own process costs.
func addBrokerCPURows(t *table, scen string, runs []string, desc map[string]string, machine, self, busy map[string]series) {
	for _, run := range runs {
		m := machine[run]
		if len(m) == 0 {
			continue
		}
		t.add(&row{scenario: scen, contender: desc[run][:3] + " CPU", metric: "machine CPU µs/event", vals: m, format: fmtMicrosFrac,
			note: fmt.Sprintf("of which the bench process %s; the machine %.0f%% busy (%d cores)",
				fmtMicrosFrac(self[run].median()), 100*busy[run].median(), runtime.NumCPU())})
	}
	a := machine[bFloorAsync]
	if len(a) == 0 {
		return
	}
	// bound is NumCPU / ((a) + cost) per round, as the ratios: the two
	// measured minutes apart at most.
	bound := func(n int, cost func(i int) float64) series {
		var b series
		for i := range min(len(a), n) {
			b = append(b, float64(runtime.NumCPU())*1e6/(a[i]+cost(i)))
		}
		return b
	}
	if f := machine[bRelayNoop]; len(f) > 0 {
		t.add(&row{scenario: scen, contender: "CPU bound on (c): cores / ((a) + (f)) CPU per event", metric: "events/s",
			vals: bound(len(f), func(i int) float64 { return f[i] }), format: fmtRate,
			note: "a relay that delivers spends what the no-op relay and the floor spend per event; the machine's cores cap it at this rate, fully busy"})
	}
	if h, hs := machine[bFloorDB], self[bFloorDB]; len(h) > 0 {
		// What (h) cost beyond its own client is the database's (and the
		// kernel's) part of any leased claim and mark.
		t.add(&row{scenario: scen, contender: "CPU bound on any relay: cores / ((a) + (h) less the bench process)", metric: "events/s",
			vals: bound(min(len(h), len(hs)), func(i int) float64 { return h[i] - hs[i] }), format: fmtRate,
			note: "a relay whose own process cost nothing and that leases each row in PostgreSQL as (h) does: no adapter or relay code gets past this on this machine"})
	}
}

func fmtMicrosFrac(v float64) string { return fmt.Sprintf("%.1f µs", v) }

func asyncFloorName(b brokerClient) string {
	switch b.(type) {
	case *natsBroker:
		return "nats.go PublishMsgAsync, every ack awaited"
	case *kafkaBroker:
		return "franz-go Produce of every record, then Flush"
	case *rabbitBroker:
		return "amqp091 publishes in confirm mode, then every confirm"
	case *redisBroker:
		return fmt.Sprintf("go-redis pipelined XADD, %d per pipeline", redisFloorPipeline)
	}
	return "pipelined publish"
}

var errNoAsyncHandler = errors.New("the adapter has no AsyncHandler")

// brokerMeasure runs one contender once on a fresh destination (none for
// floor-db, which sends nothing).
func brokerMeasure(ctx context.Context, pg *pgServer, adb *sql.DB, b brokerClient, run string, evs []outbox.Event, opts options) (res brokerResult, err error) {
	n := len(evs)
	res.busy = -1
	if run == bFloorDB {
		// What any relay that leases rows in PostgreSQL costs the
		// database: the same backlog claimed and marked by the least a
		// relay can send, from a client that does nothing else.
		r, err := drain(ctx, floorRelay(pg, adb, brokerTable, defaultBatchSize, false), n, 1, opts.drainTimeout, true)
		if err != nil {
			return res, err
		}
		res.rate, res.cpu, res.elapsed, res.partial = r.rate, r.cpu, r.elapsed, r.partial
		if r.partial {
			res.note = partialNote(r.unique, n, r.elapsed)
		}
		return res, nil
	}
	d, err := b.fresh(ctx)
	if err != nil {
		return res, fmt.Errorf("destination: %w", err)
	}
	defer func() {
		// A fresh context: the run's may have ended.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		if rerr := d.remove(rctx); rerr != nil {
			err = errors.Join(err, fmt.Errorf("remove destination: %w", rerr))
		}
	}()
	var elapsed time.Duration
	switch run {
	case bFloorAsync, bFloorSync:
		var fn func(context.Context) error
		if run == bFloorAsync {
			fn, err = d.floorAsync(ctx, evs)
		} else {
			fn, err = d.floorSync(ctx, evs, syncFloorGoroutines)
		}
		if err != nil {
			return res, err
		}
		// The clock and -drain-timeout start together.
		mctx, cancel := context.WithTimeout(ctx, opts.drainTimeout)
		defer cancel()
		c0, start := readCPU(), time.Now()
		err = fn(mctx)
		elapsed = time.Since(start)
		res.cpu, res.elapsed = readCPU().sub(c0), elapsed
		done := int64(n)
		if err != nil && mctx.Err() != nil && ctx.Err() == nil {
			// Out of time: the rate is of what the destination holds.
			res.partial = true
			if done, err = d.stored(ctx); err != nil {
				return res, fmt.Errorf("count stored: %w", err)
			}
			res.note = partialNote(done, n, elapsed)
		}
		if err != nil {
			return res, err
		}
		res.rate = float64(done) / elapsed.Seconds()
	default:
		h, ah, release, err := d.adapter(ctx)
		if err != nil {
			return res, err
		}
		defer release()
		if (run == bRelayAsync || run == bRelayAsync4 || run == bRelayBig) && ah == nil {
			return res, errNoAsyncHandler
		}
		if err := pg.clear(ctx, adb, brokerTable); err != nil {
			return res, err
		}
		if err := pg.fill(ctx, adb, brokerTable, n, fillPending); err != nil {
			return res, err
		}
		relays := 1
		if run == bRelayAsync4 {
			relays = 4
		}
		var cfg outbox.RelayConfig // defaults
		if run == bRelayBig {
			cfg.BatchSize = 1000
		}
		tl := newTally(n, true)
		var fl inFlight
		register := func(ob *outbox.Outbox) {
			switch run {
			case bRelayNoop:
				ob.HandleAsync(brokerEventType, func(_ context.Context, e outbox.Event) func() error {
					return func() error { markEvent(tl, e); return nil }
				})
				return
			case bRelayHandler:
				ob.Handle(brokerEventType, func(ctx context.Context, e outbox.Event) error {
					fl.begin()
					err := h(ctx, e)
					fl.end()
					if err == nil {
						markEvent(tl, e)
					}
					return err
				})
				return
			}
			ob.HandleAsync(brokerEventType, func(ctx context.Context, e outbox.Event) func() error {
				fl.begin()
				wait := ah(ctx, e)
				return func() error {
					err := wait()
					fl.end()
					if err == nil {
						markEvent(tl, e)
					}
					return err
				}
			})
		}
		runRelays, closeRelays, err := prepareBrokerRelays(ctx, pg, cfg, relays, register)
		if err != nil {
			return res, err
		}
		defer closeRelays()
		mctx, cancel := context.WithTimeout(ctx, opts.drainTimeout)
		defer cancel()
		rctx, stop := context.WithCancel(mctx)
		defer stop()
		errc := make(chan error, 1)
		c0, start := readCPU(), time.Now()
		go func() { errc <- runRelays(rctx) }()
		var runErr error
		stopped := false
		select {
		case <-tl.done:
		case <-mctx.Done():
			if ctx.Err() != nil {
				stop()
				<-errc
				return res, ctx.Err()
			}
			res.partial = true
		case runErr = <-errc:
			stopped = true
		}
		elapsed = time.Since(start)
		res.cpu, res.elapsed = readCPU().sub(c0), elapsed
		stop()
		if !stopped {
			runErr = <-errc
		}
		if runErr != nil {
			return res, runErr
		}
		u := tl.unique.Load()
		if u < int64(n) {
			res.partial = true
			res.note = partialNote(u, n, elapsed)
		}
		if dup := tl.total.Load() - u; dup > 0 {
			res.note = joinNote(res.note, fmt.Sprintf("%d duplicate deliveries", dup))
		}
		res.rate = float64(u) / elapsed.Seconds()
		if run != bRelayNoop {
			res.busy = fl.busy().Seconds() / elapsed.Seconds()
			res.first = fl.firstAfter(start)
		}
	}
	if run == bRelayNoop {
		return res, nil
	}
	// The destination must hold every message once: a floor or relay that
	// lost or repeated some would not be comparable.
	got, err := d.stored(ctx)
	if err != nil {
		return res, fmt.Errorf("count stored: %w", err)
	}
	if got != int64(n) && !res.partial {
		res.note = joinNote(res.note, fmt.Sprintf("the broker holds %d of %d", got, n))
	}
	return res, nil
}

func markEvent(t *tally, e outbox.Event) {
	i, _ := strconv.Atoi(e.AggregateID)
	t.mark(i)
}

// prepareBrokerRelays returns relays Relay.Run loops with cfg, which run
// until ctx is done, on a fresh pool with a fresh Outbox whose handlers
// register installs.
//
// Opening the pool (with one connection made), installing the plugin and
// creating the relays are done before it returns, untimed, as the floors
// connect before their clock starts; run is the timed part, from Relay.Run
// on (its start, a relay's first sweep of the table included), and release
// closes the pool.
func prepareBrokerRelays(ctx context.Context, pg *pgServer, cfg outbox.RelayConfig, relays int, register func(*outbox.Outbox)) (run func(context.Context) error, release func(), err error) {
	db, err := pg.open()
	if err != nil {
		return nil, nil, err
	}
	release = func() { closeDB(db) }
	defer func() {
		if err != nil {
			release()
		}
	}()
	if err := sqlDB(db).PingContext(ctx); err != nil {
		return nil, nil, err
	}
	ob := outbox.Plugin(outbox.Config{Table: brokerTable, Logger: warnLogger, DisableAutoMigrate: true})
	if err := db.Use(ob); err != nil {
		return nil, nil, fmt.Errorf("install outbox: %w", err)
	}
	register(ob)
	rs := make([]*outbox.Relay, relays)
	for i := range rs {
		if rs[i], err = ob.Relay(db, cfg); err != nil {
			return nil, nil, err
		}
	}
	run = func(ctx context.Context) error {
		var wg sync.WaitGroup
		errs := make([]error, relays)
		for i, r := range rs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				errs[i] = r.Run(ctx)
			}()
		}
		wg.Wait()
		return errors.Join(errs...)
	}
	return run, release, nil
}

// syncFloor runs publish for every index of evs from goroutines
// goroutines, each one at a time.
func syncFloor(ctx context.Context, n, goroutines int, publish func(ctx context.Context, i int) error) error {
	var (
		next atomic.Int64
		wg   sync.WaitGroup
	)
	errs := make([]error, goroutines)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := publish(ctx, i); err != nil {
					errs[g] = err
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	return ctx.Err()
}

// nativeMessage is e laid out as the adapters lay it out in wire.Native
// format on binding b.
func nativeMessage(b wire.Binding, e outbox.Event) wire.Message {
	m, err := b.Encode(wire.Native, e, wire.CloudEventOptions{})
	if err != nil {
		panic(err) // the events of brokerEvents always encode
	}
	return m
}

// parseBrokers parses -brokers.
func parseBrokers(s string) (map[string]bool, error) {
	out := map[string]bool{}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		switch f {
		case "":
		case "nats", "kafka", "rabbitmq", "redis":
			out[f] = true
		default:
			return nil, fmt.Errorf("unknown broker %q (want %s)", f, strings.Join(brokerNames, ", "))
		}
	}
	return out, nil
}

// parseBrokerRuns parses -broker-runs.
func parseBrokerRuns(s string) (map[string]bool, error) {
	out := map[string]bool{}
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		ok := false
		for _, r := range brokerRuns {
			ok = ok || r == f
		}
		if !ok {
			return nil, fmt.Errorf("unknown run %q (want %s)", f, strings.Join(brokerRuns, ", "))
		}
		out[f] = true
	}
	return out, nil
}

// inFlight measures how long at least one delivery was in flight (started,
// its ack not yet back): the rest of a drain is the relay's own work
// between deliveries (claim, mark, wake-ups), which a relay does between
// batches, not during them.
type inFlight struct {
	mu    sync.Mutex
	n     int
	since time.Time
	first time.Time // of the first delivery
	total time.Duration
}

func (f *inFlight) begin() {
	f.mu.Lock()
	if f.n == 0 {
		f.since = time.Now()
		if f.first.IsZero() {
			f.first = f.since
		}
	}
	f.n++
	f.mu.Unlock()
}

func (f *inFlight) end() {
	f.mu.Lock()
	if f.n--; f.n == 0 {
		f.total += time.Since(f.since)
	}
	f.mu.Unlock()
}

// firstAfter is how long after start the first delivery began; 0 if none.
func (f *inFlight) firstAfter(start time.Time) time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.first.IsZero() {
		return 0
	}
	return f.first.Sub(start)
}

func (f *inFlight) busy() time.Duration {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.total
}
