package outboxtest_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/libtnb/sqlite"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxtest"
)

// The helpers take a testing.TB, so these examples show them inside the
// test functions they belong in; the examples compile but do not run.

// exampleOrder and placeOrder stand for the application code under test.
type exampleOrder struct {
	ID    string
	Total int
}

// placeOrder writes an order and its event in tx, refusing empty orders.
func placeOrder(tx *gorm.DB, o exampleOrder) error {
	if o.Total <= 0 {
		return errors.New("empty order")
	}
	return outbox.Publish(tx, outbox.Event{
		Type: "order.placed", AggregateType: "order", AggregateID: o.ID, Payload: o,
	})
}

// SQLite gives each test its own outbox on a SQLite file in t.TempDir(),
// closed when the test ends: no shared database, no cleanup code.
func ExampleSQLite() {
	testOrderPlaced := func(t *testing.T) {
		db, ob := outboxtest.SQLite(t, outbox.Config{})
		var got []string
		ob.Handle("order.placed", func(ctx context.Context, e outbox.Event) error {
			got = append(got, e.AggregateID)
			return nil
		})

		if err := db.Transaction(func(tx *gorm.DB) error {
			return placeOrder(tx, exampleOrder{ID: "42", Total: 10})
		}); err != nil {
			t.Fatal(err)
		}
		outboxtest.Drain(t, outboxtest.Relay(t, ob, db, outbox.RelayConfig{Workers: 1}))
		if len(got) != 1 || got[0] != "42" {
			t.Fatalf("delivered %v, want [42]", got)
		}
	}
	_ = testOrderPlaced // func TestOrderPlaced(t *testing.T) in a _test.go file
}

// Open is SQLite with the driver of your choice: here the pure-Go
// github.com/libtnb/sqlite, for builds without cgo, with the DSN
// settings spelled for it. It also opens a test database of another kind.
func ExampleOpen() {
	testWithoutCgo := func(t *testing.T) {
		dsn := "file:" + filepath.Join(t.TempDir(), "outbox.db") + outboxtest.PureGoDSNOptions
		db, ob := outboxtest.Open(t, sqlite.Open(dsn), outbox.Config{})
		ob.Handle("order.placed", func(ctx context.Context, e outbox.Event) error { return nil })

		outboxtest.Publish(t, db, outbox.Event{ID: "e1", Type: "order.placed"})
		outboxtest.Drain(t, outboxtest.Relay(t, ob, db, outbox.RelayConfig{}))
		if r := outboxtest.Row(t, db, "e1"); r.Status != outbox.StatusSent {
			t.Fatalf("status %s, want sent", r.Status)
		}
	}
	_ = testWithoutCgo
}

// Publish commits events in a transaction of their own, for a test whose
// subject is a consumer rather than the code that publishes.
func ExamplePublish() {
	testConsumer := func(t *testing.T) {
		db, ob := outboxtest.SQLite(t, outbox.Config{})
		ob.Handle("order.placed", func(ctx context.Context, e outbox.Event) error { return nil })

		outboxtest.Publish(t, db,
			outbox.Event{ID: "e1", Type: "order.placed", Payload: exampleOrder{ID: "1", Total: 5}},
			outbox.Event{ID: "e2", Type: "order.placed", Payload: exampleOrder{ID: "2", Total: 7}},
		)
		if n := outboxtest.Drain(t, outboxtest.Relay(t, ob, db, outbox.RelayConfig{})); n != 2 {
			t.Fatalf("delivered %d events, want 2", n)
		}
	}
	_ = testConsumer
}

