// Package sqlite is the outbox's store on SQLite, through
// gorm.io/driver/sqlite (cgo) and the pure-Go github.com/libtnb/sqlite
// (modernc.org/sqlite) alike: one writer at a time, so the single UPDATE ... RETURNING claim is
// atomic without row locks. Times are stored as text in one UTC format,
// which compares correctly as strings.
package sqlite

import (
	"context"
	"database/sql"
	_ "embed"
	"fmt"
	"log/slog"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/gorm-outbox/outbox/internal/errs"
	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/gorm-outbox/outbox/internal/store/sqlbuild"
	"gorm.io/gorm"
)

var (
	//go:embed sqlite.sql
	schema string
	//go:embed sqlite-upgrade-2.sql
	upgrade2 string
	//go:embed sqlite-upgrade-3.sql
	upgrade3 string
	//go:embed sqlite-inbox.sql
	inbox string
)

// Driver registers the store (the root package's registration line).
var Driver = store.Driver{
	Name:  "sqlite",
	Probe: func(_ context.Context, dialector string, _ *sql.DB) bool { return dialector == "sqlite" },
	Open:  func(table string) store.Store { return New(table) },
}

// Store is the SQLite store.
type Store struct {
	sqlbuild.Syntax
	sqlbuild.Walking
	name string
}

// New returns the store of the table named table.
func New(table string) *Store {
	s := &Store{name: table, Syntax: sqlbuild.Syntax{
		Table:       `"` + table + `"`,
		Placeholder: sqlbuild.Question,
		TimeArg:     Time,
		TimeCol:     sqlbuild.BareCol,
		Unsent:      "p.status <> 'sent'",
		IDCol:       "COALESCE(named_id, id)",
		IDArg:       func(u uuid.UUID) any { return u.String() },
		StatusArg:   func(ph string) string { return ph },
		Fresh:       true,
		// SQLite takes 32766 parameters a statement; an INSERT row has
		// 11, an outcome row 4.
		Lim:            store.Limits{MaxParams: 32766, InsertRows: 1000, OutcomeRows: 1000, RetentionBatch: 1000},
		InsertConflict: " ON CONFLICT DO NOTHING",
		Returning:      true,
		Dialect: sqlbuild.Dialect{
			MinuteOf:      func(col string) string { return "(CAST(strftime('%s', " + col + ") AS INTEGER) / 60)" },
			MillisBetween: func(a, b string) string { return "(julianday(" + b + ") - julianday(" + a + ")) * 86400000.0" },
			IntDiv:        "/",
			AddOnConflict: sqlbuild.OnConflictAdd,
			Upsert:        sqlbuild.OnConflictSet,
			InsertIgnore:  [2]string{"INSERT INTO", " ON CONFLICT DO NOTHING"},
		},
	}}
	s.Walking = sqlbuild.Walking{S: &s.Syntax}
	return s
}

var (
	_ store.Store    = (*Store)(nil)
	_ store.Inbox    = (*Store)(nil)
	_ store.Overview = (*Store)(nil)
	_ store.History  = (*Store)(nil)
	_ store.Relays   = (*Store)(nil)
	_ store.Walker   = (*Store)(nil)
)

// timeFormat is the one text form every time is written in, so that text
// comparisons order them: the cgo driver's own format for a time.Time,
// written explicitly so that every driver (the pure-Go ones format times
// their own way) stores the same text.
const timeFormat = "2006-01-02 15:04:05.999999999-07:00"

// Time is a time as SQLite stores it.
func Time(t time.Time) any { return t.UTC().Format(timeFormat) }

// Name implements store.Store.
func (s *Store) Name() string { return "sqlite" }

// Schema implements store.Schema.
func (s *Store) Schema() string { return store.Rename(schema, s.name) }

// Upgrade implements store.Schema.
func (s *Store) Upgrade(from int) string {
	switch from {
	case 1:
		return store.Rename(upgrade2, s.name)
	case 2:
		return store.Rename(upgrade3, s.name)
	}
	return ""
}

// InboxSchema implements store.Inbox.
func (s *Store) InboxSchema(table string) string { return store.RenameInbox(inbox, table) }

// MigrateInbox implements store.Inbox.
func (s *Store) MigrateInbox(ctx context.Context, db *sql.DB, table string) error {
	return store.CreateDDL(ctx, db, s.Exists, s.InboxSchema(table))
}

