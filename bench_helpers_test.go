package outbox

import (
	"crypto/rand"
	"encoding/hex"
	"os"
	"path/filepath"
	"testing"

	mysqldriver "github.com/go-sql-driver/mysql"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// openBenchDB opens a fresh, empty database for a benchmark, the way the
// backends of helpers_test.go do for a test (whose open functions take a
// *testing.T, which a benchmark does not have): a SQLite file with the
// README's settings, or a PostgreSQL schema of its own, dropped afterwards.
// PostgreSQL skips when OUTBOX_TEST_POSTGRES_DSN is unset.
func openBenchDB(tb testing.TB, name string) *gorm.DB {
	tb.Helper()
	cfg := &gorm.Config{Logger: logger.Discard}
	switch name {
	case sqliteBackend.name:
		dsn := "file:" + filepath.Join(tb.TempDir(), "bench.db") + SQLiteDSNOptions
		db, err := gorm.Open(sqlite.Open(dsn), cfg)
		if err != nil {
			tb.Fatalf("open sqlite: %v", err)
		}
		tb.Cleanup(func() { closeGorm(db) })
		return db
	case "postgres":
		dsn := os.Getenv(postgresDSNEnv)
		if dsn == "" {
			tb.Skipf("%s is not set; set it to run the PostgreSQL benchmarks", postgresDSNEnv)
		}
		admin, err := gorm.Open(postgres.Open(dsn), &gorm.Config{Logger: logger.Discard})
		if err != nil {
			tb.Fatalf("%s is set but PostgreSQL is unreachable: %v", postgresDSNEnv, err)
		}
		tb.Cleanup(func() { closeGorm(admin) })
		b := make([]byte, 6)
		_, _ = rand.Read(b)
		schema := "b_" + hex.EncodeToString(b)
		if err := admin.Exec("CREATE SCHEMA " + schema).Error; err != nil {
			tb.Fatalf("create schema: %v", err)
		}
		tb.Cleanup(func() { _ = admin.Exec("DROP SCHEMA " + schema + " CASCADE").Error })
		sep := "?"
		if containsByte(dsn, '?') {
			sep = "&"
		}
		db, err := gorm.Open(postgres.Open(dsn+sep+"search_path="+schema), cfg)
		if err != nil {
			tb.Fatalf("open postgres: %v", err)
		}
		// Registered after the schema's drop, so it runs first: the pool
		// is closed before its schema goes.
		tb.Cleanup(func() { closeGorm(db) })
		return db
	case "mysql":
		dsn := os.Getenv(mysqlDSNEnv)
		if dsn == "" {
			tb.Skipf("%s is not set; set it to run the MySQL/MariaDB benchmarks", mysqlDSNEnv)
		}
		mcfg, err := mysqldriver.ParseDSN(dsn)
		if err != nil {
			tb.Fatalf("%s: %v", mysqlDSNEnv, err)
		}
		admin, err := gorm.Open(mysql.Open(dsn), &gorm.Config{Logger: logger.Discard})
		if err != nil {
			tb.Fatalf("%s is set but MySQL is unreachable: %v", mysqlDSNEnv, err)
		}
		tb.Cleanup(func() { closeGorm(admin) })
		b := make([]byte, 6)
		_, _ = rand.Read(b)
		name := "b_" + hex.EncodeToString(b)
		if err := admin.Exec("CREATE DATABASE " + name).Error; err != nil {
			tb.Fatalf("create database: %v", err)
		}
		tb.Cleanup(func() { _ = admin.Exec("DROP DATABASE " + name).Error })
		mcfg.DBName = name
		db, err := gorm.Open(mysql.Open(mcfg.FormatDSN()), cfg)
		if err != nil {
			tb.Fatalf("open mysql: %v", err)
		}
		tb.Cleanup(func() { closeGorm(db) })
		return db
	}
	tb.Fatalf("unknown backend %q", name)
	return nil
}

func closeGorm(db *gorm.DB) {
	if sqlDB, err := db.DB(); err == nil {
		_ = sqlDB.Close()
	}
}
