// Package outboxtest helps test code that uses the outbox: a SQLite
// database in a temporary file with the plugin installed (through the cgo
// driver, or any driver with Open), publishing in a transaction, reading a
// row back, draining a relay. It is what the broker adapters' tests use,
// and works for application tests alike:
//
//	db, ob := outboxtest.SQLite(t, outbox.Config{})
//	ob.Handle("order.created", handler)
//	outboxtest.Publish(t, db, outbox.Event{Type: "order.created"})
//	outboxtest.Drain(t, outboxtest.Relay(t, ob, db, outbox.RelayConfig{}))
package outboxtest

import (
	"context"
	"encoding/json"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outbox"
)

// DSNOptions are the SQLite settings docs/databases.md recommends for concurrent
// writers and a relay on one file, spelled for gorm.io/driver/sqlite:
// [outbox.SQLiteDSNOptions].
const DSNOptions = outbox.SQLiteDSNOptions

// PureGoDSNOptions are DSNOptions spelled for the pure-Go SQLite drivers
// (github.com/libtnb/sqlite, modernc.org/sqlite, github.com/glebarez/sqlite)
// with _pragma: [outbox.SQLitePureGoDSNOptions].
const PureGoDSNOptions = outbox.SQLitePureGoDSNOptions

// SQLite opens a SQLite database in t's temporary directory with DSNOptions,
// installs an outbox configured by cfg (its Logger, when nil, discards) and
// closes the database when the test ends. It uses gorm.io/driver/sqlite,
// which needs cgo; without cgo, pass the pure-Go driver to Open:
//
//	dsn := "file:" + filepath.Join(t.TempDir(), "outbox.db") + outboxtest.PureGoDSNOptions
//	db, ob := outboxtest.Open(t, sqlite.Open(dsn), outbox.Config{}) // github.com/libtnb/sqlite
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

// installed is the outbox installed on db, or the test fails.
func installed(t testing.TB, db *gorm.DB) *outbox.Outbox {
	t.Helper()
	ob, ok := db.Config.Plugins["outbox"].(*outbox.Outbox)
	if !ok {
		t.Fatalf("outboxtest: %v", outbox.ErrNotInstalled)
	}
	return ob
}

// Row reads the outbox row of event id from the table of the outbox
// installed on db.
func Row(t testing.TB, db *gorm.DB, id string) outbox.Row {
	t.Helper()
	ob := installed(t, db)
	r, err := ob.Get(db, id)
	if err != nil {
		t.Fatalf("outboxtest: read event %s: %v", id, err)
	}
	return r
}

// RequirePublished fails the test unless the outbox table of the outbox
// installed on db holds an event of type eventType for which match returns
// true (any such event when match is nil), and returns the first one, its
// Payload the encoded JSON as a [json.RawMessage] ([outbox.Event.DecodePayload]
// reads it into a value of yours). Called with a transaction, it sees the
// events that transaction wrote and has not committed yet, so a test can
// check what a function published before deciding to commit or roll back:
//
//	err := db.Transaction(func(tx *gorm.DB) error {
//		if err := placeOrder(tx, order); err != nil {
//			return err
//		}
//		e := outboxtest.RequirePublished(t, tx, "order.placed", func(e outbox.Event) bool {
//			return e.AggregateID == order.ID
//		})
//		...
//	})
//
// It reads the table, so it works in Persistent mode only: in Memory mode
// no table exists, and in Logical mode events travel in the WAL (use a
// handler, or [outbox.Hooks.Publish], there).
func RequirePublished(t testing.TB, db *gorm.DB, eventType string, match func(outbox.Event) bool) outbox.Event {
	t.Helper()
	events := published(t, db, eventType)
	for _, e := range events {
		if match == nil || match(e) {
			return e
		}
	}
	if len(events) == 0 {
		t.Fatalf("outboxtest: no %s event was published (%s)", eventType, seen(t, db))
	} else {
		t.Fatalf("outboxtest: %d %s event(s) were published and none matches (IDs %s)", len(events), eventType, ids(events))
	}
	return outbox.Event{}
}

// RequireNotPublished fails the test if the outbox table of the outbox
// installed on db holds an event of one of eventTypes, or any event when
// none is given: the check that a function which failed, or decided not
// to, published nothing. Through a transaction it sees that transaction's
// own uncommitted events too. Persistent mode only, as [RequirePublished].
func RequireNotPublished(t testing.TB, db *gorm.DB, eventTypes ...string) {
	t.Helper()
	if len(eventTypes) == 0 {
		if events := published(t, db, ""); len(events) > 0 {
			t.Fatalf("outboxtest: %d event(s) were published, want none (%s)", len(events), seen(t, db))
		}
		return
	}
	for _, typ := range eventTypes {
		if events := published(t, db, typ); len(events) > 0 {
			t.Fatalf("outboxtest: %d %s event(s) were published, want none (IDs %s)", len(events), typ, ids(events))
		}
	}
}

// published reads the events of type eventType (every type when "") from
// the table, in the order they were written.
func published(t testing.TB, db *gorm.DB, eventType string) []outbox.Event {
	t.Helper()
	ob := installed(t, db)
	if ob.Mode() != outbox.Persistent {
		t.Fatalf("outboxtest: the outbox is in %s mode; RequirePublished and RequireNotPublished read the table, which only Persistent mode writes", ob.Mode())
	}
	q := db.Table(ob.Table()).Order("seq")
	if eventType != "" {
		q = q.Where("event_type = ?", eventType)
	}
	var rows []outbox.Row
	if err := q.Find(&rows).Error; err != nil {
		t.Fatalf("outboxtest: read the outbox table: %v", err)
	}
	out := make([]outbox.Event, len(rows))
	for i, r := range rows {
		out[i] = outbox.Event{
			ID: r.ID, Type: r.EventType, AggregateType: r.AggregateType, AggregateID: r.AggregateID,
			IdempotencyKey: r.IdempotencyKey, Payload: json.RawMessage(r.Payload), OccurredAt: r.OccurredAt,
		}
		if r.Headers != nil {
			if err := json.Unmarshal([]byte(*r.Headers), &out[i].Headers); err != nil {
				t.Fatalf("outboxtest: event %s: headers: %v", r.ID, err)
			}
		}
	}
	return out
}

// seen names the types the table holds, for a failure message.
func seen(t testing.TB, db *gorm.DB) string {
	t.Helper()
	events := published(t, db, "")
	if len(events) == 0 {
		return "the table is empty"
	}
	var types []string
	for _, e := range events {
		if !slices.Contains(types, e.Type) {
			types = append(types, e.Type)
		}
	}
	return "the table holds " + strings.Join(types, ", ")
}

func ids(events []outbox.Event) string {
	out := make([]string, len(events))
	for i, e := range events {
		out[i] = e.ID
	}
	return strings.Join(out, ", ")
}

// Relay builds ob's relay on db with cfg and fails the test at once when
// the configuration is refused.
func Relay(t testing.TB, ob *outbox.Outbox, db *gorm.DB, cfg outbox.RelayConfig) *outbox.Relay {
	t.Helper()
	r, err := ob.Relay(db, cfg)
	if err != nil {
		t.Fatalf("outboxtest: relay: %v", err)
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
