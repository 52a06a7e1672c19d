package outbox

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/gorm-outbox/outbox/internal/engine"
	"github.com/gorm-outbox/outbox/internal/store"
	mysqlstore "github.com/gorm-outbox/outbox/internal/store/mysql"
	sqlitestore "github.com/gorm-outbox/outbox/internal/store/sqlite"
	puresqlite "github.com/libtnb/sqlite"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// backend is one database the shared suite runs on; caps says what differs.
type backend struct {
	name string
	// open returns a fresh, empty database for one test.
	open func(t *testing.T, gcfg *gorm.Config) *gorm.DB
	// logical: Persistent-mode setups become Logical mode, each with a
	// slot of its own.
	logical bool
	// sqlite is the SQLite driver the backend opens databases with, for
	// the tests that open databases of their own (nil on the others).
	sqlite *sqliteDriver
	// lead: Consume sends its inbox INSERT with the BEGIN (PostgreSQL
	// through pgx; MySQL with multiStatements=true).
	lead bool
}

// sqliteDriver is one GORM SQLite driver.
type sqliteDriver struct {
	// open returns a dialector on dsn.
	open func(dsn string) gorm.Dialector
	// conn returns a dialector on an open connection pool.
	conn func(gorm.ConnPool) gorm.Dialector
	// settings is the DSN suffix the README recommends (WAL, a busy
	// timeout, immediate transactions) in this driver's spelling.
	settings string
}

// cgoSQLite is gorm.io/driver/sqlite (mattn/go-sqlite3, cgo).
var cgoSQLite = &sqliteDriver{
	open:     sqlite.Open,
	conn:     func(c gorm.ConnPool) gorm.Dialector { return sqlite.Dialector{Conn: c} },
	settings: sqlitestore.CgoDSN.Recommended,
}

// pureSQLite is github.com/libtnb/sqlite (modernc.org/sqlite, no cgo),
// which GORM users pick for static builds.
var pureSQLite = &sqliteDriver{
	open:     puresqlite.Open,
	conn:     func(c gorm.ConnPool) gorm.Dialector { return puresqlite.Dialector{Conn: c} },
	settings: sqlitestore.PragmaDSN.Recommended,
}

// openSQLite opens a file in t's temporary directory through d with its
// recommended settings, closed when the test ends.
func openSQLite(t *testing.T, d *sqliteDriver, gcfg *gorm.Config) *gorm.DB {
	// A file, not :memory:, which gives each pooled connection its own
	// database.
	dsn := "file:" + filepath.Join(t.TempDir(), "test.db") + d.settings
	db, err := gorm.Open(d.open(dsn), gcfg)
	require.NoError(t, err)
	dsns.Store(db, dsn)
	if d == pureSQLite {
		pure.Store(db, true)
	}
	t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	return db
}

const postgresDSNEnv = "OUTBOX_TEST_POSTGRES_DSN"

var sqliteBackend = backend{
	name:   "sqlite",
	open:   func(t *testing.T, gcfg *gorm.Config) *gorm.DB { return openSQLite(t, cgoSQLite, gcfg) },
	sqlite: cgoSQLite,
}

// pureSQLiteBackend is SQLite through the pure-Go driver.
var pureSQLiteBackend = backend{
	name:   "sqlite",
	open:   func(t *testing.T, gcfg *gorm.Config) *gorm.DB { return openSQLite(t, pureSQLite, gcfg) },
	sqlite: pureSQLite,
}

// pure marks the databases opened through the pure-Go SQLite driver.
var pure sync.Map

