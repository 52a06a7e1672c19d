package mysql_test

import (
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"testing"
	"time"
	_ "time/tzdata" // Asia/Kolkata on machines without a zone database

	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/gorm-outbox/outbox/internal/store"
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
	return func(t *testing.T) (store.Store, *gorm.DB) {
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
		return mysql.New(table), gdb
	}
}