// Record implements store.Inbox. SQLite has one writer at a time: a second
// transaction recording the same pair waits (busy_timeout) for the first to
// end, then finds it or not.
func (s *Store) Record(ctx context.Context, db store.DB, table, consumer, messageID string, now time.Time) (bool, error) {
	return s.Recorded(ctx, db, s.InboxInsert("INSERT INTO", `"`+table+`"`, " ON CONFLICT DO NOTHING", consumer, messageID, now))
}

// RetryRecord implements store.Inbox: nothing to run again.
func (s *Store) RetryRecord(error) bool { return false }

// ForgetConsumed implements store.Inbox.
func (s *Store) ForgetConsumed(ctx context.Context, db store.DB, table string, before time.Time, limit int) (int64, error) {
	return s.ForgetConsumedByKey(ctx, db, `"`+table+`"`, before, limit)
}

// Migrate implements store.Store: an upgrade script's first write takes
// the database's write lock in the script's transaction.
func (s *Store) Migrate(ctx context.Context, db *sql.DB) error {
	return store.Migrate(ctx, db, s, store.TxLock)
}

// Exists implements store.Schema.
func (s *Store) Exists(ctx context.Context, db store.DB, name string) (bool, error) {
	var n int
	err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM sqlite_master WHERE name = ?", name).Scan(&n)
	return n > 0, err
}

// Version implements store.Schema.
func (s *Store) Version(ctx context.Context, q store.DB) (int, error) {
	var table, seq, named int
	err := q.QueryRowContext(ctx, "SELECT (SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?),"+
		" (SELECT COUNT(*) FROM pragma_table_info(?) WHERE name = 'seq'), (SELECT COUNT(*) FROM pragma_table_info(?) WHERE name = 'named_id')",
		s.name, s.name, s.name).Scan(&table, &seq, &named)
	return store.VersionOf(table > 0, seq > 0, named > 0), err
}

// EnsureOrdering implements store.Store. The claim needs no row locks:
// the database's one writer makes it atomic.
func (s *Store) EnsureOrdering(ctx context.Context, db *sql.DB) error {
	name := s.name + "_aggregate_idx"
	return store.Ensure(ctx, db, s.Exists, name, `CREATE INDEX IF NOT EXISTS "`+name+`" ON `+s.Table+
		" (aggregate_type, aggregate_id, seq) WHERE status <> 'sent'")
}

// check refuses a pooled in-memory database, and logs once when the
// settings concurrent writers need are missing.
func (s *Store) Check(ctx context.Context, gdb *gorm.DB, logger *slog.Logger) error {
	db, err := gdb.DB()
	if err != nil {
		return fmt.Errorf("outbox: %w", err)
	}
	var (
		seq        int
		name, file string
	)
	if err := db.QueryRowContext(ctx, "PRAGMA database_list").Scan(&seq, &name, &file); err != nil {
		return fmt.Errorf("outbox: inspect the SQLite database: %w", err)
	}
	// Every pooled connection to ":memory:" gets its own empty database, so
	// the relay would not see the events the writers committed; one
	// connection, one database, works.
	var version string
	if err := db.QueryRowContext(ctx, "SELECT sqlite_version()").Scan(&version); err != nil {
		return fmt.Errorf("outbox: inspect the SQLite library: %w", err)
	}
	if err := CheckVersion(version); err != nil {
		return err
	}
	if file == "" && db.Stats().MaxOpenConnections != 1 {
		return fmt.Errorf("%w: persistent mode needs a SQLite file: an in-memory database (\":memory:\") gives each pooled connection its own database, so relays would not see committed events; use a file (see docs/databases.md, SQLite), Mode: outbox.Memory, or SetMaxOpenConns(1) before db.Use", errs.ErrInvalidConfig)
	}
	warnSettings(ctx, db, gdb.Dialector, logger)
	return nil
}

// CheckVersion refuses a SQLite library before 3.35, which has no UPDATE
// ... RETURNING (the claim) nor INSERT ... RETURNING (DeliverAfterCommit).
func CheckVersion(version string) error {
	var v [3]int
	for i, p := range strings.SplitN(version, ".", 3) {
		v[i], _ = strconv.Atoi(p)
	}
	if v[0] < 3 || v[0] == 3 && v[1] < 35 {
		return fmt.Errorf("%w: SQLite %s; the outbox needs SQLite 3.35 or later (RETURNING)", errs.ErrUnsupportedVersion, version)
	}
	return nil
}

