package outbox

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorm-outbox/outbox/internal/encode"
	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/gorm-outbox/outbox/internal/txhook"
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
	// Logical, on PostgreSQL only, writes every event into the publishing
	// transaction's WAL (pg_logical_emit_message) instead of a table row;
	// a [Relay] streams the committed events from a logical replication
	// slot, in commit order, at least once. Failed deliveries go to the
	// outbox table and are retried from there as in Persistent mode. It
	// needs wal_level=logical and a role allowed to replicate; see
	// docs/logical.md.
	Logical
)

// String returns "persistent", "memory" or "logical".
func (m Mode) String() string {
	switch m {
	case Persistent:
		return "persistent"
	case Memory:
		return "memory"
	case Logical:
		return "logical"
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// DefaultTable is the outbox table's name when [Config.Table] is empty.
const DefaultTable = "outbox_events"

// Config configures the plugin. Its zero value is usable: persistent mode, the
// table outbox_events created at db.Use, logging to slog.Default().
type Config struct {
	// Mode selects persistent (table + relay), memory (synchronous,
	// after-commit) or, on PostgreSQL, logical (WAL + streaming relay)
	// delivery. Defaults to Persistent.
	Mode Mode

	// Table is the outbox table's name. It must be a plain SQL identifier:
	// ASCII letters, digits and underscores, not starting with a digit, at
	// most 40 bytes (so that the index, constraint and NOTIFY channel names
	// derived from it stay within PostgreSQL's 63), and neither "sqlite"
	// nor starting with "sqlite_" (reserved by SQLite), nor the inbox's
	// name (InboxTable, in any case). It is quoted in
	// every statement, so capitals and SQL keywords are kept as they are.
	// Anything else is an error from db.Use. Defaults to "outbox_events".
	Table string

	// Logger receives the plugin's and the relay's logs. Payloads are never
	// logged. Defaults to slog.Default().
	Logger *slog.Logger

	// DisableAutoMigrate stops db.Use from creating the outbox table and its
	// indexes. Teams that run their own migrations apply schema/postgres.sql,
	// schema/sqlite.sql or schema/mysql.sql (or [SchemaSQL]) instead.
	// Defaults to false.
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

	// DisableNotify turns PostgreSQL's LISTEN/NOTIFY off for this outbox:
	// no NOTIFY after a commit that wrote events (which wakes relays in
	// other processes; it is sent outside the business transaction, only
	// when no relay of this process runs on the pool that committed, and
	// debounced per pool: at most one a millisecond over time, one per 4 ms
	// above 1,500 commits a second, one per 8 ms while wake-ups keep
	// coming as it is sent), and no LISTEN in
	// its relays, which then rely on RelayConfig.PollInterval and on
	// wake-ups from writers in their own process. Set it behind a
	// transaction-pooling proxy, where LISTEN cannot work. Defaults to
	// false.
	DisableNotify bool

	// Logical holds the settings of [Logical] mode; ignored in other modes.
	Logical LogicalConfig

	// InboxTable is the name of the table [Consume] records consumed
	// messages in, created by db.Use beside the outbox table (in
	// Persistent and Logical modes). The rules of Table apply. Several
	// outboxes on one database may share it: its key is the consumer and
	// the message ID. Defaults to "outbox_inbox".
	InboxTable string

	// RetainSent is how long the table keeps sent rows, and their event
	// history, before the relays delete them, in small batches;
	// [RetainForever] keeps them. A sent row also makes its idempotency
	// key a no-op for as long as it is kept. It is the table's setting:
	// give every Outbox of one table the same. Failed rows are never
	// deleted automatically. Defaults to 72 hours.
	RetainSent time.Duration

	// InboxRetention is how long [Consume] keeps a consumed message's
	// record: a redelivery after that runs the consumer's function again.
	// [RetainForever] keeps every record. Defaults to 7 days.
	InboxRetention time.Duration
}

// LogicalConfig holds the settings of [Logical] mode. Its zero value is
// usable.
type LogicalConfig struct {
	// Slot names the logical replication slot Logical mode streams from
	// (and the publication it reads through, and the prefix of its WAL
	// messages). Slots belong to the whole PostgreSQL cluster: give every
	// outbox (every table, schema or database) its own. Lower-case ASCII
	// letters, digits and underscores, at most 63 bytes. Defaults to the
	// table's name in lower case followed by "_slot".
	Slot string

	// ReplicationDSN is the connection string of the replication connection
	// relays stream through. Defaults to the DSN the *gorm.DB was opened
	// with (gorm.io/driver/postgres's Config.DSN); set it when db was opened
	// from an existing *sql.DB, or to stream through another role or host.
	// The relay sets wal_sender_timeout=5s on the replication connection, so
	// that PostgreSQL ends the session of a relay that froze or vanished,
	// and a standby takes over, within seconds; a wal_sender_timeout in the
	// DSN (a parameter of its own or in options) is kept instead.
	ReplicationDSN string
}

// Outbox is the GORM plugin. Create it with [Plugin], install it with
// db.Use, register handlers with [Outbox.Handle]. It is safe for concurrent
// use.
type Outbox struct {
	mode           Mode
	table          string
	slot           string // Logical mode
	replicationDSN string // Logical mode; "" is the *gorm.DB's own DSN
	logger         *slog.Logger
	migrate        bool
	maxPayload     int
	cfgErr         error

	mu          sync.Mutex  // serialises Handle and Initialize
	dialectName string      // GORM's dialector name, fixed by the first persistent Initialize
	store       store.Store // nil in Memory mode, which needs no SQL
	limits      store.Limits

	// The mode's parts, wired once (Plugin, Initialize): the rest of the
	// package asks these, never the mode.
	noTable error // ErrMemoryMode in Memory mode: no table, no relay
	// noHistory turns the event history off: for the benchmark that
	// measures what it costs the failure path.
	noHistory bool
	wal       store.Logical // Logical mode: the WAL carries new events

	handlers atomic.Pointer[[]route] // copy-on-write, read without locks
	hooks    atomic.Pointer[hookSet] // copy-on-write; nil until AddHooks
	keys     recentKeys              // memory mode's idempotency keys
	memInbox memInbox                // memory mode's inbox

	retainSent     time.Duration
	inbox          string
	inboxRetention time.Duration
	inboxForgetAt  atomic.Int64 // UnixNano before which Consume deletes no expired pairs
	dropped        atomic.Int64 // Stats.Dropped
	slotLost       atomic.Int64 // Stats.SlotLost
	dropSeen       recentKeys   // the drops counted, so that a batch handled again counts none twice

	deliverAfterCommit bool
	notify             bool
	sites              sync.Map // *sql.DB -> *site: the databases it is installed on

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

// tableRule says which of Config.Table's rules name breaks.
func tableRule(name string) string {
	if identRE.MatchString(name) {
		// SQLite reserves the prefix; it is refused on every database so
		// that one configuration works on all of them.
		return "is reserved by SQLite (names that are \"sqlite\" or start with \"sqlite_\" are refused on every database)"
	}
	return "is not a plain SQL identifier (use ASCII letters, digits and underscores, not starting with a digit, at most 40 bytes)"
}

// Plugin returns the outbox plugin configured by cfg. Install it with
// db.Use, which validates cfg and, unless disabled, creates the table.
func Plugin(cfg Config) *Outbox {
	o := &Outbox{
		mode:       cfg.Mode,
		table:      cmp.Or(cfg.Table, DefaultTable),
		logger:     cfg.Logger,
		migrate:    !cfg.DisableAutoMigrate,
		maxPayload: cmp.Or(cfg.MaxPayloadBytes, encode.DefaultMaxPayload),
		clock:      time.Now,

		retainSent:     cmp.Or(cfg.RetainSent, defaultRetainSent),
		inbox:          cmp.Or(cfg.InboxTable, DefaultInboxTable),
		inboxRetention: cmp.Or(cfg.InboxRetention, defaultInboxRetention),

		deliverAfterCommit: cfg.DeliverAfterCommit,
		notify:             !cfg.DisableNotify,
	}
	if o.logger == nil {
		o.logger = slog.Default()
	}
	switch {
	case cfg.Mode != Persistent && cfg.Mode != Memory && cfg.Mode != Logical:
		o.cfgErr = fmt.Errorf("%w: unknown Mode %d", ErrInvalidConfig, int(cfg.Mode))
	case !validTable(o.table):
		o.cfgErr = fmt.Errorf("%w: Table %q %s", ErrInvalidConfig, o.table, tableRule(o.table))
	case !validTable(o.inbox):
		o.cfgErr = fmt.Errorf("%w: InboxTable %q %s", ErrInvalidConfig, o.inbox, tableRule(o.inbox))
	case strings.EqualFold(o.inbox, o.table):
		o.cfgErr = fmt.Errorf("%w: InboxTable and Table are both %q", ErrInvalidConfig, o.table)
	case cfg.RetainSent < 0 && cfg.RetainSent != RetainForever:
		o.cfgErr = fmt.Errorf("%w: RetainSent %v is negative (RetainForever keeps sent rows)", ErrInvalidConfig, cfg.RetainSent)
	case cfg.InboxRetention < 0 && cfg.InboxRetention != RetainForever:
		o.cfgErr = fmt.Errorf("%w: InboxRetention %v is negative (RetainForever keeps every record)", ErrInvalidConfig, cfg.InboxRetention)
	case cfg.MaxPayloadBytes < 0:
		o.cfgErr = fmt.Errorf("%w: MaxPayloadBytes is negative (%d); use 0 for the 1 MiB default", ErrInvalidConfig, cfg.MaxPayloadBytes)
	}
	if o.mode == Memory {
		o.noTable = ErrMemoryMode
	}
	if o.cfgErr == nil && o.mode == Logical {
		o.slot = cmp.Or(cfg.Logical.Slot, strings.ToLower(o.table)+"_slot")
		o.replicationDSN = cfg.Logical.ReplicationDSN
		if !slotRE.MatchString(o.slot) {
			o.cfgErr = fmt.Errorf("%w: Logical.Slot %q is not a valid replication slot name (lower-case ASCII letters, digits and underscores, at most 63 bytes)", ErrInvalidConfig, o.slot)
		}
	}
	o.handlers.Store(&[]route{})
	return o
}

var slotRE = regexp.MustCompile(`^[a-z0-9_]{1,63}$`)

// Name returns "outbox", the key under which GORM registers the plugin.
func (o *Outbox) Name() string { return "outbox" }

// Mode returns the mode the outbox was configured with.
func (o *Outbox) Mode() Mode { return o.mode }

// Table returns the outbox table's name.
func (o *Outbox) Table() string { return o.table }

// Initialize implements gorm.Plugin; db.Use calls it. It checks the
// configuration, hooks the connection pool so that after-commit work runs on
// the outermost commit, registers the model callbacks and, in persistent mode,
// checks the database's settings and creates the table unless
// Config.DisableAutoMigrate is set. In Logical mode it also checks that the
// server can decode the WAL and that the role may replicate, and creates the
// replication slot when it is missing. Memory mode runs no SQL, so it works
// on any database GORM supports.
//
// Install the plugin before other plugins that wrap the connection pool or
// re-initialize plugins (such as dbresolver), and before creating sessions
// from db: sessions made earlier keep the unhooked pool.
func (o *Outbox) Initialize(db *gorm.DB) error {
	if o.cfgErr != nil {
		return o.cfgErr
	}
	if o.mode != Memory {
		if err := o.bindDialect(db); err != nil {
			return err
		}
		if o.mode == Logical {
			l, ok := o.store.(store.Logical)
			if !ok {
				return fmt.Errorf("%w: Logical mode needs PostgreSQL, not %s", ErrUnsupportedDialect, o.dialectName)
			}
			o.wal = l
		}
	}
	txhook.Install(db, (*txOwner)(o))
	if err := registerCallbacks(db); err != nil {
		return fmt.Errorf("outbox: register callbacks: %w", err)
	}
	if o.mode == Memory || db.DryRun {
		return nil
	}
	ctx := db.Statement.Context
	if ctx == nil {
		ctx = context.Background()
	}
	if err := o.store.Check(ctx, db, o.logger); err != nil {
		return err
	}
	if o.mode == Logical {
		// Before anything is created: a server that cannot do logical
		// decoding is refused as it is.
		sqlDB, err := rawDB(db)
		if err != nil {
			return err
		}
		if err := o.wal.CheckLogical(ctx, sqlDB); err != nil {
			return err
		}
	}
	if err := o.initTable(ctx, db); err != nil {
		return err
	}
	if o.mode == Logical {
		sqlDB, err := rawDB(db)
		if err != nil {
			return err
		}
		replaced, err := o.wal.CreateSlot(ctx, sqlDB, o.slot, o.logger)
		if replaced {
			o.slotLost.Add(1)
		}
		return err
	}
	return nil
}

// initTable creates or upgrades the table, or, with DisableAutoMigrate,
// refuses one of an earlier schema version.
func (o *Outbox) initTable(ctx context.Context, db *gorm.DB) error {
	if o.migrate {
		return o.Migrate(db.WithContext(ctx))
	}
	sqlDB, err := rawDB(db)
	if err != nil {
		return err
	}
	v, err := o.store.Version(ctx, sqlDB)
	if err != nil {
		return fmt.Errorf("outbox: read the schema of %s: %w", o.table, err)
	}
	if v > 0 && v < store.SchemaVersion {
		return fmt.Errorf("%w: table %s has schema version %d and Config.DisableAutoMigrate is set: apply outbox.UpgradeSQLFrom(%q, %q, %d) (schema/%s-upgrade-*.sql) first",
			ErrInvalidConfig, o.table, v, o.store.Name(), o.table, v, o.store.Name())
	}
	return nil
}

// bindDialect fixes the database the outbox writes to, and its store; one
// Outbox serves one database.
func (o *Outbox) bindDialect(db *gorm.DB) error {
	name := db.Dialector.Name()
	o.mu.Lock()
	defer o.mu.Unlock()
	switch {
	case o.store == nil:
		sqlDB, err := rawDB(db)
		if err != nil {
			return err
		}
		ctx := db.Statement.Context
		if ctx == nil {
			ctx = context.Background()
		}
		s, err := store.Open(ctx, name, sqlDB, o.table)
		if err != nil {
			return err
		}
		o.store, o.limits, o.dialectName = s, s.Limits(), name
	case o.dialectName != name:
		return fmt.Errorf("%w: this Outbox is already installed on a %s database; create one Outbox per database", ErrInvalidConfig, o.dialectName)
	}
	return nil
}

func (o *Outbox) now() time.Time { return o.clock().UTC().Truncate(time.Microsecond) }

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

// rawDB returns the *sql.DB behind db.
func rawDB(db *gorm.DB) (*sql.DB, error) {
	d, err := db.DB()
	if err != nil {
		return nil, fmt.Errorf("outbox: %w", err)
	}
	return d, nil
}

// unsupported is the error of an operation whose feature the store lacks.
func (o *Outbox) unsupported(feature string) error {
	return fmt.Errorf("%w: %s on %s", ErrUnsupportedFeature, feature, o.store.Name())
}
