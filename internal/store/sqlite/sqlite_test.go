package sqlite_test

import (
	"path/filepath"
	"testing"

	puresqlite "github.com/glebarez/sqlite"
	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/gorm-outbox/outbox/internal/store/sqlite"
	"github.com/gorm-outbox/outbox/internal/store/storetest"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"
	cgosqlite "gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// table is a keyword with capitals: the statements must quote it.
const table = "Order"

// open returns an opener of a file in the test's directory through one
// driver, with the settings the README recommends for it (the suite runs
// the check db.Use runs), of a store with the limits lim (its own when
// nil).
func open(dial func(dsn string) gorm.Dialector, options string, lim *store.Limits) storetest.Open {
	return func(t *testing.T) (store.Store, *gorm.DB) {
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
		return s, gdb
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
// (mattn/go-sqlite3, cgo) and github.com/glebarez/sqlite (pure Go, with
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
