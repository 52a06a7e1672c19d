package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// hooksTests run on every backend, in both modes.
var hooksTests = map[string]func(*testing.T, backend){
	"HooksPublishDeliverDelivered": testHooks,
	"HooksNoHandlerAndPanic":       testHooksNoHandler,
	"HooksKeepGeneratedEvents":     testHooksKeepGenerated,
	"HooksStored":                  testHooksStored,
	"HooksStoredAfterPanic":        testHooksStoredAfterPanic,
}

// panicMarshaler is a payload whose encoding panics.
type panicMarshaler struct{}

func (panicMarshaler) MarshalJSON() ([]byte, error) { panic("marshal bug") }

// testHooksStoredAfterPanic: a Publish hook that panics ends Publish, and
// the events the hooks saw still reach Stored, unstored, so that state a
// hook keeps per event is dropped. A dry run in memory mode dispatches
// nothing, as GORM runs nothing.
func testHooksStoredAfterPanic(t *testing.T, b backend) {
	e := b.setup(t, withConfig(Config{Mode: Memory}))
	var (
		seen    int
		outcome []bool
	)
	e.ob.AddHooks(Hooks{
		Publish: func(_ context.Context, ev *Event) {
			if seen++; seen == 2 {
				panic("hook bug")
			}
		},
		Stored: func(_ context.Context, _ *Event, stored bool) { outcome = append(outcome, stored) },
	})
	c := &collector{}
	e.ob.Handle("x", c.handle)
	require.PanicsWithValue(t, "hook bug", func() { _ = PublishAlone(e.db, Event{Type: "x"}, Event{Type: "x"}) })
	assert.Equal(t, []bool{false, false}, outcome, "both events the hooks saw, neither stored")

	// A panic after the hooks, while the payload is encoded.
	outcome = nil
	require.PanicsWithValue(t, "marshal bug", func() { _ = PublishAlone(e.db, Event{Type: "x", Payload: panicMarshaler{}}) })
	assert.Equal(t, []bool{false}, outcome, "an event a panic kept from being stored is not stored")

	outcome = nil
	require.NoError(t, PublishAlone(e.db.Session(&gorm.Session{DryRun: true}), Event{Type: "x"}))
	assert.Equal(t, []bool{false}, outcome)
	assert.Zero(t, c.len(), "a dry run dispatches nothing")
}

// insertRecorder wraps a store to keep what Publish asks it to insert:
// whether each row's ID and key were generated, which decides whether its
// INSERT may conflict (sqlbuild's TestInsertRowsShape checks the clause).
type insertRecorder struct {
	store.Store
	mu        sync.Mutex
	generated [][]bool
}

func (d *insertRecorder) Insert(ctx context.Context, db store.DB, rows []store.Event, now time.Time, seqs bool) (store.Inserted, error) {
	gen := make([]bool, len(rows))
	for i := range rows {
		gen[i] = rows[i].Generated
	}
	d.mu.Lock()
	d.generated = append(d.generated, gen)
	d.mu.Unlock()
	return d.Store.Insert(ctx, db, rows, now, seqs)
}

