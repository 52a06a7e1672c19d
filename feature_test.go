package outbox

import (
	"context"
	"testing"

	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// coreOnly is a store with the core role alone: the interface field hides
// the feature roles of the store it wraps.
type coreOnly struct{ store.Store }

// TestUnsupportedFeature: on a store without a feature's role, the root
// refuses the feature with ErrUnsupportedFeature, naming it and the store;
// what needs only the core works.
func TestUnsupportedFeature(t *testing.T) {
	t.Parallel()
	e := sqliteBackend.setup(t)
	e.ob.store = coreOnly{e.ob.store}
	db := e.db.WithContext(t.Context())

	_, err := e.ob.Overview(db, OverviewParams{})
	require.ErrorIs(t, err, ErrUnsupportedFeature)
	assert.ErrorContains(t, err, "Overview on sqlite")
	_, err = e.ob.History(db, "x")
	require.ErrorIs(t, err, ErrUnsupportedFeature)
	err = Consume(db, "c", "m", func(*gorm.DB) error { return nil })
	require.ErrorIs(t, err, ErrUnsupportedFeature)

	require.NoError(t, PublishAlone(e.db, Event{ID: "core", Type: "x"}))
	var got []string
	e.ob.Handle("x", func(_ context.Context, ev Event) error { got = append(got, ev.ID); return nil })
	r, err := e.ob.Relay(e.db, RelayConfig{})
	require.NoError(t, err)
	svcs := r.services()
	if assert.Len(t, svcs, 1, "no rollup without its role; retention alone") {
		assert.Equal(t, "deleting old sent events", svcs[0].Name)
	}
	_, err = r.ProcessOnce(t.Context())
	require.NoError(t, err)
	assert.Equal(t, []string{"core"}, got, "the core delivers")
	_, err = e.ob.Stats(db)
	require.NoError(t, err)
}
