package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	osexec "os/exec" // renamed: the package already has a func exec
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gorm-outbox/outbox"
)

// The openoutbox scenario drains the same backlog with our relay and with
// open-outbox/relay (github.com/open-outbox/relay), a stand-alone polling
// relay, on the same PostgreSQL, interleaved round by round:
//
//	A ours, 1 relay at defaults (outbox.RelayConfig{}), Persistent mode;
//	B ours, 4 relays at defaults, each on its own pool and Outbox;
//	C open-outbox at its defaults (internal/config/config.go: BATCH_SIZE
//	  100, POLL_INTERVAL 500ms), null publisher;
//	D open-outbox with the settings its documentation gives for
//	  throughput (ooTunedEnv), null publisher.
//
// open-outbox is a separate program: it is run from the binary given by
// -open-outbox (built from its cmd/relay), one process per drain, configured
// through its environment as its documentation describes. It delivers
// from one loop per process (claim a batch, publish each event, mark the
// batch delivered; no worker setting: it scales by running more
// processes), so C and D are one process each.

// ooTable is open-outbox's default table name (STORAGE_TABLE_NAME), in the
// benchmark's schema (the search_path of the DSN it is given).
const ooTable = "openoutbox_events"

// ooSchema is open-outbox's PostgreSQL schema, schema/postgres/open-outbox.sql
// at commit b8efc8f717b394ab74213d7845cc330756d891a8, copied because it ships
// no migration of its own (its docker-compose applies the file at the
// database's first start): the same table and the same four partial
// indexes, without the file's leading DROP TABLE and with the indexes'
// "public." qualifier left out so that they land in the benchmark's schema.
var ooSchema = []string{
	`CREATE TABLE ` + ooTable + ` (
		event_id      UUID PRIMARY KEY,
		event_type    TEXT NOT NULL,
		partition_key TEXT,
		payload       BYTEA NOT NULL,
		headers       JSONB NOT NULL DEFAULT '{}',
		status        TEXT NOT NULL DEFAULT 'PENDING',
		attempts      INT NOT NULL DEFAULT 0,
		last_error    TEXT,
		available_at  TIMESTAMPTZ NOT NULL DEFAULT NOW(),
		locked_by     TEXT,
		locked_at     TIMESTAMPTZ,
		delivered_at  TIMESTAMPTZ,
		created_at    TIMESTAMPTZ NOT NULL DEFAULT NOW(),
		updated_at    TIMESTAMPTZ NOT NULL DEFAULT NOW(),
		CONSTRAINT check_valid_status CHECK (
			status IN ('PENDING', 'DELIVERING', 'DELIVERED', 'DEAD')
		)
	)`,
	`CREATE INDEX idx_openoutbox_processing_queue ON ` + ooTable + ` (available_at ASC, created_at ASC) WHERE status = 'PENDING'`,
	`CREATE INDEX idx_openoutbox_stuck_leases ON ` + ooTable + ` (locked_at ASC) WHERE status = 'DELIVERING'`,
	`CREATE INDEX idx_openoutbox_metrics_count ON ` + ooTable + ` (status) INCLUDE (attempts) WHERE status = 'PENDING'`,
	`CREATE INDEX idx_openoutbox_metrics_lag ON ` + ooTable + ` (status, created_at ASC) WHERE status = 'PENDING'`,
}

// ooBaseEnv is the environment of every open-outbox process besides its
// storage URL: the null publisher (a no-op, internal/publishers/null.go,
// which its benchmark README recommends for measuring the relay's own
// ceiling), telemetry exporters off as in its .env.example (unset, the
// OpenTelemetry autoexport default is OTLP to a collector that is not
// there), and the health/metrics server on a free loopback port instead of
// :8080. Nothing else is set: the engine runs at its defaults.
var ooBaseEnv = []string{
	"STORAGE_TYPE=postgres",
	"PUBLISHER_TYPE=null",
	"SERVER_PORT=127.0.0.1:0",
	"OTEL_TRACES_EXPORTER=none",
	"OTEL_METRICS_EXPORTER=none",
	"OTEL_LOGS_EXPORTER=none",
}

// ooTunedEnv is what open-outbox documents for throughput: BATCH_SIZE=1000
// and REAP_BATCH_SIZE=500 ("Performance Tuning" in benchmark/README.md,
// which also lists BATCH_SIZE=1000 as "Higher = better throughput"), and
// POLL_INTERVAL=100ms (the production recommendation in
// docs/src/content/docs/guides/deployment.mdx, which puts BATCH_SIZE at
// 500–2000). The poll interval is only the pause after an empty batch or
// an error, so it does not slow a backlog drain either way.
var ooTunedEnv = []string{"BATCH_SIZE=1000", "REAP_BATCH_SIZE=500", "POLL_INTERVAL=100ms"}

