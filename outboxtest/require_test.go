package outboxtest_test

import (
	"errors"
	"fmt"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/libtnb/sqlite"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxtest"
)

// fatalTB records the failure a helper reports instead of failing the
// test, so that the helpers' own failures can be asserted.
type fatalTB struct {
	testing.TB
	failed string
}

func (f *fatalTB) Fatalf(format string, args ...any) {
	f.failed = fmt.Sprintf(format, args...)
	runtime.Goexit() // as testing's Fatalf: nothing after it runs
}

// failure runs fn with a fatalTB and returns what it reported, "" if
// nothing.
func failure(t *testing.T, fn func(tb testing.TB)) string {
	t.Helper()
	f := &fatalTB{TB: t}
	done := make(chan struct{})
	go func() { defer close(done); fn(f) }()
	<-done
	return f.failed
}

func pureSQLite(t *testing.T, cfg outbox.Config) *gorm.DB {
	dsn := "file:" + filepath.Join(t.TempDir(), "outbox.db") + outboxtest.PureGoDSNOptions
	db, _ := outboxtest.Open(t, sqlite.Open(dsn), cfg)
	return db
}

type placed struct {
	Order string `json:"order"`
	Total int    `json:"total"`
}

func TestRequirePublished(t *testing.T) {
	db := pureSQLite(t, outbox.Config{})
	outboxtest.Publish(t, db,
		outbox.Event{ID: "e1", Type: "order.placed", AggregateType: "order", AggregateID: "o-1", Payload: placed{"o-1", 10}},
		outbox.Event{ID: "e2", Type: "order.placed", AggregateType: "order", AggregateID: "o-2", Payload: placed{"o-2", 20},
			Headers: map[string]string{"tenant": "acme"}},
		outbox.Event{ID: "e3", Type: "order.shipped", Payload: placed{"o-1", 10}},
	)

	e := outboxtest.RequirePublished(t, db, "order.placed", func(e outbox.Event) bool {
		var p placed
		return e.DecodePayload(&p) == nil && p.Total > 15
	})
	if e.ID != "e2" || e.AggregateID != "o-2" || e.Headers["tenant"] != "acme" {
		t.Fatalf("got %+v, want e2 with its aggregate and headers", e)
	}
	if e := outboxtest.RequirePublished(t, db, "order.placed", nil); e.ID != "e1" {
		t.Fatalf("nil match: got %s, want the first written, e1", e.ID)
	}

	// What a failure says.
	msg := failure(t, func(tb testing.TB) { outboxtest.RequirePublished(tb, db, "order.cancelled", nil) })
	if !strings.Contains(msg, "no order.cancelled event") || !strings.Contains(msg, "order.placed, order.shipped") {
		t.Fatalf("unexpected failure %q", msg)
	}
	msg = failure(t, func(tb testing.TB) {
		outboxtest.RequirePublished(tb, db, "order.placed", func(outbox.Event) bool { return false })
	})
	if !strings.Contains(msg, "2 order.placed event(s) were published and none matches (IDs e1, e2)") {
		t.Fatalf("unexpected failure %q", msg)
	}
}

// TestRequireInTransaction: through a transaction the helpers see what it
// wrote before it commits, and a rolled-back transaction left nothing.
func TestRequireInTransaction(t *testing.T) {
	db := pureSQLite(t, outbox.Config{})
	errRollback := errors.New("roll back")
	err := db.Transaction(func(tx *gorm.DB) error {
		if err := outbox.Publish(tx, outbox.Event{ID: "t1", Type: "order.placed", Payload: placed{"o-9", 1}}); err != nil {
			return err
		}
		outboxtest.RequirePublished(t, tx, "order.placed", nil)
		return errRollback
	})
	if !errors.Is(err, errRollback) {
		t.Fatal(err)
	}
	outboxtest.RequireNotPublished(t, db)
	outboxtest.RequireNotPublished(t, db, "order.placed")
}

func TestRequireNotPublished(t *testing.T) {
	db := pureSQLite(t, outbox.Config{})
	outboxtest.RequireNotPublished(t, db)
	outboxtest.Publish(t, db, outbox.Event{ID: "n1", Type: "order.placed"})
	outboxtest.RequireNotPublished(t, db, "order.cancelled")

	msg := failure(t, func(tb testing.TB) { outboxtest.RequireNotPublished(tb, db, "order.cancelled", "order.placed") })
	if !strings.Contains(msg, "1 order.placed event(s) were published, want none (IDs n1)") {
		t.Fatalf("unexpected failure %q", msg)
	}
	msg = failure(t, func(tb testing.TB) { outboxtest.RequireNotPublished(tb, db) })
	if !strings.Contains(msg, "1 event(s) were published, want none (the table holds order.placed)") {
		t.Fatalf("unexpected failure %q", msg)
	}
}

// TestRequireOtherModes: the helpers read the table, and say so in a mode
// that writes none.
func TestRequireOtherModes(t *testing.T) {
	db := pureSQLite(t, outbox.Config{Mode: outbox.Memory})
	msg := failure(t, func(tb testing.TB) { outboxtest.RequireNotPublished(tb, db) })
	if !strings.Contains(msg, "memory mode") {
		t.Fatalf("unexpected failure %q", msg)
	}
}
