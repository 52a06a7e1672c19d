package store

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"
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

// RenameInbox renames the shipped inbox schema's table and index.
func RenameInbox(ddl, table string) string { return strings.ReplaceAll(ddl, DefaultInbox, table) }

// UpgradeLock is how a store's upgrade scripts take the lock that keeps
// two processes from upgrading at once.
type UpgradeLock int

const (
	// TxLock: the script's first statement takes a lock inside the
	// script's transaction (PostgreSQL's LOCK TABLE; SQLite's write lock,
	// which its first write takes).
	TxLock UpgradeLock = iota
	// SessionLock: the script's first statement takes a lock the session
	// holds (MySQL's GET_LOCK, since MySQL commits each ALTER TABLE by
	// itself), which its last statement releases; the upgrade runs on one
	// connection and releases the lock however it ends.
	SessionLock
)

// Migrate is Store.Migrate for a store whose upgrade scripts lock as lock
// says: an upgrade of a table of an earlier version, then whatever of the
// schema is missing.
func Migrate(ctx context.Context, db *sql.DB, s Store, lock UpgradeLock) error {
	v, err := s.Version(ctx, db)
	if err != nil {
		return fmt.Errorf("read the schema version: %w", err)
	}
	for from := v; from > 0 && from < SchemaVersion; from++ {
		if err := upgradeOne(ctx, db, s, from, lock); err != nil {
			return fmt.Errorf("upgrade from schema version %d to %d: %w", from, from+1, err)
		}
	}
	if err := CreateDDL(ctx, db, s.Exists, s.Schema()); err != nil {
		return fmt.Errorf("create: %w", err)
	}
	return nil
}

// Exists is Store.Exists.
type Exists func(ctx context.Context, db DB, name string) (bool, error)

// Ensure runs ddl unless the object name already exists. Another process
// may build it at the same moment: a statement that fails while the
// object appears is no error.
func Ensure(ctx context.Context, db DB, exists Exists, name string, ddl ...string) error {
	if ok, err := exists(ctx, db, name); err != nil || ok {
		return err
	}
	for _, stmt := range ddl {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			if ok, _ := exists(ctx, db, name); ok {
				return nil
			}
			return err
		}
	}
	return nil
}

// CreateDDL runs the statements of ddl whose object does not exist yet.
func CreateDDL(ctx context.Context, db DB, exists Exists, ddl string) error {
	stmts, err := SplitDDL(ddl)
	if err != nil {
		return err
	}
	for _, st := range stmts {
		if err := Ensure(ctx, db, exists, st.Name, st.SQL); err != nil {
			return err
		}
	}
	return nil
}

func upgradeOne(ctx context.Context, db *sql.DB, s Store, from int, lock UpgradeLock) error {
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
	if len(stmts) < 2 {
		return errors.New("the upgrade script has no lock statement before its work")
	}
	// One connection for the whole script: a lock the session takes must
	// be released on that session, whatever happens.
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	if lock == SessionLock {
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
			return errors.New("another process holds the upgrade's lock; try again")
		}
		stmts = stmts[:len(stmts)-1]
	}
	tx, err := conn.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }()
	if lock == TxLock {
		if _, err := tx.ExecContext(ctx, stmts[0]); err != nil {
			return err
		}
	}
	// Read again under the lock: another process may have upgraded.
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

var createdRE = regexp.MustCompile("(?i)^\\s*CREATE\\s+(?:UNIQUE\\s+)?(?:TABLE|INDEX|TYPE)\\s+(?:IF\\s+NOT\\s+EXISTS\\s+)?[\"`]?(\\w+)")

// SplitDDL splits a schema into its statements (the shipped files hold no
// "--" or ";" inside a literal), one at a time because PostgreSQL refuses
// several commands in one prepared statement, each with the name of the
// object it creates. A statement that creates nothing it can name is an
// error: run blindly on every start it could fail or repeat, and skipped it
// would be lost.
func SplitDDL(ddl string) ([]DDL, error) {
	var out []DDL
	for _, stmt := range strings.Split(stripSQLComments(ddl), ";") {
		if strings.TrimSpace(stmt) == "" {
			continue
		}
		m := createdRE.FindStringSubmatch(stmt)
		if m == nil {
			return nil, fmt.Errorf("outbox: the schema holds a statement that creates no table, index or type it can name: %.80s", strings.TrimSpace(stmt))
		}
		out = append(out, DDL{Name: m[1], SQL: strings.TrimSpace(stmt)})
	}
	return out, nil
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

// Serialized runs fn on a connection of db of its own while it holds a
// lock the session takes (tryLock, a SELECT of 1 when it took the lock, 0
// when another session holds it) and releases (unlock), however fn ends:
// how a store makes processes that build one object at once take turns.
// It tries again every few milliseconds, up to a few hundred, until ctx
// ends: a waiter must not sit in a statement meanwhile, since a concurrent
// index build (PostgreSQL's CONCURRENTLY) waits for every open statement's
// snapshot, the waiter's included, and would deadlock with it. The session
// keeps the lock: should the release fail, the connection is closed, not
// returned to the pool with it.
func Serialized(ctx context.Context, db *sql.DB, tryLock, unlock interface{ Statement() (string, []any) }, fn func(conn DB) error) error {
	conn, err := db.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	wait := 5 * time.Millisecond
	for {
		q, args := tryLock.Statement()
		var got sql.NullInt64
		if err := conn.QueryRowContext(ctx, q, args...).Scan(&got); err != nil {
			return err
		}
		if got.Int64 == 1 {
			break
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("outbox: waiting for another process's lock: %w", ctx.Err())
		case <-t.C:
		}
		wait = min(2*wait, 200*time.Millisecond)
	}
	defer func() {
		q, args := unlock.Statement()
		if _, err := conn.ExecContext(context.WithoutCancel(ctx), q, args...); err != nil {
			_ = conn.Raw(func(any) error { return driver.ErrBadConn })
		}
	}()
	return fn(conn)
}