// testHooksKeepGenerated: a Publish hook (tracing adds a header to every
// event) sees the event's ID before it is stored, and must not make an
// event whose ID and key the outbox generated look named by the caller:
// Persistent mode still inserts it without the conflict clause, and
// Logical mode, which checks named events against the table, writes no
// row for it.
func testHooksKeepGenerated(t *testing.T, b backend) {
	e := b.setup(t)
	var seen []string
	e.ob.AddHooks(Hooks{Publish: func(_ context.Context, ev *Event) {
		seen = append(seen, ev.ID)
		ev.Headers = map[string]string{"traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"}
	}})
	if b.logical {
		c := &collector{}
		e.ob.Handle("x", c.handle)
		require.NoError(t, PublishAlone(e.db, Event{Type: "x"}, Event{Type: "x"}))
		drain(t, e.relay(RelayConfig{Workers: 1})) // one worker: delivery order is commit order
		assert.Equal(t, seen, c.ids(), "the hook saw the IDs delivered")
		assert.EqualValues(t, 0, e.count(""), "generated events delivered from the stream leave no row")
		return
	}
	rec := &insertRecorder{Store: e.ob.store}
	e.ob.store = rec
	require.NoError(t, PublishAlone(e.db, Event{Type: "x"}))
	require.NoError(t, PublishAlone(e.db, Event{Type: "x", IdempotencyKey: "named"}))
	require.Len(t, rec.generated, 2)
	assert.Equal(t, []bool{true}, rec.generated[0], "a generated event stays generated (its INSERT cannot conflict), hook or not")
	assert.Equal(t, []bool{false}, rec.generated[1], "a named event does not")
	assert.EqualValues(t, 1, e.count(e.ob.store.IDColumn()+" = ?", seen[0]), "stored under the ID the hook saw")
	assert.EqualValues(t, 1, e.count(e.ob.store.IDColumn()+" = ? AND headers IS NOT NULL", seen[0]), "with the hook's header")
}

// testHooksStored: the Stored hook learns which events Publish wrote, with
// the pointer the Publish hook got; refused events, and in Persistent mode
// duplicates, are not stored.
func testHooksStored(t *testing.T, b backend) {
	for _, mode := range []Mode{Persistent, Memory} {
		t.Run(mode.String(), func(t *testing.T) {
			e := b.setup(t, withConfig(Config{Mode: mode}))
			var (
				mu      sync.Mutex
				handed  = map[*Event]string{}
				outcome = map[string]bool{}
				strays  int
			)
			e.ob.AddHooks(Hooks{
				Publish: func(_ context.Context, ev *Event) {
					mu.Lock()
					defer mu.Unlock()
					handed[ev] = ev.Headers["n"]
				},
				Stored: func(_ context.Context, ev *Event, stored bool) {
					mu.Lock()
					defer mu.Unlock()
					n, ok := handed[ev]
					if !ok {
						strays++
						return
					}
					delete(handed, ev)
					outcome[n] = stored
				},
			})
			e.ob.Handle(AnyEvent, func(context.Context, Event) error { return nil })
			n := func(name string, ev Event) Event { ev.Headers = map[string]string{"n": name}; return ev }
			require.NoError(t, PublishAlone(e.db, n("new", Event{Type: "x"})))
			require.NoError(t, PublishAlone(e.db, n("first", Event{Type: "x", IdempotencyKey: "k"})))
			require.NoError(t, PublishAlone(e.db, n("fresh", Event{Type: "x"}), n("dup", Event{Type: "x", IdempotencyKey: "k"})))
			require.NoError(t, PublishAlone(e.db, n("twin-a", Event{ID: "twin", Type: "x"}), n("twin-b", Event{ID: "twin", Type: "x"})))
			require.Error(t, PublishAlone(e.db, n("ok-but-refused-with", Event{Type: "x"}), n("invalid", Event{})))
			require.NoError(t, PublishAlone(e.db.Session(&gorm.Session{DryRun: true}), n("dry", Event{Type: "x"})))
			if mode == Persistent && !b.logical {
				require.NoError(t, PublishAlone(e.db, n("named", Event{ID: "taken", Type: "x"})))
				err := PublishAlone(e.db, n("conflict", Event{ID: "taken", Type: "x", IdempotencyKey: "other"}))
				require.ErrorIs(t, err, ErrIDConflict)
				require.ErrorIs(t, err, ErrInvalidEvent)
			}

			mu.Lock()
			defer mu.Unlock()
			assert.Zero(t, strays, "Stored got a pointer the Publish hook never saw")
			assert.Empty(t, handed, "every event the Publish hook saw reaches Stored")
			want := map[string]bool{"new": true, "first": true, "fresh": true, "ok-but-refused-with": false, "invalid": false, "twin-a": true, "twin-b": true}
			switch {
			case mode == Memory:
				want["dry"] = false
				want["dup"] = true // told apart at dispatch
			case b.logical:
				want["dry"] = false
				want["dup"] = true // told apart by the relay
			default:
				want["dry"] = false
				want["dup"] = false
				want["twin-b"] = false // the same event twice in one call: written once
				want["named"] = true
				want["conflict"] = false
			}
			assert.Equal(t, want, outcome)
		})
	}
}

