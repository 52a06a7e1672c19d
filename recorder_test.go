package outbox

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

func testRecorder(t *testing.T, b backend) {
	for _, mode := range []Mode{Persistent, Memory} {
		t.Run(mode.String(), func(t *testing.T) {
			e := b.setup(t, withConfig(Config{Mode: mode}))
			c := &collector{}
			e.ob.Handle("*", c.handle)
			delivered := func() []string {
				if mode == Persistent {
					for {
						n, err := e.relay(RelayConfig{Workers: 1}).ProcessOnce(t.Context())
						require.NoError(t, err)
						if n == 0 {
							break
						}
					}
				}
				return c.ids()
			}

			// No columns added to the model's table.
			cols, err := e.db.Migrator().ColumnTypes(&Order{})
			require.NoError(t, err)
			assert.Len(t, cols, 2, "Recorder must not add columns")

			// Create: published in the INSERT's own (implicit) transaction.
			o := Order{Total: 1}
			o.Record(Event{ID: "created", Type: "order.created"})
			require.NoError(t, e.db.Create(&o).Error)
			assert.Empty(t, o.Recorded(), "published events are cleared")
			assert.Equal(t, []string{"created"}, delivered())

			// Saving again does not re-publish; Save/Update/Delete publish what
			// was recorded since.
			require.NoError(t, e.db.Save(&o).Error)
			o.Record(Event{ID: "saved", Type: "order.saved"})
			require.NoError(t, e.db.Save(&o).Error)
			o.Record(Event{ID: "updated", Type: "order.updated"})
			require.NoError(t, e.db.Model(&o).Update("total", 3).Error)
			o.Record(Event{ID: "deleted", Type: "order.deleted"})
			require.NoError(t, e.db.Delete(&o).Error)
			assert.Equal(t, []string{"created", "saved", "updated", "deleted"}, delivered())

			// Slices.
			batch := []*Order{{Total: 10}, {Total: 11}}
			batch[0].Record(Event{ID: "s0", Type: "order.created"})
			batch[1].Record(Event{ID: "s1", Type: "order.created"})
			require.NoError(t, e.db.Create(&batch).Error)
			assert.Equal(t, []string{"created", "saved", "updated", "deleted", "s0", "s1"}, delivered())

			// Save of a new row with a primary key set: an UPDATE of no row,
			// then an INSERT; published once, with the INSERT.
			n := Order{ID: 999, Total: 5}
			n.Record(Event{ID: "upsert", Type: "order.created"})
			require.NoError(t, e.db.Save(&n).Error)
			assert.Equal(t, "upsert", delivered()[6])
			assert.Len(t, delivered(), 7)

			// Rolled back with the enclosing transaction: nothing published.
			r := Order{Total: 7}
			r.Record(Event{ID: "rolled-back", Type: "order.created"})
			_ = e.db.Transaction(func(tx *gorm.DB) error {
				require.NoError(t, tx.Create(&r).Error)
				return errors.New("rollback")
			})
			assert.Len(t, delivered(), 7)

			// An invalid recorded event fails the write; nothing is lost from
			// the entity.
			bad := Order{Total: 8}
			bad.Record(Event{})
			require.ErrorIs(t, e.db.Create(&bad).Error, ErrInvalidEvent)
			assert.Len(t, bad.Recorded(), 1)
			var count int64
			require.NoError(t, e.db.Model(&Order{}).Where("total = ?", 8).Count(&count).Error)
			assert.EqualValues(t, 0, count, "the model's INSERT rolled back with the event")
		})
	}
}

func testRecorderSkipDefaultTx(t *testing.T, b backend) {
	e := b.setup(t, withGorm(&gorm.Config{SkipDefaultTransaction: true}))
	c := &collector{}
	e.ob.Handle(AnyEvent, c.handle)
	// GORM opens no transaction here, so the plugin opens one for a statement
	// that carries events: the model row and the outbox row commit or roll
	// back together. An event that fails validation shows it.
	bad := Order{Total: 1}
	bad.Record(Event{ID: "bad"})
	require.ErrorIs(t, e.db.Create(&bad).Error, ErrInvalidEvent)
	var n int64
	require.NoError(t, e.db.Model(&Order{}).Count(&n).Error)
	assert.EqualValues(t, 0, n, "the model's INSERT rolled back with the failed event")

	good := Order{Total: 2}
	good.Record(Event{ID: "good", Type: "order.created"})
	require.NoError(t, e.db.Create(&good).Error)
	require.NoError(t, e.db.Model(&Order{}).Count(&n).Error)
	assert.EqualValues(t, 1, n)
	if b.logical { // a WAL message, no row: the relay delivers the committed event, and only it
		assert.EqualValues(t, 0, e.count(""))
		assert.Equal(t, []string{"good"}, e.delivered(t, c))
	} else {
		assert.EqualValues(t, 1, e.count("named_id = ?", "good"))
	}

	// Statements without events keep autocommitting, untouched.
	require.NoError(t, e.db.Create(&Order{Total: 3}).Error)
}
