package postgres_test

import (
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/pgtest"
	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/gorm-outbox/outbox/internal/store/postgres"
	"github.com/gorm-outbox/outbox/internal/store/storetest"
	"github.com/gorm-outbox/outbox/internal/testenv"
	"github.com/stretchr/testify/assert"
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

// dialect is how the conformance suite's own SQL is spelt on PostgreSQL,
// and its parameter limit.
var dialect = storetest.Dialect{
	Placeholder: func(n int) string { return fmt.Sprintf("$%d", n) },
	Time:        func(t time.Time) any { return t },
	IDHex:       "REPLACE(id::text, '-', '')",
	MaxParams:   65535,
}

// past is the PostgreSQL store's earlier schema versions: the first
// release's table and version 2's. Its upgrades lock the table in their
// transaction, and compute store.RowID with MD5.
var past = storetest.Past{V1: storetest.Shipped(1, "postgres"), V2: storetest.Shipped(2, "postgres")}

// opener returns an opener of a fresh schema (search_path) per call on the
// server dsn names, dropped when the test ends, through pgx as the root
// package opens PostgreSQL (gorm.io/driver/postgres), so that Listen works
// (the suite runs Check itself): the PostgreSQL store's.
func opener(t *testing.T, dsn string) storetest.Open {
	return schemas(t, dsn, "", func(t *testing.T, _ *gorm.DB) storetest.DB {
		return storetest.DB{Store: postgres.New(table), Dialect: dialect, Past: past}
	})
}

// schemas returns an opener of a fresh schema per call on the server dsn
// names, its DSN's parameters params added ("a=b&c=d"), dropped when the
// test ends; of returns the store on the session and what the suite
// must know of it (schemas adds the session).
func schemas(t *testing.T, dsn, params string, of func(t *testing.T, gdb *gorm.DB) storetest.DB) storetest.Open {
	admin, err := sql.Open("pgx", dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = admin.Close() })
	require.NoError(t, admin.Ping(), "PostgreSQL at %s is unreachable", dsn)
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	if params != "" {
		params = "&" + params
	}
	return func(t *testing.T) storetest.DB {
		b := make([]byte, 6)
		_, _ = rand.Read(b)
		schema := "storetest_" + hex.EncodeToString(b)
		_, err := admin.Exec("CREATE SCHEMA " + schema)
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = admin.Exec("DROP SCHEMA " + schema + " CASCADE") })
		gdb, err := gorm.Open(gormpg.Open(dsn+sep+"search_path="+schema+params), &gorm.Config{Logger: logger.Discard})
		require.NoError(t, err)
		db, err := gdb.DB()
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		o := of(t, gdb)
		o.Gorm = gdb
		return o
	}
}

// serverDSN is the server OUTBOX_TEST_POSTGRES_DSN names: the test is
// skipped when it is not set (and failed, by the opener, when it is set
// and the server is unreachable).
func serverDSN(t *testing.T) string {
	t.Helper()
	dsn := os.Getenv(dsnEnv)
	if dsn == "" {
		t.Skipf("%s is not set; set it (e.g. postgres://postgres@127.0.0.1:5432/test?sslmode=disable) to run the PostgreSQL store's suite", dsnEnv)
	}
	return dsn
}

// TestStore runs the conformance suite on the server OUTBOX_TEST_POSTGRES_DSN
// names, and the PostgreSQL store's checks of its own: skipped when it is
// not set, failed when it is set and the server is unreachable.
func TestStore(t *testing.T) {
	open := opener(t, serverDSN(t))
	storetest.Exercise(t, open)
	t.Run("InvalidIndexRebuilt", func(t *testing.T) { t.Parallel(); invalidIndexRebuilt(t, open) })
}

// invalidIndexRebuilt: Exists treats "a PostgreSQL index a failed
// concurrent build left invalid" as missing, so that EnsureOrdering
// builds it again.
func invalidIndexRebuilt(t *testing.T, open storetest.Open) {
	o := open(t)
	s, ctx := o.Store, t.Context()
	db, err := o.Gorm.DB()
	require.NoError(t, err)
	require.NoError(t, s.Check(ctx, o.Gorm, slog.New(slog.DiscardHandler)))
	require.NoError(t, s.Migrate(ctx, db))
	now := time.Date(2031, 3, 14, 15, 9, 26, 535897000, time.UTC)
	evs := make([]store.Event, 2)
	for i, id := range []string{"x-1", "x-2"} {
		evs[i] = store.Event{ID: id, Type: "order.created", Key: id, NamedID: true, AggregateType: "acct", AggregateID: fmt.Sprint(i + 1),
			Payload: []byte(`{"id":"` + id + `"}`), OccurredAt: now.Add(-time.Minute)}
	}
	got, err := s.Insert(ctx, db, evs, now, false)
	require.NoError(t, err)
	require.Equal(t, 2, got.Written)

	name := table + "_aggregate_idx"
	_, err = db.ExecContext(ctx, `CREATE UNIQUE INDEX CONCURRENTLY "`+name+`" ON "`+table+`" (aggregate_type)`)
	require.Error(t, err, "a concurrent build that fails")
	var left bool
	require.NoError(t, db.QueryRowContext(ctx, `SELECT to_regclass('"`+name+`"') IS NOT NULL`).Scan(&left))
	require.True(t, left, "the failed build left its index behind")
	ok, err := s.Exists(ctx, db, name)
	require.NoError(t, err)
	assert.False(t, ok, "Exists of an invalid index")
	require.NoError(t, s.EnsureOrdering(ctx, db))
	ok, err = s.Exists(ctx, db, name)
	require.NoError(t, err)
	assert.True(t, ok, "Exists after EnsureOrdering rebuilt it")
	var valid bool
	require.NoError(t, db.QueryRowContext(ctx, `SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass('"`+name+`"')`).Scan(&valid))
	assert.True(t, valid, "the rebuilt index is valid")
}

// logical is the cluster TestSlots starts: the shared server's wal_level
// cannot change without a restart.
var logical struct {
	once sync.Once
	s    *pgtest.Server
	err  error
}

// TestSlots runs the Logical statements that need wal_level=logical on a
// cluster of the test's own, in the full tests or when -run names it.
// There a missing PostgreSQL installation fails it (testenv.Strict);
// elsewhere it skips it.
func TestSlots(t *testing.T) {
	testenv.Long(t, "a PostgreSQL cluster of its own with wal_level=logical")
	logical.once.Do(func() {
		logical.s, logical.err = pgtest.Start("wal_level=logical", "max_replication_slots=4", "max_wal_senders=4")
	})
	if err := logical.err; err != nil {
		if errors.Is(err, pgtest.ErrNoBinaries) && !testenv.Strict() {
			t.Skipf("the slot checks need a PostgreSQL installation: %v", err)
		}
		t.Fatalf("cannot start a PostgreSQL with wal_level=logical: %v", err)
	}
	storetest.ExerciseSlots(t, opener(t, logical.s.DSN("postgres")))
}
