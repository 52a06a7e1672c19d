package outbox

import (
	"fmt"
	"strings"

	"github.com/gorm-outbox/outbox/internal/store"
	"gorm.io/gorm"
)

// SchemaSQL returns the DDL that creates the outbox table named table on the
// given dialect ("postgres", "sqlite" or "mysql", as GORM's dialectors name
// themselves), and the inbox table [Consume] writes under its default name
// (outbox_inbox), for teams that run their own migrations. It is the same
// SQL db.Use runs. [InboxSchemaSQL] gives the inbox table under another
// name.
func SchemaSQL(dialect, table string) (string, error) {
	s, err := storeByName(dialect, table)
	if err != nil {
		return "", err
	}
	if in, ok := s.(store.Inbox); ok {
		return s.Schema() + "\n" + in.InboxSchema(DefaultInboxTable), nil
	}
	return s.Schema(), nil
}

// InboxSchemaSQL returns the DDL that creates the inbox table named table
// ([Config.InboxTable]) on the given dialect, for teams that run their own
// migrations.
func InboxSchemaSQL(dialect, table string) (string, error) {
	s, err := storeByName(dialect, table)
	if err != nil {
		return "", err
	}
	in, ok := s.(store.Inbox)
	if !ok {
		return "", fmt.Errorf("%w: the inbox on %s", ErrUnsupportedFeature, s.Name())
	}
	return in.InboxSchema(table), nil
}

// UpgradeSQL returns the statements that upgrade an outbox table of the
// previous schema version (2) to the current one (3) on the given dialect,
// for teams that run their own migrations (db.Use runs them itself unless
// Config.DisableAutoMigrate is set). A table of an older version needs
// [UpgradeSQLFrom] first.
func UpgradeSQL(dialect, table string) (string, error) {
	return UpgradeSQLFrom(dialect, table, store.SchemaVersion-1)
}

// UpgradeSQLFrom returns the statements that upgrade an outbox table of
// schema version from to the current one on the given dialect: one script
// per version, each in its own transaction, in the order to run them. It is
// "" when the dialect never had that version (MySQL starts at 2).
func UpgradeSQLFrom(dialect, table string, from int) (string, error) {
	s, err := storeByName(dialect, table)
	if err != nil {
		return "", err
	}
	var b strings.Builder
	for v := from; v < store.SchemaVersion; v++ {
		script := s.Upgrade(v)
		if script == "" {
			return "", nil
		}
		b.WriteString(script)
	}
	if in, ok := s.(store.Inbox); ok && from < 3 && b.Len() > 0 {
		// Version 3 brought the inbox table; db.Use creates it beside
		// any outbox table.
		b.WriteString("\n" + in.InboxSchema(DefaultInboxTable))
	}
	return b.String(), nil
}

func storeByName(dialect, table string) (store.Store, error) {
	if !validTable(table) {
		return nil, fmt.Errorf("%w: Table %q %s", ErrInvalidConfig, table, tableRule(table))
	}
	return store.ByName(dialect, table)
}

// Migrate creates the outbox table and its indexes, and the tables beside
// it (the inbox, Config.InboxTable; the overview's rollup and its state,
// <table>_rollup and <table>_rollup_state; the event history,
// <table>_attempts; the relays, <table>_relays) if they do not exist. It is
// what db.Use runs unless Config.DisableAutoMigrate is set.
//
// It reads the catalog first and runs DDL only for what is missing: even
// CREATE ... IF NOT EXISTS takes a lock that would queue behind open
// publishing transactions (and stall every publisher behind it) on
// PostgreSQL.
//
// A table of an earlier schema version is upgraded in place, in one
// transaction that locks it (UpgradeSQL shows the statements); the rows it
// holds, pending, failed and sent, keep their state and order.
func (o *Outbox) Migrate(db *gorm.DB) error {
	ctx := dbContext(db)
	// Called without db.Use, the configuration is not checked yet: an
	// unchecked Table would reach the DDL.
	if o.cfgErr != nil {
		return o.cfgErr
	}
	if db == nil {
		return fmt.Errorf("%w: the *gorm.DB is nil", ErrNotInstalled)
	}
	sqlDB, err := rawDB(db)
	if err != nil {
		return err
	}
	s, err := store.Open(ctx, db.Dialector.Name(), sqlDB, o.table)
	if err != nil {
		return err
	}
	if err := s.Migrate(ctx, sqlDB); err != nil {
		return fmt.Errorf("outbox: migrate table %s to schema version %d: %w", o.table, store.SchemaVersion, err)
	}
	if in, ok := s.(store.Inbox); ok {
		if err := in.MigrateInbox(ctx, sqlDB, o.inbox); err != nil {
			return fmt.Errorf("outbox: create the inbox table %s: %w", o.inbox, err)
		}
	}
	return nil
}
