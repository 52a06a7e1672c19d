package reliability

// Per-aggregate ordering under load (issue 19): writers commit events of
// many aggregates, relays in child processes deliver them with
// OrderByAggregate, every handler call is recorded with tickets from one
// database sequence taken at its start and at its end, and the test counts
// the events delivered out of turn.

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxtest"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/clause"
	"gorm.io/gorm/logger"
)

const (
	orderingEventsEnv = "OUTBOX_ORDERING_EVENTS"     // committed events per scenario; default per scenario (ordScenario.events)
	orderingOutageEnv = "OUTBOX_ORDERING_OUTAGE"     // length of the destination outage; default 2s
	orderingSeedEnv   = "OUTBOX_ORDERING_SEED"       // seed of the workload and the kill moments; default random
	orderingFailEnv   = "OUTBOX_ORDERING_FAIL_EVERY" // the handler fails the first attempt at one event in this many; default 8, 0 for none
	orderingAsyncEnv  = "OUTBOX_ORDERING_ASYNC"      // "1": the relays deliver through an AsyncHandler (waves), its calls run on goroutines of their own

	// The relay child's settings.
	ordServerEnv     = "OUTBOX_ORDERING_SERVER" // "postgres" or "mysql" (see servers)
	ordLogicalEnv    = "OUTBOX_ORDERING_LOGICAL"
	ordDSNEnv        = "OUTBOX_ORDERING_DSN"
	ordRelayEnv      = "OUTBOX_ORDERING_RELAY"       // the relay's number, recorded with its handler calls
	ordOutageFileEnv = "OUTBOX_ORDERING_OUTAGE_FILE" // while this file exists, the destination is down
	ordLeaseEnv      = "OUTBOX_ORDERING_LEASE"       // the relays' Lease (see ordLease)

	ordEventType   = "ord.event"
	ordAggType     = "ord_aggregates" // the table's name: what a Recorder fills in
	ordRelays      = 4
	ordWriterCount = 4
	ordWorkers     = 4
	ordBatch       = 20

	// ordDestinationLatency stands for the destination's round trip inside
	// a handler call, between its two tickets. It orders nothing; it only
	// gives two calls that run at once the width a real broker call has,
	// so that the tickets show them overlapping.
	ordDestinationLatency = time.Millisecond
)

// ordLease is the relays' lease: short, so that a killed relay's rows are
// claimed again soon, but longer on a loaded machine. A handler's last
// statement, sent before its deadline, can still run on a starved server
// after it: the lease budget's margin (a fifth of the lease) must cover
// that, or the next relay's call overlaps it (CI, load 21: a 2 s lease,
// 0.4 s of margin, gave one overlap and 21 duplicates without a kill).
func ordLease() time.Duration {
	return min(byLoad(4*time.Second), 20*time.Second)
}

func ordRelayConfig(lease time.Duration) outbox.RelayConfig {
	return outbox.RelayConfig{
		BatchSize:        ordBatch,
		Workers:          ordWorkers,
		PollInterval:     20 * time.Millisecond,
		Lease:            lease,
		MaxAttempts:      1000, // kills must not push a row to failed
		Backoff:          func(int) time.Duration { return 10 * time.Millisecond },
		OrderByAggregate: true,
	}
}

// ordScenario is one run of TestOrdering.
type ordScenario struct {
	server  string // "postgres" or "mysql"
	logical bool   // Logical mode, on a cluster of the test's own
	kills   bool   // SIGKILL relays while the writers write, and until every event was delivered once
	outage  bool   // the destination is down for OUTBOX_ORDERING_OUTAGE, a quarter into the run
	events  int    // committed events, unless OUTBOX_ORDERING_EVENTS says otherwise
}

// ordModel is the aggregate: its row holds the number of events written
// for it, read under a row lock by every transaction that writes one, so
// that the writer knows each event's position in its aggregate and writes
// to one aggregate are serialised by the business row, as the README asks.
type ordModel struct {
	ID string `gorm:"primaryKey"`
	N  int
	outbox.Recorder
}

func (ordModel) TableName() string { return ordAggType }

// ordPayload identifies an event: transaction tx's event i, the n-th
// (from 1) of aggregate agg.
type ordPayload struct {
	Agg string `json:"agg"`
	N   int    `json:"n"`
	Tx  string `json:"tx"`
	I   int    `json:"i"`
}

func (p ordPayload) key() string { return p.Tx + "/" + strconv.Itoa(p.I) }

// ordFailsOnce reports whether the handler fails the first attempt at the
// event: one in every (0: none), chosen by its identity, so that it goes
// through the retry path (the table, in Logical mode).
func ordFailsOnce(p ordPayload, every int) bool {
	if every <= 0 {
		return false
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(p.key()))
	return h.Sum32()%uint32(every) == 0
}

// ordSQL is what the tables and the handler's tickets look like on a
// server.
type ordSQL struct {
	ddl  []string
	tick string // an expression for the next value of the sequence ord_clock
}

