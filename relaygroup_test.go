package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

func TestGateIsFIFO(t *testing.T) {
	g := newGate(1)
	require.NoError(t, g.acquire(t.Context()))
	var order []int
	var mu sync.Mutex
	var wg sync.WaitGroup
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			require.NoError(t, g.acquire(t.Context()))
			mu.Lock()
			order = append(order, i)
			mu.Unlock()
			g.release()
		}()
		// Each waiter queued before the next starts.
		require.Eventually(t, func() bool { g.mu.Lock(); defer g.mu.Unlock(); return len(g.waiting) == i+1 }, time.Second, time.Millisecond)
	}
	g.release()
	wg.Wait()
	assert.Equal(t, []int{0, 1, 2}, order, "turns in the order asked")

	// A waiter whose context ends leaves the line; a turn granted to it
	// meanwhile passes on.
	require.NoError(t, g.acquire(t.Context()))
	ctx, cancel := context.WithCancel(t.Context())
	errc := make(chan error, 1)
	go func() { errc <- g.acquire(ctx) }()
	require.Eventually(t, func() bool { g.mu.Lock(); defer g.mu.Unlock(); return len(g.waiting) == 1 }, time.Second, time.Millisecond)
	cancel()
	require.ErrorIs(t, <-errc, context.Canceled)
	g.release()
	require.NoError(t, g.acquire(t.Context()), "the turn is free again")
	g.release()
	assert.Equal(t, 1, g.free)
}

// groupEnv is one Outbox installed on n databases of one backend.
type groupEnv struct {
	ob  *Outbox
	dbs []*gorm.DB
}

func newGroupEnv(t *testing.T, b backend, n int) *groupEnv {
	t.Helper()
	e := &groupEnv{ob: Plugin(Config{Logger: slog.New(slog.DiscardHandler)})}
	for range n {
		db := b.open(t, &gorm.Config{Logger: logger.Discard})
		require.NoError(t, db.Use(e.ob))
		e.dbs = append(e.dbs, db)
	}
	return e
}

func (e *groupEnv) publish(t *testing.T, i, n int, prefix string) {
	t.Helper()
	evs := make([]Event, n)
	for j := range evs {
		evs[j] = Event{ID: fmt.Sprintf("%s-%d-%d", prefix, i, j), Type: prefix}
	}
	for off := 0; off < n; off += 500 {
		require.NoError(t, e.dbs[i].Transaction(func(tx *gorm.DB) error { return Publish(tx, evs[off:min(off+500, n)]...) }))
	}
}

func runGroup(t *testing.T, g *RelayGroup) {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- g.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
	})
}

// TestRelayGroup: one group delivers the events of every database in it,
// added before Run and while it runs; Stats are per database; a database
// removed is no longer served; names are unique.
func TestRelayGroup(t *testing.T) {
	t.Parallel()
	for _, b := range []backend{sqliteBackend, postgresBackend(t), mysqlBackend(t)} {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			e := newGroupEnv(t, b, 3)
			var delivered sync.Map
			e.ob.Handle(AnyEvent, func(_ context.Context, ev Event) error { delivered.Store(ev.ID, true); return nil })
			g, err := e.ob.RelayGroup(RelayGroupConfig{MaxActive: 1, Relay: RelayConfig{PollInterval: 20 * time.Millisecond}})
			require.NoError(t, err)
			require.NoError(t, g.Add("t0", e.dbs[0]))
			require.NoError(t, g.Add("t1", e.dbs[1]))
			require.ErrorIs(t, g.Add("t1", e.dbs[2]), ErrInvalidConfig, "a name twice")
			runGroup(t, g)
			require.NoError(t, g.Add("t2", e.dbs[2]), "while it runs")
			assert.Equal(t, []string{"t0", "t1", "t2"}, g.Names())

			for i := range 3 {
				e.publish(t, i, 5, "x")
			}
			require.Eventually(t, func() bool {
				n := 0
				delivered.Range(func(any, any) bool { n++; return true })
				return n == 15
			}, 10*time.Second, 10*time.Millisecond)
			// A handler's return comes before its batch is marked sent:
			// the marks are waited for, not assumed.
			for i := range 3 {
				require.Eventually(t, func() bool {
					st, err := e.ob.Stats(e.dbs[i])
					require.NoError(t, err)
					return st.Pending == 0 && sentRows(t, e.dbs[i], e.ob) == 5
				}, 10*time.Second, 10*time.Millisecond, "database %d: every event marked sent, none pending", i)
			}

			require.True(t, g.Remove("t2"))
			assert.False(t, g.Remove("t2"))
			e.publish(t, 2, 1, "after-remove")
			e.publish(t, 0, 1, "after-remove")
			require.Eventually(t, func() bool { _, ok := delivered.Load("after-remove-0-0"); return ok }, 10*time.Second, 10*time.Millisecond)
			st, err := e.ob.Stats(e.dbs[2])
			require.NoError(t, err)
			assert.EqualValues(t, 1, st.Pending, "a removed database is not served")
		})
	}
}

// TestRelayGroupIsFair: one database with a backlog and one with a single
// event, one turn at a time: the single event is delivered while the
// backlog is still almost whole, and never more than MaxActive batches run
// at once.
func TestRelayGroupIsFair(t *testing.T) {
	t.Parallel()
	for _, b := range []backend{sqliteBackend, postgresBackend(t)} {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			const backlog, batch = 1000, 10
			e := newGroupEnv(t, b, 4)
			var busyDone, inFlight, maxInFlight atomic.Int64
			quiet := make(chan int64, 1)
			e.ob.Handle("busy", func(context.Context, Event) error {
				defer inFlight.Add(-1)
				if n := inFlight.Add(1); n > maxInFlight.Load() {
					maxInFlight.Store(n)
				}
				time.Sleep(time.Millisecond) // a destination's work, not synchronisation
				busyDone.Add(1)
				return nil
			})
			e.ob.Handle("quiet", func(context.Context, Event) error { quiet <- busyDone.Load(); return nil })
			for i := range 3 {
				e.publish(t, i, backlog, "busy")
			}
			g, err := e.ob.RelayGroup(RelayGroupConfig{MaxActive: 1, Relay: RelayConfig{BatchSize: batch, Workers: 2, PollInterval: 20 * time.Millisecond}})
			require.NoError(t, err)
			for i, db := range e.dbs {
				require.NoError(t, g.Add(fmt.Sprint("t", i), db))
			}
			runGroup(t, g)
			require.Eventually(t, func() bool { return busyDone.Load() >= 3*batch }, 10*time.Second, time.Millisecond, "the backlogs are being drained")

			e.publish(t, 3, 1, "quiet")
			var doneThen int64
			select {
			case doneThen = <-quiet:
			case <-time.After(10 * time.Second):
				t.Fatal("the quiet database's event was not delivered")
			}
			// FIFO turns: it waited for the batches already in line (one
			// per busy database), not for the backlogs.
			assert.Less(t, doneThen, int64(3*backlog/2), "delivered while the backlogs were still large (%d of %d done)", doneThen, 3*backlog)
			assert.LessOrEqual(t, maxInFlight.Load(), int64(2), "MaxActive 1 × Workers 2")
		})
	}
}
