package outbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/maint"
	"github.com/gorm-outbox/outbox/internal/store"
	mysqlstore "github.com/gorm-outbox/outbox/internal/store/mysql"
	pgstore "github.com/gorm-outbox/outbox/internal/store/postgres"
	"github.com/gorm-outbox/outbox/internal/store/sqlbuild"
	sqlitestore "github.com/gorm-outbox/outbox/internal/store/sqlite"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// productionTests cover the relay features meant for running several
// instances under load.
var productionTests = map[string]func(*testing.T, backend){
	"WorkersDeliverConcurrently":      testWorkers,
	"WakeUpInProcess":                 testWakeInProcess,
	"WakeUpAcrossProcesses":           testWakeAcrossProcesses,
	"DeliverAfterCommit":              testDeliverAfterCommit,
	"OrderByAggregate":                testOrderByAggregate,
	"OrderByAggregateFailedHoldsBack": testOrderFailedHoldsBack,
	"HandlerTimeout":                  testHandlerTimeout,
	"Retention":                       testRetention,
	"ClaimUsesPendingIndex":           testClaimPlan,
	"ShutdownReleasesClaims":          testShutdownReleases,
	"StatsAndDelivered":               testStatsAndDelivered,
	"ListenUnavailablePolls":          testListenUnavailable,
	"OutcomesGuardedByLease":          testOutcomeGuards,
	"GeneratedEventsInsertPlainly":    testGeneratedEventsInsertPlainly,
}