func ordSQLFor(server string) ordSQL {
	if server == "mysql" {
		const opts = " ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin"
		return ordSQL{tick: "NEXTVAL(ord_clock)", ddl: []string{
			`CREATE TABLE ord_aggregates (id VARCHAR(64) NOT NULL PRIMARY KEY, n INT NOT NULL)` + opts,
			`CREATE TABLE ord_events (tx VARCHAR(64) NOT NULL, i INT NOT NULL, agg VARCHAR(64) NOT NULL, n INT NOT NULL,
    kind VARCHAR(8) NOT NULL, PRIMARY KEY (tx, i), UNIQUE KEY ord_events_agg (agg, n))` + opts,
			// NOCACHE: every value is taken from the sequence's row, in the
			// order the calls reach the server, whichever the session.
			`CREATE SEQUENCE ord_clock NOCACHE`,
			`CREATE TABLE ord_deliveries (id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, tx VARCHAR(64) NOT NULL, i INT NOT NULL,
    agg VARCHAR(64) NOT NULL, n INT NOT NULL, event_id VARCHAR(255) NOT NULL, agg_type VARCHAR(255) NOT NULL, agg_id VARCHAR(255) NOT NULL,
    relay INT NOT NULL, attempt INT NOT NULL, ok BOOLEAN NOT NULL, started BIGINT NOT NULL, ended BIGINT NOT NULL,
    INDEX ord_deliveries_event (tx, i))` + opts,
		}}
	}
	return ordSQL{tick: "nextval('ord_clock')", ddl: []string{
		`CREATE TABLE ord_aggregates (id text PRIMARY KEY, n integer NOT NULL)`,
		`CREATE TABLE ord_events (tx text NOT NULL, i integer NOT NULL, agg text NOT NULL, n integer NOT NULL,
    kind text NOT NULL, PRIMARY KEY (tx, i), UNIQUE (agg, n))`,
		`CREATE SEQUENCE ord_clock`,
		`CREATE TABLE ord_deliveries (id bigserial PRIMARY KEY, tx text NOT NULL, i integer NOT NULL,
    agg text NOT NULL, n integer NOT NULL, event_id text NOT NULL, agg_type text NOT NULL, agg_id text NOT NULL,
    relay integer NOT NULL, attempt integer NOT NULL, ok boolean NOT NULL, started bigint NOT NULL, ended bigint NOT NULL)`,
		`CREATE INDEX ord_deliveries_event ON ord_deliveries (tx, i)`,
	}}
}

// TestOrdering measures per-aggregate ordering with OrderByAggregate:
// violations per events, on MariaDB and PostgreSQL in Persistent mode and
// in Logical mode (a cluster of the test's own), each without and with
// SIGKILLed relays, and in Logical mode through a destination outage.
//
// Four writers commit transactions that each write 1-3 events of one
// aggregate (picked at random among about one per ten events, so each gets
// several over the run), under a lock on the aggregate's row, which holds
// its count of events: the writer numbers the events of each aggregate 1,
// 2, 3, ... as it commits them (ord_events, in the same transaction). One
// transaction in four records its events on the aggregate's model
// (outbox.Recorder); the others publish events with a generated ID, with
// Event.ID set, or with an IdempotencyKey set, in one Publish call or one
// call per event. One transaction in ten rolls back on purpose. The
// handler fails the first attempt at one event in eight (chosen by the
// event's identity), which then goes through the retry path.
//
// Four relays (Run, BatchSize 20, Workers 4, OrderByAggregate) run in child
// processes (this test binary re-executed). With kills, one is SIGKILLed
// every 0.2-0.8 s (in Logical mode, three times in four, the one streaming
// the slot) and a fresh one started, until every committed event was
// delivered once. Through an outage, every handler reports its destination
// down (outbox.Unavailable) for OUTBOX_ORDERING_OUTAGE, from a quarter of
// the events on, and the writers are paced to spread the events over twice
// its length. Every handler call takes a
// ticket from the sequence ord_clock when it starts and another in the
// INSERT that records it (ord_deliveries) before it returns, so the two
// tickets lie within the call: two calls whose ticket intervals overlap
// did run at once, and two that ran one after the other cannot show
// overlapping tickets. After the drain the test counts, each violating
// event once:
//
//   - overlap: a handler call for an event that started while another call
//     for an event of its aggregate (or for itself) was in progress;
//   - order: an event whose first successful delivery started before the
//     first successful delivery of an earlier event of its aggregate ended;
//
// and lost (committed, never delivered) and phantom (delivered, never
// committed). All must be 0.
//
// OUTBOX_ORDERING_EVENTS sets the committed events per scenario (the
// defaults keep each scenario to seconds), OUTBOX_ORDERING_OUTAGE the
// outage's length (default 2s), OUTBOX_ORDERING_FAIL_EVERY how many events
// per failing first attempt (default 8; 0: no planned failure, to tell
// the violations failures cause from those kills or an outage cause), and
// OUTBOX_ORDERING_SEED the workload's and the kills' random choices. The
// mysql scenarios need MariaDB (sequences).
func TestOrdering(t *testing.T) {
	long(t, "minutes of ordered delivery under load and SIGKILLs, per database")
	t.Parallel()
	groups := []struct {
		name     string
		variants []struct {
			name string
			sc   ordScenario
		}
	}{
		{"mariadb", []struct {
			name string
			sc   ordScenario
		}{
			{"steady", ordScenario{server: "mysql", events: 4000}},
			{"kills", ordScenario{server: "mysql", kills: true, events: 4000}},
		}},
		{"postgres", []struct {
			name string
			sc   ordScenario
		}{
			{"steady", ordScenario{server: "postgres", events: 4000}},
			{"kills", ordScenario{server: "postgres", kills: true, events: 4000}},
		}},
		{"logical", []struct {
			name string
			sc   ordScenario
		}{
			{"steady", ordScenario{server: "postgres", logical: true, events: 2000}},
			{"kills", ordScenario{server: "postgres", logical: true, kills: true, events: 3000}},
			{"outage", ordScenario{server: "postgres", logical: true, outage: true, events: 400}},
		}},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			t.Parallel() // the groups run at once; the variants of a group one after the other
			for _, v := range g.variants {
				t.Run(v.name, func(t *testing.T) { runOrdering(t, g.name+"/"+v.name, v.sc) })
			}
		})
	}
}

