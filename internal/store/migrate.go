package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"regexp"
	"strings"
)

// SchemaVersion is the schema version this code reads and writes.
const SchemaVersion = 3

// DefaultTable is the table name the shipped schema files use.
const DefaultTable = "outbox_events"

// VersionOf is the schema version of a table that exists or not and has
// the seq column (version 2) and the named_id column (version 3) or not.
func VersionOf(table, seq, named bool) int {
	switch {
	case !table:
		return 0
	case !seq:
		return 1
	case !named:
		return 2
	}
	return 3
}

// Rename renames the shipped schema's table (and the index and
// constraint names derived from it).
func Rename(ddl, table string) string { return strings.ReplaceAll(ddl, DefaultTable, table) }

// Ensure runs ddl unless the object name already exists.
func Ensure(ctx context.Context, db *sql.DB, s Schema, name string, ddl ...string) error {
	if ok, err := s.Exists(ctx, db, name); err != nil || ok {
		return err
	}
	for _, stmt := range ddl {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			// Another process may have created it in the meantime.
			if ok, _ := s.Exists(ctx, db, name); ok {
				return nil
			}
			return err
		}
	}
	return nil
}

// Create runs the schema's statements for whatever is missing. It reads
// the catalog first: even CREATE ... IF NOT EXISTS takes a lock that would
// queue behind open publishing transactions on PostgreSQL.
func Create(ctx context.Context, db *sql.DB, s Schema) error {
	return CreateDDL(ctx, db, s, s.Schema())
}

// CreateDDL is Create of another table's DDL in the same store (the inbox's).
func CreateDDL(ctx context.Context, db *sql.DB, s Schema, ddl string) error {
	for _, st := range SplitDDL(ddl) {
		if err := Ensure(ctx, db, s, st.Name, st.SQL); err != nil {
			return err
		}
	}
	return nil
}

// Upgrade runs the store's upgrade scripts from version from to the
// current one, each in one transaction. A script's first statement takes a
// write lock (PostgreSQL: LOCK TABLE; SQLite: the database's write lock,
// which its first write takes; MySQL: a named lock); the version is read
// again under that lock, so that of several instances starting at once one
// upgrades and the others find the work done.
func Upgrade(ctx context.Context, db *sql.DB, s Schema, from int) error {
	for v := from; v < SchemaVersion; v++ {
		if err := upgradeOne(ctx, db, s, v); err != nil {
			return err
		}
	}
	return nil
}

func upgradeOne(ctx context.Context, db *sql.DB, s Schema, from int) error {
	script := s.Upgrade(from)
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
	// One connection for the whole script: a lock taken by a session (MySQL's
	// GET_LOCK) must be released on that session, whatever happens.
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	namedLock := strings.HasPrefix(strings.ToUpper(stmts[0]), "SELECT GET_LOCK")
	if namedLock {
		// A named lock: the script's last statement releases it; it runs
		// however the upgrade ends, and without the lock nothing runs.
		var got sql.NullInt64
		if err := conn.QueryRowContext(ctx, stmts[0]).Scan(&got); err != nil {
			return err
		}
		release := stmts[len(stmts)-1]
		defer func() {
			if _, err := conn.ExecContext(context.WithoutCancel(ctx), release); err != nil {
				// The session would keep the lock in the pool: close it,
				// which releases the lock, instead.
				_ = conn.Raw(func(any) error { return driver.ErrBadConn })
			}
		}()
		if got.Int64 != 1 {
			return errors.New("another process holds the upgrade's lock (GET_LOCK timed out); try again")
		}
		stmts = stmts[:len(stmts)-1]
	}
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if !namedLock {
		if _, err := tx.ExecContext(ctx, stmts[0]); err != nil {
			return err
		}
	}
	if v, err := s.Version(ctx, tx); err != nil || v != from {
		return err
	}
	for _, st := range stmts[1:] {
		if _, err := tx.ExecContext(ctx, st); err != nil {
			return fmt.Errorf("%w (in: %.80s)", err, st)
		}
	}
	return tx.Commit()
}

// DDL is one statement of a schema and the name of what it creates.
type DDL struct{ Name, SQL string }

var createdRE = regexp.MustCompile("(?i)\\bCREATE\\s+(?:UNIQUE\\s+)?(?:TABLE|INDEX|TYPE)\\s+(?:IF\\s+NOT\\s+EXISTS\\s+)?[\"`]?(\\w+)")

// SplitDDL splits a schema into its statements (the shipped files hold no
// "--" or ";" inside a literal), one at a time because PostgreSQL refuses
// several commands in one prepared statement, each with the name of the
// object it creates.
func SplitDDL(ddl string) []DDL {
	var out []DDL
	for _, stmt := range strings.Split(stripSQLComments(ddl), ";") {
		m := createdRE.FindStringSubmatch(stmt)
		if m == nil {
			continue
		}
		out = append(out, DDL{Name: m[1], SQL: strings.TrimSpace(stmt)})
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
