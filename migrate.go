package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"strings"

	"gorm.io/gorm"
)

// SchemaSQL returns the DDL that creates the outbox table named table on the
// given dialect ("postgres", "sqlite" or "mysql", as GORM's dialectors name
// themselves), for teams that run their own migrations. It is the same SQL
// db.Use runs.
func SchemaSQL(dialect, table string) (string, error) {
	if !validTable(table) {
		return "", fmt.Errorf("%w: Table %q %s", ErrInvalidConfig, table, tableRule(table))
	}
	d, err := newDialect(dialect, table)
	if err != nil {
		return "", err
	}
	return d.schema(), nil
}

// UpgradeSQL returns the statements that upgrade an outbox table created by
// an earlier schema version to the current one on the given dialect, for
// teams that run their own migrations (db.Use runs them itself unless
// Config.DisableAutoMigrate is set). It is "" when the dialect has nothing
// to upgrade.
func UpgradeSQL(dialect, table string) (string, error) {
	if !validTable(table) {
		return "", fmt.Errorf("%w: Table %q %s", ErrInvalidConfig, table, tableRule(table))
	}
	d, err := newDialect(dialect, table)
	if err != nil {
		return "", err
	}
	return d.upgrade(), nil
}

// schemaVersionCurrent is the schema version this code reads and writes.
const schemaVersionCurrent = 2

func schemaVersion(table, seq bool) int {
	switch {
	case !table:
		return 0
	case !seq:
		return 1
	}
	return schemaVersionCurrent
}

// schemaFor renames the shipped schema's table (and the index and
// constraint names derived from it).
func schemaFor(ddl, table string) string { return strings.ReplaceAll(ddl, DefaultTable, table) }

// Migrate creates the outbox table and its indexes if they do not exist. It
// is what db.Use runs unless Config.DisableAutoMigrate is set.
//
// It reads the catalog first and runs DDL only for what is missing: even
// CREATE ... IF NOT EXISTS takes a lock that would queue behind open
// publishing transactions (and stall every publisher behind it) on
// PostgreSQL.
//
// A table of an earlier schema version is upgraded in place, in one
// transaction that locks it (UpgradeSQL shows the statements); the rows it
// holds, pending, failed and sent, keep their state and order.
func (o *Outbox) Migrate(ctx context.Context, db *gorm.DB) error {
	// Called without db.Use, the configuration is not checked yet: an
	// unchecked Table would reach the DDL.
	if o.cfgErr != nil {
		return o.cfgErr
	}
	d, err := newDialect(db.Dialector.Name(), o.table)
	if err != nil {
		return err
	}
	sqlDB, err := rawDB(db)
	if err != nil {
		return err
	}
	v, err := d.version(ctx, sqlDB)
	if err != nil {
		return fmt.Errorf("outbox: read the schema of %s: %w", o.table, err)
	}
	if v > 0 && v < schemaVersionCurrent {
		if err := upgrade(ctx, sqlDB, d); err != nil {
			return fmt.Errorf("outbox: upgrade table %s to schema version %d: %w", o.table, schemaVersionCurrent, err)
		}
	}
	for _, st := range splitDDL(d.schema()) {
		if err := ensure(ctx, db, d, st.name, st.sql); err != nil {
			return fmt.Errorf("outbox: create table %s: %w", o.table, err)
		}
	}
	return nil
}

// ensure runs ddl unless the object name already exists.
func ensure(ctx context.Context, db *gorm.DB, d dialect, name string, ddl ...string) error {
	sqlDB, err := rawDB(db)
	if err != nil {
		return err
	}
	if ok, err := d.exists(ctx, sqlDB, name); err != nil || ok {
		return err
	}
	for _, stmt := range ddl {
		if _, err := sqlDB.ExecContext(ctx, stmt); err != nil {
			// Another process may have created it in the meantime.
			if ok, _ := d.exists(ctx, sqlDB, name); ok {
				return nil
			}
			return err
		}
	}
	return nil
}

// upgrade runs the dialect's upgrade script in one transaction. Its first
// statement takes a write lock (PostgreSQL: LOCK TABLE; SQLite: the
// database's write lock, which its first write takes); the version is read
// again under that lock, so
// that of several instances starting at once one upgrades and the others
// find the work done.
func upgrade(ctx context.Context, db *sql.DB, d dialect) error {
	script := d.upgrade()
	if script == "" {
		return errors.New("this database has no upgrade from that version (the table was created by a pre-release build: drop it once it holds no pending events)")
	}
	var stmts []string
	for _, st := range strings.Split(stripSQLComments(script), ";") {
		st = strings.TrimSpace(st)
		switch u := strings.ToUpper(st); {
		case st == "", strings.HasPrefix(u, "BEGIN"), u == "COMMIT":
			continue
		}
		stmts = append(stmts, st)
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, stmts[0]); err != nil {
		return err
	}
	if v, err := d.version(ctx, tx); err != nil || v == schemaVersionCurrent {
		return err
	}
	for _, st := range stmts[1:] {
		if _, err := tx.ExecContext(ctx, st); err != nil {
			return fmt.Errorf("%w (in: %.80s)", err, st)
		}
	}
	return tx.Commit()
}

type ddlStatement struct{ name, sql string }

var createdRE = regexp.MustCompile("(?i)\\bCREATE\\s+(?:UNIQUE\\s+)?(?:TABLE|INDEX)\\s+(?:IF\\s+NOT\\s+EXISTS\\s+)?[\"`]?(\\w+)")

// splitDDL splits a schema into its statements (the shipped files hold no
// "--" or ";" inside a literal) (one at a time: PostgreSQL
// refuses several commands in one prepared statement), each with the name
// of the object it creates.
func splitDDL(ddl string) []ddlStatement {
	var out []ddlStatement
	for _, stmt := range strings.Split(stripSQLComments(ddl), ";") {
		m := createdRE.FindStringSubmatch(stmt)
		if m == nil {
			continue
		}
		out = append(out, ddlStatement{name: m[1], sql: strings.TrimSpace(stmt)})
	}
	return out
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
