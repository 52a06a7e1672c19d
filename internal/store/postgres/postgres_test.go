package postgres_test

import (
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/gorm-outbox/outbox/internal/pgtest"
	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/gorm-outbox/outbox/internal/store/postgres"
	"github.com/gorm-outbox/outbox/internal/store/storetest"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	gormpg "gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

const dsnEnv = "OUTBOX_TEST_POSTGRES_DSN"

func TestMain(m *testing.M) { goleak.VerifyTestMain(stopsServer{m}) }

// stopsServer stops the cluster TestSlots started once the tests are done.
type stopsServer struct{ m *testing.M }

func (s stopsServer) Run() int {
	code := s.m.Run()
	if logical.s != nil {
		logical.s.Close()
	}
	return code
}

// table is a keyword with capitals: the statements must quote it.
const table = "Order"

// opener returns an opener of a fresh schema (search_path) per call on the
// server dsn names, dropped when the test ends, through pgx as the root
// package opens PostgreSQL (gorm.io/driver/postgres), so that Listen works
// (the suite runs Check itself).
func opener(t *testing.T, dsn string) storetest.Open {
	admin, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close() })
	require.NoError(t, admin.Ping(), "PostgreSQL at %s is unreachable", dsn)
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	return func(t *testing.T) (store.Store, *gorm.DB) {
		b := make([]byte, 6)
		_, _ = rand.Read(b)
		schema := "storetest_" + hex.EncodeToString(b)
		_, err := admin.Exec("CREATE SCHEMA " + schema)
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = admin.Exec("DROP SCHEMA " + schema + " CASCADE") })
		gdb, err := gorm.Open(gormpg.Open(dsn+sep+"search_path="+schema), &gorm.Config{Logger: logger.Discard})
		require.NoError(t, err)
		db, err := gdb.DB()
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		return postgres.New(table), gdb
	}
}

// TestStore runs the conformance suite on the server OUTBOX_TEST_POSTGRES_DSN
// names: skipped when it is not set, failed when it is set and the server
// is unreachable.
func TestStore(t *testing.T) {
	dsn := os.Getenv(dsnEnv)
	if dsn == "" {
		t.Skipf("%s is not set; set it (e.g. postgres://postgres@127.0.0.1:5432/test?sslmode=disable) to run the PostgreSQL store's suite", dsnEnv)
	}
	storetest.Exercise(t, opener(t, dsn))
}

// logical is the cluster TestSlots starts: the shared server's wal_level
// cannot change without a restart.
var logical struct {
	once sync.Once
	s    *pgtest.Server
	err  error
}

// TestSlots runs the Logical statements that need wal_level=logical on a
// cluster of the test's own. Under CI a missing PostgreSQL installation
// fails it; elsewhere it skips it.
func TestSlots(t *testing.T) {
	logical.once.Do(func() {
		logical.s, logical.err = pgtest.Start("wal_level=logical", "max_replication_slots=4", "max_wal_senders=4")
	})
	if err := logical.err; err != nil {
		if errors.Is(err, pgtest.ErrNoBinaries) && os.Getenv("CI") == "" {
			t.Skipf("the slot checks need a PostgreSQL installation: %v", err)
		}
		t.Fatalf("cannot start a PostgreSQL with wal_level=logical: %v", err)
	}
	storetest.ExerciseSlots(t, opener(t, logical.s.DSN("postgres")))
}