// ooPollEvery is how often a drain checks open-outbox's table for rows left
// to publish: the drain's time is that of the first check that finds none,
// so it is late by up to this much.
const ooPollEvery = 50 * time.Millisecond

// ooBuildHint is how to get the binary -open-outbox wants.
const ooBuildHint = "fetch github.com/open-outbox/relay, then: git -C <its clone> archive HEAD | tar -x -C /tmp/oo/src && (cd /tmp/oo/src && go build -o /tmp/oo/relay ./cmd/relay), and pass -open-outbox /tmp/oo/relay"

// ooContender is one side of the scenario: drain seeds a fresh backlog of n
// events and times its delivery.
type ooContender struct {
	name  string
	drain func(ctx context.Context, n int) (drainResult, error)
}

func runOpenOutbox(ctx context.Context, e *env, opts options, t *table) error {
	if opts.openOutbox == "" {
		progress("openoutbox skipped: no -open-outbox binary; %s", ooBuildHint)
		return nil
	}
	if e.pg == nil {
		progress("openoutbox skipped: it runs on PostgreSQL only (-db postgres)")
		return nil
	}
	if fi, err := os.Stat(opts.openOutbox); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
		return fmt.Errorf("-open-outbox %s is not an executable file (%v); %s", opts.openOutbox, err, ooBuildHint)
	}
	pg := e.pg
	progress("openoutbox: load average at start: %s", loadAverage())
	admin, err := pg.openSQL()
	if err != nil {
		return err
	}
	defer admin.Close()
	if err := exec(ctx, admin, ooSchema...); err != nil {
		return fmt.Errorf("open-outbox schema: %w", err)
	}
	// open-outbox and viper both read a .env file in the working directory:
	// an empty directory of its own keeps any such file out.
	dir, err := os.MkdirTemp("", "oo-bench-")
	if err != nil {
		return fmt.Errorf("temp dir: %w", err)
	}
	defer os.RemoveAll(dir)
	oo := ooRunner{bin: opts.openOutbox, dir: dir, pg: pg, admin: admin, timeout: opts.drainTimeout}

	// Startup is part of every open-outbox drain (the clock starts before
	// its process does); measured here once, on an empty table, to show how
	// much of a drain it is.
	empty, err := oo.emptyStart(ctx)
	if err != nil {
		return err
	}
	progress("openoutbox: open-outbox empty start (process start → first claim query done): %s", empty.Round(time.Millisecond))

	const oursTable = "oo_ours"
	base, err := oursRelay(pg, admin, oursTable, relayShape{defaultBatchSize, defaultWorkers}, "")
	if err != nil {
		return err
	}
	ours := func(name string, relays int) ooContender {
		c := base
		c.name = name
		// Each relay on a pool and Outbox of its own, as separate
		// processes would be (runOurs opens both), at RelayConfig{}, in
		// the plugin's default Persistent mode.
		c.run = func(ctx context.Context, n int, t *tally) error {
			var wg sync.WaitGroup
			errs := make([]error, n)
			for i := range n {
				wg.Add(1)
				go func() {
					defer wg.Done()
					errs[i] = runOurs(ctx, pg, oursTable, outbox.RelayConfig{}, 1, t, nil)
				}()
			}
			wg.Wait()
			return errors.Join(errs...)
		}
		var before tableReads
		fill := c.fill
		c.fill = func(ctx context.Context, n int) error {
			if err := fill(ctx, n); err != nil {
				return err
			}
			var err error
			before, err = readTableStats(ctx, admin, oursTable)
			return err
		}
		return ooContender{name: name, drain: func(ctx context.Context, n int) (drainResult, error) {
			res, err := drain(ctx, c, n, relays, opts.drainTimeout, true)
			if err != nil {
				return res, err
			}
			// The relays' sessions report their counts as they end, not
			// at once: read until every event's claim and mark are
			// counted (two updates each), for at most 5 s.
			var after tableReads
			for deadline := time.Now().Add(5 * time.Second); ; {
				if after, err = readTableStats(ctx, admin, oursTable); err != nil {
					return res, err
				}
				if after.upd-before.upd >= 2*int64(n) || time.Now().After(deadline) {
					break
				}
				time.Sleep(50 * time.Millisecond)
			}
			res.note = joinNote(res.note, after.minus(before).perEvent(n))
			return res, nil
		}}
	}
	const (
		nOurs1   = "ours, 1 relay, defaults (RelayConfig{}), no-op handler"
		nOurs4   = "ours, 4 relays, defaults, a pool each, no-op handler"
		nOODef   = "open-outbox, defaults (BATCH_SIZE 100), null publisher"
		nOOTuned = "open-outbox, documented tuning (BATCH_SIZE 1000, REAP_BATCH_SIZE 500, POLL_INTERVAL 100ms), null publisher"
	)
	cs := []ooContender{
		ours(nOurs1, 1),
		ours(nOurs4, 4),
		{nOODef, func(ctx context.Context, n int) (drainResult, error) {
			return oo.drain(ctx, n, "bench_oo_default", nil)
		}},
		{nOOTuned, func(ctx context.Context, n int) (drainResult, error) {
			return oo.drain(ctx, n, "bench_oo_tuned", ooTunedEnv)
		}},
	}

	rates := map[string]series{}
	notes := map[string]string{}
	for round := range opts.rounds {
		// Each round starts with the next contender (A B C D, B C D A,
		// ...), so that none always follows the same one.
		for _, c := range rotate(cs, round) {
			res, err := c.drain(ctx, opts.ooBacklog)
			if err != nil {
				return fmt.Errorf("%s: %w", c.name, err)
			}
			rates[c.name] = append(rates[c.name], res.rate)
			note := res.note
			if res.partial {
				note = joinNote(partialNote(res.unique, opts.ooBacklog, res.elapsed), note)
			}
			if d := res.total - res.unique; d > 0 {
				note = joinNote(note, fmt.Sprintf("%d duplicate deliveries", d))
			}
			if note != "" {
				notes[c.name] = joinNote(notes[c.name], fmt.Sprintf("r%d: %s", round+1, note))
			}
			progress("openoutbox round %d: %-105s %8.0f ev/s in %s %s", round+1, c.name, res.rate, res.elapsed.Round(time.Millisecond), note)
		}
	}

	scen := fmt.Sprintf("O open-outbox/relay comparison, postgres, %d-event backlog", opts.ooBacklog)
	for _, c := range cs {
		t.add(&row{scenario: scen, contender: c.name, metric: "events/s", vals: rates[c.name], format: fmtRate, note: notes[c.name]})
	}
	t.add(&row{scenario: scen, contender: "open-outbox empty start (process start → first claim done), once per run", metric: "ms",
		vals: series{float64(empty) / float64(time.Millisecond)}, format: fmtMS,
		note: "included in each open-outbox drain above, not subtracted"})
	// Each ratio is the median over rounds of a/b measured in the same round.
	for _, r := range []struct{ a, b, label string }{
		{nOurs1, nOOTuned, "ours1 / oo-tuned"},
		{nOurs1, nOODef, "ours1 / oo-default"},
		{nOurs4, nOurs1, "ours4 / ours1"},
		{nOurs4, nOOTuned, "ours4 / oo-tuned"},
	} {
		var q series
		for i, v := range rates[r.a] {
			q = append(q, v/rates[r.b][i])
		}
		t.add(&row{scenario: scen, contender: r.label, metric: "ratio", vals: q, format: fmtRatio})
		progress("openoutbox: %-20s median %.2f× (medians: %.0f vs %.0f ev/s)", r.label, q.median(), rates[r.a].median(), rates[r.b].median())
	}
	progress("openoutbox: load average at end: %s", loadAverage())
	return nil
}

