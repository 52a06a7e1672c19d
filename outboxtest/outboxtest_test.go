package outboxtest_test

import (
	"context"
	"log/slog"
	"path/filepath"
	"strings"
	"testing"

	"github.com/libtnb/sqlite"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxtest"
)

func TestRoundTrip(t *testing.T) {
	if !cgoEnabled {
		t.Skip("outboxtest.SQLite uses gorm.io/driver/sqlite, which needs cgo; TestOpenPureGo covers the cgo-free path")
	}
	db, ob := outboxtest.SQLite(t, outbox.Config{})
	roundTrip(t, db, ob)
}

// TestOpenPureGo: Open with the pure-Go driver and PureGoDSNOptions, as the
// README shows for builds without cgo; db.Use, which warns when the
// settings concurrent writers need are missing, logs nothing.
func TestOpenPureGo(t *testing.T) {
	dsn := "file:" + filepath.Join(t.TempDir(), "outbox.db") + outboxtest.PureGoDSNOptions
	var logs strings.Builder
	db, ob := outboxtest.Open(t, sqlite.Open(dsn), outbox.Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	if logs.Len() > 0 {
		t.Fatalf("db.Use logged with PureGoDSNOptions: %s", logs.String())
	}
	var mode string
	if err := db.Raw("PRAGMA journal_mode").Scan(&mode).Error; err != nil || mode != "wal" {
		t.Fatalf("journal_mode %q (%v), want wal", mode, err)
	}
	roundTrip(t, db, ob)
}

func roundTrip(t *testing.T, db *gorm.DB, ob *outbox.Outbox) {
	t.Helper()
	var got []string
	ob.Handle("x", func(_ context.Context, e outbox.Event) error { got = append(got, e.ID); return nil })
	outboxtest.Publish(t, db, outbox.Event{ID: "a", Type: "x"}, outbox.Event{ID: "b", Type: "x"})
	if n := outboxtest.Drain(t, outboxtest.Relay(t, ob, db, outbox.RelayConfig{Workers: 1})); n != 2 {
		t.Fatalf("drained %d events, want 2", n)
	}
	if len(got) != 2 || got[0] != "a" || got[1] != "b" {
		t.Fatalf("delivered %v, want [a b]", got)
	}
	if s := outboxtest.Row(t, db, "a").Status; s != outbox.StatusSent {
		t.Fatalf("status %q, want sent", s)
	}
}