func runOrdering(t *testing.T, name string, sc ordScenario) {
	events := envInt(t, orderingEventsEnv, sc.events)
	failEvery := envInt(t, orderingFailEnv, 8)
	planned := "none"
	if failEvery > 0 {
		planned = "1/" + strconv.Itoa(failEvery)
	}
	outageFor := 2 * time.Second
	if v := os.Getenv(orderingOutageEnv); v != "" {
		d, err := time.ParseDuration(v)
		require.NoError(t, err, "%s", orderingOutageEnv)
		outageFor = d
	}
	seed := uint64(envInt(t, orderingSeedEnv, int(rand.Int32())))
	rng := rand.New(rand.NewPCG(seed, 0))
	t.Logf("ordering %s: %d events, first attempts failing: %s, seed %d (%s=%d reproduces the workload and the kills' choices)", name, events, planned, seed, orderingSeedEnv, seed)

	// The database, the outbox (the writers publish through it) and the
	// test's tables.
	var (
		dsn    string
		dsnFor func(tag string) string // a relay child's DSN
		cfg    = outbox.Config{Logger: newLogSink().logger()}
		open   = postgres.Open
	)
	switch {
	case sc.logical:
		_, dsn = logicalCluster(t)
		cfg = logicalConfig(cfg.Logger)
		dsnFor = func(tag string) string { return withParam(t, dsn, "application_name", tag) }
	case sc.server == "mysql":
		s := mysqlServer()
		dsn, open = s.fresh(t), s.open
		dsnFor = func(string) string { return dsn }
	default:
		dsn = postgresSchema(t)
		dsnFor = func(tag string) string { return withParam(t, dsn, "application_name", tag) }
	}
	db := openGorm(t, open(dsn))
	if sc.server == "mysql" {
		var version string
		require.NoError(t, db.Raw(`SELECT VERSION()`).Scan(&version).Error)
		if !strings.Contains(strings.ToLower(version), "mariadb") {
			t.Skipf("the ordering test's tickets are a SEQUENCE, which MySQL %s does not have; it needs MariaDB", version)
		}
	}
	q := ordSQLFor(sc.server)
	for _, stmt := range q.ddl {
		require.NoError(t, db.Exec(stmt).Error)
	}
	ob := install(t, db, cfg)
	// The relays run without migrations (several processes starting at
	// once); one relay run here creates the ordering index first.
	lease := ordLease()
	_, err := outboxtest.Relay(t, ob, db, ordRelayConfig(lease)).ProcessOnce(context.Background())
	require.NoError(t, err)
	require.True(t, ordIndexExists(t, db, sc.server, ob.Table()+"_aggregate_idx"), "the ordering index was not created")

	aggs := make([]string, max(20, events/10))
	for i := range aggs {
		aggs[i] = fmt.Sprintf("a%05d", i)
	}
	for chunk := range slices.Chunk(aggs, 500) {
		rows := make([]ordModel, len(chunk))
		for i, id := range chunk {
			rows[i] = ordModel{ID: id}
		}
		require.NoError(t, db.Create(&rows).Error)
	}

	// The relays.
	outageFile := filepath.Join(t.TempDir(), "destination-down")
	rs := &ordRelaySet{t: t, dsnFor: dsnFor, env: []string{
		childRoleEnv + "=ordering", ordServerEnv + "=" + sc.server, ordLogicalEnv + "=" + strconv.FormatBool(sc.logical),
		ordOutageFileEnv + "=" + outageFile, orderingFailEnv + "=" + strconv.Itoa(failEvery),
		ordLeaseEnv + "=" + lease.String(), orderingAsyncEnv + "=" + os.Getenv(orderingAsyncEnv),
	}}
	for range ordRelays {
		rs.start()
	}
	for _, c := range rs.live {
		c.waitReady(t)
	}
	if sc.logical {
		waitSlotHeld(t, db)
	}

	// The writers. Through an outage they are paced, so that events are
	// committed before, during and after it.
	var interval time.Duration
	if sc.outage {
		// about 2 events per transaction, spread over twice the outage
		txs := max(1, events/2)
		interval = time.Duration(int64(2*outageFor) * ordWriterCount / int64(txs))
	}
	start := time.Now()
	w := startOrdWriters(db, aggs, events, seed, interval)
	t.Cleanup(w.stop)

	undelivered := func() (int64, error) {
		var n int64
		err := db.Raw(`SELECT count(*) FROM ord_events e WHERE NOT EXISTS
			(SELECT 1 FROM ord_deliveries d WHERE d.tx = e.tx AND d.i = e.i AND d.ok)`).Scan(&n).Error
		return n, err
	}
	var outageTook time.Duration
	switch {
	case sc.kills:
		// Kill while the writers write, and on until every committed
		// event was delivered at least once.
		for {
			waitKillMoment(time.Duration(200+rng.IntN(600)) * time.Millisecond)
			if w.finished() {
				n, err := undelivered()
				require.NoError(t, err)
				if n == 0 {
					break
				}
			}
			rs.killOne(t, db, sc.logical, rng)
			rs.start()
			// The next kill comes once the replacement runs: on a slow
			// machine, where a relay takes longer to start than the
			// interval between kills, kills at a fixed pace would stall
			// delivery (every relay killed before it got going).
			rs.live[len(rs.live)-1].waitReady(t)
		}
	case sc.outage:
		select {
		case <-w.quarter:
		case <-w.done: // a writer failed: wait reports it
		}
		require.NoError(t, os.WriteFile(outageFile, nil, 0o600))
		began := time.Now()
		waitKillMoment(outageFor)
		require.NoError(t, os.Remove(outageFile))
		outageTook = time.Since(began)
	}
	require.NoError(t, w.wait())
	wrote := time.Since(start)

	// The drain: every committed event delivered, and no row left unsent
	// (a killed relay's leased rows are delivered again once its lease
	// has passed).
	// It fails when neither count has gone down for a minute (scaled):
	// a slow machine drains slowly, a defect does not drain.
	waitDrained(t, time.Minute, func() (int64, error) {
		n, err := undelivered()
		if err != nil {
			return -1, err
		}
		var unsent int64
		if err := db.Table(ob.Table()).Where("status <> ?", outbox.StatusSent).Count(&unsent).Error; err != nil {
			return -1, err
		}
		if n > 0 || unsent > 0 {
			return n + unsent, fmt.Errorf("%d committed events not delivered, %d rows not sent", n, unsent)
		}
		return 0, nil
	})
	for len(rs.live) > 0 {
		rs.kill(t, 0, false)
	}

	var committed []ordCommitted
	require.NoError(t, db.Raw(`SELECT tx, i, agg, n, kind FROM ord_events`).Scan(&committed).Error)
	var calls []ordCall
	require.NoError(t, db.Raw(`SELECT tx, i, agg, n, event_id, agg_type, agg_id, relay, attempt, ok, started, ended FROM ord_deliveries`).Scan(&calls).Error)
	rep := countOrdering(committed, calls)
	require.Positive(t, rep.committed, "nothing was committed: the test proves nothing")
	assert.Equal(t, w.committed.Load(), int64(rep.committed), "the writers' count of committed events and ord_events disagree")
	for _, ex := range rep.examples {
		t.Logf("violation: %s", ex)
	}
	assert.Zero(t, rep.overlap, "events whose handler call overlapped another call for their aggregate")
	assert.Zero(t, rep.order, "events delivered before an earlier event of their aggregate was")
	assert.Zero(t, rep.lost, "committed events never delivered")
	assert.Zero(t, rep.phantom, "events delivered whose transaction did not commit")
	assert.Zero(t, rep.mismatched, "deliveries whose aggregate or position is not the one the writer committed")

	outage := ""
	if sc.outage {
		outage = fmt.Sprintf(" outage=%v", outageTook.Round(time.Millisecond))
	}
	t.Logf("ORDERING-RESULT scenario=%s events=%d txs=%d rolled_back=%d delivered=%d distinct=%d violations_overlap=%d violations_order=%d violating_events=%d violating_by_kind=%s lost=%d phantom=%d duplicates=%d kills=%d failed_attempts=%d planned_failures=%s%s aggregates=%d relays=%d workers=%d batch=%d async=%v write_phase=%v total=%v seed=%d",
		name, rep.committed, w.txs.Load(), w.rolledBack.Load(), rep.delivered, rep.distinct, rep.overlap, rep.order, rep.violating, rep.byKind(),
		rep.lost, rep.phantom, rep.duplicates, rs.kills, rep.failedCalls, planned, outage, len(aggs), ordRelays, ordWorkers, ordBatch, os.Getenv(orderingAsyncEnv) == "1",
		wrote.Round(time.Millisecond), time.Since(start).Round(time.Millisecond), seed)
}