// postgresBackend gives every test its own schema, dropped afterwards, so
// tests and packages can run in parallel against one database.
func postgresBackend(t *testing.T) backend {
	dsn := os.Getenv(postgresDSNEnv)
	if dsn == "" {
		t.Skipf("%s is not set; set it (e.g. postgres://postgres@127.0.0.1:5432/test?sslmode=disable) to run the PostgreSQL suite", postgresDSNEnv)
	}
	admin, err := gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err, "%s is set but PostgreSQL is unreachable", postgresDSNEnv)
	sqlAdmin, err := admin.DB()
	require.NoError(t, err)
	require.NoError(t, sqlAdmin.Ping(), "%s is set but PostgreSQL is unreachable", postgresDSNEnv)
	t.Cleanup(func() { _ = sqlAdmin.Close() })

	return backend{
		name: "postgres",
		lead: true,
		open: func(t *testing.T, gcfg *gorm.Config) *gorm.DB {
			b := make([]byte, 6)
			_, _ = rand.Read(b)
			schema := "t_" + hex.EncodeToString(b)
			require.NoError(t, admin.Exec("CREATE SCHEMA "+schema).Error)
			t.Cleanup(func() { _ = admin.Exec("DROP SCHEMA " + schema + " CASCADE").Error })
			sep := "?"
			if containsByte(dsn, '?') {
				sep = "&"
			}
			db, err := gorm.Open(postgres.Open(dsn+sep+"search_path="+schema), gcfg)
			require.NoError(t, err)
			dsns.Store(db, dsn+sep+"search_path="+schema)
			t.Cleanup(func() {
				if sqlDB, err := db.DB(); err == nil {
					_ = sqlDB.Close()
				}
			})
			return db
		},
	}
}

const mysqlDSNEnv = "OUTBOX_TEST_MYSQL_DSN"

// mysqlBackend gives every test its own database, dropped afterwards. The
// DSN is the one GORM's documentation shows (parseTime=True&loc=Local).
func mysqlBackend(t *testing.T) backend { return mysqlBackendWith(t, nil) }

// mysqlBackendWith is mysqlBackend with the DSN's settings changed by tweak.
func mysqlBackendWith(t *testing.T, tweak func(*mysqldriver.Config)) backend {
	dsn := os.Getenv(mysqlDSNEnv)
	if dsn == "" {
		t.Skipf("%s is not set; set it (e.g. root@tcp(127.0.0.1:3306)/test?charset=utf8mb4&parseTime=True&loc=Local) to run the MySQL/MariaDB suite", mysqlDSNEnv)
	}
	cfg, err := mysqldriver.ParseDSN(dsn)
	require.NoError(t, err, "%s", mysqlDSNEnv)
	if tweak != nil {
		tweak(cfg)
	}
	admin, err := gorm.Open(mysql.Open(dsn), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err, "%s is set but MySQL is unreachable", mysqlDSNEnv)
	sqlAdmin, err := admin.DB()
	require.NoError(t, err)
	require.NoError(t, sqlAdmin.Ping(), "%s is set but MySQL is unreachable", mysqlDSNEnv)
	t.Cleanup(func() { _ = sqlAdmin.Close() })

	return backend{
		name: "mysql",
		lead: cfg.MultiStatements,
		open: func(t *testing.T, gcfg *gorm.Config) *gorm.DB {
			b := make([]byte, 6)
			_, _ = rand.Read(b)
			name := "t_" + hex.EncodeToString(b)
			require.NoError(t, admin.Exec("CREATE DATABASE "+name).Error)
			t.Cleanup(func() { _ = admin.Exec("DROP DATABASE " + name).Error })
			c := cfg.Clone()
			c.DBName = name
			db, err := gorm.Open(mysql.Open(c.FormatDSN()), gcfg)
			require.NoError(t, err)
			dsns.Store(db, c.FormatDSN())
			t.Cleanup(func() {
				if sqlDB, err := db.DB(); err == nil {
					_ = sqlDB.Close()
				}
			})
			return db
		},
	}
}

// dsns maps each test database to its DSN, so a test can open a second
// connection pool on it, as another process would.
var dsns sync.Map

