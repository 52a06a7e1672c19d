package outboxtest_test

import (
	"context"
	"testing"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxtest"
)

func TestRoundTrip(t *testing.T) {
	db, ob := outboxtest.SQLite(t, outbox.Config{})
	var got []string
	ob.Handle("x", func(_ context.Context, e outbox.Event) error { got = append(got, e.ID); return nil })
	outboxtest.Publish(t, db, outbox.Event{ID: "a", Type: "x"}, outbox.Event{ID: "b", Type: "x"})
	if n := outboxtest.Drain(t, ob.Relay(db, outbox.RelayConfig{Workers: 1})); n != 2 {
		t.Fatalf("drained %d events, want 2", n)
	}
	if len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Fatalf("delivered %v, want [a b]", got)
	}
	if s := outboxtest.Row(t, db, "a").Status; s != outbox.StatusSent {
		t.Fatalf("status %q, want sent", s)
	}
}
