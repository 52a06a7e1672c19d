package outbox

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

func init() {
	productionTests["RelaysRecorded"] = testRelaysRecorded
}

// testRelaysRecorded: a relay records itself (name, host, PID, mode, when it
// last claimed and delivered, its last error) and Stats reports the relays
// alive and the last delivery; a relay not seen for 15 s is gone, and its
// row is deleted after a day by the relays that remain.
func testRelaysRecorded(t *testing.T, b backend) {
	e := b.setup(t)
	ctx := t.Context()
	db := e.db.WithContext(ctx)
	rs, ok := e.ob.store.(store.Relays)
	require.True(t, ok, "every shipped store records relays")
	stats := func() Stats {
		t.Helper()
		st, err := e.ob.Stats(db)
		require.NoError(t, err)
		return st
	}
	st := stats()
	assert.Empty(t, st.Relays, "no relay has run")
	assert.Zero(t, st.LastDelivery)

	e.ob.Handle("x", func(context.Context, Event) error { return nil })
	publishN(t, e.db, "x", 1)
	r := e.relay(RelayConfig{Name: "relay-a"})
	_, err := r.ProcessOnce(ctx)
	require.NoError(t, err)
	delivered := e.clock.Now()
	_, err = r.heartbeat(rs).Pass(ctx)
	require.NoError(t, err)

	st = stats()
	require.Len(t, st.Relays, 1)
	got := st.Relays[0]
	host, _ := os.Hostname()
	assert.Equal(t, "relay-a", got.Name)
	assert.Equal(t, host, got.Host)
	assert.Equal(t, os.Getpid(), got.PID)
	assert.Equal(t, e.ob.mode.String(), got.Mode)
	assert.WithinDuration(t, delivered, got.LastDelivery, time.Second)
	assert.Equal(t, got.LastDelivery, st.LastDelivery, "the last delivery any relay recorded")
	assert.Equal(t, got.Seen, st.RelaySeen)
	assert.Empty(t, got.LastError)
	if !b.logical { // in Logical mode the event came from the stream: no claim
		assert.WithinDuration(t, delivered, got.LastClaim, time.Second)
	}

	// A cycle that fails records its error; one that goes through clears it.
	e.ob.Handle("down", func(context.Context, Event) error { return Unavailable(errors.New("broker gone")) })
	publishN(t, e.db, "down", 1)
	e.clock.Advance(time.Second)
	_, err = r.ProcessOnce(ctx)
	require.Error(t, err)
	_, err = r.heartbeat(rs).Pass(ctx)
	require.NoError(t, err)
	st = stats()
	require.Len(t, st.Relays, 1)
	assert.True(t, strings.HasPrefix(st.Relays[0].LastError, "broker gone (destination unavailable)"),
		"the cause first, for a column cut to a line: %q", st.Relays[0].LastError)
	seen := st.Relays[0].Seen // as the database stored it: to its precision

	// Gone: not seen for 15 s.
	e.clock.Advance(16 * time.Second)
	st = stats()
	assert.Empty(t, st.Relays, "not seen for 15 s: gone")
	assert.Equal(t, got.LastDelivery, st.LastDelivery, "its last delivery is still the table's last")
	assert.Equal(t, seen, st.RelaySeen, "and when it was last seen")

	// Forgotten: another relay deletes the rows of relays gone for a day.
	e.clock.Advance(25 * time.Hour)
	other := e.relay(RelayConfig{Name: "relay-b"})
	_, err = other.heartbeat(rs).Pass(ctx)
	require.NoError(t, err)
	st = stats()
	require.Len(t, st.Relays, 1)
	assert.Equal(t, "relay-b", st.Relays[0].Name)
	assert.Zero(t, st.LastDelivery, "relay-a's row, and its last delivery, are gone")
}

func init() {
	productionTests["OrderingIndexRaceIsQuiet"] = testOrderingIndexRaceIsQuiet
}

// testOrderingIndexRaceIsQuiet: relays that start together with
// OrderByAggregate, each in a process of its own (a pool and an Outbox of
// its own), take turns building the ordering index: none logs an error for
// the race, and each delivers.
func testOrderingIndexRaceIsQuiet(t *testing.T, b backend) {
	if b.sqlite != nil {
		t.Skip("SQLite has one writer: its relays cannot race on the index")
	}
	e := b.setup(t)
	const relays = 4
	var logs syncBuffer
	logger := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelWarn}))
	rs := make([]*Relay, relays)
	for i := range rs {
		db := e.reopen(t)
		ob := Plugin(Config{Mode: e.ob.mode, Table: e.ob.Table(), Logger: logger, Logical: LogicalConfig{Slot: e.ob.slot}})
		ob.clock = e.clock.Now
		require.NoError(t, db.Use(ob))
		ob.Handle(AnyEvent, func(context.Context, Event) error { return nil })
		rs[i] = mustRelay(t, ob, db, RelayConfig{OrderByAggregate: true})
	}
	start := make(chan struct{})
	errs := make(chan error, relays)
	for _, r := range rs {
		go func() {
			<-start
			_, err := r.ProcessOnce(t.Context())
			errs <- err
		}()
	}
	close(start)
	for range relays {
		require.NoError(t, <-errs, "no relay fails for the race")
	}
	assert.NotContains(t, logs.String(), "level=ERROR", "no error logged for a race the relays win or lose harmlessly")
	ok, err := e.ob.store.Exists(t.Context(), mustSQLDB(t, e.db), e.ob.Table()+"_aggregate_idx")
	require.NoError(t, err)
	assert.True(t, ok, "the index is built")
}

func mustSQLDB(t *testing.T, db *gorm.DB) *sql.DB {
	t.Helper()
	sqlDB, err := db.DB()
	require.NoError(t, err)
	return sqlDB
}
