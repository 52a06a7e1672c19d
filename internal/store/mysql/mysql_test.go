package mysql_test

import (
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"log/slog"
	"os"
	"testing"
	"time"
	_ "time/tzdata" // Asia/Kolkata on machines without a zone database

	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/gorm-outbox/outbox/internal/store/mysql"
	"github.com/gorm-outbox/outbox/internal/store/storetest"
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

	loc, err := time.LoadLocation("Asia/Kolkata")
	require.NoError(t, err)
	storetest.Exercise(t, func(t *testing.T) (store.Store, *sql.DB) {
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
		gdb, err := gorm.Open(gormmysql.Open(c.FormatDSN()), &gorm.Config{Logger: logger.Discard})
		require.NoError(t, err)
		db, err := gdb.DB()
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		s := mysql.New(table)
		require.NoError(t, s.Check(t.Context(), gdb, slog.New(slog.DiscardHandler)))
		return s, db
	})
}
