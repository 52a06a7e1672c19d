package outbox

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// TestLogicalSlotLostIsLoud does to a running relay what a failover to a
// standby without the slot does (PostgreSQL before 17): the slot vanishes
// while its publication, a catalog object, stays. Publish must fail
// closed; the relay must say, at Error, that the slot is gone and from
// which position events are out of reach, and count it; a process that
// then installs the plugin creates a new slot and says that it replaces a
// lost one; and the relay streams the new slot, saying so, and delivers
// what is published from then on.
func TestLogicalSlotLostIsLoud(t *testing.T) {
	t.Parallel()
	var logs syncBuffer
	e := setupLogical(t, Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	var got collector
	e.ob.Handle(AnyEvent, got.handle)
	r := e.relay(RelayConfig{PollInterval: 20 * time.Millisecond})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })

	require.NoError(t, PublishAlone(e.db, Event{ID: "before", Type: "x"}))
	require.Eventually(t, func() bool { return got.len() == 1 }, 10*time.Second, 10*time.Millisecond)

	// The relay reconnects within a poll interval: end its session and
	// drop the slot until the drop wins.
	require.Eventually(t, func() bool {
		e.db.Exec("SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots WHERE slot_name = ? AND active_pid IS NOT NULL", e.slot)
		return e.db.Exec("SELECT pg_drop_replication_slot(?)", e.slot).Error == nil
	}, 10*time.Second, 5*time.Millisecond)

	require.ErrorIs(t, PublishAlone(e.db, Event{ID: "into-the-void", Type: "x"}), ErrNoSlot, "fails closed")
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "the replication slot is gone") }, 10*time.Second, 10*time.Millisecond)
	line := lineWith(logs.String(), "the replication slot is gone")
	assert.Contains(t, line, "level=ERROR")
	assert.Contains(t, line, "delivered_lsn=", "names where the window starts")
	assert.NotContains(t, line, "delivered_lsn=0/0", "the position the relay had delivered")
	st, err := e.ob.Stats(e.db.WithContext(t.Context()))
	require.ErrorIs(t, err, ErrNoSlot)
	assert.EqualValues(t, 1, st.SlotLost, "counted, and readable while the slot is missing")

	// Another process starts: db.Use creates a slot, and knows from the
	// publication that it replaces a lost one.
	var otherLogs syncBuffer
	other, err := gorm.Open(postgres.Open(e.dsn), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	t.Cleanup(func() {
		if sqlDB, err := other.DB(); err == nil {
			_ = sqlDB.Close()
		}
	})
	otherOb := Plugin(Config{Mode: Logical, Logical: LogicalConfig{Slot: e.slot}, Logger: slog.New(slog.NewTextHandler(&otherLogs, nil))})
	require.NoError(t, other.Use(otherOb))
	line = lineWith(otherLogs.String(), "slot was gone although its publication exists")
	assert.Contains(t, line, "level=ERROR")
	st, err = otherOb.Stats(other.WithContext(t.Context()))
	require.NoError(t, err)
	assert.EqualValues(t, 1, st.SlotLost)

	// The relay streams the new slot, says so once, and delivers again.
	require.NoError(t, PublishAlone(e.db, Event{ID: "after", Type: "x"}))
	require.Eventually(t, func() bool { return got.len() == 2 }, 10*time.Second, 10*time.Millisecond)
	assert.Equal(t, []string{"before", "after"}, got.ids())
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "in place of the lost one") }, 10*time.Second, 10*time.Millisecond)
	assert.Contains(t, lineWith(logs.String(), "in place of the lost one"), "level=ERROR")
	assert.Equal(t, 1, strings.Count(logs.String(), "the replication slot is gone"), "one loss, logged once:\n%s", logs.String())
	st, err = e.ob.Stats(e.db.WithContext(t.Context()))
	require.NoError(t, err)
	assert.EqualValues(t, 1, st.SlotLost, "one loss, counted once")
}

// lineWith returns the first line of logs that contains s, or "".
func lineWith(logs, s string) string {
	for l := range strings.Lines(logs) {
		if strings.Contains(l, s) {
			return l
		}
	}
	return ""
}
