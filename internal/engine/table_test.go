package engine

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/errs"
	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/gorm-outbox/outbox/internal/store/sqlite"
	_ "github.com/mattn/go-sqlite3"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestTableSource runs the engine's rules over the table source, on
// SQLite: a claimed batch delivered by Fanout.Process records each result
// in the table under the claim's lease, and the rows come out as the
// policy decided.
func TestTableSource(t *testing.T) {
	db, err := sql.Open("sqlite3", "file:"+filepath.Join(t.TempDir(), "t.db")+sqlite.DSNOptions)
	require.NoError(t, err)
	t.Cleanup(func() { _ = db.Close() })
	s := sqlite.New(store.DefaultTable)
	require.NoError(t, s.Migrate(t.Context(), db))
	require.NoError(t, s.EnsureOrdering(t.Context(), db))
	clock := t0
	now := func() time.Time { return clock }
	var rows []store.Event
	for _, id := range []string{"a1", "b1", "a2", "c1", "d1"} {
		rows = append(rows, store.Event{ID: id, Type: "x", AggregateType: "a", AggregateID: id[:1], Key: id, NamedID: true, Payload: []byte("{}"), OccurredAt: t0})
	}
	_, err = s.Insert(t.Context(), db, rows, t0, false)
	require.NoError(t, err)

	table := &Table{Store: s, DB: db, Now: now, Lease: time.Minute, StatementTimeout: 10 * time.Second, Ordered: true}
	f, _ := fanout(false, true, func(it *Item) error {
		switch it.Event.ID {
		case "a1":
			return errors.New("a1 fails")
		case "c1":
			return errs.Permanent(errors.New("c1 is bad"))
		case "d1":
			return errs.Unavailable(errors.New("d's destination is down"))
		}
		return nil
	})
	f.Workers = 1
	b, err := table.Claim(t.Context(), nil, 10)
	require.NoError(t, err)
	require.NotNil(t, b)
	assert.Len(t, b.Items(), 4, "a2 waits behind a1: the ordered claim leaves it")
	down, err := f.Process(t.Context(), b)
	require.NoError(t, err)
	assert.True(t, errs.IsUnavailable(down))
	assert.Equal(t, 1, b.Sent())

	status := func(id string) (st string, attempts int) {
		require.NoError(t, db.QueryRow("SELECT status, attempts FROM outbox_events WHERE named_id = ?", id).Scan(&st, &attempts))
		return st, attempts
	}
	for id, want := range map[string][2]any{
		"a1": {"pending", 1}, // retried after its backoff
		"b1": {"sent", 1},
		"a2": {"pending", 0}, // never claimed
		"c1": {"failed", 1},
		"d1": {"pending", 0}, // handed back, the attempt taken back
	} {
		st, n := status(id)
		assert.Equal(t, want[0], st, id)
		assert.Equal(t, want[1], n, id)
	}
	clock = clock.Add(time.Second)
	b, err = table.Claim(context.Background(), nil, 10)
	require.NoError(t, err)
	require.NotNil(t, b)
	ids := []string{}
	for _, it := range b.Items() {
		ids = append(ids, it.Event.ID)
	}
	assert.Equal(t, []string{"d1"}, ids, "due again at once: the handed-back d1; a1 waits for its backoff, a2 behind it")
	require.NoError(t, b.Close(context.Background(), nil))
}