// The settings concurrent writers and a relay need on one SQLite file: the
// WAL journal (readers never block the writer), a 10 s busy timeout (wait
// for the write lock rather than fail), and immediate transactions (take
// the write lock at BEGIN, so a transaction that reads first is not
// refused at its first write), spelled for each driver; the root package
// exports them (outbox.SQLiteDSNOptions, outbox.SQLitePureGoDSNOptions).
const (
	// DSNOptions is the spelling of gorm.io/driver/sqlite (mattn/go-sqlite3).
	DSNOptions = "?_journal_mode=WAL&_busy_timeout=10000&_txlock=immediate"
	// PureGoDSNOptions is the pure-Go drivers' (github.com/libtnb/sqlite,
	// modernc.org/sqlite, github.com/ncruces/go-sqlite3,
	// github.com/glebarez/sqlite): the _pragma spelling, which they all
	// read; all but modernc.org/sqlite since v1.55 ignore _journal_mode and
	// _busy_timeout.
	PureGoDSNOptions = "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_txlock=immediate"
)

// DSN is how one driver spells the settings docs/databases.md recommends: the
// whole suffix, and the part that turns WAL on.
type DSN struct {
	Recommended, WAL string
}

var (
	// CgoDSN: gorm.io/driver/sqlite (mattn/go-sqlite3).
	CgoDSN = DSN{
		Recommended: DSNOptions,
		WAL:         "_journal_mode=WAL",
	}
	// PragmaDSN: the pure-Go drivers (github.com/libtnb/sqlite,
	// modernc.org/sqlite, github.com/ncruces/go-sqlite3,
	// github.com/glebarez/sqlite), PureGoDSNOptions.
	PragmaDSN = DSN{
		Recommended: PureGoDSNOptions,
		WAL:         "_pragma=journal_mode(WAL)",
	}
)

// DSNFor returns the spelling of the driver that parses the DSN: the
// database/sql driver's package, or, when a wrapper hides it, the
// dialector's; the cgo driver's (GORM's own) when neither is known.
func DSNFor(db *sql.DB, dial gorm.Dialector) DSN {
	for _, v := range []any{db.Driver(), dial} {
		t := reflect.TypeOf(v)
		for t != nil && t.Kind() == reflect.Pointer {
			t = t.Elem()
		}
		if t == nil {
			continue
		}
		switch p := t.PkgPath(); {
		case strings.HasPrefix(p, "github.com/mattn/go-sqlite3"), p == "gorm.io/driver/sqlite":
			return CgoDSN
		case strings.HasPrefix(p, "modernc.org/sqlite"), strings.HasPrefix(p, "github.com/libtnb/sqlite"),
			strings.HasPrefix(p, "github.com/glebarez/"), strings.HasPrefix(p, "github.com/ncruces/go-sqlite3"):
			return PragmaDSN
		}
	}
	return CgoDSN
}

// warnSettings logs once when the SQLite settings concurrent writers need
// are missing. Without them nothing is lost, but writers whose transactions
// read before they write are refused with "database is locked" (measured in
// RELIABILITY.md: 401 of 480 transactions of 8 writers on a default DSN).
// Immediate transactions are the BEGIN the driver sends, which no PRAGMA
// shows, so the DSN is read. The advice is spelled for the driver in use.
func warnSettings(ctx context.Context, db *sql.DB, dial gorm.Dialector, logger *slog.Logger) {
	spelling := DSNFor(db, dial)
	var missing []string
	var mode string
	if err := db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err == nil && !strings.EqualFold(mode, "wal") {
		missing = append(missing, "WAL journal mode ("+spelling.WAL+")")
	}
	if dsn, ok := dialectorDSN(dial); ok {
		q := strings.ToLower(dsn)
		if !strings.Contains(q, "_txlock=immediate") && !strings.Contains(q, "_txlock=exclusive") {
			missing = append(missing, "immediate transactions (_txlock=immediate)")
		}
	}
	if len(missing) > 0 {
		logger.Warn("outbox: SQLite lacks settings concurrent writers need; they may see \"database is locked\" (nothing is lost). Add "+spelling.Recommended+" to the DSN",
			slog.String("missing", strings.Join(missing, ", ")))
	}
}

// dialectorDSN reads a dialector's DSN field, if it has one (by reflection,
// to keep the drivers out of the core's imports).
func dialectorDSN(d gorm.Dialector) (string, bool) {
	v := reflect.ValueOf(d)
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		if v.IsNil() {
			return "", false
		}
		v = v.Elem()
	}
	if v.Kind() != reflect.Struct {
		return "", false
	}
	f := v.FieldByName("DSN")
	if !f.IsValid() || f.Kind() != reflect.String || f.String() == "" {
		return "", false
	}
	return f.String(), true
}