// ooRunner starts open-outbox processes against the benchmark's schema.
type ooRunner struct {
	bin     string
	dir     string // working directory, empty
	pg      *pgServer
	admin   *sql.DB
	timeout time.Duration
}

// env is the environment of one process: only what is listed (not the
// benchmark's own environment, which could hold a BATCH_SIZE of its own),
// the storage URL with appName as application_name, so that its sessions
// can be told apart in pg_stat_activity.
func (r ooRunner) env(appName string, extra []string) ([]string, error) {
	u, err := url.Parse(r.pg.dsn)
	if err != nil {
		return nil, fmt.Errorf("storage URL: %w", err)
	}
	q := u.Query()
	q.Set("application_name", appName)
	u.RawQuery = q.Encode()
	env := append([]string{"STORAGE_URL=" + u.String()}, ooBaseEnv...)
	return append(env, extra...), nil
}

// start starts one process. Its output (JSON log lines, one per batch at
// its default level) is kept in out, last bytes only, for errors; exited
// receives what Wait returns.
func (r ooRunner) start(appName string, extra []string) (cmd *osexec.Cmd, out *tailBuffer, exited <-chan error, err error) {
	env, err := r.env(appName, extra)
	if err != nil {
		return nil, nil, nil, err
	}
	out = &tailBuffer{max: 4096}
	cmd = osexec.Command(r.bin)
	cmd.Dir = r.dir
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = out, out
	if err := cmd.Start(); err != nil {
		return nil, nil, nil, fmt.Errorf("start %s: %w", r.bin, err)
	}
	ch := make(chan error, 1)
	go func() { ch <- cmd.Wait() }()
	return cmd, out, ch, nil
}