func testWorkers(t *testing.T, b backend) {
	e := b.setup(t)
	const workers = 4
	var inFlight, peak atomic.Int32
	release := make(chan struct{})
	e.ob.Handle("x", func(ctx context.Context, _ Event) error {
		n := inFlight.Add(1)
		defer inFlight.Add(-1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		if n == workers {
			close(release) // every worker is in a handler at once
		}
		select {
		case <-release:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	})
	publishN(t, e.db, "x", workers)
	n, err := e.relay(RelayConfig{Workers: workers}).ProcessOnce(t.Context())
	require.NoError(t, err)
	assert.Equal(t, workers, n)
	assert.EqualValues(t, workers, peak.Load())
	assert.EqualValues(t, workers, e.count("status = ?", StatusSent))
}

// runRelay starts Run in the background and returns a stop function that
// cancels it and waits for it to return.
func runRelay(t *testing.T, r *Relay) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	var once sync.Once
	stop = func() {
		once.Do(func() {
			cancel()
			select {
			case err := <-done:
				require.NoError(t, err)
			case <-time.After(30 * time.Second):
				t.Error("Run did not return after cancel")
			}
		})
	}
	t.Cleanup(stop)
	return stop
}

// receive waits for a delivery; the deadline is far above the expected
// milliseconds so a slow CI machine does not flake, while the relay's poll
// interval (an hour) is further still: only a wake-up can deliver in time.
func receive(t *testing.T, ch <-chan string) string {
	t.Helper()
	select {
	case id := <-ch:
		return id
	case <-time.After(10 * time.Second):
		t.Fatal("event not delivered: no wake-up reached the relay")
		return ""
	}
}

func testWakeInProcess(t *testing.T, b backend) {
	e := b.setup(t, withConfig(Config{DisableNotify: true})) // no LISTEN: only the in-process wake-up can find the event
	got := make(chan string, 10)
	e.ob.Handle("x", func(_ context.Context, ev Event) error { got <- ev.ID; return nil })
	runRelay(t, e.relay(RelayConfig{PollInterval: time.Hour}))
	// Let the relay's first (empty) claim pass, so only a wake-up can find
	// the event.
	require.Eventually(t, func() bool { return len(e.ob.wakersSnapshot()) == 1 }, 5*time.Second, time.Millisecond)

	require.NoError(t, e.db.Transaction(func(tx *gorm.DB) error { return Publish(tx, Event{ID: "in-tx", Type: "x"}) }))
	assert.Equal(t, "in-tx", receive(t, got))
	require.NoError(t, PublishAlone(e.db, Event{ID: "no-tx", Type: "x"}))
	assert.Equal(t, "no-tx", receive(t, got))
}

func (o *Outbox) wakersSnapshot() []*waker {
	var out []*waker
	o.sites.Range(func(_, s any) bool {
		ws := &s.(*site).wakers
		ws.mu.Lock()
		defer ws.mu.Unlock()
		for w := range ws.set {
			out = append(out, w)
		}
		return true
	})
	return out
}

func testWakeAcrossProcesses(t *testing.T, b backend) {
	if b.name != "postgres" {
		t.Skip("LISTEN/NOTIFY is PostgreSQL's; SQLite relays poll or are woken in-process")
	}
	// A table of its own: its NOTIFY channel is this test's alone.
	e := b.setup(t, withConfig(Config{Table: randomName("wake_")}))
	got := make(chan string, 10)
	e.ob.Handle("x", func(_ context.Context, ev Event) error { got <- ev.ID; return nil })
	r := e.relay(RelayConfig{PollInterval: time.Hour})
	runRelay(t, r)

	// Another "process": its own connection pool and its own Outbox on the
	// same schema, so no in-process wake-up can reach the relay.
	writerDB := e.reopen(t)
	writer := Plugin(Config{Logger: e.ob.logger, Table: e.ob.Table()})
	writer.clock = e.clock.Now // one clock for both "processes"
	require.NoError(t, writerDB.Use(writer))

	// Once the relay listens, only a NOTIFY can wake it before its hour-long
	// poll.
	var channel string
	base := e.ob.store.(store.Notifier).Channel()
	require.NoError(t, e.db.Raw("SELECT "+strings.ReplaceAll(pgstore.ChannelSQL, "$1", "?"), base, base).Scan(&channel).Error)
	assert.NotEqual(t, base, channel, "a schema of its own, a channel of its own")
	require.Eventually(t, func() bool {
		var n int64
		require.NoError(t, e.db.Raw("SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database() AND query = ?",
			`LISTEN "`+channel+`"`).Scan(&n).Error)
		return n > 0
	}, 10*time.Second, time.Millisecond, "the relay listens")
	require.NoError(t, writerDB.Transaction(func(tx *gorm.DB) error { return Publish(tx, Event{ID: "remote", Type: "x"}) }))
	assert.Equal(t, "remote", receive(t, got))
}

func testDeliverAfterCommit(t *testing.T, b backend) {
	e := b.setup(t, withConfig(Config{DeliverAfterCommit: true, DisableNotify: true}))
	var mu sync.Mutex
	seen := map[string]int{}
	got := make(chan string, 1000)
	e.ob.Handle("x", func(_ context.Context, ev Event) error {
		mu.Lock()
		seen[ev.ID]++
		mu.Unlock()
		got <- ev.ID
		return nil
	})
	// Two relays in this process plus one polling: the fresh IDs go through
	// the same claim, so nothing is delivered twice.
	runRelay(t, e.relay(RelayConfig{PollInterval: time.Hour}))
	runRelay(t, e.relay(RelayConfig{PollInterval: time.Hour}))
	runRelay(t, e.relay(RelayConfig{PollInterval: 5 * time.Millisecond}))

	const writers, each = 4, 25
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range each {
				err := e.db.Transaction(func(tx *gorm.DB) error {
					return Publish(tx, Event{ID: fmt.Sprintf("w%d-%d", w, i), Type: "x"})
				})
				if err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	for range writers * each {
		receive(t, got)
	}
	require.Eventually(t, func() bool { return e.count("status = ?", StatusSent) == writers*each }, 10*time.Second, 5*time.Millisecond)
	mu.Lock()
	defer mu.Unlock()
	assert.Len(t, seen, writers*each)
	for id, n := range seen {
		assert.Equal(t, 1, n, "event %s delivered %d times", id, n)
	}
}

func testOrderByAggregate(t *testing.T, b backend) {
	e := b.setup(t)
	var mu sync.Mutex
	var order []string
	var failedOnce atomic.Bool
	e.ob.Handle("x", func(_ context.Context, ev Event) error {
		if ev.ID == "a1" && failedOnce.CompareAndSwap(false, true) {
			return errors.New("transient")
		}
		mu.Lock()
		order = append(order, ev.ID)
		mu.Unlock()
		return nil
	})
	var events []Event
	for i := 1; i <= 3; i++ {
		events = append(events,
			Event{ID: fmt.Sprintf("a%d", i), Type: "x", AggregateType: "order", AggregateID: "A"},
			Event{ID: fmt.Sprintf("b%d", i), Type: "x", AggregateType: "order", AggregateID: "B"},
			Event{ID: fmt.Sprintf("n%d", i), Type: "x"}, // no aggregate: unordered
		)
	}
	for _, ev := range events { // one transaction each: distinct commit order
		require.NoError(t, PublishAlone(e.db, ev))
	}

	cfg := RelayConfig{OrderByAggregate: true, Workers: 4, Backoff: func(int) time.Duration { return 0 }}
	r1, r2 := e.relay(cfg), e.relay(cfg)
	// The first claim takes the head of each aggregate and every unordered
	// event; a1 fails, which holds back A but not B.
	n, err := r1.ProcessOnce(t.Context())
	require.NoError(t, err)
	mu.Lock()
	if b.logical {
		// ProcessOnce streams one batch, here every transaction committed
		// before it, then claims one batch from the table: the nine
		// streamed, and a1's retry, whose failure queued a2 and a3
		// behind it in the table. B and the unordered events are not held.
		assert.Equal(t, 9+1, n, "nine streamed, and a1 from the table")
		assert.Subset(t, order, []string{"a1", "b1", "b2", "b3", "n1", "n2", "n3"})
		assert.NotContains(t, order, "a3")
	} else {
		assert.Equal(t, 5, n, "a1, b1, n1, n2, n3")
		assert.Contains(t, order, "b1")
	}
	assert.NotContains(t, order, "a2")
	mu.Unlock()

	// Two relays drain the rest concurrently.
	var wg sync.WaitGroup
	for _, r := range []*Relay{r1, r2} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 20 {
				if _, err := r.ProcessOnce(t.Context()); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	assert.EqualValues(t, 9, e.count("status = ?", StatusSent))
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"a1", "a2", "a3"}, filterPrefix(order, "a"))
	assert.Equal(t, []string{"b1", "b2", "b3"}, filterPrefix(order, "b"))
}

func filterPrefix(ids []string, p string) []string {
	var out []string
	for _, id := range ids {
		if strings.HasPrefix(id, p) {
			out = append(out, id)
		}
	}
	return out
}

func testOrderFailedHoldsBack(t *testing.T, b backend) {
	e := b.setup(t)
	c := &collector{}
	var fail atomic.Bool
	fail.Store(true)
	e.ob.Handle("x", func(ctx context.Context, ev Event) error {
		if ev.ID == "a1" && fail.Load() {
			return Permanent(errors.New("rejected"))
		}
		return c.handle(ctx, ev)
	})
	for _, id := range []string{"a1", "a2", "b1"} {
		require.NoError(t, PublishAlone(e.db, Event{ID: id, Type: "x", AggregateType: "t", AggregateID: id[:1]}))
	}
	r := e.relay(RelayConfig{OrderByAggregate: true})
	for range 3 {
		_, err := r.ProcessOnce(t.Context())
		require.NoError(t, err)
	}
	assert.Equal(t, StatusFailed, e.record("a1").Status)
	assert.Equal(t, []string{"b1"}, c.ids(), "a failed event holds back the rest of its aggregate only")
	assert.Equal(t, StatusPending, e.record("a2").Status)

	fail.Store(false)
	_, err := e.ob.Replay(e.db, Filter{IDs: []string{"a1"}})
	require.NoError(t, err)
	for range 2 {
		_, err := r.ProcessOnce(t.Context())
		require.NoError(t, err)
	}
	assert.Equal(t, []string{"b1", "a1", "a2"}, c.ids())
}

func testHandlerTimeout(t *testing.T, b backend) {
	e := b.setup(t)
	e.ob.Handle("x", func(ctx context.Context, _ Event) error {
		<-ctx.Done() // a handler that would block forever
		return ctx.Err()
	})
	publishN(t, e.db, "x", 1)
	begin := time.Now()
	_, err := e.relay(RelayConfig{HandlerTimeout: 50 * time.Millisecond}).ProcessOnce(t.Context())
	require.NoError(t, err)
	assert.Less(t, time.Since(begin), 20*time.Second, "bounded by HandlerTimeout, not the minute-long lease")
	rec := e.record("x-00000")
	require.NotNil(t, rec.LastError)
	assert.Contains(t, *rec.LastError, "deadline exceeded")
}

func testRetention(t *testing.T, b backend) {
	e := b.setup(t)
	e.ob.Handle("ok", func(context.Context, Event) error { return nil })
	e.ob.Handle("bad", func(context.Context, Event) error { return Permanent(errors.New("no")) })
	publishN(t, e.db, "ok", 1200) // more than one delete batch
	publishN(t, e.db, "bad", 3)
	r := e.relay(RelayConfig{BatchSize: 1000})
	for {
		n, err := r.ProcessOnce(t.Context())
		require.NoError(t, err)
		if n == 0 {
			break
		}
	}
	e.clock.Advance(30 * time.Minute)
	publishN(t, e.db, "young", 1)
	e.ob.Handle("young", func(context.Context, Event) error { return nil })
	_, err := r.ProcessOnce(t.Context())
	require.NoError(t, err)
	publishN(t, e.db, "waiting", 2)
	if b.logical { // Logical mode's Publish writes no row: another relay parks the events in the table
		e.parkInTable(t)
	}

	sqlDB, err := e.db.DB()
	require.NoError(t, err)
	retain := maint.Retention(e.ob.store, nil, sqlDB, time.Hour, defaultStatementTimeout, e.ob.now)
	n, err := retain.Pass(t.Context())
	require.NoError(t, err)
	assert.EqualValues(t, 0, n, "nothing is old enough yet")

	e.clock.Advance(31 * time.Minute)
	n, err = retain.Pass(t.Context())
	require.NoError(t, err)
	assert.EqualValues(t, 1200, n)
	assert.EqualValues(t, 1, e.count("status = ?", StatusSent), "a younger sent row stays")
	assert.EqualValues(t, 3, e.count("status = ?", StatusFailed), "failed rows are never deleted")
	assert.EqualValues(t, 2, e.count("status = ?", StatusPending))
}

// testClaimPlan checks with EXPLAIN that the claim reads the pending index
// in order, so its cost does not grow with the number of sent rows.
func testClaimPlan(t *testing.T, b backend) {
	e := b.setup(t)
	now := e.ob.now()
	// Many sent rows, a few pending.
	const sent = 50000
	switch b.name {
	case "postgres":
		require.NoError(t, e.db.Exec(`INSERT INTO outbox_events (id, event_type, payload, status, attempts, occurred_at, updated_at, sent_at)
			SELECT md5('s' || g)::uuid, 'x', '{}', 'sent', 1, ?, ?, ? FROM generate_series(1, ?) g`, now, now, now, sent).Error)
		require.NoError(t, e.db.Exec("ANALYZE outbox_events").Error)
	case "mysql":
		ts := mysqlstore.Time(now)
		require.NoError(t, e.db.Exec(`INSERT INTO outbox_events (id, event_type, payload, status, attempts, available_at, occurred_at, updated_at, sent_at)
			SELECT UNHEX(MD5(CONCAT('s', seq))), 'x', '{}', 'sent', 1, ?, ?, ?, ? FROM seq_1_to_50000`, ts, ts, ts, ts).Error)
		require.NoError(t, e.db.Exec("ANALYZE TABLE outbox_events").Error)
	default:
		require.NoError(t, e.db.Exec(`WITH RECURSIVE g(n) AS (SELECT 1 UNION ALL SELECT n+1 FROM g WHERE n < ?)
			INSERT INTO outbox_events (id, event_type, payload, status, attempts, occurred_at, updated_at, sent_at)
			SELECT 's' || n, 'x', '{}', 'sent', 1, ?, ?, ? FROM g`, sent, now, now, now).Error)
		require.NoError(t, e.db.Exec("ANALYZE").Error)
	}
	publishN(t, e.db, "x", 5)

	for _, ordered := range []bool{false, true} {
		// From: the watermark at the pending rows, as the relay's walk puts it.
		c := store.ClaimSpec{Now: now, Lease: now.Add(time.Minute), Limit: 100, Ordered: ordered, From: sent + 1, Gaps: []int64{7, 9}}
		var plan []string
		explain := func(prefix string, q sqlbuild.Query, scan func(*sql.Rows) string) {
			rows, err := e.db.Raw(prefix+q.SQL, q.Args...).Rows()
			require.NoError(t, err)
			for rows.Next() {
				plan = append(plan, scan(rows))
			}
			require.NoError(t, rows.Close())
		}
		switch d := e.ob.store.(type) {
		case *pgstore.Store:
			explain("EXPLAIN ", d.ClaimUpdate(c), func(rows *sql.Rows) string {
				var line string
				require.NoError(t, rows.Scan(&line))
				return line
			})
		case *sqlitestore.Store:
			explain("EXPLAIN QUERY PLAN ", d.ClaimUpdate(c), func(rows *sql.Rows) string {
				var id, parent, notused int
				var detail string
				require.NoError(t, rows.Scan(&id, &parent, &notused, &detail))
				return detail
			})
		case *mysqlstore.Store:
			mysqlPlan := func(rows *sql.Rows) string {
				cols, err := rows.Columns()
				require.NoError(t, err)
				vals := make([]sql.NullString, len(cols))
				ptrs := make([]any, len(cols))
				for i := range vals {
					ptrs[i] = &vals[i]
				}
				require.NoError(t, rows.Scan(ptrs...))
				var line []string
				for i, c := range cols {
					line = append(line, c+"="+vals[i].String)
				}
				return strings.Join(line, " ")
			}
			explain("EXPLAIN ", d.SelectDue(c), mysqlPlan)
			if ordered {
				// The second step of an ordered claim (dropOvertaking).
				require.NoError(t, e.relay(RelayConfig{OrderByAggregate: true}).ensureOrdering(t.Context()))
				explain("EXPLAIN ", d.Overtaking([]int64{1, 2, 3}), mysqlPlan)
				joined := strings.Join(plan, "\n")
				assert.Contains(t, joined, "outbox_events_aggregate_idx", "the predecessor probe must read the ordering index:\n%s", joined)
			}
		}
		joined := strings.Join(plan, "\n")
		switch e.ob.store.(type) {
		case *mysqlstore.Store:
			assert.Contains(t, joined, "outbox_events_pending_idx", "claim (ordered=%v) must read the pending index:\n%s", ordered, joined)
		case *pgstore.Store:
			assert.Contains(t, joined, "outbox_events_retry_idx", "claim (ordered=%v) must read the retry index:\n%s", ordered, joined)
			assert.Contains(t, joined, "outbox_events_pkey", "claim (ordered=%v) must read new rows by seq:\n%s", ordered, joined)
		default:
			assert.Contains(t, joined, "outbox_events_retry_idx", "claim (ordered=%v) must read the retry index:\n%s", ordered, joined)
			assert.Contains(t, joined, "INTEGER PRIMARY KEY", "claim (ordered=%v) must read new rows by seq:\n%s", ordered, joined)
		}
		assert.NotRegexp(t, `(?i)seq scan on outbox_events c\b|SCAN c\b|filesort|type=ALL`, joined, "claim (ordered=%v) must not scan the table or sort:\n%s", ordered, joined)
	}
}

func testShutdownReleases(t *testing.T, b backend) {
	e := b.setup(t)
	started := make(chan string, 10)
	unblock := make(chan struct{})
	e.ob.Handle("x", func(_ context.Context, ev Event) error {
		started <- ev.ID
		<-unblock
		return nil
	})
	publishN(t, e.db, "x", 3)
	stop := runRelay(t, e.relay(RelayConfig{Workers: 1}))
	assert.Equal(t, "x-00000", receive(t, started))

	stopped := make(chan struct{})
	go func() { stop(); close(stopped) }()
	select {
	case <-stopped:
		t.Fatal("Run returned while a delivery was in flight")
	case <-time.After(50 * time.Millisecond):
	}
	close(unblock)
	<-stopped

	assert.Equal(t, StatusSent, e.record("x-00000").Status, "the in-flight delivery finished and was recorded")
	for _, id := range []string{"x-00001", "x-00002"} {
		rec := e.record(id)
		assert.Equal(t, StatusPending, rec.Status)
		assert.Nil(t, rec.LockedUntil, "no row is left claimed by a stopped relay")
		assert.Equal(t, 0, rec.Attempts)
	}
	assert.Len(t, started, 0, "no new delivery started after cancel")
}

func testStatsAndDelivered(t *testing.T, b backend) {
	e := b.setup(t)
	e.ob.Handle("ok", func(context.Context, Event) error { return nil })
	e.ob.Handle("bad", func(context.Context, Event) error { return Permanent(errors.New("no")) })
	publishN(t, e.db, "ok", 2)
	publishN(t, e.db, "bad", 1)
	e.clock.Advance(time.Minute)
	publishN(t, e.db, "later", 1) // no handler: stays pending

	var mu sync.Mutex
	var ds []Delivery
	e.ob.AddHooks(Hooks{Delivered: func(d Delivery) {
		mu.Lock()
		ds = append(ds, d)
		mu.Unlock()
	}})
	r := e.relay(RelayConfig{Backoff: func(int) time.Duration { return time.Hour }})
	_, err := r.ProcessOnce(t.Context())
	require.NoError(t, err)

	st, err := e.ob.Stats(e.db.WithContext(t.Context()))
	require.NoError(t, err)
	want := Stats{Pending: 1, Failed: 1, FailedLastHour: 1, OldestPending: st.OldestPending}
	assert.Equal(t, int64(2), sentRows(t, e.db, e.ob))
	if b.logical {
		// The same rows: the relay wrote one for each event (their IDs
		// are explicit), and the outcomes on them. Stats adds the slot's
		// fields, whose subject is TestLogicalStatsSlotLag.
		want.SlotLagBytes, want.SlotActive = st.SlotLagBytes, st.SlotActive
	}
	assert.Equal(t, want, st)
	assert.Greater(t, st.OldestPending, time.Duration(0))
	assert.Less(t, st.OldestPending, time.Minute)

	mu.Lock()
	defer mu.Unlock()
	require.Len(t, ds, 4)
	byStatus := map[Status]int{}
	for _, d := range ds {
		byStatus[d.Status]++
		assert.Equal(t, 1, d.Attempt)
		if d.Event.Type != "later" {
			// From the INSERT, not from the claim (which would be about 0):
			// the fake clock moved a minute. Not to the second: in Logical
			// mode the database's clock stamps the row, and a loaded
			// machine took 1.2 s between the fake clock's start and it.
			assert.GreaterOrEqual(t, d.Latency, 30*time.Second, "latency runs from the INSERT (fake clock moved a minute)")
		}
		if d.Status == StatusSent {
			assert.NoError(t, d.Err)
		} else {
			assert.Error(t, d.Err)
		}
	}
	assert.Equal(t, map[Status]int{StatusSent: 2, StatusFailed: 1, StatusPending: 1}, byStatus)
}

// otherConn is a pgx connection behind a type the relay does not know, as a
// driver other than pgx's stdlib would be: LISTEN cannot be used on it.
type otherConn struct{ *stdlib.Conn }

type otherConnector struct{ driver.Connector }

func (c otherConnector) Connect(ctx context.Context) (driver.Conn, error) {
	cn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	return otherConn{cn.(*stdlib.Conn)}, nil
}

func testListenUnavailable(t *testing.T, b backend) {
	if b.name != "postgres" {
		t.Skip("LISTEN is PostgreSQL's")
	}
	e := b.setup(t)
	v, ok := dsns.Load(e.db)
	require.True(t, ok)
	cfg, err := pgx.ParseConfig(v.(string))
	require.NoError(t, err)
	sqlDB := sql.OpenDB(otherConnector{stdlib.GetConnector(*cfg)})
	t.Cleanup(func() { _ = sqlDB.Close() })
	db, err := gorm.Open(postgres.New(postgres.Config{Conn: sqlDB}), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)

	var logs syncBuffer
	ob := Plugin(Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	require.NoError(t, db.Use(ob))
	got := make(chan string, 10)
	ob.Handle("x", func(_ context.Context, ev Event) error { got <- ev.ID; return nil })
	runRelay(t, mustRelay(t, ob, db, RelayConfig{PollInterval: 20 * time.Millisecond}))

	for i := range 3 {
		require.NoError(t, PublishAlone(db, Event{ID: fmt.Sprint("polled-", i), Type: "x"}))
		assert.Equal(t, fmt.Sprint("polled-", i), receive(t, got), "the relay keeps delivering by polling")
	}
	// The listener runs beside the poll: on a loaded machine the events can
	// be delivered before it has tried.
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "LISTEN unavailable") }, 10*time.Second, 10*time.Millisecond)
	assert.Equal(t, 1, strings.Count(logs.String(), "LISTEN unavailable"), "logged once:\n%s", logs.String())
}

