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
	"log/slog"
	"strings"
	"time"

	"github.com/google/uuid"
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

func init() {
	store.Register(store.Driver{
		Name:  "postgres",
		Probe: func(_ context.Context, dialector string, _ *sql.DB) bool { return dialector == "postgres" },
		Open:  func(table string) store.Store { return New(table) },
	})
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
		Dialect: sqlbuild.Dialect{
			MinuteOf:      func(col string) string { return "floor(extract(epoch FROM " + col + ") / 60)::bigint" },
			MillisBetween: func(a, b string) string { return "extract(epoch FROM " + b + " - " + a + ") * 1000" },
			IntDiv:        "/",
			AddOnConflict: sqlbuild.OnConflictAdd,
			InsertIgnore:  [2]string{"INSERT INTO", " ON CONFLICT DO NOTHING"},
		},
	}}
	s.Walking = sqlbuild.Walking{S: &s.Syntax, Lock: sqlbuild.SkipLocked}
	return s
}

var (
	_ store.Store    = (*Store)(nil)
	_ store.Notifier = (*Store)(nil)
	_ store.Logical  = (*Store)(nil)
	_ store.Walker   = (*Store)(nil)
	_ store.Replicas = (*Store)(nil)
)

// WALInsertPosition implements store.Replicas.
func (s *Store) WALInsertPosition() store.Query {
	return store.Query{SQL: "SELECT pg_current_wal_lsn()::text"}
}

// ReplicasFlushed implements store.Replicas: flush_lsn, the standby's
// disk, which a promotion replays in full.
func (s *Store) ReplicasFlushed(lsn string) store.Query {
	return store.Query{SQL: "SELECT count(*) FROM pg_stat_replication WHERE flush_lsn >= $1::pg_lsn", Args: []any{lsn}}
}

// Name implements store.Store.
func (s *Store) Name() string { return "postgres" }

// Limits implements store.Store: PostgreSQL takes 65535 parameters a
// statement; an INSERT row has 11, and ID lists travel as one array.
func (s *Store) Limits() store.Limits {
	return store.Limits{InsertRows: 1000, OutcomeRows: 1000, AdminBatch: 1000, AdminScan: 10000, RetentionBatch: 1000}
}

// Check implements store.Schema: PostgreSQL has no setting to refuse.
func (s *Store) Check(context.Context, *gorm.DB, *slog.Logger) error { return nil }

// Schema implements store.Schema.
func (s *Store) Schema() string { return store.Rename(schema, s.name) }

// InboxSchema implements store.Inbox.
func (s *Store) InboxSchema(table string) string { return store.RenameInbox(inbox, table) }

// Consume implements store.Inbox: ON CONFLICT DO NOTHING waits for a
// concurrent insert of the same pair to commit or roll back.
func (s *Store) Consume(table, consumer, messageID string, now time.Time) store.Query {
	return s.InboxConsume("INSERT INTO", `"`+table+`"`, " ON CONFLICT DO NOTHING", consumer, messageID, now)
}

// ConsumeLead implements store.InboxLead: pgx pipelines the BEGIN and the
// INSERT, prepared as any statement it runs.
func (s *Store) ConsumeLead(table, consumer, messageID string, now time.Time) store.Lead {
	return store.Lead{Begin: "BEGIN", Query: s.Consume(table, consumer, messageID, now)}
}

// CanLead implements store.InboxLead: pgx (GORM's driver) pipelines. Other
// drivers (lib/pq) take the usual way.
func (s *Store) CanLead(_ context.Context, db *sql.DB) (bool, error) {
	_, ok := db.Driver().(*stdlib.Driver)
	return ok, nil
}

// ForgetConsumed implements store.Inbox.
func (s *Store) ForgetConsumed(table string, before time.Time, limit int) store.Query {
	return s.ForgetConsumedByKey(`"`+table+`"`, before, limit)
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

// Exists treats an index a failed concurrent build left invalid as
// missing, so that it is built again.
func (s *Store) Exists(ctx context.Context, db *sql.DB, name string) (bool, error) {
	var ok bool
	err := db.QueryRowContext(ctx, "SELECT COALESCE((SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)), to_regclass($1) IS NOT NULL OR to_regtype($1) IS NOT NULL)",
		`"`+name+`"`).Scan(&ok)
	return ok, err
}

// Version implements store.Schema.
func (s *Store) Version(ctx context.Context, q store.Querier) (int, error) {
	var table, seq, named bool
	err := q.QueryRowContext(ctx, "SELECT to_regclass($1) IS NOT NULL, EXISTS (SELECT 1 FROM pg_attribute"+
		" WHERE attrelid = to_regclass($1) AND attname = 'seq' AND NOT attisdropped), EXISTS (SELECT 1 FROM pg_attribute"+
		" WHERE attrelid = to_regclass($1) AND attname = 'named_id' AND NOT attisdropped)", `"`+s.name+`"`).Scan(&table, &seq, &named)
	return store.VersionOf(table, seq, named), err
}

// OrderingIndex is built CONCURRENTLY: a plain CREATE INDEX takes a lock
// that queues behind open publishing transactions and stalls every
// publisher behind it. A failed concurrent build leaves an invalid index,
// dropped first.
func (s *Store) OrderingIndex() (string, []string) {
	name := s.name + "_aggregate_idx"
	return name, []string{
		`DROP INDEX CONCURRENTLY IF EXISTS "` + name + `"`,
		`CREATE INDEX CONCURRENTLY IF NOT EXISTS "` + name + `" ON ` + s.Table +
			" (aggregate_type, aggregate_id, seq) WHERE status <> 'sent'",
	}
}

// Insert implements store.Writer. A duplicate is a no-op, and the caller's
// transaction is not aborted by a unique violation.
func (s *Store) Insert(rows []store.Event, now time.Time, seqs bool) store.Query {
	return s.InsertRows(rows, now, " ON CONFLICT DO NOTHING", sqlbuild.ReturningSeq(seqs))
}

// Returning implements store.Writer.
func (s *Store) Returning() bool { return true }

// Claim implements store.Claimer in one statement.
func (s *Store) Claim(ctx context.Context, db *sql.DB, c store.ClaimSpec) ([]store.Claimed, error) {
	return store.QueryClaimed(ctx, db, s.ClaimUpdate(c, sqlbuild.SkipLocked))
}

// MarkFailed implements store.Claimer.
func (s *Store) MarkFailed(outs []store.Outcome, now, lease time.Time) store.Query {
	return s.MarkFailedValues(outs, now, lease, "::timestamptz", "::bigint")
}

// DeleteSent implements store.Claimer.
func (s *Store) DeleteSent(before time.Time, limit int) store.Query {
	return s.DeleteSentIn(before, limit, sqlbuild.SkipLocked)
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

// NotifySQL implements store.Notifier. The payload names the schema, for
// whoever listens by hand.
func (s *Store) NotifySQL(ctx context.Context, db store.Querier) (string, error) {
	var channel, schema string
	if err := db.QueryRowContext(ctx, "SELECT "+schemaChannel+", current_schema()", s.Channel()).Scan(&channel, &schema); err != nil {
		return "", err
	}
	return "NOTIFY " + quoteIdent(channel) + ", " + quoteLiteral(schema), nil
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
