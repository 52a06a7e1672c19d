package outbox

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/maint"
	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func init() {
	overviewTests["History"] = testHistory
}

// testHistory: each failed attempt and each replay is an entry of the
// event's history, with its error and who replayed; deliveries that
// succeed add none; a purge and retention delete entries.
func testHistory(t *testing.T, b backend) {
	mem := b.setup(t, withConfig(Config{Mode: Memory}))
	_, err := mem.ob.History(mem.db.WithContext(t.Context()), "x")
	require.ErrorIs(t, err, ErrMemoryMode)

	e := b.setup(t)
	fails := map[int]error{1: errors.New("first: broker busy"), 2: Permanent(errors.New("second: 422"))}
	e.ob.Handle("h", func(ctx context.Context, _ Event) error { return fails[Attempt(ctx)] })
	e.ob.Handle("ok", func(context.Context, Event) error { return nil })
	publishN(t, e.db, "h", 1)
	publishN(t, e.db, "ok", 1)
	r := e.relay(RelayConfig{Backoff: func(int) time.Duration { return time.Second }})
	for range 2 {
		_, err := r.ProcessOnce(t.Context())
		require.NoError(t, err)
		e.clock.Advance(2 * time.Second)
	}
	db := e.db.WithContext(t.Context())
	row, err := e.ob.Get(db, "h-00000")
	require.NoError(t, err)
	require.Equal(t, StatusFailed, row.Status)

	h, err := e.ob.History(db, "h-00000")
	require.NoError(t, err)
	require.Len(t, h, 2)
	assert.Equal(t, []Outcome{OutcomeRetry, OutcomeFailed}, []Outcome{h[0].Outcome, h[1].Outcome})
	assert.Equal(t, []int{1, 2}, []int{h[0].Attempt, h[1].Attempt})
	assert.Contains(t, h[0].Error, "first: broker busy")
	assert.Contains(t, h[1].Error, "second: 422")
	assert.True(t, h[0].At.Before(h[1].At))
	none, err := e.ob.History(db, "ok-00000")
	require.NoError(t, err)
	assert.Empty(t, none, "a delivery that succeeds leaves no entry")

	// An event whose ID the outbox generated: in Logical mode it is
	// delivered from the stream, and its failed attempt is written to the
	// table by the stream, with its history entry as any other.
	var genID atomic.Value
	e.ob.Handle("g", func(_ context.Context, ev Event) error {
		genID.Store(ev.ID)
		return Permanent(errors.New("g: refused"))
	})
	require.NoError(t, PublishAlone(e.db, Event{Type: "g"}))
	_, err = r.ProcessOnce(t.Context())
	require.NoError(t, err)
	id, _ := genID.Load().(string)
	require.NotEmpty(t, id, "the generated event was delivered")
	g, err := e.ob.History(db, id)
	require.NoError(t, err)
	if assert.Len(t, g, 1, "one entry for the failed attempt of a generated event") {
		assert.Equal(t, OutcomeFailed, g[0].Outcome)
		assert.Equal(t, 1, g[0].Attempt)
		assert.Contains(t, g[0].Error, "g: refused")
	}

	n, err := e.ob.Replay(e.db.WithContext(WithActor(t.Context(), "alice@ops")), Filter{IDs: []string{"h-00000"}})
	require.NoError(t, err)
	require.Equal(t, 1, n)
	fails = map[int]error{}
	_, err = r.ProcessOnce(t.Context())
	require.NoError(t, err)
	h, err = e.ob.History(db, "h-00000")
	require.NoError(t, err)
	require.Len(t, h, 3, "the replay is an entry; the delivery after it none")
	assert.Equal(t, OutcomeReplayed, h[2].Outcome)
	assert.Equal(t, "alice@ops", h[2].Actor)
	assert.Contains(t, h[2].Error, "second: 422", "the error the replay went past")
	row, err = e.ob.Get(db, "h-00000")
	require.NoError(t, err)
	assert.Equal(t, StatusSent, row.Status)

	// Retention deletes entries as old as the sent rows it deletes.
	e.clock.Advance(time.Hour)
	publishN(t, e.db, "p", 1)
	e.ob.Handle("p", func(context.Context, Event) error { return Permanent(errors.New("no")) })
	_, err = r.ProcessOnce(t.Context())
	require.NoError(t, err)
	sqlDB, err := e.db.DB()
	require.NoError(t, err)
	_, err = maint.Retention(e.ob.store, e.ob.store.(store.History), sqlDB, 30*time.Minute, time.Minute, e.ob.now).Pass(t.Context())
	require.NoError(t, err)
	h, err = e.ob.History(db, "h-00000")
	require.NoError(t, err)
	assert.Empty(t, h, "older than the retention window")
	h, err = e.ob.History(db, "p-00000")
	require.NoError(t, err)
	require.Len(t, h, 1, "newer: kept")

	// A purge deletes the history with the row.
	_, err = e.ob.Purge(db, Filter{IDs: []string{"p-00000", id}})
	require.NoError(t, err)
	var left int64
	require.NoError(t, e.db.Table(e.ob.Table()+"_attempts").Count(&left).Error)
	assert.Zero(t, left)
}

// BenchmarkFailurePath measures what the event history costs the one path
// that writes it: a relay cycle whose every delivery fails and is
// retried, with the history and without it, alternating by sub-benchmark
// (run with -count to interleave them):
//
//	go test -run '^$' -bench FailurePath -benchtime 200x -count 5 .
func BenchmarkFailurePath(b *testing.B) {
	for _, backend := range []string{"sqlite", "postgres", "mysql"} {
		for _, history := range []bool{true, false} {
			name := backend + "/history"
			if !history {
				name = backend + "/nohistory"
			}
			b.Run(name, func(b *testing.B) {
				db, ob := benchOutbox(b, backend, Config{DisableNotify: true, RetainSent: RetainForever})
				ob.noHistory = !history
				ob.Handle("order.created", func(context.Context, Event) error { return errors.New("503 from the broker") })
				relay, err := ob.Relay(db, RelayConfig{BatchSize: relayCycleBatch,
					Backoff: func(int) time.Duration { return 0 }, MaxAttempts: 1 << 30})
				if err != nil {
					b.Fatal(err)
				}
				events := make([]Event, relayCycleBatch)
				for j := range events {
					events[j] = Event{Type: "order.created", Payload: j}
				}
				if err := PublishAlone(db, events...); err != nil {
					b.Fatal(err)
				}
				ctx := context.Background()
				b.ResetTimer()
				for b.Loop() {
					n, err := relay.ProcessOnce(ctx)
					if err != nil {
						b.Fatal(err)
					}
					if n != relayCycleBatch {
						b.Fatalf("claimed %d, want %d", n, relayCycleBatch)
					}
				}
				b.ReportMetric(float64(relayCycleBatch), "failures/op")
			})
		}
	}
}
