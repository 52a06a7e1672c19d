// Package postgres is the outbox's store on PostgreSQL: every statement
// the outbox runs there, LISTEN/NOTIFY wake-ups, and the statements of
// Logical mode (the WAL message, the slot, the rows the stream parks).
package postgres

import (
	"context"
	"database/sql"
	"database/sql/driver"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/gorm-outbox/outbox/internal/errs"
	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/gorm-outbox/outbox/internal/store/sqlbuild"
	"github.com/jackc/pgx/v5/stdlib"
	"gorm.io/gorm"
)

var (
	//go:embed postgres.sql
	schema string
	//go:embed postgres-upgrade-2.sql
	upgrade2 string
	//go:embed postgres-upgrade-3.sql
	upgrade3 string
	//go:embed postgres-inbox.sql
	inbox string
)

// Driver registers the store (the root package's registration line).
var Driver = store.Driver{
	Name:  "postgres",
	Probe: func(_ context.Context, dialector string, _ *sql.DB) bool { return dialector == "postgres" },
	Open:  func(table string) store.Store { return New(table) },
}

// Store is the PostgreSQL store. One UPDATE ... RETURNING claims, FOR
// UPDATE SKIP LOCKED lets concurrent relays take disjoint batches instead
// of queueing on each other's row locks, ID lists travel as one array
// argument, and partial indexes keep sent rows out of the claim's way.
type Store struct {
	sqlbuild.Syntax
	sqlbuild.Walking
	name string
}