// syncBuffer is a strings.Builder safe for the concurrent writes of a
// logger.
type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// testGeneratedEventsInsertPlainly: events whose ID and key the publisher
// generated cannot be duplicates, so their INSERT goes without the conflict
// clause (a speculative insertion costs PostgreSQL more: sqlbuild's
// TestInsertRowsShape checks the statement); a statement with any event
// the caller named keeps it, and its duplicate is still a no-op.
func testGeneratedEventsInsertPlainly(t *testing.T, b backend) {
	e := b.setup(t)
	c := &collector{}
	e.ob.Handle("x", c.handle)
	require.NoError(t, PublishAlone(e.db, Event{Type: "x", IdempotencyKey: "once"}))
	require.NoError(t, PublishAlone(e.db, Event{Type: "x"}, Event{Type: "x", IdempotencyKey: "once"}, Event{Type: "x"}),
		"a duplicate key next to generated events is a no-op")
	if b.logical {
		// Logical mode's Publish writes no row; the relay writes the keyed
		// events only (its INSERT keeps the conflict clause) and skips the
		// duplicate; the generated events are delivered without a row.
		assert.EqualValues(t, 0, e.count(""))
		assert.Len(t, e.delivered(t, c), 3)
		assert.EqualValues(t, 1, e.count(""))
		assert.EqualValues(t, 1, e.count("idempotency_key = ? AND status = ?", "once", StatusSent))
		return
	}
	assert.EqualValues(t, 3, e.count(""))
	assert.EqualValues(t, 1, e.count("idempotency_key = ?", "once"))
}