type ctxKey struct{}

// hookRecorder is a set of hooks that records what they saw.
type hookRecorder struct {
	mu        sync.Mutex
	published []string          // event IDs the Publish hook saw
	ctxValues []any             // the ctx value the Publish hook saw
	attempts  []int             // Attempt(ctx) in the Deliver hook
	outerErrs []error           // what next returned to the Deliver hook
	delivered []Delivery        // what Delivered got
	order     []string          // the order hooks ran in
	handled   map[string]string // event ID -> header "hooked" the handler saw
}

func (h *hookRecorder) hooks(name string) Hooks {
	return Hooks{
		Publish: func(ctx context.Context, e *Event) {
			h.mu.Lock()
			defer h.mu.Unlock()
			h.order = append(h.order, "publish:"+name)
			if name != "outer" {
				return
			}
			h.published = append(h.published, e.ID)
			h.ctxValues = append(h.ctxValues, ctx.Value(ctxKey{}))
			if e.Headers == nil {
				e.Headers = map[string]string{}
			}
			e.Headers["hooked"] = "at-publish"
		},
		Deliver: func(next Handler) Handler {
			return func(ctx context.Context, e Event) error {
				h.mu.Lock()
				h.order = append(h.order, "deliver:"+name)
				h.mu.Unlock()
				if name == "outer" {
					e.Headers["hooked"] = "at-delivery"
				}
				err := next(ctx, e)
				if name == "outer" {
					h.mu.Lock()
					h.attempts = append(h.attempts, Attempt(ctx))
					h.outerErrs = append(h.outerErrs, err)
					h.mu.Unlock()
				}
				return err
			}
		},
		Delivered: func(d Delivery) {
			if name != "outer" {
				return
			}
			h.mu.Lock()
			h.delivered = append(h.delivered, d)
			h.mu.Unlock()
		},
	}
}

