package outbox

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	mysqldriver "github.com/go-sql-driver/mysql"
	mysqlstore "github.com/gorm-outbox/outbox/internal/store/mysql"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// TestMySQL runs the shared suite on MySQL or MariaDB. It needs
// OUTBOX_TEST_MYSQL_DSN; it skips when that is unset and fails when it is set
// but the server cannot be reached.
func TestMySQL(t *testing.T) {
	t.Parallel()
	runSuite(t, mysqlBackend(t))
}

// TestMySQLMultiStatements runs the inbox's tests on connections with
// multiStatements=true, where Consume sends its INSERT with the BEGIN.
func TestMySQLMultiStatements(t *testing.T) {
	t.Parallel()
	b := mysqlBackendWith(t, func(c *mysqldriver.Config) { c.MultiStatements = true })
	for name, fn := range inboxTests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, b)
		})
	}
}

// TestMySQLTimeZones runs the relay on a connection whose loc and session
// time_zone are both far from UTC (and from each other): due times,
// leases, OccurredAt and Stats must not move by either offset.
func TestMySQLTimeZones(t *testing.T) {
	t.Parallel()
	b := mysqlBackend(t)
	base := b.open(t, &gorm.Config{Logger: logger.Discard})
	v, _ := dsns.Load(base)
	cfg, err := mysqldriver.ParseDSN(v.(string))
	require.NoError(t, err)
	cfg.Loc, err = time.LoadLocation("Asia/Kolkata") // +05:30
	require.NoError(t, err)
	cfg.Params = map[string]string{"time_zone": "'-07:00'"}
	db, err := gorm.Open(mysql.Open(cfg.FormatDSN()), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	var zone string
	require.NoError(t, db.Raw("SELECT @@SESSION.time_zone").Scan(&zone).Error)
	require.Equal(t, "-07:00", zone)

	ob := Plugin(Config{Logger: slog.New(slog.DiscardHandler)})
	clock := &fakeClock{t: time.Now().UTC()}
	ob.clock = clock.Now
	require.NoError(t, db.Use(ob))
	got := make(chan Event, 4)
	fail := true
	ob.Handle("x", func(_ context.Context, e Event) error {
		got <- e
		if fail {
			return errors.New("not yet")
		}
		return nil
	})
	occurred := time.Date(2026, 3, 29, 1, 30, 0, 123456000, time.UTC)
	require.NoError(t, PublishAlone(db, Event{ID: "tz", Type: "x", OccurredAt: occurred}))

	st, err := ob.Stats(db.WithContext(t.Context()))
	require.NoError(t, err)
	assert.Less(t, st.OldestPending, time.Minute, "the oldest pending age must not carry a zone offset")

	r := mustRelay(t, ob, db, RelayConfig{Backoff: func(int) time.Duration { return time.Hour }})
	n, err := r.ProcessOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, n, "a just-published event is due at once, not after a zone offset")
	e := <-got
	assert.True(t, occurred.Equal(e.OccurredAt), "OccurredAt %v came back as %v", occurred, e.OccurredAt)
	assert.Equal(t, time.UTC, e.OccurredAt.Location())

	// The stored times are UTC, as a reader on loc=UTC sees them.
	var due, created string
	require.NoError(t, base.Raw("SELECT CAST(available_at AS CHAR), CAST(created_at AS CHAR) FROM outbox_events WHERE named_id = 'tz'").Row().Scan(&due, &created))
	dueAt, err := time.Parse("2006-01-02 15:04:05.000000", due)
	require.NoError(t, err)
	assert.WithinDuration(t, clock.Now().Add(time.Hour), dueAt, time.Second, "retry due in an hour, stored as UTC")

	clock.Advance(59 * time.Minute)
	n, err = r.ProcessOnce(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 0, n, "not due before the backoff has passed")
	clock.Advance(2 * time.Minute)
	fail = false
	n, err = r.ProcessOnce(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 1, n, "due once the backoff has passed")
	<-got
	st, err = ob.Stats(db.WithContext(t.Context()))
	require.NoError(t, err)
	assert.Zero(t, st.Pending)
	assert.Equal(t, int64(1), sentRows(t, db, ob))
}

// TestMySQLChecks: db.Use refuses what would fail later, and names the fix.
func TestMySQLChecks(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		version string
		ok      bool
	}{
		{"10.11.19-MariaDB-0+deb12u1", true}, {"10.6.0-MariaDB", true}, {"10.5.27-MariaDB-log", false},
		{"11.4.2-MariaDB", true}, {"8.0.36", true}, {"8.0.1", true}, {"8.0.0-dmr", false},
		{"5.7.44-log", false}, {"9.1.0", true},
	} {
		err := mysqlstore.CheckVersion(c.version)
		if c.ok {
			assert.NoError(t, err, c.version)
		} else {
			assert.ErrorIs(t, err, ErrUnsupportedVersion, c.version)
			assert.ErrorContains(t, err, "SKIP LOCKED", c.version)
		}
	}
	assert.NoError(t, mysqlstore.CheckBinlog(false, "STATEMENT"), "no binary log, no restriction")
	assert.NoError(t, mysqlstore.CheckBinlog(true, "ROW"))
	assert.NoError(t, mysqlstore.CheckBinlog(true, "MIXED"))
	err := mysqlstore.CheckBinlog(true, "STATEMENT")
	assert.ErrorIs(t, err, ErrServerSetting)
	assert.ErrorContains(t, err, "binlog_format")

	// A DSN without parseTime=True is refused at db.Use in persistent mode,
	// and is fine in memory mode, which runs no SQL of its own.
	b := mysqlBackend(t)
	base := b.open(t, &gorm.Config{Logger: logger.Discard})
	v, _ := dsns.Load(base)
	cfg, err := mysqldriver.ParseDSN(v.(string))
	require.NoError(t, err)
	cfg.ParseTime = false
	for _, mode := range []Mode{Persistent, Memory} {
		db, err := gorm.Open(mysql.Open(cfg.FormatDSN()), &gorm.Config{Logger: logger.Discard})
		require.NoError(t, err)
		err = db.Use(Plugin(Config{Mode: mode}))
		if mode == Persistent {
			require.ErrorIs(t, err, ErrInvalidConfig)
			assert.ErrorContains(t, err, "parseTime=True")
		} else {
			require.NoError(t, err)
		}
		sqlDB, _ := db.DB()
		_ = sqlDB.Close()
	}
}
