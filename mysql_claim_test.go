package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// TestMySQLClaimAlongsideWriters: claims run while business transactions
// publish, as in production. Under REPEATABLE READ, the session default,
// the claim's locking statements lock rows and gaps that the writers'
// INSERTs need, and deadlock them (error 1213 in the business transaction),
// mostly while the table is small (the claim's UPDATE then scans it whole);
// the claim runs at READ COMMITTED whatever the session default is (and
// retries a lost lock wait or deadlock: TestMySQLClaimRetriesLockWait). No
// writer may fail, no claim may fail, and no event may be delivered twice:
// each round is far shorter than the lease, so a second delivery would be
// one under a live lease. Each round starts on a new, empty table.
func TestMySQLClaimAlongsideWriters(t *testing.T) {
	t.Parallel()
	const rounds, round = 5, 400 * time.Millisecond
	b := mysqlBackend(t)
	for i := range rounds {
		if !claimRace(t, b, round) {
			t.Fatalf("round %d of %d failed", i+1, rounds)
		}
	}
}

// claimRace runs 4 claim loops alongside 8 writers for d on a new database,
// delivers the rest, and reports whether every check passed.
func claimRace(t *testing.T, b backend, d time.Duration) bool {
	const claimers, writers = 4, 8
	e := b.setup(t)

	var mu sync.Mutex
	delivered := map[string]int{}
	e.ob.Handle("claim.race", func(_ context.Context, ev Event) error {
		mu.Lock()
		delivered[ev.ID]++
		mu.Unlock()
		return nil
	})

	stop := make(chan struct{})
	stopped := func() bool {
		select {
		case <-stop:
			return true
		default:
			return false
		}
	}
	var (
		wg                    sync.WaitGroup
		errMu                 sync.Mutex
		writerErrs, claimErrs []error
		published             []string
		claims, rows          atomic.Int64
	)
	for w := range writers {
		wg.Go(func() {
			for i := 0; !stopped(); i++ {
				id := fmt.Sprintf("w%d-%d", w, i)
				err := e.db.Transaction(func(tx *gorm.DB) error {
					if err := tx.Create(&Order{Total: i}).Error; err != nil {
						return err
					}
					return Publish(tx, Event{ID: id, Type: "claim.race", AggregateType: "order", AggregateID: id})
				})
				errMu.Lock()
				if err != nil {
					writerErrs = append(writerErrs, err)
				} else {
					published = append(published, id)
				}
				errMu.Unlock()
			}
		})
	}
	for range claimers {
		r := e.relay(RelayConfig{BatchSize: 20, Workers: 2, Lease: time.Minute})
		wg.Go(func() {
			for !stopped() {
				n, err := r.ProcessOnce(t.Context())
				claims.Add(1)
				rows.Add(int64(n))
				if err != nil {
					errMu.Lock()
					claimErrs = append(claimErrs, err)
					errMu.Unlock()
				}
			}
		})
	}
	time.AfterFunc(d, func() { close(stop) })
	wg.Wait()
	t.Logf("%d business transactions committed, %d claims delivered %d events", len(published), claims.Load(), rows.Load())

	ok := assert.Empty(t, firstErrs(writerErrs), "business transactions failed (%d of %d)", len(writerErrs), len(published)+len(writerErrs))
	ok = assert.Empty(t, firstErrs(claimErrs), "claims failed (%d)", len(claimErrs)) && ok
	require.NotEmpty(t, published)
	require.NotZero(t, rows.Load(), "the claims ran alongside the writers, not after them")

	// Deliver the rest, then: every committed event exactly once.
	r := e.relay(RelayConfig{BatchSize: 500})
	for {
		n, err := r.ProcessOnce(t.Context())
		require.NoError(t, err)
		if n == 0 {
			break
		}
	}
	mu.Lock()
	defer mu.Unlock()
	twice := map[string]int{}
	for id, n := range delivered {
		if n > 1 {
			twice[id] = n
		}
	}
	ok = assert.Empty(t, twice, "events delivered more than once within their lease (%d)", len(twice)) && ok
	ok = assert.Len(t, delivered, len(published), "every committed event delivered") && ok
	return assert.Zero(t, e.count("status <> ?", StatusSent)) && ok
}