func testHooks(t *testing.T, b backend) {
	for _, mode := range []Mode{Persistent, Memory} {
		t.Run(mode.String(), func(t *testing.T) {
			e := b.setup(t, withConfig(Config{Mode: mode}))
			h := &hookRecorder{handled: map[string]string{}}
			e.ob.AddHooks(h.hooks("outer"))
			e.ob.AddHooks(h.hooks("inner"))
			fail := errors.New("broker down")
			e.ob.Handle("*", func(_ context.Context, ev Event) error {
				h.mu.Lock()
				h.handled[ev.ID] = ev.Headers["hooked"]
				h.mu.Unlock()
				if ev.Type == "bad" {
					return fail
				}
				return nil
			})
			caller := map[string]string{"keep": "me"}
			ctx := context.WithValue(t.Context(), ctxKey{}, "request")
			require.NoError(t, e.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
				return Publish(tx, Event{Type: "good", Headers: caller}, Event{ID: "b1", Type: "bad"})
			}))
			// The Recorder's harvest goes through Publish too.
			o := Order{Total: 1}
			o.Record(Event{ID: "r1", Type: "good"})
			require.NoError(t, e.db.WithContext(ctx).Create(&o).Error)
			if mode == Persistent {
				_, err := e.relay(RelayConfig{Workers: 1}).ProcessOnce(t.Context())
				require.NoError(t, err)
			}

			h.mu.Lock()
			defer h.mu.Unlock()
			assert.Equal(t, map[string]string{"keep": "me"}, caller, "the caller's headers map is not changed")
			require.Len(t, h.published, 3)
			assert.NotEmpty(t, h.published[0], "the hook sees the ID that is stored")
			assert.Equal(t, []string{"b1", "r1"}, h.published[1:])
			assert.Equal(t, []any{"request", "request", "request"}, h.ctxValues, "Publish hooks get the statement's context")
			assert.Equal(t, "publish:outer", h.order[0])
			assert.Equal(t, "publish:inner", h.order[1])
			assert.Contains(t, h.order, "deliver:outer")
			i := indexOf(h.order, "deliver:outer")
			assert.Equal(t, "deliver:inner", h.order[i+1], "the first hook added wraps the later ones")

			if mode == Persistent && !b.logical { // Logical mode writes no row for it
				var got Row
				require.NoError(t, e.db.Table(e.ob.Table()).Where(e.ob.store.IDColumn()+" = ?", h.published[0]).Take(&got).Error)
				require.NotNil(t, got.Headers)
				var stored map[string]string
				require.NoError(t, json.Unmarshal([]byte(*got.Headers), &stored))
				assert.Equal(t, map[string]string{"keep": "me", "hooked": "at-publish"}, stored, "a Publish hook's header is stored")
			}
			assert.Equal(t, map[string]string{h.published[0]: "at-delivery", "b1": "at-delivery", "r1": "at-delivery"}, h.handled,
				"handlers see the headers the Deliver hook set")

			wantAttempt := 0
			if mode == Persistent {
				wantAttempt = 1
			}
			assert.Equal(t, []int{wantAttempt, wantAttempt, wantAttempt}, h.attempts)
			require.Len(t, h.delivered, 3)
			byID := map[string]Delivery{}
			for _, d := range h.delivered {
				byID[d.Event.ID] = d
			}
			assert.Equal(t, StatusSent, byID[h.published[0]].Status)
			assert.NoError(t, byID[h.published[0]].Err)
			bad := byID["b1"]
			assert.ErrorIs(t, bad.Err, fail)
			assert.Equal(t, wantAttempt, bad.Attempt)
			if mode == Persistent {
				assert.Equal(t, StatusPending, bad.Status, "a retry is scheduled")
			} else {
				assert.Equal(t, StatusFailed, bad.Status, "memory mode does not retry")
			}
			if mode == Memory { // the relay's Latency is by the test's fake clock
				assert.GreaterOrEqual(t, bad.Latency, bad.Duration)
			}
		})
	}
}

func testHooksNoHandler(t *testing.T, b backend) {
	for _, mode := range []Mode{Persistent, Memory} {
		t.Run(mode.String(), func(t *testing.T) {
			e := b.setup(t, withConfig(Config{Mode: mode}))
			var (
				mu   sync.Mutex
				errs = map[string]error{}
				ds   = map[string]Delivery{}
			)
			e.ob.AddHooks(Hooks{
				Deliver: func(next Handler) Handler {
					return func(ctx context.Context, ev Event) error {
						err := next(ctx, ev)
						mu.Lock()
						errs[ev.Type] = err
						mu.Unlock()
						return err
					}
				},
				Delivered: func(d Delivery) { mu.Lock(); ds[d.Event.Type] = d; mu.Unlock() },
			})
			e.ob.Handle("panics", func(context.Context, Event) error { panic("boom") })
			require.NoError(t, e.db.Transaction(func(tx *gorm.DB) error {
				return Publish(tx, Event{Type: "orphan"}, Event{Type: "panics"})
			}))
			if mode == Persistent {
				_, err := e.relay(RelayConfig{Workers: 1}).ProcessOnce(t.Context())
				require.NoError(t, err)
			}
			mu.Lock()
			defer mu.Unlock()
			assert.ErrorIs(t, errs["orphan"], ErrNoHandler, "next reports that no handler matched")
			assert.ErrorIs(t, ds["orphan"].Err, ErrNoHandler)
			assert.ErrorIs(t, errs["panics"], errHandlerPanic, "a handler's panic reaches the hook as an error")
			assert.ErrorIs(t, ds["panics"].Err, errHandlerPanic)
			if mode == Persistent {
				assert.Equal(t, int64(2), e.count("status = ? AND last_error IS NOT NULL", StatusPending))
			}
		})
	}
}

func indexOf(s []string, v string) int {
	for i := range s {
		if s[i] == v {
			return i
		}
	}
	return -1
}
