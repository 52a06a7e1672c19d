package sqlite_test

import (
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/gorm-outbox/outbox/internal/store/sqlite"
	"github.com/gorm-outbox/outbox/internal/store/storetest"
	puresqlite "github.com/libtnb/sqlite"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	cgosqlite "gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// table is a keyword with capitals: the statements must quote it.
const table = "Order"

// dialect is how the conformance suite's own SQL is spelt on SQLite, and
// its parameter limit (SQLITE_MAX_VARIABLE_NUMBER since 3.32), the same
// through either driver.
var dialect = storetest.Dialect{
	Placeholder: func(int) string { return "?" },
	Time:        func(t time.Time) any { return t.UTC().Format("2006-01-02 15:04:05.999999999-07:00") },
	IDHex:       "REPLACE(id, '-', '')",
	MaxParams:   32766,
}

// past is the SQLite store's earlier schema versions: the first
// release's table and version 2's. SQLite has no MD5: the upgrade to
// version 3 keeps the old ID in id (read without its dashes by IDHex)
// rather than store.RowID of it.
var past = storetest.Past{
	V1:         storetest.Shipped(1, "sqlite"),
	V2:         storetest.Shipped(2, "sqlite"),
	UpgradedID: func(id string) string { return strings.ReplaceAll(id, "-", "") },
}

// open returns an opener of a file in the test's directory through one
// driver, with the settings the README recommends for it (the suite runs
// the check db.Use runs), of a store with the limits lim (its own when
// nil).
func open(dial func(dsn string) gorm.Dialector, options string, lim *store.Limits) storetest.Open {
	return func(t *testing.T) storetest.DB {
		dsn := "file:" + filepath.Join(t.TempDir(), "outbox.db") + options
		gdb, err := gorm.Open(dial(dsn), &gorm.Config{Logger: logger.Discard})
		require.NoError(t, err)
		db, err := gdb.DB()
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		s := sqlite.New(table)
		if lim != nil {
			s.Lim = *lim
		}
		return storetest.DB{Store: s, Gorm: gdb, Dialect: dialect, Past: past}
	}
}

// pureGoLimits are the limits of the store the pure-Go driver's run
// exercises. The suite sends every chunking method lists of MaxParams+1
// items, which at SQLite's own 32766 the pure-Go SQLite takes over a
// minute for under -race; the cgo run checks that size, this one the same
// chunking in smaller statements, and what the driver does differently
// (its times, its parameters) in every other check.
var pureGoLimits = &store.Limits{MaxParams: 10100, InsertRows: 150, OutcomeRows: 400, RetentionBatch: 100}

// TestStore runs the conformance suite through gorm.io/driver/sqlite
// (mattn/go-sqlite3, cgo) and github.com/libtnb/sqlite (pure Go, with
// smaller limits: pureGoLimits).
func TestStore(t *testing.T) {
	t.Run("cgo", func(t *testing.T) {
		t.Parallel()
		storetest.Exercise(t, open(cgosqlite.Open, sqlite.DSNOptions, nil))
	})
	t.Run("purego", func(t *testing.T) {
		t.Parallel()
		storetest.Exercise(t, open(puresqlite.Open, sqlite.PureGoDSNOptions, pureGoLimits))
	})
}

// TestRecommendedSettings: each driver applies every setting of the DSN
// options spelled for it, on every pooled connection (a driver ignoring a
// key would leave it at its default, silently): WAL, the 10 s busy timeout
// and immediate transactions (BEGIN takes the write lock). Neither
// spelling sets synchronous: it stays each driver's default, pinned here so
// that a driver upgrade changing it is noticed. mattn/go-sqlite3 is built
// with SQLITE_DEFAULT_WAL_SYNCHRONOUS=1 (NORMAL: in WAL mode a commit is
// synced at the next checkpoint, so a power loss may undo the last ones, a
// crash of the process none); modernc.org/sqlite keeps SQLite's FULL (2:
// every commit synced), as the pure-Go path did before, durability first.
func TestRecommendedSettings(t *testing.T) {
	for _, c := range []struct {
		name        string
		dial        func(string) gorm.Dialector
		options     string
		synchronous int
	}{
		{"cgo", cgosqlite.Open, sqlite.DSNOptions, 1},
		{"purego", puresqlite.Open, sqlite.PureGoDSNOptions, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			gdb, err := gorm.Open(c.dial("file:"+filepath.Join(t.TempDir(), "outbox.db")+c.options), &gorm.Config{Logger: logger.Discard})
			require.NoError(t, err)
			db, err := gdb.DB()
			require.NoError(t, err)
			t.Cleanup(func() { _ = db.Close() })
			ctx := t.Context()
			// Three connections held at once: three connections of the pool.
			for i := range 3 {
				conn, err := db.Conn(ctx)
				require.NoError(t, err)
				defer func() { _ = conn.Close() }()
				var (
					mode              string
					timeout, syncMode int
				)
				require.NoError(t, conn.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode))
				require.NoError(t, conn.QueryRowContext(ctx, "PRAGMA busy_timeout").Scan(&timeout))
				require.NoError(t, conn.QueryRowContext(ctx, "PRAGMA synchronous").Scan(&syncMode))
				assert.Equal(t, "wal", strings.ToLower(mode), "connection %d: journal_mode", i)
				assert.Equal(t, 10000, timeout, "connection %d: busy_timeout", i)
				assert.Equal(t, c.synchronous, syncMode, "connection %d: synchronous", i)
			}
			// Immediate transactions: with the first holding the write lock
			// from its BEGIN, a second BEGIN on a connection that does not
			// wait (busy_timeout 0 on that connection alone) is refused.
			first, err := db.BeginTx(ctx, nil)
			require.NoError(t, err)
			defer func() { _ = first.Rollback() }()
			conn, err := db.Conn(ctx)
			require.NoError(t, err)
			defer func() { _ = conn.Close() }()
			_, err = conn.ExecContext(ctx, "PRAGMA busy_timeout = 0")
			require.NoError(t, err)
			second, err := conn.BeginTx(ctx, nil)
			if err == nil {
				_ = second.Rollback()
			}
			assert.ErrorContains(t, err, "locked", "a second transaction began beside the first: transactions are deferred, not immediate")
		})
	}
}