// TestMySQLClaimRetriesLockWait: a claim that loses a lock wait (1205, as
// a deadlock 1213 would) is tried again rather than failing the cycle. The
// relay's connections give up a lock wait after one second; another
// session holds the table with LOCK TABLES until the claim has timed out
// once and started again, then lets it through.
func TestMySQLClaimRetriesLockWait(t *testing.T) {
	t.Parallel()
	base := mysqlBackend(t).open(t, &gorm.Config{Logger: logger.Discard})
	v, _ := dsns.Load(base)
	cfg, err := mysqldriver.ParseDSN(v.(string))
	require.NoError(t, err)
	cfg.Params = map[string]string{"lock_wait_timeout": "1"}
	db, err := gorm.Open(mysql.Open(cfg.FormatDSN()), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	ob := Plugin(Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, db.Use(ob))
	c := &collector{}
	ob.Handle("x", c.handle)
	require.NoError(t, PublishAlone(db, Event{ID: "waited", Type: "x"}))

	sqlBase, err := base.DB()
	require.NoError(t, err)
	var version string
	require.NoError(t, sqlBase.QueryRowContext(t.Context(), "SELECT VERSION()").Scan(&version))
	if !strings.Contains(version, "MariaDB") {
		t.Skipf("tells one claim attempt from the next by information_schema.processlist.time_ms, which MariaDB has and MySQL %s has not", version)
	}
	lock, err := sqlBase.Conn(t.Context())
	require.NoError(t, err)
	defer func() { _ = lock.Close() }()
	_, err = lock.ExecContext(t.Context(), "LOCK TABLES "+ob.Table()+" WRITE")
	require.NoError(t, err)
	unlocked := false
	unlock := func() {
		if !unlocked {
			_, err := lock.ExecContext(context.Background(), "UNLOCK TABLES")
			require.NoError(t, err)
			unlocked = true
		}
	}
	defer unlock()

	type result struct {
		n   int
		err error
	}
	done := make(chan result, 1)
	relay := mustRelay(t, ob, db, RelayConfig{})
	go func() {
		n, err := relay.ProcessOnce(t.Context())
		done <- result{n, err}
	}()

	// A wait on the table's lock, seen in the process list: a claim attempt.
	// An attempt that has run for less time than the previous one had is
	// the next attempt.
	waitMS := func() (ms float64, ok bool) {
		err := sqlBase.QueryRowContext(t.Context(), "SELECT time_ms FROM information_schema.processlist"+
			" WHERE db = ? AND state = 'Waiting for table metadata lock' AND info LIKE 'SELECT%' ORDER BY time_ms DESC LIMIT 1",
			cfg.DBName).Scan(&ms)
		if errors.Is(err, sql.ErrNoRows) {
			return 0, false
		}
		require.NoError(t, err)
		return ms, true
	}
	var longest float64
	attempts := 0
	deadline := time.Now().Add(20 * time.Second)
	for attempts < 2 {
		select {
		case r := <-done:
			t.Fatalf("the claim returned after %d lock wait(s) instead of trying again: n=%d err=%v", attempts, r.n, r.err)
		default:
		}
		require.True(t, time.Now().Before(deadline), "no second claim attempt within 20 s (%d seen)", attempts)
		ms, ok := waitMS()
		switch {
		case ok && attempts == 0:
			attempts, longest = 1, ms
		case ok && ms < longest:
			attempts = 2
		case ok:
			longest = ms
		}
		time.Sleep(5 * time.Millisecond) // the poll's interval
	}
	unlock()
	r := <-done
	require.NoError(t, r.err, "the retried claim succeeds once the table is free")
	assert.Equal(t, 1, r.n)
	assert.Equal(t, []string{"waited"}, c.ids())
}

// firstErrs returns up to five of errs, for a readable failure message.
func firstErrs(errs []error) []error {
	if len(errs) > 5 {
		return append(errs[:5:5], errors.New("…"))
	}
	return errs
}