// ordIndexExists reports whether the outbox table has the index name.
func ordIndexExists(t *testing.T, db *gorm.DB, server, name string) bool {
	t.Helper()
	var n int64
	if server == "mysql" {
		require.NoError(t, db.Raw(`SELECT count(*) FROM information_schema.statistics WHERE table_schema = DATABASE() AND index_name = ?`, name).Scan(&n).Error)
	} else {
		require.NoError(t, db.Raw(`SELECT count(*) FROM pg_class WHERE oid = to_regclass(?)`, name).Scan(&n).Error)
	}
	return n > 0
}

// waitSlotHeld waits until a relay streams the slot.
func waitSlotHeld(t *testing.T, db *gorm.DB) string {
	t.Helper()
	var holder string
	eventually(t, 30*time.Second, func() error {
		if holder = slotHolder(t, db); holder == "" {
			return errors.New("no relay streams the slot")
		}
		return nil
	})
	return holder
}

// ordRelaySet is the relay children running.
type ordRelaySet struct {
	t      *testing.T
	env    []string
	dsnFor func(tag string) string
	next   int
	live   []*crashChild
	kills  int
}

func (rs *ordRelaySet) start() {
	id := rs.next
	rs.next++
	tag := fmt.Sprintf("outbox-ord-%s-%d", randomHex(3), id)
	env := append(slices.Clone(rs.env), ordDSNEnv+"="+rs.dsnFor(tag), ordRelayEnv+"="+strconv.Itoa(id))
	rs.live = append(rs.live, startLogicalChild(rs.t, tag, "TestOrderingRelayChild", env...))
}

