package mysql

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"log/slog"
	"os"
	"testing"
	"time"

	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// TestOrderedClaimSeesCommitsMidScan: an ordered claim must not hand out
// an event while an older event of its aggregate is unsent, even when both
// were committed while the claim's scan ran. The scan is a locking read and
// sees rows committed after the statement began; a predecessor probe
// inside the same statement reads an older snapshot and does not. Here the
// scan is held on purpose at a first row, and another session
// commits two events of one aggregate meanwhile: the claim may return the
// first, never the second (it returned both before dropOvertaking).
func TestOrderedClaimSeesCommitsMidScan(t *testing.T) {
	t.Parallel()
	d, db := openStore(t)
	require.NoError(t, d.EnsureOrdering(t.Context(), db))
	now := time.Now().UTC().Truncate(time.Microsecond)
	ev := func(id, agg string) store.Event {
		return store.Event{ID: id, Type: "x", AggregateType: "a", AggregateID: agg, Key: id, NamedID: true, Payload: []byte("{}"), OccurredAt: now}
	}
	insert := func(db store.DB, evs ...store.Event) {
		got, err := d.Insert(t.Context(), db, evs, now, false)
		require.NoError(t, err)
		require.Equal(t, len(evs), got.Written)
	}
	insert(db, ev("first", "other"))

	// The test holds the gate on a connection of its own; the claim's scan
	// waits for it on its first row, its statement begun, until released.
	// Named locks are server-wide: the gate is named after the test's own
	// database, so that runs from other checkouts do not contend for it.
	hold, err := db.Conn(t.Context())
	require.NoError(t, err)
	defer func() { _ = hold.Close() }()
	var gate string
	require.NoError(t, hold.QueryRowContext(t.Context(), "SELECT CONCAT('outbox_', DATABASE())").Scan(&gate))
	var got int
	require.NoError(t, hold.QueryRowContext(t.Context(), "SELECT GET_LOCK(?, 0)", gate).Scan(&got))
	require.Equal(t, 1, got, "the test takes the gate")
	released := false
	release := func() {
		if !released {
			released = true
			_, err := hold.ExecContext(context.Background(), "DO RELEASE_LOCK(?)", gate)
			require.NoError(t, err)
		}
	}
	defer release() // a failing run must not leave the claim waiting

	type result struct {
		batch []store.Claimed
		err   error
	}
	done := make(chan result, 1)
	go func() {
		later := now.Add(time.Hour)
		b, err := d.claim(context.Background(), db, store.ClaimSpec{Now: later, Lease: later.Add(time.Hour), Limit: 10, Ordered: true}, gate)
		done <- result{b, err}
	}()
	waiting := func() int {
		var n int
		require.NoError(t, db.QueryRowContext(t.Context(),
			"SELECT COUNT(*) FROM information_schema.processlist WHERE db = DATABASE() AND id <> CONNECTION_ID() AND info LIKE 'SELECT%GET_LOCK(%'").Scan(&n))
		return n
	}
	// The claim waits at its first row: its statement has begun.
	require.Eventually(t, func() bool { return waiting() > 0 }, 10*time.Second, 5*time.Millisecond, "the claim to wait at its first row")
	tx, err := db.BeginTx(t.Context(), nil)
	require.NoError(t, err)
	insert(tx, ev("n", "one"), ev("n+1", "one"))
	require.NoError(t, tx.Commit())
	require.Equal(t, 1, waiting(), "the commit must land while the claim's scan runs")
	release()
	res := <-done
	require.NoError(t, res.err)
	var ids []string
	for _, c := range res.batch {
		ids = append(ids, c.ID)
	}
	assert.Contains(t, ids, "first")
	assert.NotContains(t, ids, "n+1", "the claim handed out an event while an older event of its aggregate (n) was unsent")
}

// openStore is the store on a database of its own on OUTBOX_TEST_MYSQL_DSN,
// its table created.
func openStore(t *testing.T) (*Store, *sql.DB) {
	t.Helper()
	dsn := os.Getenv("OUTBOX_TEST_MYSQL_DSN")
	if dsn == "" {
		t.Skip("OUTBOX_TEST_MYSQL_DSN is not set")
	}
	cfg, err := mysqldriver.ParseDSN(dsn)
	require.NoError(t, err)
	admin, err := sql.Open("mysql", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close() })
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "scan_" + hex.EncodeToString(b)
	_, err = admin.Exec("CREATE DATABASE " + name)
	require.NoError(t, err, "OUTBOX_TEST_MYSQL_DSN is set but MySQL is unreachable")
	t.Cleanup(func() { _, _ = admin.Exec("DROP DATABASE " + name) })
	c := cfg.Clone()
	c.DBName = name
	// The gate is a GET_LOCK() in the claim's WHERE. It names no column, so
	// with index condition pushdown (which MariaDB uses on the pending
	// index since status is an ENUM) it is evaluated inside InnoDB, holding
	// the index page's latch: other sessions' INSERTs into that page wait
	// for it, and cannot commit while the scan runs. Evaluated by the server
	// above the storage engine, as without the pushdown, it leaves them be.
	if c.Params == nil {
		c.Params = map[string]string{}
	}
	c.Params["optimizer_switch"] = "'index_condition_pushdown=off'"
	gdb, err := gorm.Open(gormmysql.Open(c.FormatDSN()), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	db, err := gdb.DB()
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	s := New(store.DefaultTable)
	require.NoError(t, s.Check(t.Context(), gdb, slog.New(slog.DiscardHandler)))
	require.NoError(t, s.Migrate(t.Context(), db))
	return s, db
}
