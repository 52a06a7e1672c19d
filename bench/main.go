// Command bench compares the outbox with watermill-sql and with hand-written
// SQL floors on the same machine, and prints one markdown table.
//
//	cd bench && OUTBOX_TEST_POSTGRES_DSN=postgres://... go run . [flags]
//
// It starts no service: it uses the PostgreSQL named by
// OUTBOX_TEST_POSTGRES_DSN, in a schema of its own that it drops at the end,
// the MySQL or MariaDB named by OUTBOX_TEST_MYSQL_DSN (if set and reachable;
// otherwise its rows are skipped with a message), in a database of its own
// that it drops at the end, and a SQLite file in a temporary directory.
// -db picks the databases. The broker scenario (-only broker) also uses
// the NATS, RabbitMQ and Redis named by OUTBOX_TEST_NATS_URL,
// OUTBOX_TEST_RABBITMQ_URL and OUTBOX_TEST_REDIS_ADDR (each skipped with a
// message when unset or not answering), on streams, queues and keys of its
// own that it deletes, and Kafka in process (kfake). The table goes to stdout, progress to stderr. See
// ../BENCHMARKS.md for full runs and how to read them.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"runtime/pprof"
	"strings"
	"syscall"
	"time"
)

// options are the command-line flags. Every loop the benchmark runs is
// bounded by one of them, in count or in time.
type options struct {
	// The tenants scenario.
	tenants, tenantEvents, tenantBusy, tenantMaxActive int

	rounds       int
	quick        bool
	only         map[string]bool
	dbs          map[string]bool
	writeDur     time.Duration
	writers      []int
	backlog      int
	relays       []int
	tuned        []relayShape
	drainTimeout time.Duration
	latencyDur   time.Duration
	latencyHist  int
	rate         int
	scaleSent    int
	scaleBacklog int
	claimSent    int
	claimCycles  int
	memBig       int
	memSmall     int
	memTimeout   time.Duration
	asyncCommit  bool
	fillfactor   int
	maxIdle      int
	cpuProfile   string
	floors       bool

	// The broker scenario.
	brokers      map[string]bool
	brokerEvents int
	brokerRuns   map[string]bool

	// The openoutbox scenario.
	openOutbox string // the open-outbox relay binary; empty: skipped
	ooBacklog  int
}

