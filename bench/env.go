package main

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"

	"github.com/gorm-outbox/outbox"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// env is where the benchmark runs: the servers it was given (each in a
// schema or database of its own) and a temporary directory for SQLite
// files, all removed by close.
type env struct {
	pg      *pgServer    // nil: PostgreSQL not selected
	my      *mysqlServer // nil: MySQL/MariaDB not selected or not reachable
	sqlite  bool         // SQLite selected
	dir     string
	sqliteN int
	maxIdle int // idle connections each pool keeps; 0: database/sql's default of 2
}

// newEnv connects to the databases opts.dbs selects. PostgreSQL must
// answer when selected; MySQL/MariaDB is skipped with a message when its
// DSN is unset or it does not answer, so PostgreSQL-only runs keep working.
func newEnv(ctx context.Context, opts options) (_ *env, err error) {
	e := &env{maxIdle: opts.maxIdle, sqlite: opts.dbs["sqlite"]}
	defer func() {
		if err != nil {
			_ = e.close()
		}
	}()
	if opts.dbs["postgres"] {
		if e.pg, err = newPG(ctx, os.Getenv(pgDSNEnv), opts.asyncCommit, opts.maxIdle); err != nil {
			return nil, err
		}
		progress("PostgreSQL schema %s", e.pg.schema)
	}
	if opts.dbs["mysql"] {
		switch dsn := os.Getenv(mysqlDSNEnv); {
		case dsn == "":
			progress("MySQL/MariaDB skipped: %s is not set (e.g. root@tcp(127.0.0.1:3306)/test?charset=utf8mb4&parseTime=True&loc=Local)", mysqlDSNEnv)
		default:
			my, merr := newMySQL(ctx, dsn, opts.maxIdle)
			if merr != nil {
				progress("MySQL/MariaDB skipped: %v", merr)
				break
			}
			e.my = my
			progress("%s %s, database %s", my.flavour, my.version, my.db)
		}
	}
	if e.sqlite {
		if e.dir, err = os.MkdirTemp("", "outbox-bench-"); err != nil {
			return nil, fmt.Errorf("temp dir: %w", err)
		}
		progress("SQLite in %s", e.dir)
	}
	return e, nil
}

func (e *env) close() error {
	var err error
	if e.pg != nil {
		err = e.pg.close()
	}
	if e.my != nil {
		err = errors.Join(err, e.my.close())
	}
	if e.dir != "" {
		_ = os.RemoveAll(e.dir)
	}
	return err
}

// servers are the selected, reachable server databases, PostgreSQL first.
func (e *env) servers() []server {
	var s []server
	if e.pg != nil {
		s = append(s, e.pg)
	}
	if e.my != nil {
		s = append(s, e.my)
	}
	return s
}

// databases are the databases of the write and claim scenarios: the
// servers and a new SQLite file, in the order PostgreSQL, SQLite,
// MySQL/MariaDB.
func (e *env) databases() []database {
	var d []database
	if e.pg != nil {
		d = append(d, e.pg)
	}
	if e.sqlite {
		e.sqliteN++
		d = append(d, sqliteDB{path: filepath.Join(e.dir, fmt.Sprintf("bench%d.db", e.sqliteN)), maxIdle: e.maxIdle})
	}
	if e.my != nil {
		d = append(d, e.my)
	}
	return d
}

// gormCfg returns a new config for every pool: gorm.Open keeps the pointer
// and registers plugins in it, so a shared one would install a plugin on
// every pool at once.
func gormCfg() *gorm.Config { return &gorm.Config{Logger: logger.Discard} }

// warnLogger is what the outbox logs to here: only warnings and errors, to
// stderr with the progress, so a failing contender is visible.
var warnLogger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))

func closeDB(db *gorm.DB) {
	if sqlDB, err := db.DB(); err == nil {
		_ = sqlDB.Close()
	}
}

func sqlDB(db *gorm.DB) *sql.DB {
	s, err := db.DB()
	if err != nil {
		// Only a *gorm.DB without a pool fails here, which none of ours is.
		panic(err)
	}
	return s
}

// createOutboxTable creates a table in the outbox's own format (the shipped
// DDL), so the hand-written floors pay for exactly the same columns and
// indexes.
func createOutboxTable(ctx context.Context, db *gorm.DB, table string) error {
	ddl, err := outbox.SchemaSQL(db.Dialector.Name(), table)
	if err != nil {
		return fmt.Errorf("schema for %s: %w", table, err)
	}
	// Comments first: they may hold semicolons.
	for _, stmt := range strings.Split(stripComments(ddl), ";") {
		if strings.TrimSpace(stmt) == "" {
			continue
		}
		if err := db.WithContext(ctx).Exec(stmt).Error; err != nil {
			return fmt.Errorf("create %s: %w", table, err)
		}
	}
	return nil
}

func stripComments(s string) string {
	var b strings.Builder
	for _, line := range strings.Split(s, "\n") {
		if i := strings.Index(line, "--"); i >= 0 {
			line = line[:i]
		}
		b.WriteString(line + "\n")
	}
	return b.String()
}

// The library's RelayConfig defaults, which the "defaults" rows use.
const (
	defaultBatchSize = 100
	defaultWorkers   = 4
)