// kill SIGKILLs live relay i (failing the test if it had exited on its
// own) and forgets it.
func (rs *ordRelaySet) kill(t *testing.T, i int, count bool) {
	t.Helper()
	rs.live[i].kill(t)
	rs.live = slices.Delete(rs.live, i, i+1)
	if count {
		rs.kills++
	}
}

// killOne SIGKILLs a relay: in Logical mode, three times in four the one
// streaming the slot (the others stand by and retry the table), once it
// streams; otherwise one at random.
func (rs *ordRelaySet) killOne(t *testing.T, db *gorm.DB, logical bool, rng *rand.Rand) {
	t.Helper()
	i := rng.IntN(len(rs.live))
	if logical && rng.IntN(4) != 0 {
		holder := waitSlotHeld(t, db)
		for j, c := range rs.live {
			if c.tag == holder {
				i = j
			}
		}
	}
	rs.kill(t, i, true)
}

// ordWriters commit transactions until target events are committed.
type ordWriters struct {
	target     int64
	committed  atomic.Int64 // events
	txs        atomic.Int64 // committed transactions
	rolledBack atomic.Int64
	quarter    chan struct{} // closed once a quarter of target is committed
	done       chan struct{} // closed once every writer has returned
	cancel     context.CancelFunc
	once       sync.Once
	mu         sync.Mutex
	err        error
}

// startOrdWriters starts ordWriterCount writers; with interval > 0, each
// begins a transaction every interval.
func startOrdWriters(db *gorm.DB, aggs []string, target int, seed uint64, interval time.Duration) *ordWriters {
	ctx, cancel := context.WithCancel(context.Background())
	w := &ordWriters{target: int64(target), quarter: make(chan struct{}), done: make(chan struct{}), cancel: cancel}
	var wg sync.WaitGroup
	for k := range ordWriterCount {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(k+1)))
			var tick <-chan time.Time
			if interval > 0 {
				ticker := time.NewTicker(interval)
				defer ticker.Stop()
				tick = ticker.C
			}
			for seq := 0; ctx.Err() == nil && w.committed.Load() < w.target; seq++ {
				if tick != nil {
					select {
					case <-ctx.Done():
						return
					case <-tick:
					}
				}
				rollback := rng.IntN(10) == 0
				id := fmt.Sprintf("w%d-%06d", k, seq)
				if rollback {
					id = "rb-" + id
				}
				n, err := writeOrdTx(ctx, db, rng, aggs, id, rollback)
				if err != nil {
					if ctx.Err() == nil {
						w.fail(fmt.Errorf("writer %d, transaction %s: %w", k, id, err))
					}
					return
				}
				if rollback {
					w.rolledBack.Add(1)
					continue
				}
				w.txs.Add(1)
				if w.committed.Add(int64(n)) >= w.target/4 {
					w.once.Do(func() { close(w.quarter) })
				}
			}
		}()
	}
	go func() { wg.Wait(); close(w.done) }()
	return w
}

func (w *ordWriters) fail(err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.err == nil {
		w.err = err
		w.cancel()
	}
}

func (w *ordWriters) finished() bool {
	select {
	case <-w.done:
		return true
	default:
		return false
	}
}

// wait waits for the writers and returns the first error one met.
func (w *ordWriters) wait() error {
	<-w.done
	w.once.Do(func() { close(w.quarter) })
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.err
}

func (w *ordWriters) stop() { w.cancel(); <-w.done }

