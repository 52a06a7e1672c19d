package postgres_test

import (
	"context"
	"database/sql"
	"testing"

	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/gorm-outbox/outbox/internal/store/postgres"
	"github.com/gorm-outbox/outbox/internal/store/storetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// variant is a store built on the PostgreSQL store, as the store of a
// more specific server would be (ARCHITECTURE.md, "A store may build on
// another: embed it and override what differs"): a database of its own,
// so with no earlier schema versions to upgrade.
type variant struct{ *postgres.Store }

// Name implements store.Store.
func (variant) Name() string { return "pgvariant" }

// Upgrade implements store.Store: a new database never had an earlier
// version.
func (variant) Upgrade(int) string { return "" }

// Migrate implements store.Store. It must be the variant's own: the
// embedded store's Migrate hands store.Migrate the embedded store, which
// would upgrade with the PostgreSQL scripts, not the variant's Upgrade.
func (v variant) Migrate(ctx context.Context, db *sql.DB) error {
	return store.Migrate(ctx, db, v, store.TxLock)
}

// marker is the application_name of the sessions the variant serves: its
// probe accepts the "postgres" dialector only on those, so that, of the
// process-wide registry, it takes no store another test opens.
const marker = "outbox_pgvariant"

// variantDriver registers the variant above the PostgreSQL store, as a
// store for a more specific server is.
var variantDriver = store.Driver{
	Name:     "pgvariant",
	Priority: postgres.Driver.Priority + 1,
	Probe: func(ctx context.Context, dialector string, db *sql.DB) bool {
		if dialector != "postgres" || db == nil {
			return false
		}
		var app string
		return db.QueryRowContext(ctx, "SELECT current_setting('application_name')").Scan(&app) == nil && app == marker
	},
	Open: func(table string) store.Store { return variant{postgres.New(table)} },
}

// The registration lines, as the root's store_*.go files have them.
func init() {
	store.Register(postgres.Driver)
	store.Register(variantDriver)
}

// variantOpener returns an opener of a fresh schema per call whose
// sessions carry the marker, its store the one store.Open picks for them.
func variantOpener(t *testing.T, dsn string) storetest.Open {
	return schemas(t, dsn, "application_name="+marker, func(t *testing.T, gdb *gorm.DB) storetest.DB {
		db, err := gdb.DB()
		require.NoError(t, err)
		s, err := store.Open(t.Context(), gdb.Dialector.Name(), db, table)
		require.NoError(t, err)
		require.IsType(t, variant{}, s, "store.Open picks the variant on its sessions")
		// The same SQL as PostgreSQL's; no earlier versions (Past).
		return storetest.DB{Store: s, Dialect: dialect}
	})
}

// TestVariantRegistered: store.Open asks the variant first, which takes
// the sessions that carry its marker and leaves every other PostgreSQL
// session to the PostgreSQL store; ByName finds each.
func TestVariantRegistered(t *testing.T) {
	dsn := serverDSN(t)
	plain := opener(t, dsn)(t)
	db, err := plain.Gorm.DB()
	require.NoError(t, err)
	s, err := store.Open(t.Context(), plain.Gorm.Dialector.Name(), db, table)
	require.NoError(t, err)
	assert.IsType(t, (*postgres.Store)(nil), s, "a session without the marker: the PostgreSQL store")
	s, err = store.Open(t.Context(), "postgres", nil, table)
	require.NoError(t, err)
	assert.IsType(t, (*postgres.Store)(nil), s, "no database to ask: the PostgreSQL store")

	marked := variantOpener(t, dsn)(t)
	assert.Equal(t, "pgvariant", marked.Store.Name())
	s, err = store.ByName("pgvariant", table)
	require.NoError(t, err)
	assert.IsType(t, variant{}, s)
	s, err = store.ByName("postgres", table)
	require.NoError(t, err)
	assert.IsType(t, (*postgres.Store)(nil), s)
}

// TestVariant runs the whole conformance suite, and the PostgreSQL store's
// own check, on the variant: a store built on another passes the suite
// with no change to it. It runs the suite a second time on the server,
// so -short leaves it out; and after TestStore, not beside it, so as not
// to double the index builds (CREATE INDEX CONCURRENTLY) that run at once
// on the server.
func TestVariant(t *testing.T) {
	dsn := serverDSN(t)
	if testing.Short() {
		t.Skip("-short: the conformance suite runs on the PostgreSQL store alone")
	}
	open := variantOpener(t, dsn)
	storetest.Exercise(t, open)
	t.Run("InvalidIndexRebuilt", func(t *testing.T) { t.Parallel(); invalidIndexRebuilt(t, open) })
}