// reopen opens a new connection pool on the test's database.
func (e *testEnv) reopen(t *testing.T) *gorm.DB {
	v, ok := dsns.Load(e.db)
	require.True(t, ok)
	var dial gorm.Dialector
	switch e.name {
	case "postgres":
		dial = postgres.Open(v.(string))
	case "mysql":
		dial = mysql.Open(v.(string))
	default:
		dial = sqlite.Open(v.(string))
		if _, ok := pure.Load(e.db); ok {
			dial = puresqlite.Open(v.(string))
		}
	}
	db, err := gorm.Open(dial, &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	return db
}

// timeArg is t as the test's database stores it, for writing a time
// column with plain SQL.
func (e *testEnv) timeArg(t time.Time) any {
	switch e.name {
	case "mysql":
		return mysqlstore.Time(t)
	case "sqlite":
		return sqlitestore.Time(t)
	}
	return t
}

// asUTC reads t's wall clock as UTC.
func asUTC(t time.Time) time.Time {
	return time.Date(t.Year(), t.Month(), t.Day(), t.Hour(), t.Minute(), t.Second(), t.Nanosecond(), time.UTC)
}

func containsByte(s string, c byte) bool {
	for i := range len(s) {
		if s[i] == c {
			return true
		}
	}
	return false
}

// fakeClock is a settable clock for the outbox's database timestamps, so
// backoff and leases are tested without sleeping.
type fakeClock struct {
	mu sync.Mutex
	t  time.Time
}

// Now returns the clock's time and moves it on by a microsecond, as real
// time would between two reads, so successive writes get distinct times.
func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(time.Microsecond)
	return c.t
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// testEnv is what setup returns: a database with the plugin installed.
type testEnv struct {
	t     *testing.T
	db    *gorm.DB
	ob    *Outbox
	clock *fakeClock
	name  string
	// parker is the relay of parkInTable (Logical mode).
	parker *Relay
}

type setupOpts struct {
	cfg  Config
	gorm *gorm.Config
}

func (b backend) setup(t *testing.T, opts ...func(*setupOpts)) *testEnv {
	t.Helper()
	o := setupOpts{gorm: &gorm.Config{Logger: logger.Discard}}
	for _, f := range opts {
		f(&o)
	}
	db := b.open(t, o.gorm)
	if o.cfg.Logger == nil {
		o.cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if b.logical && o.cfg.Mode == Persistent {
		o.cfg.Mode = Logical
		o.cfg.Logical.Slot = randomName("s_")
		dropSlotAtCleanup(t, db, o.cfg.Logical.Slot)
	}
	ob := Plugin(o.cfg)
	clock := &fakeClock{t: time.Now().UTC()}
	ob.clock = clock.Now
	require.NoError(t, db.Use(ob))
	require.NoError(t, db.AutoMigrate(&Order{}))
	return &testEnv{t: t, db: db, ob: ob, clock: clock, name: b.name}
}

func withConfig(cfg Config) func(*setupOpts) { return func(o *setupOpts) { o.cfg = cfg } }
func withGorm(g *gorm.Config) func(*setupOpts) {
	return func(o *setupOpts) {
		if g.Logger == nil {
			g.Logger = logger.Discard
		}
		o.gorm = g
	}
}

// Order is the business model of the tests; it records events.
type Order struct {
	ID    uint `gorm:"primaryKey"`
	Total int
	Recorder
}

// count returns how many outbox rows match the condition, read outside any
// transaction.
func (e *testEnv) count(where string, args ...any) int64 {
	e.t.Helper()
	var n int64
	q := e.db.Table(e.ob.Table())
	if where != "" {
		q = q.Where(where, args...)
	}
	require.NoError(e.t, q.Count(&n).Error)
	return n
}

func (e *testEnv) record(id string) Row {
	e.t.Helper()
	var r Row
	require.NoError(e.t, e.db.Table(e.ob.Table()).Where(e.ob.store.IDColumn()+" = ?", id).Take(&r).Error)
	if e.name == "mysql" {
		// The columns hold UTC; the driver labels them with the DSN's loc.
		for _, p := range []*time.Time{&r.AvailableAt, &r.OccurredAt, &r.CreatedAt, &r.UpdatedAt, r.LockedUntil, r.SentAt} {
			if p != nil {
				*p = asUTC(*p)
			}
		}
	}
	return r
}

func (e *testEnv) relay(cfg RelayConfig) *Relay {
	return mustRelay(e.t, e.ob, e.db, cfg)
}

// collector is a handler that records what it receives.
type collector struct {
	mu     sync.Mutex
	events []Event
}

func (c *collector) handle(_ context.Context, e Event) error {
	c.mu.Lock()
	c.events = append(c.events, e)
	c.mu.Unlock()
	return nil
}

func (c *collector) ids() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]string, len(c.events))
	for i, e := range c.events {
		out[i] = e.ID
	}
	return out
}