// writeOrdTx commits (or, with rollback, rolls back on purpose) one
// transaction writing 1-3 events of one aggregate, and returns how many.
// A deadlock or a serialisation failure is tried again.
func writeOrdTx(ctx context.Context, db *gorm.DB, rng *rand.Rand, aggs []string, id string, rollback bool) (int, error) {
	agg := aggs[rng.IntN(len(aggs))]
	kinds := make([]string, 1+rng.IntN(3))
	recorder := rng.IntN(4) == 0
	for i := range kinds {
		kinds[i] = "rec"
		if !recorder {
			kinds[i] = [...]string{"gen", "id", "key"}[rng.IntN(3)]
		}
	}
	oneCall := rng.IntN(2) == 0
	for attempt := 1; ; attempt++ {
		err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			var m ordModel
			if err := tx.Clauses(clause.Locking{Strength: "UPDATE"}).Where("id = ?", agg).Take(&m).Error; err != nil {
				return err
			}
			evs := make([]outbox.Event, len(kinds))
			var rows []string
			var args []any
			for i, kind := range kinds {
				p := ordPayload{Agg: agg, N: m.N + 1 + i, Tx: id, I: i}
				e := outbox.Event{Type: ordEventType, Payload: p}
				if kind != "rec" { // a Recorder fills in the model's table and key
					e.AggregateType, e.AggregateID = ordAggType, agg
				}
				switch kind {
				case "id":
					e.ID = "x:" + p.key()
				case "key":
					e.IdempotencyKey = "k:" + p.key()
				}
				evs[i] = e
				rows = append(rows, "(?, ?, ?, ?, ?)")
				args = append(args, id, i, agg, p.N, kind)
			}
			if err := tx.Exec(`INSERT INTO ord_events (tx, i, agg, n, kind) VALUES `+strings.Join(rows, ", "), args...).Error; err != nil {
				return err
			}
			switch {
			case recorder:
				m.N += len(kinds)
				m.Record(evs...)
				if err := tx.Save(&m).Error; err != nil {
					return err
				}
			default:
				if err := tx.Exec(`UPDATE ord_aggregates SET n = ? WHERE id = ?`, m.N+len(kinds), agg).Error; err != nil {
					return err
				}
				if oneCall {
					if err := outbox.Publish(tx, evs...); err != nil {
						return err
					}
				} else {
					for _, e := range evs {
						if err := outbox.Publish(tx, e); err != nil {
							return err
						}
					}
				}
			}
			if rollback {
				return errRollback
			}
			return nil
		})
		switch {
		case err == nil:
			return len(kinds), nil
		case rollback && errors.Is(err, errRollback):
			return 0, nil
		case attempt < 10 && ordRetryable(err):
			continue
		default:
			return 0, err
		}
	}
}

// ordRetryable reports a deadlock or a lock wait timeout (MySQL) or a
// deadlock or serialisation failure (PostgreSQL).
func ordRetryable(err error) bool {
	var me *mysqldriver.MySQLError
	if errors.As(err, &me) {
		return me.Number == 1213 || me.Number == 1205
	}
	var pe *pgconn.PgError
	return errors.As(err, &pe) && (pe.Code == "40P01" || pe.Code == "40001")
}

// ordHandler records every call as a row of ord_deliveries, with a ticket
// taken as it starts and one taken by the INSERT before it returns. It
// fails the first attempt at the events ordFailsOnce picks (recorded with
// ok false), and while outageFile exists reports its destination down
// without recording anything.
func ordHandler(db *gorm.DB, q ordSQL, relay, failEvery int, outageFile string) outbox.Handler {
	return func(ctx context.Context, e outbox.Event) error {
		var p ordPayload
		if err := e.DecodePayload(&p); err != nil || p.Tx == "" {
			return outbox.Permanent(fmt.Errorf("event %s: payload: %v", e.ID, err))
		}
		if _, err := os.Stat(outageFile); err == nil {
			return outbox.Unavailable(errors.New("destination down"))
		}
		var started int64
		if err := db.WithContext(ctx).Raw(`SELECT ` + q.tick).Scan(&started).Error; err != nil {
			return err
		}
		latency := time.NewTimer(ordDestinationLatency)
		select {
		case <-ctx.Done():
			latency.Stop()
			return ctx.Err()
		case <-latency.C:
		}
		attempt := outbox.Attempt(ctx)
		ok := attempt > 1 || !ordFailsOnce(p, failEvery)
		if err := db.WithContext(ctx).Exec(`INSERT INTO ord_deliveries (tx, i, agg, n, event_id, agg_type, agg_id, relay, attempt, ok, started, ended)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, `+q.tick+`)`,
			p.Tx, p.I, p.Agg, p.N, e.ID, e.AggregateType, e.AggregateID, relay, attempt, ok, started).Error; err != nil {
			return err
		}
		if !ok {
			return errors.New("the first attempt fails")
		}
		return nil
	}
}

// ordAsync is h as an AsyncHandler whose deliveries run at once, each on
// a goroutine of its own: a wave's calls overlap, so the tickets show
// whether the relay kept an aggregate's calls apart. wait waits for the
// call, which honours its context.
func ordAsync(h outbox.Handler) outbox.AsyncHandler {
	return func(ctx context.Context, e outbox.Event) func() error {
		done := make(chan error, 1)
		go func() { done <- h(ctx, e) }()
		return func() error { return <-done }
	}
}

