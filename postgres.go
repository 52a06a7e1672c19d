package outbox

import (
	"context"
	"database/sql"
	_ "embed"
	"time"

	"gorm.io/gorm"
)

var (
	//go:embed schema/postgres.sql
	schemaPostgres string
	//go:embed schema/postgres-upgrade-2.sql
	upgradePostgres string
)

func init() { dialects["postgres"] = newPostgres }

// postgresDialect: one UPDATE ... RETURNING claims, FOR UPDATE SKIP LOCKED
// lets concurrent relays take disjoint batches instead of queueing on each
// other's row locks, ID lists travel as one array argument, and partial
// indexes keep sent rows out of the claim's way.
type postgresDialect struct {
	sqlSyntax
	name string
}

func newPostgres(table string) dialect {
	return &postgresDialect{name: table, sqlSyntax: sqlSyntax{
		table:       `"` + table + `"`,
		placeholder: dollar,
		arrays:      true,
		timeArg:     sameTime,
		timeCol:     bareCol,
		unsent:      "p.status <> 'sent'",
	}}
}

const skipLocked = " FOR UPDATE SKIP LOCKED"

func (d *postgresDialect) check(context.Context, *gorm.DB, *Outbox) error { return nil }

func (d *postgresDialect) schema() string { return schemaFor(schemaPostgres, d.name) }

// exists treats an index a failed concurrent build left invalid as
// missing, so that it is built again.
func (d *postgresDialect) exists(ctx context.Context, db *sql.DB, name string) (bool, error) {
	var ok bool
	err := db.QueryRowContext(ctx, "SELECT COALESCE((SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)), to_regclass($1) IS NOT NULL)",
		`"`+name+`"`).Scan(&ok)
	return ok, err
}

func (d *postgresDialect) insert(rows []encoded, now time.Time) query {
	// A duplicate is a no-op, and the caller's transaction is not aborted
	// by a unique violation.
	return d.insertRows(rows, now, " ON CONFLICT DO NOTHING")
}

func (d *postgresDialect) version(ctx context.Context, db querier) (int, error) {
	var table, seq bool
	err := db.QueryRowContext(ctx, "SELECT to_regclass($1) IS NOT NULL, EXISTS (SELECT 1 FROM pg_attribute"+
		" WHERE attrelid = to_regclass($1) AND attname = 'seq' AND NOT attisdropped)", `"`+d.name+`"`).Scan(&table, &seq)
	return schemaVersion(table, seq), err
}

func (d *postgresDialect) upgrade() string { return schemaFor(upgradePostgres, d.name) }

func (d *postgresDialect) claim(ctx context.Context, db *sql.DB, c claimSpec) ([]claimed, error) {
	return queryClaimed(ctx, db, d.claimUpdate(c, skipLocked))
}

func (d *postgresDialect) markFailed(outs []outcome, now, lease time.Time) query {
	return d.markFailedValues(outs, now, lease, "::timestamptz")
}

func (d *postgresDialect) deleteSent(before time.Time, limit int) query {
	return d.deleteSentIn(before, limit, skipLocked)
}

// orderingIndex is built CONCURRENTLY: a plain CREATE INDEX takes a lock
// that queues behind open publishing transactions and stalls every
// publisher behind it. A failed concurrent build leaves an invalid index,
// dropped first.
func (d *postgresDialect) orderingIndex() (string, []string) {
	name := d.name + "_aggregate_idx"
	return name, []string{
		`DROP INDEX CONCURRENTLY IF EXISTS "` + name + `"`,
		`CREATE INDEX CONCURRENTLY IF NOT EXISTS "` + name + `" ON ` + d.table +
			" (aggregate_type, aggregate_id, seq) WHERE status <> 'sent'",
	}
}

func (d *postgresDialect) notifies() bool { return true }