// Relay fails the test at once on a refused configuration, so the test
// body goes straight to ProcessOnce or Drain.
func ExampleRelay() {
	testRetry := func(t *testing.T) {
		db, ob := outboxtest.SQLite(t, outbox.Config{})
		calls := 0
		ob.Handle("order.placed", func(ctx context.Context, e outbox.Event) error {
			calls++
			if calls == 1 {
				return errors.New("broker timeout")
			}
			return nil
		})
		outboxtest.Publish(t, db, outbox.Event{ID: "e1", Type: "order.placed"})

		// No backoff: the retry is due at once.
		relay := outboxtest.Relay(t, ob, db, outbox.RelayConfig{Backoff: func(int) time.Duration { return 0 }})
		outboxtest.Drain(t, relay)
		if r := outboxtest.Row(t, db, "e1"); r.Status != outbox.StatusSent || r.Attempts != 2 {
			t.Fatalf("status %s after %d attempts, want sent after 2", r.Status, r.Attempts)
		}
	}
	_ = testRetry
}

// Drain delivers everything that is due, batch after batch, and returns the
// count: the deterministic stand-in for a relay running in the background.
func ExampleDrain() {
	testBacklog := func(t *testing.T) {
		db, ob := outboxtest.SQLite(t, outbox.Config{})
		ob.Handle(outbox.AnyEvent, func(ctx context.Context, e outbox.Event) error { return nil })
		for range 250 {
			outboxtest.Publish(t, db, outbox.Event{Type: "order.placed"})
		}

		relay := outboxtest.Relay(t, ob, db, outbox.RelayConfig{BatchSize: 100})
		if n := outboxtest.Drain(t, relay); n != 250 {
			t.Fatalf("drained %d events, want 250", n)
		}
		if n := outboxtest.Drain(t, relay); n != 0 {
			t.Fatalf("a second drain claimed %d events, want 0", n)
		}
	}
	_ = testBacklog
}

// Row reads an event's row back, to check what the relay recorded: the
// status, the attempts, the last error.
func ExampleRow() {
	testPermanentFailure := func(t *testing.T) {
		db, ob := outboxtest.SQLite(t, outbox.Config{})
		ob.Handle("order.placed", func(ctx context.Context, e outbox.Event) error {
			return outbox.Permanent(errors.New("422 Unprocessable Entity"))
		})
		outboxtest.Publish(t, db, outbox.Event{ID: "e1", Type: "order.placed"})
		outboxtest.Drain(t, outboxtest.Relay(t, ob, db, outbox.RelayConfig{}))

		r := outboxtest.Row(t, db, "e1")
		if r.Status != outbox.StatusFailed || r.Attempts != 1 || r.LastError == nil {
			t.Fatalf("got status %s, %d attempts, error %v; want failed after 1 attempt", r.Status, r.Attempts, r.LastError)
		}
	}
	_ = testPermanentFailure
}

// RequirePublished checks what the code under test published, payload
// included, without a relay or a handler. Given the transaction, it sees
// the events before they commit.
func ExampleRequirePublished() {
	testPlaceOrder := func(t *testing.T) {
		db, _ := outboxtest.SQLite(t, outbox.Config{})

		err := db.Transaction(func(tx *gorm.DB) error {
			if err := placeOrder(tx, exampleOrder{ID: "42", Total: 10}); err != nil {
				return err
			}
			e := outboxtest.RequirePublished(t, tx, "order.placed", func(e outbox.Event) bool {
				return e.AggregateID == "42"
			})
			var got exampleOrder
			if err := e.DecodePayload(&got); err != nil {
				return err
			}
			if got.Total != 10 {
				t.Errorf("payload total %d, want 10", got.Total)
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	_ = testPlaceOrder
}

// RequireNotPublished is the other half: code that refuses, or rolls back,
// must leave no event behind.
func ExampleRequireNotPublished() {
	testEmptyOrderRefused := func(t *testing.T) {
		db, _ := outboxtest.SQLite(t, outbox.Config{})

		err := db.Transaction(func(tx *gorm.DB) error {
			return placeOrder(tx, exampleOrder{ID: "43"})
		})
		if err == nil {
			t.Fatal("an empty order was accepted")
		}
		outboxtest.RequireNotPublished(t, db, "order.placed")
		outboxtest.RequireNotPublished(t, db) // nor any other event
	}
	_ = testEmptyOrderRefused
}