// TestOrderingRelayChild is a relay of TestOrdering: Run with
// OrderByAggregate and ordHandler. It runs until it is killed, or until its
// parent goes away.
func TestOrderingRelayChild(t *testing.T) {
	if os.Getenv(childRoleEnv) != "ordering" {
		t.Skip("helper process of TestOrdering; runs only when re-executed by it")
	}
	// The parent holds our stdin; if it dies, stop.
	go func() {
		_, _ = io.Copy(io.Discard, os.Stdin)
		os.Exit(0)
	}()
	fail := func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "ordering relay: "+format+"\n", args...)
		os.Exit(2)
	}
	relay, err := strconv.Atoi(os.Getenv(ordRelayEnv))
	if err != nil {
		fail("relay: %v", err)
	}
	server := os.Getenv(ordServerEnv)
	s, ok := serverNamed(server)
	if !ok {
		fail("unknown server %q", server)
	}
	db, err := gorm.Open(s.open(os.Getenv(ordDSNEnv)), &gorm.Config{Logger: logger.Discard})
	if err != nil {
		fail("open: %v", err)
	}
	if sqlDB, err := db.DB(); err == nil {
		sqlDB.SetMaxOpenConns(2 * ordWorkers)
	}
	cfg := outbox.Config{DisableAutoMigrate: true}
	if os.Getenv(ordLogicalEnv) == "true" {
		cfg = logicalConfig(nil)
		cfg.DisableAutoMigrate = true
	}
	cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelError}))
	ob := outbox.Plugin(cfg)
	if err := db.Use(ob); err != nil {
		fail("use: %v", err)
	}
	failEvery, err := strconv.Atoi(os.Getenv(orderingFailEnv))
	if err != nil {
		fail("%s: %v", orderingFailEnv, err)
	}
	h := ordHandler(db, ordSQLFor(server), relay, failEvery, os.Getenv(ordOutageFileEnv))
	if os.Getenv(orderingAsyncEnv) == "1" {
		ob.HandleAsync(ordEventType, ordAsync(h))
	} else {
		ob.Handle(ordEventType, h)
	}
	lease, err := time.ParseDuration(os.Getenv(ordLeaseEnv))
	if err != nil {
		fail("%s: %v", ordLeaseEnv, err)
	}
	r, err := ob.Relay(db, ordRelayConfig(lease))
	if err != nil {
		fail("relay: %v", err)
	}
	go func() {
		if err := r.Run(context.Background()); err != nil {
			fail("relay: %v", err)
		}
	}()
	fmt.Println("ready")
	select {}
}

// ordCommitted is an event the writers committed (ord_events).
type ordCommitted struct {
	Tx   string
	I    int
	Agg  string
	N    int
	Kind string
}

// ordCall is a handler call (ord_deliveries).
type ordCall struct {
	Tx      string
	I       int
	Agg     string
	N       int
	EventID string
	AggType string
	AggID   string
	Relay   int
	Attempt int
	OK      bool
	Started int64
	Ended   int64
}

func (c ordCall) key() string { return c.Tx + "/" + strconv.Itoa(c.I) }

// ordReport is what countOrdering finds.
type ordReport struct {
	committed   int
	delivered   int // successful calls
	distinct    int // committed events delivered
	duplicates  int // successful calls beyond an event's first
	failedCalls int
	overlap     int // events with a call that overlapped another of their aggregate
	order       int // events first delivered before an earlier one of their aggregate was
	violating   int // events in either set
	violKinds   map[string]int
	lost        int
	phantom     int // successful calls for events never committed
	mismatched  int // calls whose aggregate or position differs from what was committed
	examples    []string
}

func (r ordReport) byKind() string {
	var parts []string
	for _, k := range []string{"gen", "id", "key", "rec"} {
		parts = append(parts, fmt.Sprintf("%s:%d", k, r.violKinds[k]))
	}
	return strings.Join(parts, ",")
}