// New returns the store of the table named table.
func New(table string) *Store {
	s := &Store{name: table, Syntax: sqlbuild.Syntax{
		Table:       `"` + table + `"`,
		Placeholder: sqlbuild.Dollar,
		Arrays:      true,
		TimeArg:     sqlbuild.SameTime,
		TimeCol:     sqlbuild.BareCol,
		Unsent:      "p.status <> 'sent'",
		IDCol:       "COALESCE(named_id, id::text)",
		IDArg:       func(u uuid.UUID) any { return u.String() },
		StatusArg:   func(ph string) string { return ph + `::"` + table + `_status"` },
		Fresh:       true,
		Opaque:      sqlbuild.OpaqueSubquery,
		// PostgreSQL takes 65535 parameters a statement; an INSERT row has
		// 11, and ID lists travel as one array.
		Lim:            store.Limits{MaxParams: 65535, InsertRows: 1000, OutcomeRows: 1000, RetentionBatch: 1000},
		Lock:           sqlbuild.SkipLocked,
		InsertConflict: " ON CONFLICT DO NOTHING",
		Returning:      true,
		FailedCasts:    [2]string{"::timestamptz", "::bigint"},
		Snapshot:       true,
		Dialect: sqlbuild.Dialect{
			MinuteOf:      func(col string) string { return "floor(extract(epoch FROM " + col + ") / 60)::bigint" },
			MillisBetween: func(a, b string) string { return "extract(epoch FROM " + b + " - " + a + ") * 1000" },
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
	_ store.Store     = (*Store)(nil)
	_ store.Inbox     = (*Store)(nil)
	_ store.InboxLead = (*Store)(nil)
	_ store.Overview  = (*Store)(nil)
	_ store.History   = (*Store)(nil)
	_ store.Relays    = (*Store)(nil)
	_ store.Notifier  = (*Store)(nil)
	_ store.Logical   = (*Store)(nil)
	_ store.Walker    = (*Store)(nil)
	_ store.Replicas  = (*Store)(nil)
)

// WALInsertPosition implements store.Replicas.
func (s *Store) WALInsertPosition(ctx context.Context, db store.DB) (string, error) {
	var lsn string
	err := s.Row(ctx, db, sqlbuild.Query{SQL: "SELECT pg_current_wal_lsn()::text"}, &lsn)
	return lsn, err
}

// ReplicasFlushed implements store.Replicas: flush_lsn, the standby's
// disk, which a promotion replays in full.
func (s *Store) ReplicasFlushed(ctx context.Context, db store.DB, lsn string) (int, error) {
	var n int
	err := s.Row(ctx, db, sqlbuild.Query{SQL: "SELECT count(*) FROM pg_stat_replication WHERE flush_lsn >= $1::pg_lsn", Args: []any{lsn}}, &n)
	return n, err
}

// Name implements store.Store.
func (s *Store) Name() string { return "postgres" }

// Check implements store.Store: a server before PostgreSQL 13 is refused.
func (s *Store) Check(ctx context.Context, gdb *gorm.DB, _ *slog.Logger) error {
	db, err := gdb.DB()
	if err != nil {
		return fmt.Errorf("outbox: %w", err)
	}
	var version int
	if err := db.QueryRowContext(ctx, "SELECT current_setting('server_version_num')::int").Scan(&version); err != nil {
		return fmt.Errorf("outbox: inspect the PostgreSQL server: %w", err)
	}
	return CheckVersion(version)
}

// minVersion is PostgreSQL 13: the slot's wal_status, which Emit reads, and
// the oldest release the project tests against upstream's support window.
const minVersion = 130000

// CheckVersion refuses a server older than PostgreSQL 13
// (server_version_num).
func CheckVersion(version int) error {
	if version < minVersion {
		return fmt.Errorf("%w: PostgreSQL %d.%d; the outbox needs PostgreSQL 13 or later", errs.ErrUnsupportedVersion, version/10000, version%10000)
	}
	return nil
}

// Schema implements store.Schema.
func (s *Store) Schema() string { return store.Rename(schema, s.name) }

// InboxSchema implements store.Inbox.
func (s *Store) InboxSchema(table string) string { return store.RenameInbox(inbox, table) }

// MigrateInbox implements store.Inbox.
func (s *Store) MigrateInbox(ctx context.Context, db *sql.DB, table string) error {
	return store.CreateDDL(ctx, db, s.Exists, s.InboxSchema(table))
}

// record is the inbox INSERT: ON CONFLICT DO NOTHING waits for a
// concurrent insert of the same pair to commit or roll back.
func (s *Store) record(table, consumer, messageID string, now time.Time) sqlbuild.Query {
	return s.InboxInsert("INSERT INTO", `"`+table+`"`, " ON CONFLICT DO NOTHING", consumer, messageID, now)
}

// Record implements store.Inbox.
func (s *Store) Record(ctx context.Context, db store.DB, table, consumer, messageID string, now time.Time) (bool, error) {
	return s.Recorded(ctx, db, s.record(table, consumer, messageID, now))
}

// RetryRecord implements store.Inbox: a delivery that waited on another's
// record reads its outcome; none has to run again.
func (s *Store) RetryRecord(error) bool { return false }

// CanLead implements store.InboxLead: pgx (GORM's driver) pipelines. Other
// drivers (lib/pq) take the usual way.
func (s *Store) CanLead(_ context.Context, db *sql.DB) (bool, error) {
	_, ok := db.Driver().(*stdlib.Driver)
	return ok, nil
}

// RecordLead implements store.InboxLead: pgx pipelines the BEGIN and the
// INSERT, prepared as any statement it runs.
func (s *Store) RecordLead(table, consumer, messageID string, now time.Time) store.Lead {
	return pgLead{s.record(table, consumer, messageID, now)}
}

// ForgetConsumed implements store.Inbox.
func (s *Store) ForgetConsumed(ctx context.Context, db store.DB, table string, before time.Time, limit int) (int64, error) {
	return s.ForgetConsumedByKey(ctx, db, `"`+table+`"`, before, limit)
}

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

// Migrate implements store.Store: an upgrade script's first statement
// locks the table (LOCK TABLE) in the script's transaction.
func (s *Store) Migrate(ctx context.Context, db *sql.DB) error {
	return store.Migrate(ctx, db, s, store.TxLock)
}

// Exists treats an index a failed concurrent build left invalid as
// missing, so that it is built again.
func (s *Store) Exists(ctx context.Context, db store.DB, name string) (bool, error) {
	var ok bool
	err := db.QueryRowContext(ctx, "SELECT COALESCE((SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)), to_regclass($1) IS NOT NULL OR to_regtype($1) IS NOT NULL)",
		`"`+name+`"`).Scan(&ok)
	return ok, err
}

// Version implements store.Schema.
func (s *Store) Version(ctx context.Context, q store.DB) (int, error) {
	var table, seq, named bool
	err := q.QueryRowContext(ctx, "SELECT to_regclass($1) IS NOT NULL, EXISTS (SELECT 1 FROM pg_attribute"+
		" WHERE attrelid = to_regclass($1) AND attname = 'seq' AND NOT attisdropped), EXISTS (SELECT 1 FROM pg_attribute"+
		" WHERE attrelid = to_regclass($1) AND attname = 'named_id' AND NOT attisdropped)", `"`+s.name+`"`).Scan(&table, &seq, &named)
	return store.VersionOf(table, seq, named), err
}

// EnsureOrdering implements store.Store, CONCURRENTLY: a plain CREATE
// INDEX takes a lock that queues behind open publishing transactions and
// stalls every publisher behind it. A failed concurrent build leaves an
// invalid index, dropped first. Relays that start together take turns
// under one advisory lock of the database: two concurrent builds deadlock,
// of one index and of two (a concurrent build waits for every older
// transaction of the database, another build's included, whatever its
// schema), and the loser would report an error for a race it lost
// harmlessly; in turn, the later ones find the index built.
func (s *Store) EnsureOrdering(ctx context.Context, db *sql.DB) error {
	name := s.name + "_aggregate_idx"
	if ok, err := s.Exists(ctx, db, name); err != nil || ok {
		return err
	}
	return store.Serialized(ctx, db,
		sqlbuild.Query{SQL: "SELECT CASE WHEN pg_try_advisory_lock(hashtext('outbox: build an ordering index')) THEN 1 ELSE 0 END"},
		sqlbuild.Query{SQL: "SELECT pg_advisory_unlock(hashtext('outbox: build an ordering index'))"},
		func(conn store.DB) error {
			return store.Ensure(ctx, conn, s.Exists, name,
				`DROP INDEX CONCURRENTLY IF EXISTS "`+name+`"`,
				`CREATE INDEX CONCURRENTLY IF NOT EXISTS "`+name+`" ON `+s.Table+
					" (aggregate_type, aggregate_id, seq) WHERE status <> 'sent'")
		})
}

// Channel implements store.Notifier: derived from the table, within
// PostgreSQL's 63-byte identifier limit.
func (s *Store) Channel() string {
	const suffix = "_outbox_wakeup"
	table := s.name
	if len(table)+len(suffix) > 63 {
		table = table[:63-len(suffix)]
	}
	return table + suffix
}

// schemaChannel is the channel of the session's schema, computed by the
// server so that the writer's NOTIFY and the relay's LISTEN agree: the
// table's channel in schema public (as before schemas were told apart),
// and that name cut to 50 bytes, "_" and 12 hex digits of the schema's
// MD5 in any other. NOTIFY channels are per database, not per schema: a
// schema per tenant would otherwise wake every tenant's relays on every
// tenant's commit. A collision of the digits costs a spurious wake-up.
const schemaChannel = ChannelSQL

// ChannelSQL is the expression of the session's channel, with the table's
// channel ([Store.Channel]) as $1.
const ChannelSQL = `CASE WHEN current_schema() = 'public' THEN $1::text ELSE left($1::text, 50) || '_' || left(md5(current_schema()), 12) END`

// PrepareNotify implements store.Notifier. The payload names the schema,
// for whoever listens by hand.
func (s *Store) PrepareNotify(ctx context.Context, db store.DB) (func(context.Context, store.DB) error, error) {
	var channel, schema string
	if err := s.Row(ctx, db, sqlbuild.Query{SQL: "SELECT " + schemaChannel + ", current_schema()", Args: []any{s.Channel()}}, &channel, &schema); err != nil {
		return nil, err
	}
	stmt := "NOTIFY " + quoteIdent(channel) + ", " + quoteLiteral(schema)
	return func(ctx context.Context, conn store.DB) error {
		_, err := conn.ExecContext(ctx, stmt)
		return err
	}, nil
}

// quoteIdent is name as a quoted identifier.
func quoteIdent(name string) string { return `"` + strings.ReplaceAll(name, `"`, `""`) + `"` }

// quoteLiteral is s as a string constant whose escapes mean the same
// whatever standard_conforming_strings says (s holds no NUL: it came from
// the server).
func quoteLiteral(s string) string {
	return "E'" + strings.NewReplacer(`\`, `\\`, `'`, `''`).Replace(s) + "'"
}

// Listen implements store.Notifier on pgx's connection.
func (s *Store) Listen(ctx context.Context, conn *sql.Conn, ready, wake func()) error {
	return conn.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return store.ErrListenUnsupported
		}
		pc := sc.Conn()
		var channel string
		if err := pc.QueryRow(ctx, "SELECT "+schemaChannel, s.Channel()).Scan(&channel); err != nil {
			return err
		}
		if _, err := pc.Exec(ctx, "LISTEN "+quoteIdent(channel)); err != nil {
			return err
		}
		ready()
		for {
			if _, err := pc.WaitForNotification(ctx); err != nil {
				// The connection carries a LISTEN and may be mid-read: never
				// hand it back to the pool.
				return errors.Join(err, driver.ErrBadConn)
			}
			wake()
		}
	})
}
