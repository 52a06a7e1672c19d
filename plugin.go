package outbox

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"reflect"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"gorm.io/gorm"
)

// Mode selects where events live between Publish and delivery.
type Mode int

const (
	// Persistent writes every event to the outbox table in the publishing
	// transaction; a [Relay] delivers it after the commit, at least once,
	// surviving crashes. This is the zero value.
	Persistent Mode = iota
	// Memory keeps no table: events are handed to the handlers synchronously
	// right after the transaction commits, and lost if the process dies
	// before that. Meant for development on SQLite and for tests.
	Memory
)

// String returns "persistent" or "memory".
func (m Mode) String() string {
	switch m {
	case Persistent:
		return "persistent"
	case Memory:
		return "memory"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// DefaultTable is the outbox table's name when [Config.Table] is empty.
const DefaultTable = "outbox_events"

// Config configures the plugin. Its zero value is usable: persistent mode, the
// table outbox_events created at db.Use, logging to slog.Default().
type Config struct {
	// Mode selects persistent (table + relay) or memory (synchronous,
	// after-commit) delivery. Defaults to Persistent.
	Mode Mode

	// Table is the outbox table's name. It must be a plain SQL identifier:
	// ASCII letters, digits and underscores, not starting with a digit, at
	// most 40 bytes (so that the index, constraint and NOTIFY channel names
	// derived from it stay within PostgreSQL's 63), and neither "sqlite"
	// nor starting with "sqlite_" (reserved by SQLite). It is quoted in
	// every statement, so capitals and SQL keywords are kept as they are.
	// Anything else is an error from db.Use. Defaults to "outbox_events".
	Table string

	// Logger receives the plugin's and the relay's logs. Payloads are never
	// logged. Defaults to slog.Default().
	Logger *slog.Logger

	// DisableAutoMigrate stops db.Use from creating the outbox table and its
	// indexes. Teams that run their own migrations apply schema/postgres.sql
	// or schema/sqlite.sql (or [SchemaSQL]) instead. Defaults to false.
	DisableAutoMigrate bool

	// MaxPayloadBytes bounds an event's encoded payload; a larger one is
	// rejected with [ErrInvalidEvent]. Defaults to 1 MiB.
	MaxPayloadBytes int

	// DeliverAfterCommit hands the events a transaction wrote to a relay
	// running in the same process right after the commit, which claims and
	// delivers exactly those at once (through the same claim as any batch,
	// so a live claim is never delivered twice). A single-instance app gets
	// near-zero latency, SQLite included; relays elsewhere remain the safety
	// net. Defaults to false: committed events wake local relays, which then
	// claim the oldest due events.
	DeliverAfterCommit bool

	// DisableNotify stops the NOTIFY this process sends on PostgreSQL after
	// a commit that wrote events, which wakes relays in other processes. It
	// is sent outside the business transaction, debounced (at most about one
	// per millisecond per process). Defaults to false.
	DisableNotify bool
}

// Outbox is the GORM plugin. Create it with [Plugin], install it with
// db.Use, register handlers with [Outbox.Handle]. It is safe for concurrent
// use.
type Outbox struct {
	mode       Mode
	table      string
	logger     *slog.Logger
	migrate    bool
	maxPayload int
	cfgErr     error

	mu      sync.Mutex // serialises Handle and Initialize
	dialect string     // "postgres" or "sqlite", fixed by the first Initialize
	sql     *statements

	handlers atomic.Pointer[[]route] // copy-on-write, read without locks

	deliverAfterCommit bool
	notify             bool
	wakers             wakers
	fresh              chan []string // IDs just committed, for DeliverAfterCommit
	notifier           *notifier

	// clock is replaced by tests to move time without sleeping.
	clock func() time.Time
}

var identRE = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,39}$`)

// validTable reports whether name is a table name Config.Table accepts.
func validTable(name string) bool {
	// "sqlite" itself is out too: its derived index names would start with
	// the reserved "sqlite_".
	return identRE.MatchString(name) && !strings.HasPrefix(strings.ToLower(name)+"_", "sqlite_")
}

// Plugin returns the outbox plugin configured by cfg. Install it with
// db.Use, which validates cfg and, unless disabled, creates the table.
func Plugin(cfg Config) *Outbox {
	o := &Outbox{
		mode:       cfg.Mode,
		table:      cmp.Or(cfg.Table, DefaultTable),
		logger:     cfg.Logger,
		migrate:    !cfg.DisableAutoMigrate,
		maxPayload: cmp.Or(cfg.MaxPayloadBytes, defaultMaxPayload),
		clock:      time.Now,

		deliverAfterCommit: cfg.DeliverAfterCommit,
		notify:             !cfg.DisableNotify,
		fresh:              make(chan []string, 1024),
	}
	if o.logger == nil {
		o.logger = slog.Default()
	}
	switch {
	case cfg.Mode != Persistent && cfg.Mode != Memory:
		o.cfgErr = fmt.Errorf("%w: unknown Mode %d", ErrInvalidConfig, int(cfg.Mode))
	case !validTable(o.table):
		o.cfgErr = fmt.Errorf("%w: Table %q is not a plain SQL identifier (use ASCII letters, digits and underscores, not starting with a digit or \"sqlite_\", at most 40 bytes, not \"sqlite\")", ErrInvalidConfig, o.table)
	case cfg.MaxPayloadBytes < 0:
		o.cfgErr = fmt.Errorf("%w: MaxPayloadBytes is negative (%d); use 0 for the 1 MiB default", ErrInvalidConfig, cfg.MaxPayloadBytes)
	}
	o.handlers.Store(&[]route{})
	return o
}

// Name returns "outbox", the key under which GORM registers the plugin.
func (o *Outbox) Name() string { return "outbox" }

// Mode returns the mode the outbox was configured with.
func (o *Outbox) Mode() Mode { return o.mode }

// Table returns the outbox table's name.
func (o *Outbox) Table() string { return o.table }

// Initialize implements gorm.Plugin; db.Use calls it. It checks the
// configuration, hooks the connection pool so that after-commit work runs on
// the outermost commit, registers the model callbacks and, in persistent mode,
// creates the table unless Config.DisableAutoMigrate is set.
//
// Install the plugin before other plugins that wrap the connection pool or
// re-initialize plugins (such as dbresolver), and before creating sessions
// from db: sessions made earlier keep the unhooked pool.
func (o *Outbox) Initialize(db *gorm.DB) error {
	if o.cfgErr != nil {
		return o.cfgErr
	}
	dialect := db.Dialector.Name()
	switch dialect {
	case "postgres", "sqlite":
	default:
		return fmt.Errorf("%w: %q (supported: postgres, sqlite)", ErrUnsupportedDialect, dialect)
	}
	o.mu.Lock()
	switch {
	case o.dialect == "":
		o.dialect = dialect
		o.sql = buildStatements(dialect, o.table)
		if dialect == "postgres" && o.mode == Persistent && o.notify {
			sqlDB, err := db.DB()
			if err != nil {
				o.mu.Unlock()
				return fmt.Errorf("outbox: %w", err)
			}
			o.notifier = newNotifier(o, sqlDB)
		}
	case o.dialect != dialect:
		o.mu.Unlock()
		return fmt.Errorf("%w: this Outbox is already installed on a %s database; create one Outbox per database", ErrInvalidConfig, o.dialect)
	}
	o.mu.Unlock()

	if dialect == "sqlite" && o.mode == Persistent {
		if err := checkSQLiteFile(db); err != nil {
			return err
		}
		o.warnSQLiteSettings(db)
	}
	hookConnPool(db, o)
	if err := registerCallbacks(db); err != nil {
		return fmt.Errorf("outbox: register callbacks: %w", err)
	}
	if o.mode == Persistent && o.migrate {
		if err := o.Migrate(db.Statement.Context, db); err != nil {
			return err
		}
	}
	return nil
}

// Migrate creates the outbox table and its indexes if they do not exist. It
// is what db.Use runs unless Config.DisableAutoMigrate is set.
func (o *Outbox) Migrate(ctx context.Context, db *gorm.DB) error {
	ddl, err := SchemaSQL(db.Dialector.Name(), o.table)
	if err != nil {
		return err
	}
	// One statement at a time: PostgreSQL refuses several commands in one
	// prepared statement (PrepareStmt mode).
	for _, stmt := range strings.Split(ddl, ";") {
		if strings.TrimSpace(stripSQLComments(stmt)) == "" {
			continue
		}
		if err := db.WithContext(ctx).Exec(stmt).Error; err != nil {
			return fmt.Errorf("outbox: create table %s: %w", o.table, err)
		}
	}
	return nil
}

func stripSQLComments(s string) string {
	var b strings.Builder
	for _, line := range strings.Split(s, "\n") {
		if i := strings.Index(line, "--"); i >= 0 {
			line = line[:i]
		}
		b.WriteString(line)
		b.WriteByte('\n')
	}
	return b.String()
}

func (o *Outbox) now() time.Time { return o.clock().UTC().Truncate(time.Microsecond) }

// checkSQLiteFile refuses a pooled in-memory SQLite database in persistent
// mode: every pooled connection would get its own empty database, so the
// relay would not see the events the writers committed.
func checkSQLiteFile(db *gorm.DB) error {
	var (
		seq        int
		name, file string
	)
	if err := db.Raw("PRAGMA database_list").Row().Scan(&seq, &name, &file); err != nil {
		return fmt.Errorf("outbox: inspect the SQLite database: %w", err)
	}
	if file != "" {
		return nil
	}
	if sqlDB, err := db.DB(); err == nil && sqlDB.Stats().MaxOpenConnections == 1 {
		return nil // one connection, one database: it works
	}
	return fmt.Errorf("%w: persistent mode needs a SQLite file: an in-memory database (\":memory:\") gives each pooled connection its own database, so relays would not see committed events; use a file (see README, SQLite settings), Mode: outbox.Memory, or SetMaxOpenConns(1) before db.Use", ErrInvalidConfig)
}

// recommendedSQLiteDSN is the DSN suffix the README recommends.
const recommendedSQLiteDSN = "?_journal_mode=WAL&_busy_timeout=10000&_txlock=immediate"

// warnSQLiteSettings logs once when the SQLite settings concurrent writers
// need are missing. Without them nothing is lost, but writers whose
// transactions read before they write are refused with "database is
// locked" (measured in RELIABILITY.md: 401 of 480 transactions of 8 writers
// on a default DSN). Immediate transactions are the BEGIN the driver sends,
// which no PRAGMA shows, so the DSN is read (by reflection, to keep the
// cgo driver out of the core's imports).
func (o *Outbox) warnSQLiteSettings(db *gorm.DB) {
	var missing []string
	var mode string
	if err := db.Raw("PRAGMA journal_mode").Row().Scan(&mode); err == nil && !strings.EqualFold(mode, "wal") {
		missing = append(missing, "WAL journal mode (_journal_mode=WAL)")
	}
	if dsn, ok := dialectorDSN(db.Dialector); ok {
		q := strings.ToLower(dsn)
		if !strings.Contains(q, "_txlock=immediate") && !strings.Contains(q, "_txlock=exclusive") {
			missing = append(missing, "immediate transactions (_txlock=immediate)")
		}
	}
	if len(missing) > 0 {
		o.logger.Warn("outbox: SQLite lacks settings concurrent writers need; they may see \"database is locked\" (nothing is lost). Add "+recommendedSQLiteDSN+" to the DSN",
			slog.String("missing", strings.Join(missing, ", ")))
	}
}

// dialectorDSN reads a dialector's DSN field, if it has one.
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

// fromDB returns the plugin installed on db, or nil.
func fromDB(db *gorm.DB) *Outbox {
	if db.Config == nil {
		return nil
	}
	p, ok := db.Config.Plugins["outbox"]
	if !ok {
		return nil
	}
	o, _ := p.(*Outbox)
	return o
}