// countOrdering counts the violations, each violating event once, and the
// lost, phantom and duplicate deliveries.
func countOrdering(committed []ordCommitted, calls []ordCall) ordReport {
	rep := ordReport{committed: len(committed), violKinds: map[string]int{}}
	events := make(map[string]ordCommitted, len(committed))
	for _, e := range committed {
		events[e.Tx+"/"+strconv.Itoa(e.I)] = e
	}
	byAgg := map[string][]ordCall{}
	first := map[string]ordCall{} // an event's first successful delivery
	okCalls := map[string]int{}
	for _, c := range calls {
		e, ok := events[c.key()]
		if !ok {
			if c.OK {
				rep.phantom++
			}
			continue
		}
		if c.Agg != e.Agg || c.N != e.N || c.AggType != ordAggType || c.AggID != e.Agg {
			rep.mismatched++
		}
		byAgg[e.Agg] = append(byAgg[e.Agg], c)
		if !c.OK {
			rep.failedCalls++
			continue
		}
		rep.delivered++
		okCalls[c.key()]++
		if f, seen := first[c.key()]; !seen || c.Started < f.Started {
			first[c.key()] = c
		}
	}
	rep.distinct = len(okCalls)
	rep.duplicates = rep.delivered - rep.distinct
	rep.lost = rep.committed - rep.distinct

	overlap, order := map[string]bool{}, map[string]bool{}
	example := func(format string, args ...any) {
		if len(rep.examples) < 10 {
			rep.examples = append(rep.examples, fmt.Sprintf(format, args...))
		}
	}
	describe := func(c ordCall) string {
		return fmt.Sprintf("%s #%d (%s, tx %s, relay %d, attempt %d, ok %v, tickets %d-%d)",
			c.Agg, c.N, events[c.key()].Kind, c.Tx, c.Relay, c.Attempt, c.OK, c.Started, c.Ended)
	}
	aggIDs := make([]string, 0, len(byAgg))
	for a := range byAgg {
		aggIDs = append(aggIDs, a)
	}
	sort.Strings(aggIDs)
	for _, a := range aggIDs {
		cs := byAgg[a]
		// Overlap: a call that starts before an earlier-started call of
		// the aggregate has ended.
		sort.Slice(cs, func(i, j int) bool { return cs[i].Started < cs[j].Started })
		var open ordCall
		for i, c := range cs {
			if i > 0 && c.Started < open.Ended {
				if !overlap[c.key()] {
					example("overlap: %s started while %s ran", describe(c), describe(open))
				}
				overlap[c.key()] = true
			}
			if i == 0 || c.Ended > open.Ended {
				open = c
			}
		}
		// Order: in the writer's order, an event whose first delivery
		// started before an earlier event's first delivery ended.
		var evs []ordCall
		for _, c := range first {
			if c.Agg == a {
				evs = append(evs, c)
			}
		}
		sort.Slice(evs, func(i, j int) bool { return evs[i].N < evs[j].N })
		var latest ordCall
		for i, c := range evs {
			if i > 0 && c.Started < latest.Ended {
				example("order: %s was first delivered before %s had been", describe(c), describe(latest))
				order[c.key()] = true
			}
			if i == 0 || c.Ended > latest.Ended {
				latest = c
			}
		}
	}
	rep.overlap, rep.order = len(overlap), len(order)
	for k := range events {
		if overlap[k] || order[k] {
			rep.violating++
			rep.violKinds[events[k].Kind]++
		}
	}
	return rep
}

// TestOrderingCounts checks countOrdering on handler calls made up for it.
func TestOrderingCounts(t *testing.T) {
	ev := func(tx string, i int, agg string, n int, kind string) ordCommitted {
		return ordCommitted{Tx: tx, I: i, Agg: agg, N: n, Kind: kind}
	}
	call := func(e ordCommitted, ok bool, started, ended int64) ordCall {
		return ordCall{Tx: e.Tx, I: e.I, Agg: e.Agg, N: e.N, AggType: ordAggType, AggID: e.Agg, OK: ok, Started: started, Ended: ended, Attempt: 1}
	}
	a1, a2, a3 := ev("t1", 0, "a", 1, "gen"), ev("t1", 1, "a", 2, "id"), ev("t2", 0, "a", 3, "key")
	b1, b2 := ev("t3", 0, "b", 1, "rec"), ev("t3", 1, "b", 2, "rec")
	c1, c2 := ev("t4", 0, "c", 1, "gen"), ev("t5", 0, "c", 2, "id")
	committed := []ordCommitted{a1, a2, a3, b1, b2, c1, c2, ev("t6", 0, "d", 1, "gen")}
	calls := []ordCall{
		// a: in order, a1 failing once first; a3 delivered twice, one
		// after the other.
		call(a1, false, 1, 2), call(a1, true, 3, 4), call(a2, true, 5, 6), call(a3, true, 7, 8), call(a3, true, 9, 10),
		// b: b2 starts while b1 runs: overlap and order for b2.
		call(b1, true, 11, 14), call(b2, true, 12, 13),
		// c: c2 delivered first, c1 after it: order for c2 (not overlap);
		// then c1 again while c2 is redelivered: overlap for c1 too.
		call(c2, true, 15, 16), call(c1, true, 17, 18), call(c2, true, 19, 22), call(c1, true, 20, 21),
		// t6 is never delivered (lost); t9 never committed (phantom).
		{Tx: "t9", I: 0, Agg: "d", N: 1, AggType: ordAggType, AggID: "d", OK: true, Started: 23, Ended: 24},
	}
	rep := countOrdering(committed, calls)
	assert.Equal(t, 8, rep.committed)
	assert.Equal(t, 10, rep.delivered)
	assert.Equal(t, 7, rep.distinct)
	assert.Equal(t, 3, rep.duplicates)
	assert.Equal(t, 1, rep.failedCalls)
	assert.Equal(t, 2, rep.overlap, "b2 and c1")
	assert.Equal(t, 2, rep.order, "b2 and c2")
	assert.Equal(t, 3, rep.violating, "b2, c1, c2")
	assert.Equal(t, "gen:1,id:1,key:0,rec:1", rep.byKind())
	assert.Equal(t, 1, rep.lost)
	assert.Equal(t, 1, rep.phantom)
	assert.Zero(t, rep.mismatched)

	bad := call(a1, true, 1, 2)
	bad.AggID = "elsewhere"
	assert.Equal(t, 1, countOrdering([]ordCommitted{a1}, []ordCall{bad}).mismatched)
}