func parseFlags(args []string) (options, error) {
	fs := flag.NewFlagSet("bench", flag.ContinueOnError)
	var (
		o        options
		only     string
		dbs      string
		tuned    string
		writers  string
		relays   string
		brokers  string
		bruns    string
		explicit = map[string]bool{}
	)
	fs.IntVar(&o.rounds, "rounds", 3, "rounds of every A/B comparison; medians and min–max are over rounds")
	fs.BoolVar(&o.quick, "quick", false, "smoke run: small backlogs, short durations, 1 round (unless -rounds is given)")
	fs.StringVar(&only, "only", "write,relay,latency,scale,claim", "scenarios to run, comma separated; logical (Logical mode against the table path, on a PostgreSQL cluster of its own with wal_level=logical) runs only when named, and so does tenants (one RelayGroup against one relay per database, on -tenants PostgreSQL schemas and SQLite files), and broker (a relay draining PostgreSQL into each broker of -brokers, against the broker client's own floors), and openoutbox (our relay against the open-outbox/relay binary of -open-outbox on the same PostgreSQL backlog)")
	fs.StringVar(&dbs, "db", "postgres,sqlite,mysql", "databases to run them on, comma separated (mysql: MySQL or MariaDB, from "+mysqlDSNEnv+"; SQLite has only the write and claim scenarios, latency is PostgreSQL's alone)")
	fs.DurationVar(&o.writeDur, "write-dur", 3*time.Second, "how long each write-overhead measurement runs")
	fs.StringVar(&writers, "writers", "1,8", "concurrent writers for the write-overhead scenario")
	fs.IntVar(&o.backlog, "backlog", 200000, "events in the relay-throughput backlog")
	fs.StringVar(&relays, "relays", "1,4", "concurrent relays for the relay-throughput scenario")
	fs.StringVar(&tuned, "tuned", "1000x1", "tuned relay shapes to try, BatchSize x Workers, comma separated")
	fs.DurationVar(&o.drainTimeout, "drain-timeout", 3*time.Minute, "longest a single drain may run; a slower contender is reported as partial")
	fs.DurationVar(&o.latencyDur, "latency-dur", 10*time.Second, "how long each latency measurement publishes")
	fs.IntVar(&o.rate, "rate", 500, "events per second in the latency scenario")
	fs.IntVar(&o.latencyHist, "latency-history", 20000, "sent events written into each push contender's table (and ANALYZEd) before each latency measurement; 0 measures a table just truncated, whose prepared statements PostgreSQL plans for an empty table")
	fs.IntVar(&o.scaleSent, "scale-sent", 1000000, "sent rows in the table for the scale scenario")
	fs.IntVar(&o.scaleBacklog, "scale-backlog", 100000, "pending events drained in the scale scenario's throughput test")
	fs.IntVar(&o.claimSent, "claim-sent", 1000000, "sent rows beside the claim scenario's second and third table states")
	fs.IntVar(&o.claimCycles, "claim-cycles", 200, "measured relay cycles per table state and round in the claim scenario")
	fs.IntVar(&o.tenants, "tenants", 50, "databases in the tenants scenario (PostgreSQL schemas, SQLite files)")
	fs.IntVar(&o.tenantEvents, "tenant-events", 1000, "events per database in the tenants scenario's throughput test")
	fs.IntVar(&o.tenantBusy, "tenant-busy", 20000, "the busy database's backlog in the tenants scenario's quiet-beside-busy test")
	fs.IntVar(&o.tenantMaxActive, "tenant-max-active", 4, "RelayGroupConfig.MaxActive in the tenants scenario")
	fs.IntVar(&o.memBig, "mem-big", 1000000, "large backlog for the relay memory test")
	fs.IntVar(&o.memSmall, "mem-small", 100000, "small backlog for the relay memory test")
	fs.DurationVar(&o.memTimeout, "mem-timeout", 90*time.Second, "longest the memory test samples one drain; a longer drain is sampled over its start (a relay that loaded its backlog would peak there)")
	fs.IntVar(&o.maxIdle, "max-idle", 16, "SetMaxIdleConns of every pool, at least the concurrency used so connections are reused; 0 keeps database/sql's default of 2 (connection churn; see BENCHMARKS.md)")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the whole run to this file (go tool pprof)")
	fs.IntVar(&o.fillfactor, "fillfactor", 0, "PostgreSQL fillfactor of the relay scenario's tables (room on a page lets the claim's update be HOT); 0 keeps the table's default of 100")
	fs.BoolVar(&o.floors, "floors", false, "in the write scenario on PostgreSQL, also run the floor's INSERT into tables of the same columns with fewer indexes (the primary key and the two unique partial indexes; the primary key alone): what each index costs the write")
	fs.StringVar(&brokers, "brokers", strings.Join(brokerNames, ","), "brokers of the broker scenario, comma separated; each runs when reachable (nats: "+natsURLEnv+", rabbitmq: "+rabbitmqURLEnv+", redis: "+redisAddrEnv+"; kafka: kfake, in process), and is skipped with a message otherwise")
	fs.IntVar(&o.brokerEvents, "broker-events", 30000, "events each measurement of the broker scenario publishes (floors) or drains (relays)")
	fs.StringVar(&bruns, "broker-runs", strings.Join(brokerRuns, ","), "what the broker scenario measures, comma separated: "+bFloorAsync+" (the client's pipelined publish), "+bFloorSync+" (one publish at a time from 4 goroutines), "+bRelayAsync+" and "+bRelayAsync4+" (1 and 4 relays at defaults with the adapter's AsyncHandler), "+bRelayHandler+" (1 relay with its Handler), "+bRelayNoop+" (1 relay with an AsyncHandler that sends nothing: the relay's own ceiling), "+bRelayBig+" (1 relay with BatchSize 1000 and the AsyncHandler), "+bFloorDB+" (the hand-written claim and mark alone: the database's part of any relay, and the bound it puts on one); the ratios need "+bFloorAsync)
	fs.StringVar(&o.openOutbox, "open-outbox", "", "the open-outbox/relay binary (built from its cmd/relay) for the openoutbox scenario, which is skipped with a message without it")
	fs.IntVar(&o.ooBacklog, "oo-backlog", 200000, "events in each drain of the openoutbox scenario")
	fs.BoolVar(&o.asyncCommit, "async-commit", false, "set synchronous_commit=off on the benchmark's PostgreSQL sessions, to see what the WAL flush costs (not a production setting for an outbox)")
	if err := fs.Parse(args); err != nil {
		return o, err
	}
	fs.Visit(func(f *flag.Flag) { explicit[f.Name] = true })
	if o.quick {
		// Each quick value applies only where the flag was not given.
		set := func(name string, apply func()) {
			if !explicit[name] {
				apply()
			}
		}
		set("rounds", func() { o.rounds = 1 })
		set("write-dur", func() { o.writeDur = time.Second })
		set("backlog", func() { o.backlog = 20000 })
		set("latency-dur", func() { o.latencyDur = 2 * time.Second })
		set("scale-sent", func() { o.scaleSent = 100000 })
		set("scale-backlog", func() { o.scaleBacklog = 20000 })
		set("claim-sent", func() { o.claimSent = 20000 })
		set("claim-cycles", func() { o.claimCycles = 20 })
		set("mem-big", func() { o.memBig = 100000 })
		set("mem-small", func() { o.memSmall = 10000 })
		set("drain-timeout", func() { o.drainTimeout = time.Minute })
		set("broker-events", func() { o.brokerEvents = 5000 })
		set("oo-backlog", func() { o.ooBacklog = 20000 })
	}
	if o.rounds < 1 {
		return o, errors.New("-rounds must be at least 1")
	}
	o.only = map[string]bool{}
	for _, s := range strings.Split(only, ",") {
		s = strings.TrimSpace(s)
		switch s {
		case "write", "relay", "latency", "scale", "claim", "logical", "tenants", "broker", "openoutbox":
			o.only[s] = true
		case "":
		default:
			return o, fmt.Errorf("-only: unknown scenario %q (want write, relay, latency, scale, claim, logical, tenants, broker, openoutbox)", s)
		}
	}
	o.dbs = map[string]bool{}
	for _, s := range strings.Split(dbs, ",") {
		s = strings.TrimSpace(s)
		switch s {
		case "postgres", "sqlite", "mysql":
			o.dbs[s] = true
		case "mariadb":
			o.dbs["mysql"] = true
		case "":
		default:
			return o, fmt.Errorf("-db: unknown database %q (want postgres, sqlite, mysql)", s)
		}
	}
	var err error
	if o.brokers, err = parseBrokers(brokers); err != nil {
		return o, fmt.Errorf("-brokers: %w", err)
	}
	if o.brokerRuns, err = parseBrokerRuns(bruns); err != nil {
		return o, fmt.Errorf("-broker-runs: %w", err)
	}
	if o.writers, err = parseInts(writers); err != nil {
		return o, fmt.Errorf("-writers: %w", err)
	}
	if o.relays, err = parseInts(relays); err != nil {
		return o, fmt.Errorf("-relays: %w", err)
	}
	for _, s := range strings.Split(tuned, ",") {
		if s = strings.TrimSpace(s); s == "" {
			continue
		}
		var sh relayShape
		if _, err := fmt.Sscanf(s, "%dx%d", &sh.batch, &sh.workers); err != nil || sh.batch < 1 || sh.workers < 1 {
			return o, fmt.Errorf("-tuned: %q is not BatchSize x Workers (e.g. 1000x4)", s)
		}
		o.tuned = append(o.tuned, sh)
	}
	for _, v := range []struct {
		name string
		n    int
	}{{"backlog", o.backlog}, {"rate", o.rate}, {"scale-backlog", o.scaleBacklog}, {"mem-big", o.memBig}, {"mem-small", o.memSmall}, {"claim-cycles", o.claimCycles}, {"broker-events", o.brokerEvents}, {"oo-backlog", o.ooBacklog}} {
		if v.n < 1 {
			return o, fmt.Errorf("-%s must be positive", v.name)
		}
	}
	if o.scaleSent < 0 {
		return o, errors.New("-scale-sent must not be negative")
	}
	if o.claimSent < 0 {
		return o, errors.New("-claim-sent must not be negative")
	}
	return o, nil
}

func parseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		var n int
		if _, err := fmt.Sscanf(strings.TrimSpace(f), "%d", &n); err != nil || n < 1 {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, n)
	}
	return out, nil
}

func main() {
	opts, err := parseFlags(os.Args[1:])
	if errors.Is(err, flag.ErrHelp) {
		return
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(2)
	}
	if opts.dbs["postgres"] && os.Getenv(pgDSNEnv) == "" {
		fmt.Fprintf(os.Stderr, "bench: %s is not set. It starts no database of its own: point it at a PostgreSQL it may create (and drop) a schema in, e.g.\n  export %s='postgres://postgres@127.0.0.1:5432/test?sslmode=disable'\nor leave PostgreSQL out with -db (e.g. -db mysql).\n", pgDSNEnv, pgDSNEnv)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, opts); err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		stop()
		os.Exit(1)
	}
}

func run(ctx context.Context, opts options) (err error) {
	e, err := newEnv(ctx, opts)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, e.close()) }()
	progress("%d round(s); pools keep %d idle connections (0: database/sql default)", opts.rounds, opts.maxIdle)
	if opts.asyncCommit {
		progress("synchronous_commit=off on every benchmark session")
	}

	if opts.cpuProfile != "" {
		f, err := os.Create(opts.cpuProfile)
		if err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		defer f.Close()
		if err := pprof.StartCPUProfile(f); err != nil {
			return fmt.Errorf("cpu profile: %w", err)
		}
		defer pprof.StopCPUProfile()
	}
	t := &table{}
	started := time.Now()
	steps := []struct {
		name string
		fn   func(context.Context, *env, options, *table) error
	}{
		{"write", runWrite},
		{"relay", runRelay},
		{"latency", runLatency},
		{"scale", runScale},
		{"claim", runClaim},
		{"logical", runLogical},
		{"tenants", runTenants},
		{"broker", runBroker},
		{"openoutbox", runOpenOutbox},
	}
	for _, s := range steps {
		if !opts.only[s.name] {
			continue
		}
		progress("== scenario %s", s.name)
		if err := s.fn(ctx, e, opts, t); err != nil {
			return fmt.Errorf("scenario %s: %w", s.name, err)
		}
	}
	progress("done in %s", time.Since(started).Round(time.Second))
	t.print(os.Stdout)
	return nil
}

func progress(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "%s "+format+"\n", append([]any{time.Now().Format("15:04:05")}, args...)...)
}
