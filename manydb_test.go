package outbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"log/slog"
	"net/url"
	"os"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/store"
	pgstore "github.com/gorm-outbox/outbox/internal/store/postgres"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// openPostgresDatabase creates a database of its own on the test server
// (NOTIFY channels are per database, schemas share them) and opens it.
func openPostgresDatabase(t *testing.T) *gorm.DB {
	t.Helper()
	dsn := os.Getenv(postgresDSNEnv)
	if dsn == "" {
		t.Skipf("%s is not set", postgresDSNEnv)
	}
	admin, err := gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	name := "t_" + hex.EncodeToString(b)
	require.NoError(t, admin.Exec("CREATE DATABASE "+name).Error)
	u, err := url.Parse(dsn)
	require.NoError(t, err)
	u.Path = "/" + name
	db, err := gorm.Open(postgres.Open(u.String()), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
		_ = admin.Exec("DROP DATABASE " + name + " WITH (FORCE)").Error
		if sqlDB, err := admin.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	return db
}

// TestOneOutboxManyDatabasesWakes: one Outbox installed on two databases
// (a database per tenant); a commit on one wakes that database's relay in
// this process, inside a transaction and outside one. The relays poll once
// an hour, so only the wake-up can deliver in time.
func TestOneOutboxManyDatabasesWakes(t *testing.T) {
	t.Parallel()
	for _, b := range []backend{sqliteBackend, postgresBackend(t)} {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			ob := Plugin(Config{Logger: slog.New(slog.DiscardHandler)})
			dbA, dbB := b.open(t, &gorm.Config{Logger: logger.Discard}), b.open(t, &gorm.Config{Logger: logger.Discard})
			require.NoError(t, dbA.Use(ob))
			require.NoError(t, dbB.Use(ob))
			got := make(chan string, 4)
			ob.Handle(AnyEvent, func(_ context.Context, e Event) error { got <- e.ID; return nil })
			for _, db := range []*gorm.DB{dbA, dbB} {
				r, err := ob.Relay(db, RelayConfig{PollInterval: time.Hour})
				require.NoError(t, err)
				runRelay(t, r)
			}
			require.Eventually(t, func() bool { return len(ob.wakersSnapshot()) == 2 }, 5*time.Second, time.Millisecond)

			require.NoError(t, dbB.Transaction(func(tx *gorm.DB) error {
				return Publish(tx, Event{ID: "b-in-tx", Type: "x"})
			}))
			require.Equal(t, "b-in-tx", receive(t, got))
			require.NoError(t, PublishAlone(dbA, Event{ID: "a-no-tx", Type: "x"}))
			require.Equal(t, "a-no-tx", receive(t, got))
		})
	}
}