func (c *collector) len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.events)
}

// claim leases up to limit due rows (only those in ids, when given) until
// lease, as a relay's claim at now would: a claim whose outcome a test
// writes (or never writes) by hand.
func (r *Relay) claim(ctx context.Context, now, lease time.Time, ids []string, limit int) ([]claimed, error) {
	spec := store.ClaimSpec{Now: now, Lease: lease, Limit: limit, Ordered: r.cfg.OrderByAggregate}
	if len(ids) > 0 {
		seqs, err := r.seqsOf(ctx, ids)
		if err != nil {
			return nil, err
		}
		if len(seqs) == 0 {
			return nil, nil
		}
		spec.Seqs = seqs
	}
	rows, err := r.o.store.Claim(ctx, r.table.DB, spec)
	if err != nil {
		return nil, err
	}
	out := make([]claimed, len(rows))
	for i := range rows {
		out[i] = engine.FromRow(&rows[i])
	}
	return out, nil
}

// seqsOf reads the seqs of the rows with the IDs.
func (r *Relay) seqsOf(ctx context.Context, ids []string) ([]int64, error) {
	var seqs []int64
	for _, id := range ids {
		row, found, err := r.o.store.Get(ctx, r.table.DB, id)
		if err != nil {
			return nil, err
		}
		if found {
			seqs = append(seqs, row.Seq)
		}
	}
	return seqs, nil
}

func (r *Relay) markSent(ctx context.Context, ids []string, lease time.Time) error {
	seqs, err := r.seqsOf(ctx, ids)
	if err != nil {
		return err
	}
	return r.table.MarkSent(ctx, seqs, lease)
}

func (r *Relay) markFailed(ctx context.Context, outs []outcome, lease time.Time) error {
	for i := range outs {
		if outs[i].Seq == 0 {
			seqs, err := r.seqsOf(ctx, []string{outs[i].ID})
			if err != nil || len(seqs) != 1 {
				return fmt.Errorf("seq of %s: %v %w", outs[i].ID, seqs, err)
			}
			outs[i].Seq = seqs[0]
		}
	}
	return r.table.MarkFailed(ctx, outs, lease)
}

func (r *Relay) release(ctx context.Context, ids []string, lease time.Time) error {
	seqs, err := r.seqsOf(ctx, ids)
	if err != nil {
		return err
	}
	return r.table.Release(ctx, seqs, lease)
}

// mustRelay is o's relay on db, the test failing when cfg is refused.
func mustRelay(t testing.TB, o *Outbox, db *gorm.DB, cfg RelayConfig) *Relay {
	t.Helper()
	r, err := o.Relay(db, cfg)
	require.NoError(t, err)
	return r
}

// sentRows counts the table's sent rows (Stats reports none: it reads
// through indexes what is pending and failed).
func sentRows(t testing.TB, db *gorm.DB, ob *Outbox) int64 {
	t.Helper()
	var n int64
	require.NoError(t, db.Table(ob.Table()).Where("status = ?", StatusSent).Count(&n).Error)
	return n
}
