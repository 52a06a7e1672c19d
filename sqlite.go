package outbox

import (
	"context"
	"database/sql"
	_ "embed"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"time"

	"gorm.io/gorm"
)

var (
	//go:embed schema/sqlite.sql
	schemaSQLite string
	//go:embed schema/sqlite-upgrade-2.sql
	upgradeSQLite string
)

func init() { dialects["sqlite"] = newSQLite }

// sqliteDialect serves gorm.io/driver/sqlite (cgo) and the pure-Go
// github.com/glebarez/sqlite alike. One writer at a time, so the single
// UPDATE ... RETURNING claim is atomic without row locks. Times are stored
// as text in one UTC format, which compares correctly as strings.
type sqliteDialect struct {
	sqlSyntax
	name string
}

func newSQLite(table string) dialect {
	return &sqliteDialect{name: table, sqlSyntax: sqlSyntax{
		table:       `"` + table + `"`,
		placeholder: question,
		timeArg:     sqliteTime,
		timeCol:     bareCol,
		unsent:      "p.status <> 'sent'",
	}}
}

// sqliteTimeFormat is the one text form every time is written in, so that
// text comparisons order them: the cgo driver's own format for a
// time.Time, written explicitly so that every driver (the pure-Go ones
// format times their own way) stores the same text.
const sqliteTimeFormat = "2006-01-02 15:04:05.999999999-07:00"

func sqliteTime(t time.Time) any { return t.UTC().Format(sqliteTimeFormat) }

func (d *sqliteDialect) schema() string { return schemaFor(schemaSQLite, d.name) }

func (d *sqliteDialect) exists(ctx context.Context, db *sql.DB, name string) (bool, error) {
	var n int
	err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM sqlite_master WHERE name = ?", name).Scan(&n)
	return n > 0, err
}

func (d *sqliteDialect) insert(rows []encoded, now time.Time) query {
	return d.insertRows(rows, now, " ON CONFLICT DO NOTHING")
}

func (d *sqliteDialect) version(ctx context.Context, db querier) (int, error) {
	var table, seq int
	err := db.QueryRowContext(ctx, "SELECT (SELECT COUNT(*) FROM sqlite_master WHERE type = 'table' AND name = ?),"+
		" (SELECT COUNT(*) FROM pragma_table_info(?) WHERE name = 'seq')", d.name, d.name).Scan(&table, &seq)
	return schemaVersion(table > 0, seq > 0), err
}

func (d *sqliteDialect) upgrade() string { return schemaFor(upgradeSQLite, d.name) }

func (d *sqliteDialect) claim(ctx context.Context, db *sql.DB, c claimSpec) ([]claimed, error) {
	return queryClaimed(ctx, db, d.claimUpdate(c, ""))
}

func (d *sqliteDialect) markFailed(outs []outcome, now, lease time.Time) query {
	return d.markFailedValues(outs, now, lease, "")
}

func (d *sqliteDialect) deleteSent(before time.Time, limit int) query {
	return d.deleteSentIn(before, limit, "")
}

func (d *sqliteDialect) orderingIndex() (string, []string) {
	name := d.name + "_aggregate_idx"
	return name, []string{`CREATE INDEX IF NOT EXISTS "` + name + `" ON ` + d.table +
		" (aggregate_type, aggregate_id, seq) WHERE status <> 'sent'"}
}

func (d *sqliteDialect) notifies() bool { return false }