// stop ends a process as its operators would (SIGTERM, on which it shuts
// down gracefully), killing it if it takes longer than 10 s.
func stopProcess(cmd *osexec.Cmd, exited <-chan error) {
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-exited
	}
}

// fill puts n pending events in open-outbox's table, as its producers would
// have written them (not through its API: it has none for writing), in one
// INSERT ... SELECT, then vacuums as the other scenarios' fills do. They
// are the other scenarios' events: type order.created, the small JSON
// payload {"order_id": g, "total": 42} (as bytes: the column is BYTEA),
// the index as partition key, available and created a day ago a
// microsecond apart, so the claim's order is the insertion order.
func (r ooRunner) fill(ctx context.Context, n int) error {
	if err := exec(ctx, r.admin, "TRUNCATE "+ooTable); err != nil {
		return err
	}
	const ts = "t0 + g * interval '1 microsecond'"
	q := `INSERT INTO ` + ooTable + ` (event_id, event_type, partition_key, payload, available_at, created_at, updated_at)
	SELECT gen_random_uuid(), 'order.created', g::text, convert_to(json_build_object('order_id', g, 'total', 42)::text, 'UTF8'), ` + ts + `, ` + ts + `, ` + ts + `
	FROM (SELECT now() - interval '1 day' AS t0) t, generate_series(1, $1::int) g`
	if _, err := r.admin.ExecContext(ctx, q, n); err != nil {
		return fmt.Errorf("fill %s with %d rows: %w", ooTable, n, err)
	}
	return vacuum(ctx, r.admin, ooTable)
}

// ooLeft reports whether any row is still to be published (pending, or
// claimed and not yet marked): two probes of the partial indexes, cheap
// enough to run every ooPollEvery beside the drain.
const ooLeft = `SELECT EXISTS (SELECT 1 FROM ` + ooTable + ` WHERE status = 'PENDING')
	OR EXISTS (SELECT 1 FROM ` + ooTable + ` WHERE status = 'DELIVERING')`

// drain seeds n events and times one open-outbox process publishing them
// all: from just before the process starts to the first check of its table
// that finds no row left to publish. The time includes the process's
// start (runtime, configuration, telemetry setup, the pool's first
// connection; see emptyStart) and is late by up to ooPollEvery; nothing is
// subtracted. The note gives the last delivered_at (the transaction time
// of the last batch's mark) against the same start, the drain's end to
// within that batch's UPDATE, with no polling delay.
func (r ooRunner) drain(ctx context.Context, n int, appName string, extra []string) (drainResult, error) {
	if err := r.fill(ctx, n); err != nil {
		return drainResult{}, err
	}
	start := time.Now()
	cmd, out, exited, err := r.start(appName, extra)
	if err != nil {
		return drainResult{}, err
	}
	stopped := false
	defer func() {
		if !stopped {
			stopProcess(cmd, exited)
		}
	}()
	tick := time.NewTicker(ooPollEvery)
	defer tick.Stop()
	deadline := time.NewTimer(r.timeout)
	defer deadline.Stop()
	var res drainResult
poll:
	for {
		var left bool
		if err := r.admin.QueryRowContext(ctx, ooLeft).Scan(&left); err != nil {
			return res, fmt.Errorf("poll %s: %w", ooTable, err)
		}
		if !left {
			res.elapsed = time.Since(start)
			break
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			res.elapsed, res.partial = time.Since(start), true
			break poll
		case err := <-exited:
			stopped = true
			return res, fmt.Errorf("open-outbox exited before the drain ended (%v); its last output:\n%s", err, out.String())
		case <-ctx.Done():
			return res, ctx.Err()
		}
	}
	stopProcess(cmd, exited)
	stopped = true

	var delivered, dead int64
	var last sql.NullTime
	if err := r.admin.QueryRowContext(ctx, `SELECT count(*) FILTER (WHERE status = 'DELIVERED'), count(*) FILTER (WHERE status = 'DEAD'),
		max(delivered_at) FROM `+ooTable).Scan(&delivered, &dead, &last); err != nil {
		return res, fmt.Errorf("count %s: %w", ooTable, err)
	}
	// The table is read after the process stopped: a partial drain's count
	// may include what it marked while being stopped.
	res.unique, res.total = delivered, delivered
	if delivered < int64(n) {
		res.partial = true
	}
	if dead > 0 {
		res.note = fmt.Sprintf("%d DEAD rows", dead)
	}
	if last.Valid && !res.partial {
		res.note = joinNote(res.note, fmt.Sprintf("last delivered_at at +%s", last.Time.Sub(start).Round(time.Millisecond)))
	}
	res.rate = float64(delivered) / res.elapsed.Seconds()
	return res, nil
}

