package storetest

import (
	"log/slog"
	"testing"

	"github.com/gorm-outbox/outbox/internal/errs"
	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// ExerciseSlots checks the store.Logical statements that need a server
// decoding its WAL (PostgreSQL with wal_level=logical), which Exercise
// leaves out: CreateSlot, and Emit and SlotStats on a slot that exists.
// open's databases must be on such a server. Slots belong to the whole
// cluster: the suite drops the ones it creates.
func ExerciseSlots(t *testing.T, open Open) {
	t.Helper()
	e := setup(t, &suite{open: open, calls: &calls{}})
	require.True(t, is[store.Logical](e.real), "%T implements no store.Logical", e.real)
	lg := e.logical()
	require.NoError(t, lg.CheckLogical(e.ctx, e.db), "ExerciseSlots needs a server that decodes its WAL")

	slot := randomSlot()
	other := slot + "_td"
	t.Cleanup(func() {
		for _, s := range []string{slot, other} {
			dropSlot(e.db, s)
		}
	})
	logger := slog.New(slog.DiscardHandler)

	t.Run("CreateSlot", func(t *testing.T) {
		emitted, err := lg.Emit(e.ctx, e.db, slot, "outbox", []byte(`{"id":"before"}`))
		require.NoError(t, err)
		assert.False(t, emitted, "Emit before the slot exists")
		replaced, err := lg.CreateSlot(e.ctx, e.db, slot, logger)
		require.NoError(t, err)
		assert.False(t, replaced, "a first slot replaces none")
		replaced, err = lg.CreateSlot(e.ctx, e.db, slot, logger)
		require.NoError(t, err, "CreateSlot of a slot that exists")
		assert.False(t, replaced, "CreateSlot of a slot that exists")

		// A slot gone while its publication stays is what a failover to a
		// standby without the slot leaves: the new one replaces it.
		_, err = e.db.ExecContext(e.ctx, "SELECT pg_drop_replication_slot('"+slot+"')")
		require.NoError(t, err)
		replaced, err = lg.CreateSlot(e.ctx, e.db, slot, logger)
		require.NoError(t, err)
		assert.True(t, replaced, "a slot created where its publication was")
		var plugin string
		require.NoError(t, e.db.QueryRowContext(e.ctx, "SELECT plugin FROM pg_replication_slots WHERE slot_name = '"+slot+"'").Scan(&plugin))
		assert.Equal(t, "pgoutput", plugin)
	})

	t.Run("Emit", func(t *testing.T) {
		emitted, err := lg.Emit(e.ctx, e.db, slot, "outbox", []byte(`{"id":"x"}`))
		require.NoError(t, err)
		assert.True(t, emitted, "Emit once the slot exists")
		tx, err := e.db.BeginTx(e.ctx, nil)
		require.NoError(t, err)
		emitted, err = lg.Emit(e.ctx, tx, slot, "outbox", []byte(`{"id":"y"}`))
		require.NoError(t, err)
		assert.True(t, emitted, "Emit in a transaction")
		require.NoError(t, tx.Rollback())
	})

	t.Run("SlotStats", func(t *testing.T) {
		st, err := lg.SlotStats(e.ctx, e.db, slot)
		require.NoError(t, err)
		assert.False(t, st.Active, "nobody streams the slot")
		assert.GreaterOrEqual(t, st.LagBytes, int64(0))
		held, err := lg.SlotHeldBy(e.ctx, e.db, slot, 1)
		require.NoError(t, err)
		assert.False(t, held)

		// The WAL the slot keeps grows with what is written after it.
		emitted, err := lg.Emit(e.ctx, e.db, slot, "outbox", []byte(`{"id":"lag"}`))
		require.NoError(t, err)
		require.True(t, emitted)
		after, err := lg.SlotStats(e.ctx, e.db, slot)
		require.NoError(t, err)
		assert.Greater(t, after.LagBytes, st.LagBytes, "a message emitted after the slot's confirmed position")
	})

	t.Run("RefusesOtherPlugin", func(t *testing.T) {
		_, err := e.db.ExecContext(e.ctx, "SELECT pg_create_logical_replication_slot('"+other+"', 'test_decoding')")
		require.NoError(t, err)
		_, err = lg.CreateSlot(e.ctx, e.db, other, logger)
		assert.ErrorIs(t, err, errs.ErrInvalidConfig, "a slot of another plugin")
	})
}
