package mysql_test

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"
	_ "time/tzdata" // Asia/Kolkata on machines without a zone database

	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/gorm-outbox/outbox/internal/store/mysql"
	"github.com/gorm-outbox/outbox/internal/store/storetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

const dsnEnv = "OUTBOX_TEST_MYSQL_DSN"

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// table is a keyword with capitals: the statements must quote it.
const table = "Order"

// dialect is how the conformance suite's own SQL is spelt on MySQL, and
// its parameter limit.
var dialect = storetest.Dialect{
	Placeholder: func(int) string { return "?" },
	Time:        func(t time.Time) any { return t.UTC().Format("2006-01-02 15:04:05.000000") },
	IDHex:       "LOWER(HEX(id))",
	MaxParams:   65535,
}

// past is the MySQL store's earlier schema versions: version 2's table
// (no release created a version 1 table on MySQL). MySQL commits each
// ALTER TABLE by itself, so the upgrade holds a named lock of the session
// (store.SessionLock), which must be released however it ends.
var past = storetest.Past{V2: storetest.Shipped(2, "mysql"), UpgradeLockHeld: upgradeLockHeld}

// upgradeLockHeld reports whether a session holds the named lock the
// upgrade scripts of the table named table take: one per database and
// table (mysql-upgrade-3.sql), so an upgrade in another database of the
// server does not hold it.
func upgradeLockHeld(ctx context.Context, db *sql.DB, table string) (bool, error) {
	var held bool
	err := db.QueryRowContext(ctx, "SELECT IS_USED_LOCK(CONCAT(DATABASE(), '.', ?, '.upgrade')) IS NOT NULL", table).Scan(&held)
	return held, err
}

// TestStore runs the conformance suite on the server OUTBOX_TEST_MYSQL_DSN
// names (MySQL or MariaDB), a fresh database per subtest, dropped when it
// ends: skipped when the variable is not set, failed when it is set and
// the server is unreachable.
func TestStore(t *testing.T) {
	cfg, admin := server(t)
	storetest.Exercise(t, opener(t, cfg, admin, nil))
}

// TestLead runs the InboxLead checks on a connection that runs a text of
// several statements (multiStatements=true), where the store's Lead
// begins its transaction with the inbox INSERT in one round trip:
// Exercise's database cannot (CanLead is false there).
func TestLead(t *testing.T) {
	cfg, admin := server(t)
	storetest.ExerciseLead(t, opener(t, cfg, admin, map[string]string{"multiStatements": "true"}))
}

// TestRetryRecord: a deadlock (1213) ends a Record's transaction that
// running again wins; nothing else does.
func TestRetryRecord(t *testing.T) {
	s := mysql.New(table)
	assert.True(t, s.RetryRecord(&mysqldriver.MySQLError{Number: 1213}), "a deadlock")
	assert.True(t, s.RetryRecord(fmt.Errorf("record: %w", &mysqldriver.MySQLError{Number: 1213})), "a deadlock, wrapped")
	for _, err := range []error{nil, errors.New("1213"), &mysqldriver.MySQLError{Number: 1205}, &mysqldriver.MySQLError{Number: 1062}} {
		assert.False(t, s.RetryRecord(err), "%v", err)
	}
}

// server is the server OUTBOX_TEST_MYSQL_DSN names and a connection to it:
// the test is skipped when the variable is not set, failed when it is set
// and the server is unreachable.
func server(t *testing.T) (*mysqldriver.Config, *sql.DB) {
	t.Helper()
	dsn := os.Getenv(dsnEnv)
	if dsn == "" {
		t.Skipf("%s is not set; set it (e.g. root@tcp(127.0.0.1:3306)/test?charset=utf8mb4&parseTime=True&loc=Local) to run the MySQL store's suite", dsnEnv)
	}
	cfg, err := mysqldriver.ParseDSN(dsn)
	require.NoError(t, err, "%s", dsnEnv)
	admin, err := sql.Open("mysql", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close() })
	require.NoError(t, admin.Ping(), "%s is set but MySQL is unreachable", dsnEnv)
	return cfg, admin
}

// opener returns an opener of a fresh database per call on the server,
// dropped when the test ends, its DSN's parameters params added.
func opener(t *testing.T, cfg *mysqldriver.Config, admin *sql.DB, params map[string]string) storetest.Open {
	loc, err := time.LoadLocation("Asia/Kolkata")
	require.NoError(t, err)
	return func(t *testing.T) storetest.DB {
		b := make([]byte, 6)
		_, _ = rand.Read(b)
		name := "storetest_" + hex.EncodeToString(b)
		_, err := admin.Exec("CREATE DATABASE " + name)
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = admin.Exec("DROP DATABASE " + name) })
		c := cfg.Clone()
		c.DBName = name
		// Times are the store's to get right whatever the DSN's loc: a
		// zone away from UTC, where loc=Local is often UTC itself.
		c.Loc = loc
		if len(params) > 0 && c.Params == nil {
			c.Params = map[string]string{}
		}
		for k, v := range params {
			if k == "multiStatements" {
				c.MultiStatements = v == "true"
				continue
			}
			c.Params[k] = v
		}
		gdb, err := gorm.Open(gormmysql.Open(c.FormatDSN()), &gorm.Config{Logger: logger.Discard})
		require.NoError(t, err)
		db, err := gdb.DB()
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		return storetest.DB{Store: mysql.New(table), Gorm: gdb, Dialect: dialect, Past: past}
	}
}

// TestUpgradeLockHeld: the check the suite makes after every upgrade (that
// the upgrade's named lock is released) sees the lock the upgrade script
// takes, on the database it was taken in only.
func TestUpgradeLockHeld(t *testing.T) {
	cfg, admin := server(t)
	open := opener(t, cfg, admin, nil)
	o, other := open(t), open(t)
	db, err := o.Gorm.DB()
	require.NoError(t, err)
	odb, err := other.Gorm.DB()
	require.NoError(t, err)
	ctx := t.Context()

	// The script's first statement takes the lock, its last releases it.
	var script strings.Builder
	for _, l := range strings.Split(o.Store.Upgrade(2), "\n") {
		l, _, _ = strings.Cut(l, "--")
		script.WriteString(l + "\n")
	}
	var stmts []string
	for _, st := range strings.Split(script.String(), ";") {
		if st = strings.TrimSpace(st); st != "" {
			stmts = append(stmts, st)
		}
	}
	require.GreaterOrEqual(t, len(stmts), 2)
	lock, unlock := stmts[0], stmts[len(stmts)-1]
	require.Contains(t, lock, "GET_LOCK")
	require.Contains(t, unlock, "RELEASE_LOCK")

	held, err := upgradeLockHeld(ctx, db, table)
	require.NoError(t, err)
	assert.False(t, held, "before the upgrade's lock is taken")
	conn, err := db.Conn(ctx)
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	var got sql.NullInt64
	require.NoError(t, conn.QueryRowContext(ctx, lock).Scan(&got))
	require.EqualValues(t, 1, got.Int64, "the upgrade's lock taken")
	held, err = upgradeLockHeld(ctx, db, table)
	require.NoError(t, err)
	assert.True(t, held, "while a session holds the upgrade's lock")
	held, err = upgradeLockHeld(ctx, odb, table)
	require.NoError(t, err)
	assert.False(t, held, "in another database of the server")
	_, err = conn.ExecContext(ctx, unlock)
	require.NoError(t, err)
	held, err = upgradeLockHeld(ctx, db, table)
	require.NoError(t, err)
	assert.False(t, held, "once the upgrade's lock is released")
}
