package main

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/gorm-outbox/outbox"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
)

// sqliteDB is one SQLite file in the benchmark's temporary directory; every
// pool open returns is on that file.
type sqliteDB struct {
	path    string
	maxIdle int
}

func (s sqliteDB) name() string { return "sqlite" }

// open opens a pool with the settings the README recommends for concurrent
// use.
func (s sqliteDB) open() (*gorm.DB, error) {
	db, err := gorm.Open(sqlite.Open("file:"+s.path+outbox.SQLiteDSNOptions), gormCfg())
	if err != nil {
		return nil, fmt.Errorf("open sqlite: %w", err)
	}
	if s.maxIdle > 0 {
		sqlDB(db).SetMaxIdleConns(s.maxIdle)
	}
	return db, nil
}

func (s sqliteDB) clear(ctx context.Context, db *sql.DB, tables ...string) error {
	for _, t := range tables {
		if err := exec(ctx, db, `DELETE FROM "`+t+`"`); err != nil {
			return err
		}
	}
	// Start every measurement from a short WAL, as the first one did.
	return exec(ctx, db, "PRAGMA wal_checkpoint(TRUNCATE)")
}

func (s sqliteDB) floorInsert(table string) (string, int) {
	return `INSERT INTO ` + table + ` (id, event_type, aggregate_type, aggregate_id, idempotency_key, payload,
		status, attempts, available_at, occurred_at, created_at, updated_at)
		VALUES (?1, ?2, ?3, ?4, ?5, ?6, 'pending', 0, ?7, ?7, ?7, ?7)`, 1
}

func (s sqliteDB) timeArg(t time.Time) any { return t }
