package outbox

import (
	"context"
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
		return "", fmt.Errorf("%w: Table %q is not a plain SQL identifier", ErrInvalidConfig, table)
	}
	d, err := newDialect(dialect, table)
	if err != nil {
		return "", err
	}
	return d.schema(), nil
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
func (o *Outbox) Migrate(ctx context.Context, db *gorm.DB) error {
	d, err := newDialect(db.Dialector.Name(), o.table)
	if err != nil {
		return err
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

type ddlStatement struct{ name, sql string }

var createdRE = regexp.MustCompile("(?i)\\bCREATE\\s+(?:UNIQUE\\s+)?(?:TABLE|INDEX)\\s+(?:IF\\s+NOT\\s+EXISTS\\s+)?[\"`]?(\\w+)")

// splitDDL splits a schema into its statements (one at a time: PostgreSQL
// refuses several commands in one prepared statement), each with the name
// of the object it creates.
func splitDDL(ddl string) []ddlStatement {
	var out []ddlStatement
	for _, stmt := range strings.Split(ddl, ";") {
		m := createdRE.FindStringSubmatch(stripSQLComments(stmt))
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