// TestNotifyGoesToTheCommitsDatabase: the NOTIFY after a commit goes to the
// database that committed, where the relays of other processes LISTEN,
// whichever database the Outbox was installed on first.
func TestNotifyGoesToTheCommitsDatabase(t *testing.T) {
	t.Parallel()
	dbA, dbB := openPostgresDatabase(t), openPostgresDatabase(t)
	writer := Plugin(Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, dbA.Use(writer))
	require.NoError(t, dbB.Use(writer))
	// A commit on A first: a notifier bound to the first database it saw
	// would then stay on A.
	require.NoError(t, PublishAlone(dbA, Event{Type: "x"}))

	// Another process's relay on B: a second Outbox on a pool of its own.
	other, err := gorm.Open(postgres.New(postgres.Config{DSN: dsnOf(t, dbB)}), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	t.Cleanup(func() {
		if sqlDB, err := other.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	relayOb := Plugin(Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, other.Use(relayOb))
	got := make(chan string, 64)
	relayOb.Handle(AnyEvent, func(_ context.Context, e Event) error { got <- e.ID; return nil })
	// The first claim delivers the marker: from then on only a wake-up
	// delivers before the hour.
	require.NoError(t, PublishAlone(dbB, Event{ID: "marker", Type: "x"}))
	r, err := relayOb.Relay(other, RelayConfig{PollInterval: time.Hour})
	require.NoError(t, err)
	runRelay(t, r)
	require.Equal(t, "marker", receive(t, got))

	// Once LISTEN is in place (the relay may poke itself once then, to
	// catch what came before), two events one after the other: the
	// second can only come through a NOTIFY on B's database.
	require.Eventually(t, func() bool {
		var n int64
		return dbB.Raw("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND query ILIKE 'LISTEN%'").Scan(&n).Error == nil && n > 0
	}, 10*time.Second, 10*time.Millisecond, "the relay LISTENs on B")
	for _, id := range []string{"first", "second"} {
		require.NoError(t, PublishAlone(dbB, Event{ID: id, Type: "x"}))
		require.Equal(t, id, receive(t, got), "no NOTIFY reached the relay on B's database")
	}
}

// dsnOf is the DSN db was opened with (gorm.io/driver/postgres).
func dsnOf(t *testing.T, db *gorm.DB) string {
	t.Helper()
	d, ok := db.Dialector.(*postgres.Dialector)
	require.True(t, ok)
	return d.Config.DSN
}

// TestNotifyPerSchema: a schema per tenant on one database (NOTIFY channels
// are per database, not per schema): a commit in one schema notifies the
// channel of that schema's table, not that of another schema's table of
// the same name.
func TestNotifyPerSchema(t *testing.T) {
	t.Parallel()
	b := postgresBackend(t)
	dbA, dbB := b.open(t, &gorm.Config{Logger: logger.Discard}), b.open(t, &gorm.Config{Logger: logger.Discard})
	writer := Plugin(Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, dbA.Use(writer))
	require.NoError(t, dbB.Use(writer))
	nextA, nextB := listenAsRelay(t, writer, dbA), listenAsRelay(t, writer, dbB)

	// B's NOTIFY has been sent once B's listener has it; had it gone to
	// A's channel too, it would be the first A's listener reads.
	require.NoError(t, PublishAlone(dbB, Event{Type: "x"}))
	require.Equal(t, schemaOf(t, dbB), nextB())
	require.NoError(t, PublishAlone(dbA, Event{Type: "x"}))
	require.Equal(t, schemaOf(t, dbA), nextA(), "A's listener hears A's commit, not B's")
}

func schemaOf(t *testing.T, db *gorm.DB) string {
	t.Helper()
	var s string
	require.NoError(t, db.Raw("SELECT current_schema()").Scan(&s).Error)
	return s
}

// listenAsRelay LISTENs, on a connection of db's pool, on the channel a
// relay of ob on db listens on, and returns a function that waits for the
// next notification's payload.
func listenAsRelay(t *testing.T, ob *Outbox, db *gorm.DB) (next func() string) {
	t.Helper()
	sqlDB, err := db.DB()
	require.NoError(t, err)
	conn, err := sqlDB.Conn(t.Context())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	base := ob.store.(store.Notifier).Channel()
	var pc *pgx.Conn
	require.NoError(t, conn.Raw(func(dc any) error { pc = dc.(*stdlib.Conn).Conn(); return nil }))
	var channel string
	require.NoError(t, pc.QueryRow(t.Context(), "SELECT "+pgstore.ChannelSQL, base).Scan(&channel))
	_, err = pc.Exec(t.Context(), `LISTEN "`+channel+`"`)
	require.NoError(t, err)
	return func() string {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		n, err := pc.WaitForNotification(ctx)
		require.NoError(t, err, "no notification on %s", channel)
		return n.Payload
	}
}

// TestWakeAcrossPools: an app that writes through one pool and runs its
// relay on another pool of the same database, one Outbox installed on
// both: a commit still wakes the relay at once, on SQLite too (no NOTIFY).
func TestWakeAcrossPools(t *testing.T) {
	t.Parallel()
	writes := openSQLite(t, cgoSQLite, &gorm.Config{Logger: logger.Discard})
	dsn, _ := dsns.Load(writes)
	relayDB, err := gorm.Open(cgoSQLite.open(dsn.(string)), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	t.Cleanup(func() {
		if sqlDB, err := relayDB.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	ob := Plugin(Config{Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, writes.Use(ob))
	require.NoError(t, relayDB.Use(ob))
	got := make(chan string, 1)
	ob.Handle(AnyEvent, func(_ context.Context, e Event) error { got <- e.ID; return nil })
	r, err := ob.Relay(relayDB, RelayConfig{PollInterval: time.Hour})
	require.NoError(t, err)
	runRelay(t, r)
	require.Eventually(t, func() bool { return len(ob.wakersSnapshot()) == 1 }, 5*time.Second, time.Millisecond)
	require.NoError(t, writes.Transaction(func(tx *gorm.DB) error { return Publish(tx, Event{ID: "across", Type: "x"}) }))
	require.Equal(t, "across", receive(t, got))
}
