package main

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/url"
	"os"
	"regexp"
	"strings"

	mysqldriver "github.com/go-sql-driver/mysql"
	"github.com/gorm-outbox/outbox"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// target is a database the command works on.
type target struct {
	db      *gorm.DB
	ob      *outbox.Outbox // installed on db; nil when the table was not required
	dialect string         // postgres, mysql or sqlite
	table   string
}

func (t *target) close() {
	if sqlDB, err := t.db.DB(); err == nil {
		_ = sqlDB.Close()
	}
}

var (
	mysqlNativeRE = regexp.MustCompile(`@(tcp|tcp6|unix)?\(|^(tcp|tcp6|unix)\(`)
	pgKeyValueRE  = regexp.MustCompile(`(^|\s)(host|dbname|user|port|sslmode)=`)
)

// dialector chooses the driver from the DSN's form. A DSN may hold a
// password, so errors never repeat it.
func dialector(dsn string, create bool) (gorm.Dialector, string, error) {
	switch {
	case strings.HasPrefix(dsn, "postgres://"), strings.HasPrefix(dsn, "postgresql://"):
		return postgres.Open(dsn), "postgres", nil
	case strings.HasPrefix(dsn, "mysql://"):
		native, err := mysqlURL(dsn)
		if err != nil {
			return nil, "", err
		}
		return mysqlDialector(native)
	case strings.HasPrefix(dsn, "sqlite://"):
		return sqliteDialector(strings.TrimPrefix(dsn, "sqlite://"), create)
	case strings.HasPrefix(dsn, "file:"):
		return sqliteDialector(dsn, create)
	case mysqlNativeRE.MatchString(dsn):
		return mysqlDialector(dsn)
	case pgKeyValueRE.MatchString(dsn):
		return postgres.Open(dsn), "postgres", nil
	}
	path, _, _ := strings.Cut(dsn, "?")
	for _, ext := range []string{".db", ".sqlite", ".sqlite3"} {
		if strings.HasSuffix(path, ext) {
			return sqliteDialector(dsn, create)
		}
	}
	return nil, "", usagef("cannot tell the database from the DSN's form; use postgres://user@host/db, host=... dbname=..., " +
		"user:pass@tcp(host:3306)/db, mysql://user:pass@host/db, file:path.db or sqlite://path")
}

// mysqlURL turns mysql://user:pass@host:port/db?params into the driver's
// own form.
func mysqlURL(dsn string) (string, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		return "", usagef("the mysql:// DSN is not a valid URL (check its escaping)")
	}
	host := u.Host
	if host == "" {
		host = "127.0.0.1"
	}
	if u.Port() == "" {
		host = net.JoinHostPort(strings.Trim(host, "[]"), "3306")
	}
	var user string
	if u.User != nil {
		user = u.User.Username()
		if p, ok := u.User.Password(); ok {
			user += ":" + p
		}
		user += "@"
	}
	native := user + "tcp(" + host + ")/" + strings.TrimPrefix(u.Path, "/")
	if u.RawQuery != "" {
		native += "?" + u.RawQuery
	}
	return native, nil
}

// mysqlDialector sets parseTime, without which the library refuses the
// connection (GORM could not read time columns).
func mysqlDialector(dsn string) (gorm.Dialector, string, error) {
	cfg, err := mysqldriver.ParseDSN(dsn)
	if err != nil {
		return nil, "", usagef("invalid MySQL DSN (%v); the form is user:pass@tcp(host:3306)/db", errWithoutDSN(err))
	}
	cfg.ParseTime = true
	return mysql.Open(cfg.FormatDSN()), "mysql", nil
}

// errWithoutDSN keeps the driver's reason but not a DSN it may quote.
func errWithoutDSN(err error) string {
	msg := err.Error()
	if i := strings.Index(msg, ":"); i > 0 && strings.Contains(msg[i:], "@") {
		return msg[:i]
	}
	return msg
}

// sqliteDialector refuses a database file that does not exist unless the
// command creates the table: SQLite would silently create an empty one for
// a mistyped path.
func sqliteDialector(dsn string, create bool) (gorm.Dialector, string, error) {
	path, query, _ := strings.Cut(strings.TrimPrefix(dsn, "file:"), "?")
	if path == "" {
		return nil, "", usagef("the SQLite DSN names no file")
	}
	if path != ":memory:" && !create {
		if _, err := os.Stat(path); errors.Is(err, fs.ErrNotExist) {
			return nil, "", fmt.Errorf("SQLite database file %s does not exist (\"outbox migrate\" creates it with the table)", path)
		} else if err != nil {
			return nil, "", fmt.Errorf("SQLite database file: %w", err)
		}
	}
	// Wait for a relay's write lock rather than fail at once.
	if !strings.Contains(query, "busy_timeout") {
		sep := "?"
		if strings.Contains(dsn, "?") {
			sep = "&"
		}
		dsn += sep + "_busy_timeout=10000"
	}
	return sqlite.Open(dsn), "sqlite", nil
}

// open connects to the database named by --dsn. With needTable, the outbox
// table must exist, and the outbox plugin is installed on the connection.
func (c *cli) open(ctx context.Context, o *common, needTable, create bool) (*target, error) {
	dsn, table := o.dsn, o.table
	if dsn == "" {
		return nil, usagef("no database: pass --dsn or set OUTBOX_DSN")
	}
	if _, err := outbox.SchemaSQL("postgres", table); err != nil {
		return nil, usageError{err}
	}
	dial, name, err := dialector(dsn, create)
	if err != nil {
		return nil, err
	}
	db, err := gorm.Open(dial, &gorm.Config{Logger: logger.Discard})
	if err != nil {
		return nil, fmt.Errorf("cannot connect to the %s database: %w", name, err)
	}
	t := &target{db: db, dialect: name, table: table}
	if !needTable {
		t.db = db.WithContext(ctx)
		return t, nil
	}
	if !db.WithContext(ctx).Migrator().HasTable(table) {
		t.close()
		return nil, fmt.Errorf("the %s database has no table %q: create it with \"outbox migrate\", or pass --table (or OUTBOX_TABLE) if it has another name", name, table)
	}
	t.ob = outbox.Plugin(outbox.Config{
		Table:              table,
		DisableAutoMigrate: true,
		DisableNotify:      true,
		// The library's warnings address the application (SQLite settings
		// for concurrent writers), not an operator running one command.
		Logger: slog.New(slog.NewTextHandler(c.stderr, &slog.HandlerOptions{Level: slog.LevelError})),
	})
	// Installed on db itself: sessions made before db.Use keep the
	// connection pool the plugin has not hooked.
	if err := db.Use(t.ob); err != nil {
		t.close()
		if errors.Is(err, outbox.ErrInvalidConfig) && strings.Contains(err.Error(), "schema version") {
			return nil, fmt.Errorf("%w; or run \"outbox migrate\"", err)
		}
		return nil, err
	}
	t.db = db.WithContext(ctx)
	return t, nil
}
