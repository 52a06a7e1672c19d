package reliability

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// The tests in this file pin bugs in the core that the fuzz targets and the
// fault scenarios found (they failed until 2b48269 fixed them). Each accepts
// either kind of fix: reject the input with the documented sentinel error
// before anything reaches the database, or make it work end to end.

// publishMustNotAbort publishes ev in a transaction that also writes a
// business row, and checks the contract of Publish: either the event is
// accepted and the transaction commits, or the error wraps ErrInvalidEvent
// and the transaction is still usable (on PostgreSQL a failed INSERT aborts
// the caller's whole transaction).
func publishMustNotAbort(t *testing.T, db *gorm.DB, ev outbox.Event) (accepted bool) {
	t.Helper()
	require.NoError(t, db.Exec(`CREATE TABLE IF NOT EXISTS bug_orders (id integer PRIMARY KEY, note text)`).Error)
	var perr, after error
	_ = db.Transaction(func(tx *gorm.DB) error {
		perr = outbox.Publish(tx, ev)
		after = tx.Exec(`INSERT INTO bug_orders (id, note) VALUES (1, 'after publish')`).Error
		return errRollback
	})
	if perr == nil {
		require.NoError(t, db.Transaction(func(tx *gorm.DB) error { return outbox.Publish(tx, ev) }))
		return true
	}
	assert.ErrorIs(t, perr, outbox.ErrInvalidEvent,
		"Publish let the INSERT fail in the database instead of rejecting the event first")
	assert.NoError(t, after, "the caller's transaction is unusable after Publish returned")
	return false
}

// TestPublishRejectsWhatJSONBCannotStore: JSON that encoding/json accepts
// but PostgreSQL's jsonb refuses (lone UTF-16 surrogate escapes, numbers
// beyond numeric's range) used to pass validation; the INSERT then failed
// with SQLSTATE 22P02 / 22003 and aborted the caller's transaction (the next
// statement got 25P02), contrary to "every check runs before the INSERT".
// Found with FuzzPublish (testdata/fuzz/FuzzPublish/invalid-pg-jsonb-*).
func TestPublishRejectsWhatJSONBCannotStore(t *testing.T) {
	t.Parallel()
	db := backends()[1].open(t)
	install(t, db, outbox.Config{Logger: newLogSink().logger()})
	for name, payload := range map[string]string{
		"LoneHighSurrogate": `{"name":"\ud800"}`,
		"LoneLowSurrogate":  `["\udc00"]`,
		"ReversedPair":      `"\udc00\ud800"`,
		"NumericOverflow":   `{"n":1e1000000}`,
		"NumericUnderflow":  `[1e-1000000]`,
	} {
		t.Run(name, func(t *testing.T) {
			publishMustNotAbort(t, db, outbox.Event{Type: "x", Payload: json.RawMessage(payload)})
		})
	}
}

// TestOccurredAtOutsideYears1To9999: OccurredAt used not to be
// range-checked. On SQLite a time outside years 0000-9999 was stored as text
// the driver cannot parse back, and the handler silently received the zero
// time; on PostgreSQL a time outside timestamptz's range (4713 BC - 294276
// AD) failed the INSERT and aborted the caller's transaction. Found by
// FuzzPublish (testdata/fuzz/FuzzPublish/invalid-occurred-*).
func TestOccurredAtOutsideYears1To9999(t *testing.T) {
	t.Parallel()
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			for _, year := range []int{10000, -1, 300000} {
				t.Run(fmt.Sprint("Year", year), func(t *testing.T) {
					db := b.open(t)
					ob := install(t, db, outbox.Config{Logger: newLogSink().logger()})
					var got []outbox.Event
					ob.Handle("x", func(_ context.Context, e outbox.Event) error { got = append(got, e); return nil })
					occurred := time.Date(year, 6, 1, 12, 0, 0, 0, time.UTC)
					if !publishMustNotAbort(t, db, outbox.Event{Type: "x", OccurredAt: occurred}) {
						return
					}
					_, err := outboxtest.Relay(t, ob, db, outbox.RelayConfig{}).ProcessOnce(context.Background())
					require.NoError(t, err)
					require.Len(t, got, 1)
					assert.True(t, occurred.Equal(got[0].OccurredAt), "OccurredAt %v was accepted and delivered as %v", occurred, got[0].OccurredAt)
				})
			}
		})
	}
}

