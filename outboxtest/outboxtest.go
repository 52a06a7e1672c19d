// Package outboxtest helps test code that uses the outbox: a SQLite
// database in a temporary file with the plugin installed (through the cgo
// driver, or any driver with Open), publishing in a transaction, reading a
// row back, draining a relay. It is what the broker adapters' tests use,
// and works for application tests alike:
//
//	db, ob := outboxtest.SQLite(t, outbox.Config{})
//	ob.Handle("order.created", handler)
//	outboxtest.Publish(t, db, outbox.Event{Type: "order.created"})
//	outboxtest.Drain(t, ob.Relay(db, outbox.RelayConfig{}))
package outboxtest

import (
	"context"
	"log/slog"
	"path/filepath"
	"testing"

	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outbox"
)

// DSNOptions are the SQLite settings the README recommends for concurrent
// writers and a relay on one file, spelled for gorm.io/driver/sqlite:
// [outbox.SQLiteDSNOptions].
const DSNOptions = outbox.SQLiteDSNOptions

// PureGoDSNOptions are DSNOptions spelled for the pure-Go SQLite drivers
// (github.com/glebarez/sqlite, modernc.org/sqlite), which ignore
// _journal_mode and _busy_timeout: [outbox.SQLitePureGoDSNOptions].
const PureGoDSNOptions = outbox.SQLitePureGoDSNOptions

// SQLite opens a SQLite database in t's temporary directory with DSNOptions,
// installs an outbox configured by cfg (its Logger, when nil, discards) and
// closes the database when the test ends. It uses gorm.io/driver/sqlite,
// which needs cgo; without cgo, pass the pure-Go driver to Open:
//
//	dsn := "file:" + filepath.Join(t.TempDir(), "outbox.db") + outboxtest.PureGoDSNOptions
//	db, ob := outboxtest.Open(t, sqlite.Open(dsn), outbox.Config{}) // github.com/glebarez/sqlite
func SQLite(t testing.TB, cfg outbox.Config) (*gorm.DB, *outbox.Outbox) {
	t.Helper()
	return Open(t, sqlite.Open("file:"+filepath.Join(t.TempDir(), "outbox.db")+DSNOptions), cfg)
}

// Open opens a database through dial, installs an outbox configured by cfg
// (its Logger, when nil, discards) and closes the database when the test
// ends: SQLite with another driver, or a test database of another kind.
func Open(t testing.TB, dial gorm.Dialector, cfg outbox.Config) (*gorm.DB, *outbox.Outbox) {
	t.Helper()
	db, err := gorm.Open(dial, &gorm.Config{Logger: logger.Discard})
	if err != nil {
		t.Fatalf("outboxtest: open the database: %v", err)
	}
	t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	if cfg.Logger == nil {
		// Relays log every failed attempt; tests of outages make many.
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ob := outbox.Plugin(cfg)
	if err := db.Use(ob); err != nil {
		t.Fatalf("outboxtest: install the outbox: %v", err)
	}
	return db, ob
}

// Publish publishes events in one transaction on db.
func Publish(t testing.TB, db *gorm.DB, events ...outbox.Event) {
	t.Helper()
	if err := db.Transaction(func(tx *gorm.DB) error { return outbox.Publish(tx, events...) }); err != nil {
		t.Fatalf("outboxtest: publish: %v", err)
	}
}

// Row reads the outbox row of event id from the table of the outbox
// installed on db.
func Row(t testing.TB, db *gorm.DB, id string) outbox.Row {
	t.Helper()
	ob, ok := db.Config.Plugins["outbox"].(*outbox.Outbox)
	if !ok {
		t.Fatalf("outboxtest: %v", outbox.ErrNotInstalled)
	}
	var r outbox.Row
	if err := db.Table(ob.Table()).Where("id = ?", id).Take(&r).Error; err != nil {
		t.Fatalf("outboxtest: read event %s: %v", id, err)
	}
	return r
}

// Drain runs r.ProcessOnce until it claims nothing and returns how many
// events it claimed in all. Events scheduled for a later retry are left.
func Drain(t testing.TB, r *outbox.Relay) int {
	t.Helper()
	total := 0
	for {
		n, err := r.ProcessOnce(context.Background())
		if err != nil {
			t.Fatalf("outboxtest: relay: %v", err)
		}
		if n == 0 {
			return total
		}
		total += n
	}
}
