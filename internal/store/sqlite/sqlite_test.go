package sqlite_test

import (
	"database/sql"
	"log/slog"
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
// driver, with the settings the README recommends for it, after the check
// db.Use runs.
func open(dial func(dsn string) gorm.Dialector, options string) storetest.Open {
	return func(t *testing.T) (store.Store, *sql.DB) {
		dsn := "file:" + filepath.Join(t.TempDir(), "outbox.db") + options
		gdb, err := gorm.Open(dial(dsn), &gorm.Config{Logger: logger.Discard})
		require.NoError(t, err)
		db, err := gdb.DB()
		require.NoError(t, err)
		t.Cleanup(func() { _ = db.Close() })
		s := sqlite.New(table)
		require.NoError(t, s.Check(t.Context(), gdb, slog.New(slog.DiscardHandler)))
		return s, db
	}
}

// TestStore runs the conformance suite through gorm.io/driver/sqlite
// (mattn/go-sqlite3, cgo) and github.com/glebarez/sqlite (pure Go).
func TestStore(t *testing.T) {
	t.Run("cgo", func(t *testing.T) {
		t.Parallel()
		storetest.Exercise(t, open(cgosqlite.Open, sqlite.DSNOptions))
	})
	t.Run("purego", func(t *testing.T) {
		t.Parallel()
		storetest.Exercise(t, open(puresqlite.Open, sqlite.PureGoDSNOptions))
	})
}