// TestTableNamesAreCreatedOrRefused: Config.Table used to accept every
// plain identifier of at most 63 bytes, and the runtime statements quoted
// it, but the DDL did not: an SQL keyword ("order", "user") was a syntax
// error at db.Use; on PostgreSQL a name with capitals created a lower-cased
// table that Publish then could not find; on PostgreSQL a name of 62-63
// bytes made the derived constraint and index names, truncated to 63 bytes,
// collide; on SQLite "sqlite_" names are reserved, and so is the index
// "sqlite_pending_idx" derived from the table name "sqlite" (fixed in
// 39777a1).
// Found with FuzzTableName (testdata/fuzz/FuzzTableName/valid-keyword-*,
// valid-mixed-case, found-by-fuzzer-sqlite, ...).
func TestTableNamesAreCreatedOrRefused(t *testing.T) {
	t.Parallel()
	names := []string{"order", "user", "MyTable", strings.Repeat("a", 62), strings.Repeat("b", 63), "sqlite_outbox",
		"sqlite", "SQLite"} // FuzzTableName found "sqlite": its index would be sqlite_pending_idx, which SQLite reserves
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			for _, name := range names {
				t.Run(name[:min(len(name), 12)], func(t *testing.T) {
					db := b.open(t)
					ob := outbox.Plugin(outbox.Config{Table: name, Logger: newLogSink().logger()})
					err := db.Use(ob)
					if err != nil {
						assert.ErrorIs(t, err, outbox.ErrInvalidConfig, "a name Config.Table documents as valid failed in the database")
						return
					}
					require.NoError(t, outbox.PublishAlone(db, outbox.Event{Type: "x"}), "publish into %q", name)
					ob.Handle("x", func(context.Context, outbox.Event) error { return nil })
					n, err := outboxtest.Relay(t, ob, db, outbox.RelayConfig{}).ProcessOnce(context.Background())
					require.NoError(t, err)
					assert.Equal(t, 1, n)
				})
			}
		})
	}
}

// TestRelayRecoversFromSilentlyDeadConnection: the claim used to run with
// Run's context, which has no deadline, so a connection whose peer vanished
// without a reset (network partition, host power loss; simulated by the
// proxy dropping every byte of the open connections while new connections
// work) blocked Run inside ProcessOnce until TCP gave up, minutes later: no
// "cannot reach" log, no delivery, although the database was reachable.
// RelayConfig.StatementTimeout (at most the lease) now bounds it. Runs on
// each server.
func TestRelayRecoversFromSilentlyDeadConnection(t *testing.T) {
	long(t, "a partitioned connection, waited out")
	t.Parallel()
	forEachServer(t, testRelayRecoversFromSilentlyDeadConnection)
}

func testRelayRecoversFromSilentlyDeadConnection(t *testing.T, s server) {
	e := newFaultEnv(t, s, 0)
	e.ob.Handle("x", e.got.handle)
	r := outboxtest.Relay(t, e.ob, e.relayDB, outbox.RelayConfig{
		PollInterval: 50 * time.Millisecond, Lease: faultLease, Backoff: noBackoff,
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		e.proxy.close() // unblocks a hung claim so Run can return
		<-done
	})

	first := e.publish(t, "before", 5)
	eventually(t, 30*time.Second, func() error {
		for _, id := range first {
			if e.got.count(id) == 0 {
				return fmt.Errorf("%s not delivered yet", id)
			}
		}
		return nil
	})
	e.proxy.blackhole()
	began := time.Now()
	second := e.publish(t, "after", 5)
	eventually(t, 10*faultLease, func() error {
		missing := 0
		for _, id := range second {
			if e.got.count(id) == 0 {
				missing++
			}
		}
		if missing > 0 {
			return fmt.Errorf("Run delivered %d of %d events in %v after its connection went silent (the database stayed reachable; %d \"cannot reach\" lines logged)",
				len(second)-missing, len(second), time.Since(began).Round(time.Millisecond), e.sink.count("cannot reach"))
		}
		return nil
	})
	t.Logf("FAULT-RESULT server=%s scenario=silently-dead-connection recovered_in=%v", s.name, time.Since(began).Round(time.Millisecond))
}
