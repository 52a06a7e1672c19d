package main

import (
	"context"
	"fmt"
	"log/slog"
	"strings"

	"github.com/gorm-outbox/outbox"
)

func (c *cli) migrate(ctx context.Context, args []string) error {
	fs := c.flags("migrate", "[--print-sql [--dialect postgres|mysql|sqlite]]")
	o := c.common(fs)
	printSQL := fs.Bool("print-sql", false, "print the DDL (and, for a table of an older schema version, the upgrade) instead of running it")
	dialect := fs.String("dialect", "", "with --print-sql and no DSN: the database, postgres, mysql or sqlite")
	if pos, err := parse(fs, args); err != nil {
		return err
	} else if len(pos) > 0 {
		return usagef("migrate takes no arguments, got %q", pos)
	}
	o.resolved()
	if *printSQL && o.dsn == "" {
		if *dialect == "" {
			return usagef("migrate --print-sql needs --dsn (to read the table's version) or --dialect postgres|mysql|sqlite")
		}
		return c.printSQL(*dialect, o.table, 0)
	}
	if *dialect != "" {
		return usagef("--dialect goes with --print-sql and no DSN (the DSN says which database it is)")
	}
	t, err := c.open(ctx, o.resolved(), false, !*printSQL)
	if err != nil {
		return err
	}
	defer t.close()
	version, err := schemaVersion(t)
	if err != nil {
		return err
	}
	if *printSQL {
		return c.printSQL(t.dialect, t.table, version)
	}
	ob := outbox.Plugin(outbox.Config{Table: t.table, Logger: slog.New(slog.NewTextHandler(c.stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	if err := ob.Migrate(t.db.WithContext(ctx)); err != nil {
		return err
	}
	switch version {
	case 0:
		fmt.Fprintf(c.stdout, "created table %s\n", t.table)
	case 1:
		fmt.Fprintf(c.stdout, "upgraded table %s from schema version 1\n", t.table)
	default:
		fmt.Fprintf(c.stdout, "table %s is up to date (missing indexes, if any, created)\n", t.table)
	}
	return nil
}

// schemaVersion reads the table's schema version: 0 when there is no
// table, 1 before the seq column, 2 now.
func schemaVersion(t *target) (int, error) {
	m := t.db.Migrator()
	switch {
	case !m.HasTable(t.table):
		return 0, nil
	case !m.HasColumn(t.table, "seq"):
		return 1, nil
	}
	return 2, t.db.Error
}

func (c *cli) printSQL(dialect, table string, version int) error {
	schema, err := outbox.SchemaSQL(dialect, table)
	if err != nil {
		return usageError{err}
	}
	if version == 1 {
		up, err := outbox.UpgradeSQL(dialect, table)
		if err != nil {
			return err
		}
		if up == "" {
			return fmt.Errorf("table %s is of schema version 1, which this database never had a release of: drop it once it holds no pending events", table)
		}
		fmt.Fprintf(c.stdout, "-- Table %s is at schema version 1: upgrade it first.\n%s\n\n", table, strings.TrimSpace(up))
	}
	if version == 2 {
		fmt.Fprintf(c.stdout, "-- Table %s exists and is up to date; the schema, for reference.\n", table)
	}
	fmt.Fprintln(c.stdout, strings.TrimSpace(schema))
	return nil
}