// check refuses a pooled in-memory database, and logs once when the
// settings concurrent writers need are missing.
func (d *sqliteDialect) check(ctx context.Context, gdb *gorm.DB, o *Outbox) error {
	db, err := rawDB(gdb)
	if err != nil {
		return err
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
	if file == "" && db.Stats().MaxOpenConnections != 1 {
		return fmt.Errorf("%w: persistent mode needs a SQLite file: an in-memory database (\":memory:\") gives each pooled connection its own database, so relays would not see committed events; use a file (see README, SQLite settings), Mode: outbox.Memory, or SetMaxOpenConns(1) before db.Use", ErrInvalidConfig)
	}
	d.warnSettings(ctx, db, gdb.Dialector, o)
	return nil
}

// The settings concurrent writers and a relay need on one SQLite file: the
// WAL journal (readers never block the writer), a 10 s busy timeout (wait
// for the write lock rather than fail), and immediate transactions (take
// the write lock at BEGIN, so a transaction that reads first is not
// refused at its first write). db.Use logs a warning when they are missing.
const (
	// SQLiteDSNOptions spells them for gorm.io/driver/sqlite
	// (mattn/go-sqlite3, cgo):
	//
	//	gorm.Open(sqlite.Open("file:app.db"+outbox.SQLiteDSNOptions), cfg)
	SQLiteDSNOptions = "?_journal_mode=WAL&_busy_timeout=10000&_txlock=immediate"

	// SQLitePureGoDSNOptions spells them for the pure-Go drivers
	// (github.com/glebarez/sqlite, modernc.org/sqlite,
	// github.com/ncruces/go-sqlite3), which ignore _journal_mode and
	// _busy_timeout.
	SQLitePureGoDSNOptions = "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(10000)&_txlock=immediate"
)

// sqliteDSN is how one driver spells the settings the README recommends.
type sqliteDSN struct {
	recommended, wal string
}

var (
	// cgoSQLiteDSN: gorm.io/driver/sqlite (mattn/go-sqlite3).
	cgoSQLiteDSN = sqliteDSN{
		recommended: SQLiteDSNOptions,
		wal:         "_journal_mode=WAL",
	}
	// pragmaSQLiteDSN: the pure-Go drivers (github.com/glebarez/sqlite,
	// modernc.org/sqlite, github.com/ncruces/go-sqlite3), which ignore
	// _journal_mode and _busy_timeout.
	pragmaSQLiteDSN = sqliteDSN{
		recommended: SQLitePureGoDSNOptions,
		wal:         "_pragma=journal_mode(WAL)",
	}
)

// sqliteDSNFor returns the spelling of the driver that parses the DSN: the
// database/sql driver's package, or, when a wrapper hides it, the
// dialector's; the cgo driver's (GORM's own) when neither is known.
func sqliteDSNFor(db *sql.DB, dial gorm.Dialector) sqliteDSN {
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
			return cgoSQLiteDSN
		case strings.HasPrefix(p, "github.com/glebarez/"), strings.HasPrefix(p, "modernc.org/sqlite"),
			strings.HasPrefix(p, "github.com/ncruces/go-sqlite3"):
			return pragmaSQLiteDSN
		}
	}
	return cgoSQLiteDSN
}

// warnSettings logs once when the SQLite settings concurrent writers need
// are missing. Without them nothing is lost, but writers whose transactions
// read before they write are refused with "database is locked" (measured in
// RELIABILITY.md: 401 of 480 transactions of 8 writers on a default DSN).
// Immediate transactions are the BEGIN the driver sends, which no PRAGMA
// shows, so the DSN is read. The advice is spelled for the driver in use.
func (d *sqliteDialect) warnSettings(ctx context.Context, db *sql.DB, dial gorm.Dialector, o *Outbox) {
	spelling := sqliteDSNFor(db, dial)
	var missing []string
	var mode string
	if err := db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err == nil && !strings.EqualFold(mode, "wal") {
		missing = append(missing, "WAL journal mode ("+spelling.wal+")")
	}
	if dsn, ok := dialectorDSN(dial); ok {
		q := strings.ToLower(dsn)
		if !strings.Contains(q, "_txlock=immediate") && !strings.Contains(q, "_txlock=exclusive") {
			missing = append(missing, "immediate transactions (_txlock=immediate)")
		}
	}
	if len(missing) > 0 {
		o.logger.Warn("outbox: SQLite lacks settings concurrent writers need; they may see \"database is locked\" (nothing is lost). Add "+spelling.recommended+" to the DSN",
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