// emptyStart times one open-outbox process at its defaults on an empty
// table, from just before it starts to its first claim query's end, seen
// in pg_stat_activity (the session of its application_name back to idle
// with the claim as its last query), polled every 5 ms. Its other startup
// queries (backlog statistics, the lease reaper) run beside the claim on
// other connections of its pool and do not count. pgx prepares the claim
// in a round trip of its own before running it, which also leaves the
// session idle with that text: the time may be short by that round trip.
func (r ooRunner) emptyStart(ctx context.Context) (time.Duration, error) {
	if err := exec(ctx, r.admin, "TRUNCATE "+ooTable); err != nil {
		return 0, err
	}
	const app = "bench_oo_probe"
	start := time.Now()
	cmd, out, exited, err := r.start(app, nil)
	if err != nil {
		return 0, err
	}
	stopped := false
	defer func() {
		if !stopped {
			stopProcess(cmd, exited)
		}
	}()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	for {
		var polled bool
		if err := r.admin.QueryRowContext(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity
			WHERE application_name = $1 AND state = 'idle' AND query LIKE '%target_events%')`, app).Scan(&polled); err != nil {
			return 0, fmt.Errorf("pg_stat_activity: %w", err)
		}
		if polled {
			return time.Since(start), nil
		}
		select {
		case <-tick.C:
		case <-deadline.C:
			return 0, fmt.Errorf("open-outbox made no claim within 30 s of its start; its last output:\n%s", out.String())
		case err := <-exited:
			stopped = true
			return 0, fmt.Errorf("open-outbox exited at start (%v); its last output:\n%s", err, out.String())
		case <-ctx.Done():
			return 0, ctx.Err()
		}
	}
}

// tailBuffer keeps the last max bytes written to it: a child's output, for
// an error message, without holding a long run's log.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (w *tailBuffer) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.b = append(w.b, p...)
	if len(w.b) > w.max {
		w.b = append(w.b[:0], w.b[len(w.b)-w.max:]...)
	}
	return len(p), nil
}

func (w *tailBuffer) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.b)
}

// loadAverage is /proc/loadavg's 1, 5 and 15 minute load averages, as
// uptime prints them: the scenario's numbers are only as good as the
// machine was quiet.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown (" + err.Error() + ")"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown (" + strings.TrimSpace(string(b)) + ")"
	}
	return strings.Join(f[:3], ", ")
}

// tableReads are PostgreSQL's cumulative counts for a table
// (pg_stat_user_tables, pg_stat_user_indexes): what a drain read and
// wrote, per event, says where a relay's database time goes.
type tableReads struct {
	idxRead, heapFetch, seqRead, upd, hot int64
}

func readTableStats(ctx context.Context, db *sql.DB, table string) (tableReads, error) {
	var r tableReads
	err := db.QueryRowContext(ctx, `SELECT COALESCE(t.idx_tup_fetch, 0), t.seq_tup_read, t.n_tup_upd, t.n_tup_hot_upd,
		(SELECT COALESCE(sum(i.idx_tup_read), 0) FROM pg_stat_user_indexes i WHERE i.relid = t.relid)
		FROM pg_stat_user_tables t WHERE t.relname = $1 AND t.schemaname = current_schema()`, table).
		Scan(&r.heapFetch, &r.seqRead, &r.upd, &r.hot, &r.idxRead)
	if err != nil {
		return r, fmt.Errorf("read %s's statistics: %w", table, err)
	}
	return r, nil
}

func (r tableReads) minus(o tableReads) tableReads {
	return tableReads{r.idxRead - o.idxRead, r.heapFetch - o.heapFetch, r.seqRead - o.seqRead, r.upd - o.upd, r.hot - o.hot}
}

func (r tableReads) perEvent(n int) string {
	f := func(v int64) float64 { return float64(v) / float64(n) }
	return fmt.Sprintf("per event: %.1f index entries read, %.1f heap fetches, %.1f seq-scanned, %.2f updates (%.2f HOT)",
		f(r.idxRead), f(r.heapFetch), f(r.seqRead), f(r.upd), f(r.hot))
}
