package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/encode"
	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// runSuite runs every semantic of the core on one backend.
func runSuite(t *testing.T, b backend) {
	tests := map[string]func(*testing.T, backend){
		"PersistentInsertsInCallersTransaction": testPersistentInsertsInTx,
		"PersistentOutsideTransaction":          testPersistentOutsideTx,
		"PublishNeedsTransaction":               testPublishNeedsTransaction,
		"DuplicateIdempotencyKeyIsNoop":         testDuplicateKey,
		"PayloadRoundTrip":                      testPayloadRoundTrip,
		"MemoryMode":                            testMemoryMode,
		"MemoryHandlerFailuresAreIsolated":      testMemoryHandlerFailures,
		"AfterCommitOutermostCommit":            testAfterCommit,
		"AfterCommitUntrackedTransaction":       testAfterCommitUntracked,
		"BadInputLosesNothing":                  testBadInput,
		"UnsafeTableName":                       testUnsafeTableName,
		"PublishWithoutPlugin":                  testPublishWithoutPlugin,
		"Recorder":                              testRecorder,
		"RecorderSkipDefaultTransaction":        testRecorderSkipDefaultTx,
		"RelayDeliversAndMarksSent":             testRelayDelivers,
		"RelayRetriesWithBackoffThenFails":      testRelayRetries,
		"RelayPermanentErrorAndReplay":          testRelayPermanentAndReplay,
		"RelayRetryAfterAndAttempt":             testRelayRetryAfterAndAttempt,
		"RelayPanicAndMissingHandler":           testRelayPanicAndNoHandler,
		"RelayConcurrentNoDoubleDelivery":       testRelayConcurrent,
		"RelayReclaimsExpiredLease":             testRelayExpiredLease,
		"RelayStartedUnderALease":               testRelayStartedUnderALease,
		"RelayStopsBeforeLeaseRunsOut":          testRelayLeaseBudget,
		"RelayRunStopsOnCancel":                 testRelayRun,
		"RelayConfigValidation":                 testRelayConfig,
		"DisableAutoMigrate":                    testDisableAutoMigrate,
	}
	if b.sqlite != nil {
		// Only SQLite has these subjects; the other backends do not run
		// them rather than skip them.
		tests["SQLiteInMemoryRefused"] = testSQLiteInMemoryRefused
		tests["SQLiteSettingsWarning"] = testSQLiteSettingsWarning
	}
	for name, fn := range productionTests {
		tests[name] = fn
	}
	for name, fn := range correctnessTests {
		tests[name] = fn
	}
	for name, fn := range adminTests {
		tests[name] = fn
	}
	for name, fn := range hooksTests {
		tests[name] = fn
	}
	for name, fn := range refusalTests {
		tests[name] = fn
	}
	for name, fn := range inboxTests {
		tests[name] = fn
	}
	for name, fn := range overviewTests {
		tests[name] = fn
	}
	for name, fn := range asyncTests {
		tests[name] = fn
	}
	for name, fn := range tests {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			fn(t, b)
		})
	}
}

func ev(typ string, payload any) Event { return Event{Type: typ, Payload: payload} }

func testPersistentInsertsInTx(t *testing.T, b backend) {
	e := b.setup(t)
	ctx := t.Context()
	c := &collector{}
	e.ob.Handle(AnyEvent, c.handle)

	// Committed: the row is written inside the transaction (visible to it
	// before the commit), invisible to others until the commit.
	err := e.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		require.NoError(t, tx.Create(&Order{Total: 1}).Error)
		require.NoError(t, Publish(tx, Event{ID: "committed", Type: "order.created", Payload: map[string]int{"total": 1}}))
		var inside int64
		require.NoError(t, tx.Table(e.ob.Table()).Where("named_id = ?", "committed").Count(&inside).Error)
		if b.logical { // Logical mode's Publish writes a WAL message in the transaction, no row
			assert.EqualValues(t, 0, inside, "Logical mode writes no row in the caller's transaction")
		} else {
			assert.EqualValues(t, 1, inside, "the row must be INSERTed in the caller's transaction, not after commit")
		}
		assert.EqualValues(t, 0, e.count("named_id = ?", "committed"), "an uncommitted row must be invisible to others")
		return nil
	})
	require.NoError(t, err)
	if b.logical { // the event waits in the slot, not in the table, until a relay delivers it
		assert.EqualValues(t, 0, e.count(""), "Logical mode writes no row on commit either")
		assert.Empty(t, c.ids(), "nothing is delivered before a relay runs")
	} else {
		r := e.record("committed")
		assert.Equal(t, StatusPending, r.Status, "a committed row stays pending until a relay delivers it")
		assert.Equal(t, 0, r.Attempts)
		assert.Nil(t, r.SentAt)
	}

	// Rolled back: gone with the business row.
	err = e.db.Transaction(func(tx *gorm.DB) error {
		require.NoError(t, tx.Create(&Order{Total: 2}).Error)
		require.NoError(t, Publish(tx, Event{ID: "rolled-back", Type: "order.created"}))
		return errors.New("business failure")
	})
	require.Error(t, err)
	assert.EqualValues(t, 0, e.count("named_id = ?", "rolled-back"))
	var orders int64
	require.NoError(t, e.db.Model(&Order{}).Count(&orders).Error)
	assert.EqualValues(t, 1, orders)

	// Manual Begin/Rollback, and a savepoint rolled back inside a committed
	// transaction: the database drops the row with its savepoint.
	tx := e.db.Begin()
	require.NoError(t, Publish(tx, Event{ID: "manual-rollback", Type: "x"}))
	require.NoError(t, tx.Rollback().Error)
	err = e.db.Transaction(func(tx *gorm.DB) error {
		require.NoError(t, Publish(tx, Event{ID: "outer", Type: "x"}))
		_ = tx.Transaction(func(tx2 *gorm.DB) error {
			require.NoError(t, Publish(tx2, Event{ID: "inner", Type: "x"}))
			return errors.New("roll back the savepoint")
		})
		return nil
	})
	require.NoError(t, err)
	if b.logical { // the WAL message is decoded only if, and when, its transaction (or savepoint) commits
		require.Equal(t, []string{"committed", "outer"}, e.delivered(t, c), "the committed events, in commit order; nothing rolled back")
		assert.Equal(t, StatusSent, e.record("committed").Status, "an event with an explicit ID gets its row from the relay")
		var p map[string]int
		require.NoError(t, c.events[0].DecodePayload(&p))
		assert.Equal(t, map[string]int{"total": 1}, p)
	}
	assert.EqualValues(t, 0, e.count("named_id IN ?", []string{"manual-rollback", "inner"}))
	assert.EqualValues(t, 1, e.count("named_id = ?", "outer"))
}

// testPublishNeedsTransaction: Publish on a *gorm.DB outside a transaction
// writes nothing, in every mode, and says how to publish alone; in a
// transaction, and through PublishAlone, the events are published.
func testPublishNeedsTransaction(t *testing.T, b backend) {
	for _, mode := range []Mode{Persistent, Memory} {
		t.Run(mode.String(), func(t *testing.T) {
			e := b.setup(t, withConfig(Config{Mode: mode}))
			c := &collector{}
			e.ob.Handle(AnyEvent, c.handle)
			var stored []bool
			e.ob.AddHooks(Hooks{Stored: func(_ context.Context, _ *Event, ok bool) { stored = append(stored, ok) }})
			err := Publish(e.db, Event{ID: "alone", Type: "x"})
			require.ErrorIs(t, err, ErrNoTransaction)
			assert.ErrorContains(t, err, "outbox.PublishAlone", "the error says how to publish alone")
			assert.Empty(t, stored, "refused before the hooks see it")
			require.NoError(t, e.db.Transaction(func(tx *gorm.DB) error { return Publish(tx, Event{ID: "in-tx", Type: "x"}) }))
			require.NoError(t, PublishAlone(e.db, Event{ID: "on-purpose", Type: "x"}))
			if mode == Memory {
				assert.Equal(t, []string{"in-tx", "on-purpose"}, c.ids())
				return
			}
			if b.logical {
				assert.Equal(t, []string{"in-tx", "on-purpose"}, e.delivered(t, c))
				return
			}
			assert.EqualValues(t, 0, e.count("named_id = ?", "alone"))
			assert.EqualValues(t, 2, e.count(""))
		})
	}
}

func testPersistentOutsideTx(t *testing.T, b backend) {
	e := b.setup(t)
	c := &collector{}
	e.ob.Handle(AnyEvent, c.handle)
	require.NoError(t, PublishAlone(e.db.WithContext(t.Context()), ev("a", 1), ev("b", 2)))
	published := e.clock.Now()

	// Defaults: UUIDv7 id, key = id, occurred_at now at microsecond precision.
	var recs []Row
	if b.logical { // Logical mode writes a WAL message, no row: the handler receives what it holds
		assert.EqualValues(t, 0, e.count(""), "events with generated IDs leave no row")
		require.Len(t, e.delivered(t, c), 2)
		assert.EqualValues(t, 0, e.count(""), "nor once delivered")
		for _, d := range c.events { // one worker: commit order, a then b
			recs = append(recs, Row{ID: d.ID, EventType: d.Type, IdempotencyKey: d.IdempotencyKey, OccurredAt: d.OccurredAt})
		}
	} else {
		assert.EqualValues(t, 2, e.count("status = ?", StatusPending))
		require.NoError(t, e.db.Table(e.ob.Table()).Order("event_type").Find(&recs).Error)
	}
	require.Len(t, recs, 2)
	assert.Equal(t, []string{"a", "b"}, []string{recs[0].EventType, recs[1].EventType})
	assert.Len(t, recs[0].ID, 36)
	assert.Equal(t, recs[0].ID, recs[0].IdempotencyKey)
	assert.WithinDuration(t, published, recs[0].OccurredAt, time.Millisecond)
	assert.NotEqual(t, recs[0].ID, recs[1].ID)

	// More events than one INSERT takes (PostgreSQL allows 65535 arguments
	// a statement): chunked, and atomic outside a transaction too.
	many := make([]Event, 2500)
	for i := range many {
		many[i] = Event{Type: "bulk", IdempotencyKey: fmt.Sprint("bulk-", i), Payload: i}
	}
	require.NoError(t, PublishAlone(e.db, many...))
	require.NoError(t, e.db.Transaction(func(tx *gorm.DB) error { return Publish(tx, many[:1500]...) }), "duplicates are skipped")
	bulk := func() int { // the bulk events delivered, each key once
		keys := map[string]int{}
		for _, d := range c.events {
			if d.Type == "bulk" {
				keys[d.IdempotencyKey]++
				assert.Equal(t, 1, keys[d.IdempotencyKey], "key %s delivered twice", d.IdempotencyKey)
			}
		}
		return len(keys)
	}
	if b.logical { // the relay skips the duplicates (first committed wins) and writes a row for each keyed event
		e.delivered(t, c)
		assert.Equal(t, 2500, bulk())
		assert.EqualValues(t, 2500, e.count("event_type = ? AND status = ?", "bulk", StatusSent))
	}
	assert.EqualValues(t, 2500, e.count("event_type = ?", "bulk"))
	for i := range many {
		many[i].IdempotencyKey = fmt.Sprint("other-", i)
	}
	many[2400].Type = ""
	require.ErrorIs(t, PublishAlone(e.db, many...), ErrInvalidEvent)
	if b.logical { // nothing of the rejected call reaches the WAL
		e.delivered(t, c)
		assert.Equal(t, 2500, bulk(), "an invalid event rejects the whole call")
	}
	assert.EqualValues(t, 2500, e.count("event_type = ?", "bulk"), "an invalid event rejects the whole call")
}

func testDuplicateKey(t *testing.T, b backend) {
	e := b.setup(t)
	first := Event{Type: "order.created", IdempotencyKey: "order:1", Payload: "first"}
	require.NoError(t, e.db.Transaction(func(tx *gorm.DB) error {
		require.NoError(t, Publish(tx, first))
		// Same key in the same transaction: skipped, and the transaction
		// (on PostgreSQL especially) is not aborted.
		require.NoError(t, Publish(tx, Event{Type: "order.created", IdempotencyKey: "order:1", Payload: "second"}))
		return tx.Create(&Order{Total: 1}).Error
	}))
	// And across transactions, even after the first was sent.
	c := &collector{}
	e.ob.Handle("order.created", c.handle)
	n, err := e.relay(RelayConfig{}).ProcessOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.NoError(t, e.db.Transaction(func(tx *gorm.DB) error {
		return Publish(tx, Event{Type: "order.created", IdempotencyKey: "order:1", Payload: "third"})
	}))
	assert.EqualValues(t, 1, e.count(""))
	assert.EqualValues(t, 1, e.count("status = ?", StatusSent), "a duplicate must not reset a sent row to pending")
	var got string
	require.NoError(t, c.events[0].DecodePayload(&got))
	assert.Equal(t, "first", got)
}

type orderCreated struct {
	ID    int               `json:"id"`
	Items []string          `json:"items"`
	Meta  map[string]string `json:"meta"`
}

func testPayloadRoundTrip(t *testing.T, b backend) {
	for _, mode := range []Mode{Persistent, Memory} {
		t.Run(mode.String(), func(t *testing.T) {
			e := b.setup(t, withConfig(Config{Mode: mode}))
			c := &collector{}
			e.ob.Handle("*", c.handle)
			occurred := time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.FixedZone("x", 3600))
			in := Event{
				ID: "e1", Type: "order.created", AggregateType: "order", AggregateID: "7",
				IdempotencyKey: "k1", Headers: map[string]string{"traceparent": "00-abc-def-01"},
				Payload: orderCreated{ID: 7, Items: []string{"a", "ü"}, Meta: map[string]string{"k": "v"}}, OccurredAt: occurred,
			}
			raw := Event{ID: "e2", Type: "raw", Payload: json.RawMessage(`{"b":1,"a":[true,null]}`)}
			require.NoError(t, e.db.Transaction(func(tx *gorm.DB) error { return Publish(tx, in, raw) }))
			if mode == Persistent {
				_, err := e.relay(RelayConfig{Workers: 1}).ProcessOnce(t.Context())
				require.NoError(t, err)
			}
			require.Equal(t, []string{"e1", "e2"}, c.ids())
			got := c.events[0]
			assert.IsType(t, json.RawMessage{}, got.Payload, "handlers receive json.RawMessage in both modes")
			var p orderCreated
			require.NoError(t, got.DecodePayload(&p))
			assert.Equal(t, in.Payload, p)
			assert.Equal(t, "order", got.AggregateType)
			assert.Equal(t, "7", got.AggregateID)
			assert.Equal(t, "k1", got.IdempotencyKey)
			assert.Equal(t, in.Headers, got.Headers)
			assert.True(t, occurred.Truncate(time.Microsecond).Equal(got.OccurredAt), "occurred_at kept at microsecond precision: %v", got.OccurredAt)
			assert.Equal(t, time.UTC, got.OccurredAt.Location())
			assert.JSONEq(t, `{"b":1,"a":[true,null]}`, string(c.events[1].Payload.(json.RawMessage)))
		})
	}
}

func testMemoryMode(t *testing.T, b backend) {
	e := b.setup(t, withConfig(Config{Mode: Memory}))
	assert.False(t, e.db.Migrator().HasTable(e.ob.Table()), "memory mode creates no table")

	var mu sync.Mutex
	var order []string
	add := func(s string) {
		mu.Lock()
		order = append(order, s)
		mu.Unlock()
	}
	e.ob.Handle("order.created", func(_ context.Context, ev Event) error { add("typed:" + ev.ID); return nil })
	e.ob.Handle("*", func(_ context.Context, ev Event) error { add("any:" + ev.ID); return nil })

	err := e.db.Transaction(func(tx *gorm.DB) error {
		require.NoError(t, tx.Create(&Order{Total: 1}).Error)
		require.NoError(t, Publish(tx, Event{ID: "m1", Type: "order.created"}))
		require.NoError(t, tx.Create(&Order{Total: 2}).Error)
		mu.Lock()
		assert.Empty(t, order, "nothing is dispatched before the commit")
		mu.Unlock()
		return nil
	})
	require.NoError(t, err)
	// Synchronous: done by the time Transaction returns, in registration order.
	assert.Equal(t, []string{"typed:m1", "any:m1"}, order)

	err = e.db.Transaction(func(tx *gorm.DB) error {
		require.NoError(t, Publish(tx, Event{ID: "m2", Type: "order.created"}))
		return errors.New("rollback")
	})
	require.Error(t, err)
	assert.Len(t, order, 2, "nothing on rollback")

	// Outside a transaction: at once.
	require.NoError(t, PublishAlone(e.db, Event{ID: "m3", Type: "other"}))
	assert.Equal(t, []string{"typed:m1", "any:m1", "any:m3"}, order)
	assert.False(t, e.db.Migrator().HasTable(e.ob.Table()), "memory mode writes no table")

	_, err = e.ob.Replay(e.db, Filter{IDs: []string{"x"}})
	require.ErrorIs(t, err, ErrMemoryMode)
	r, err := e.ob.Relay(e.db, RelayConfig{})
	require.ErrorIs(t, err, ErrMemoryMode)
	assert.Nil(t, r)
}

func testMemoryHandlerFailures(t *testing.T, b backend) {
	e := b.setup(t, withConfig(Config{Mode: Memory}))
	c := &collector{}
	e.ob.Handle("x", func(context.Context, Event) error { return errors.New("boom") })
	e.ob.Handle("x", func(context.Context, Event) error { panic("handler panic") })
	e.ob.Handle("x", c.handle)
	err := e.db.Transaction(func(tx *gorm.DB) error {
		require.NoError(t, tx.Create(&Order{Total: 5}).Error)
		return Publish(tx, ev("x", nil))
	})
	require.NoError(t, err, "a failing handler does not affect the committed transaction")
	assert.Equal(t, 1, c.len(), "nor the other handlers")
	var n int64
	require.NoError(t, e.db.Model(&Order{}).Count(&n).Error)
	assert.EqualValues(t, 1, n)
}

// testAfterCommit checks that after-commit work (AfterCommit and memory-mode
// events) runs on the outermost real commit in every way GORM commits.
func testAfterCommit(t *testing.T, b backend) {
	cases := map[string]struct {
		gorm *gorm.Config
		run  func(t *testing.T, db *gorm.DB, hook func(tx *gorm.DB, name string))
		want []string
	}{
		"Transaction": {
			run: func(t *testing.T, db *gorm.DB, hook func(*gorm.DB, string)) {
				require.NoError(t, db.Transaction(func(tx *gorm.DB) error { hook(tx, "a"); return nil }))
				_ = db.Transaction(func(tx *gorm.DB) error { hook(tx, "rolled-back"); return errors.New("x") })
			},
			want: []string{"a"},
		},
		"ManualBeginCommit": {
			run: func(t *testing.T, db *gorm.DB, hook func(*gorm.DB, string)) {
				tx := db.Begin()
				hook(tx, "a")
				require.NoError(t, tx.Create(&Order{}).Error)
				hook(tx.Session(&gorm.Session{}), "b")
				require.NoError(t, tx.Commit().Error)
				require.ErrorIs(t, tx.Commit().Error, sql.ErrTxDone, "a second commit fails and runs nothing twice")
				tx = db.Begin()
				hook(tx, "rolled-back")
				require.NoError(t, tx.Rollback().Error)
			},
			want: []string{"a", "b"},
		},
		"NestedSavepoints": {
			run: func(t *testing.T, db *gorm.DB, hook func(*gorm.DB, string)) {
				require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
					hook(tx, "outer-1")
					require.NoError(t, tx.Transaction(func(tx2 *gorm.DB) error {
						hook(tx2, "kept-savepoint")
						return nil
					}))
					_ = tx.Transaction(func(tx2 *gorm.DB) error {
						hook(tx2, "dropped-savepoint")
						_ = tx2.Transaction(func(tx3 *gorm.DB) error { hook(tx3, "dropped-nested"); return nil })
						return errors.New("roll back to savepoint")
					})
					hook(tx, "outer-2")
					return nil
				}))
			},
			want: []string{"outer-1", "kept-savepoint", "outer-2"},
		},
		"ManualSavepoint": {
			run: func(t *testing.T, db *gorm.DB, hook func(*gorm.DB, string)) {
				tx := db.Begin()
				hook(tx, "before")
				require.NoError(t, tx.SavePoint("sp1").Error)
				hook(tx, "after-sp1")
				require.NoError(t, tx.RollbackTo("sp1").Error)
				hook(tx, "after-rollback-to")
				require.NoError(t, tx.Commit().Error)
			},
			want: []string{"before", "after-rollback-to"},
		},
		"PrepareStmt": {
			gorm: &gorm.Config{PrepareStmt: true},
			run: func(t *testing.T, db *gorm.DB, hook func(*gorm.DB, string)) {
				require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
					require.NoError(t, tx.Create(&Order{Total: 1}).Error)
					hook(tx, "a")
					_ = tx.Transaction(func(tx2 *gorm.DB) error { hook(tx2, "dropped"); return errors.New("x") })
					return nil
				}))
				tx := db.Begin()
				hook(tx, "manual")
				require.NoError(t, tx.Commit().Error)
			},
			want: []string{"a", "manual"},
		},
		"SessionPrepareStmt": {
			run: func(t *testing.T, db *gorm.DB, hook func(*gorm.DB, string)) {
				s := db.Session(&gorm.Session{PrepareStmt: true})
				require.NoError(t, s.Transaction(func(tx *gorm.DB) error { hook(tx, "a"); return nil }))
			},
			want: []string{"a"},
		},
		"SessionAndWithContextClones": {
			run: func(t *testing.T, db *gorm.DB, hook func(*gorm.DB, string)) {
				require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
					hook(tx.WithContext(context.Background()), "with-context")
					hook(tx.Session(&gorm.Session{NewDB: true}), "session")
					hook(tx.Model(&Order{}).Where("id > ?", 0), "chained")
					return nil
				}))
			},
			want: []string{"with-context", "session", "chained"},
		},
		"OutsideTransactionRunsAtOnce": {
			run: func(t *testing.T, db *gorm.DB, hook func(*gorm.DB, string)) {
				hook(db, "now")
			},
			want: []string{"now"},
		},
		"FailedCommitRunsNothing": {
			run: func(t *testing.T, db *gorm.DB, hook func(*gorm.DB, string)) {
				ctx, cancel := context.WithCancel(context.Background())
				tx := db.WithContext(ctx).Begin()
				require.NoError(t, tx.Error)
				hook(tx, "never")
				cancel() // database/sql rolls the transaction back
				require.Error(t, tx.Commit().Error)
			},
			want: nil,
		},
	}
	for name, tc := range cases {
		for _, mode := range []Mode{Persistent, Memory} {
			t.Run(name+"/"+mode.String(), func(t *testing.T) {
				opts := []func(*setupOpts){withConfig(Config{Mode: mode})}
				if tc.gorm != nil {
					g := *tc.gorm
					opts = append(opts, withGorm(&g))
				}
				e := b.setup(t, opts...)
				var mu sync.Mutex
				var got []string
				hookRan := func(name string) {
					mu.Lock()
					got = append(got, name)
					mu.Unlock()
				}
				var hook func(tx *gorm.DB, name string)
				if mode == Memory {
					// In memory mode the same points are exercised by events.
					e.ob.Handle("*", func(_ context.Context, ev Event) error { hookRan(ev.ID); return nil })
					hook = func(tx *gorm.DB, name string) { require.NoError(t, PublishAlone(tx, Event{ID: name, Type: "t"})) }
				} else {
					hook = func(tx *gorm.DB, name string) { AfterCommit(tx, func() { hookRan(name) }) }
				}
				tc.run(t, e.db, hook)
				assert.Equal(t, tc.want, got)
			})
		}
	}
}

func testAfterCommitUntracked(t *testing.T, b backend) {
	for _, mode := range []Mode{Persistent, Memory} {
		t.Run(mode.String(), func(t *testing.T) {
			e := b.setup(t, withConfig(Config{Mode: mode}))
			c := &collector{}
			e.ob.Handle("x", c.handle)
			ran := false
			err := e.db.Connection(func(conn *gorm.DB) error {
				return conn.Transaction(func(tx *gorm.DB) error {
					AfterCommit(tx, func() { ran = true })
					return tx.Error
				})
			})
			require.ErrorIs(t, err, ErrUntrackedTransaction)
			assert.False(t, ran)

			err = e.db.Connection(func(conn *gorm.DB) error {
				return conn.Transaction(func(tx *gorm.DB) error {
					require.NoError(t, tx.Create(&Order{Total: 9}).Error)
					return Publish(tx, ev("x", 1))
				})
			})
			if mode == Memory {
				require.ErrorIs(t, err, ErrUntrackedTransaction, "memory mode cannot dispatch on a commit it cannot see")
				var n int64
				require.NoError(t, e.db.Model(&Order{}).Count(&n).Error)
				assert.EqualValues(t, 0, n, "and the business write rolled back with it")
			} else {
				require.NoError(t, err, "persistent mode writes in any transaction")
				if b.logical { // a WAL message, no row: the relay delivers the event of the untracked commit
					assert.EqualValues(t, 0, e.count(""))
					assert.Len(t, e.delivered(t, c), 1)
				} else {
					assert.EqualValues(t, 1, e.count(""))
				}
			}
		})
	}
}

func testBadInput(t *testing.T, b backend) {
	e := b.setup(t)
	long := strings.Repeat("x", 256)
	bad := map[string]Event{
		"EmptyType":          {},
		"UnencodablePayload": {Type: "x", Payload: make(chan int)},
		"InvalidJSONBytes":   {Type: "x", Payload: []byte(`{"a":`)},
		"InvalidUTF8Bytes":   {Type: "x", Payload: []byte("\"\xff\"")},
		"NULInPayload":       {Type: "x", Payload: "a\x00b"},
		"InvalidUTF8String":  {Type: "x", Payload: "a\xffb"},
		"InvalidUTF8MapKey":  {Type: "x", Payload: map[string]int{"\xfe": 1}},
		"InvalidUTF8Field":   {Type: "x", Payload: struct{ Name *string }{Name: ptr("\xc3")}},
		"InvalidUTF8Marshal": {Type: "x", Payload: rawMarshaler("\"\xff\"")},
		"TooDeepForDecoder":  {Type: "x", Payload: json.RawMessage(strings.Repeat("[", 10001) + strings.Repeat("]", 10001))},
		"NULEscapeInRaw":     {Type: "x", Payload: json.RawMessage(`{"a":"\u0000"}`)},
		"LongType":           {Type: long},
		"LongID":             {Type: "x", ID: long},
		"LongAggregateID":    {Type: "x", AggregateID: long},
		"LongKey":            {Type: "x", IdempotencyKey: long},
		"InvalidUTF8Type":    {Type: "\xff"},
		"NULInAggregate":     {Type: "x", AggregateType: "a\x00"},
		"EmptyHeaderName":    {Type: "x", Headers: map[string]string{"": "v"}},
		"BadHeaderValue":     {Type: "x", Headers: map[string]string{"k": "\xff"}},
		"OversizedPayload":   {Type: "x", Payload: strings.Repeat("y", encode.DefaultMaxPayload)},
		"LoneHighSurrogate":  {Type: "x", Payload: json.RawMessage(`{"a":"\ud800"}`)},
		"LoneLowSurrogate":   {Type: "x", Payload: json.RawMessage(`["\uDC00"]`)},
		"ReversedSurrogates": {Type: "x", Payload: json.RawMessage(`"\udc00\ud800"`)},
		"NumberTooLarge":     {Type: "x", Payload: json.RawMessage(`{"n":1e131072}`)},
		"NumberTooPrecise":   {Type: "x", Payload: json.RawMessage(`[1.5e-16383]`)},
		"HugeExponentZero":   {Type: "x", Payload: json.RawMessage(`0e2147483647`)},
		"NumberViaMarshal":   {Type: "x", Payload: map[string]json.Number{"n": "1e200000"}},
		"YearAfter9999":      {Type: "x", OccurredAt: time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC)},
		"YearBefore1":        {Type: "x", OccurredAt: time.Date(0, 12, 31, 0, 0, 0, 0, time.UTC)},
	}
	for name, bev := range bad {
		t.Run(name, func(t *testing.T) {
			err := e.db.Transaction(func(tx *gorm.DB) error {
				require.NoError(t, tx.Create(&Order{Total: 1}).Error)
				// A valid event first: the invalid one in the same call must
				// reject the whole call.
				perr := Publish(tx, ev("ok", 1), bev)
				require.ErrorIs(t, perr, ErrInvalidEvent)
				// Nothing touched the database: the transaction still works.
				require.NoError(t, tx.Create(&Order{Total: 2}).Error)
				require.NoError(t, Publish(tx, Event{Type: "after", IdempotencyKey: "after-" + name}))
				return perr
			})
			require.ErrorIs(t, err, ErrInvalidEvent)
			assert.NotContains(t, err.Error(), strings.Repeat("y", 100), "errors never carry payloads")
		})
	}
	assert.EqualValues(t, 0, e.count(""), "every rejected transaction rolled back whole")
	var n int64
	require.NoError(t, e.db.Model(&Order{}).Count(&n).Error)
	assert.EqualValues(t, 0, n)

	// What PostgreSQL does store is accepted, on every database alike: an
	// escaped backslash before u0000 (not a NUL escape), a proper surrogate
	// pair, numbers at numeric's limits, the extreme years.
	for _, ok := range []Event{
		{Type: "x", Payload: json.RawMessage(`"\\u0000"`)},
		{Type: "x", Payload: json.RawMessage(`"\ud83d\ude00"`)},
		{Type: "x", Payload: json.RawMessage(`[1e131071, 0.1e131072, 1e-16383, 0e200000, -0.00012e131075]`)},
		{Type: "x", OccurredAt: time.Date(9999, 12, 31, 23, 59, 59, 999999000, time.UTC)},
		{Type: "x", OccurredAt: time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)},
	} {
		require.NoError(t, PublishAlone(e.db, ok))
	}
}

func testUnsafeTableName(t *testing.T, b backend) {
	for _, name := range []string{`x"; DROP TABLE orders; --`, "1abc", "a b", "a.b", strings.Repeat("a", 41), "ta-ble", "sqlite_x", "SQLite", "é"} {
		db := b.open(t, &gorm.Config{})
		err := db.Use(Plugin(Config{Table: name}))
		require.ErrorIs(t, err, ErrInvalidConfig, name)
		// The error names the rule the name breaks, and SQLite only
		// where its reserved prefix is the reason.
		reserved := strings.HasPrefix(strings.ToLower(name), "sqlite")
		rule := strings.ReplaceAll(err.Error(), fmt.Sprintf("%q", name), "")
		assert.Equal(t, reserved, strings.Contains(rule, "sqlite"), "%s: %v", name, err)
	}
	// Keywords, capitals and the longest name work: every statement quotes
	// the name.
	for _, name := range []string{"custom_outbox", "order", "MyOutbox", strings.Repeat("t", 40)} {
		e := b.setup(t, withConfig(Config{Table: name}))
		// A generated event and one with a key of its own, of an aggregate:
		// the claim, ordering and outcome statements (in Logical mode the
		// relay's own INSERT) all run on the table.
		require.NoError(t, PublishAlone(e.db, ev("x", 1), Event{Type: "x", IdempotencyKey: "k", AggregateType: "a", AggregateID: "1"}), name)
		if b.logical { // a WAL message, no row until the relay writes the keyed event's
			assert.EqualValues(t, 0, e.count(""), name)
		} else {
			assert.EqualValues(t, 2, e.count(""), name)
		}
		e.ob.Handle("x", func(context.Context, Event) error { return nil })
		n, err := e.relay(RelayConfig{OrderByAggregate: true}).ProcessOnce(t.Context())
		require.NoError(t, err, name)
		assert.Equal(t, 2, n, name)
		if b.logical { // the generated event leaves no row
			assert.EqualValues(t, 1, e.count("status = ? AND idempotency_key = ?", StatusSent, "k"), name)
			assert.EqualValues(t, 1, e.count(""), name)
		} else {
			assert.EqualValues(t, 2, e.count("status = ?", StatusSent), name)
		}
	}
}

func testPublishWithoutPlugin(t *testing.T, b backend) {
	db := b.open(t, &gorm.Config{})
	require.ErrorIs(t, PublishAlone(db, ev("x", 1)), ErrNotInstalled)
	require.ErrorIs(t, db.Transaction(func(tx *gorm.DB) error { return Publish(tx, ev("x", 1)) }), ErrNotInstalled)
	require.ErrorIs(t, Publish(nil, ev("x", 1)), ErrNotInstalled)
}

func testDisableAutoMigrate(t *testing.T, b backend) {
	db := b.open(t, &gorm.Config{})
	ob := Plugin(Config{DisableAutoMigrate: true})
	require.NoError(t, db.Use(ob))
	assert.False(t, db.Migrator().HasTable(DefaultTable))
	ddl, err := SchemaSQL(b.name, DefaultTable)
	require.NoError(t, err)
	// One statement at a time: MySQL runs one per Exec.
	stmts, err := store.SplitDDL(ddl)
	require.NoError(t, err)
	for _, st := range stmts {
		require.NoError(t, db.Exec(st.SQL).Error)
	}
	assert.True(t, db.Migrator().HasTable(DefaultInboxTable), "SchemaSQL creates the inbox too")
	require.NoError(t, PublishAlone(db, ev("x", 1)))
	// Running the shipped DDL twice is harmless.
	require.NoError(t, ob.Migrate(db.WithContext(t.Context())))
}

// testSQLiteInMemoryRefused runs on the SQLite backends only.
func testSQLiteInMemoryRefused(t *testing.T, b backend) {
	open := func() *gorm.DB {
		db, err := gorm.Open(b.sqlite.open(":memory:"), &gorm.Config{Logger: logger.Discard})
		require.NoError(t, err)
		sqlDB, err := db.DB()
		require.NoError(t, err)
		t.Cleanup(func() { _ = sqlDB.Close() })
		return db
	}
	require.ErrorIs(t, open().Use(Plugin(Config{})), ErrInvalidConfig, "persistent mode on a pooled in-memory database")
	require.NoError(t, open().Use(Plugin(Config{Mode: Memory})), "memory mode keeps no table: fine")

	one := open()
	sqlDB, err := one.DB()
	require.NoError(t, err)
	sqlDB.SetMaxOpenConns(1)
	require.NoError(t, one.Use(Plugin(Config{})), "a single connection is a single database")
}

func TestEventHelpers(t *testing.T) {
	// The headers an event becomes on a broker are package wire's; see its
	// tests.
	e := Event{ID: "1", Type: "t", Payload: map[string]int{"a": 1}}
	b, err := e.PayloadJSON()
	require.NoError(t, err)
	assert.JSONEq(t, `{"a":1}`, string(b))
	e.Payload = json.RawMessage(`[1`)
	_, err = e.PayloadJSON()
	require.ErrorIs(t, err, ErrInvalidEvent)
	var v any
	require.ErrorIs(t, e.DecodePayload(&v), ErrInvalidEvent)
	e.Payload = nil
	require.NoError(t, e.DecodePayload(&v))
	assert.Nil(t, v)
}

// testSQLiteSettingsWarning runs on the SQLite backends only.
func testSQLiteSettingsWarning(t *testing.T, b backend) {
	install := func(dsn string) string {
		db, err := gorm.Open(b.sqlite.open("file:"+filepath.Join(t.TempDir(), "w.db")+dsn), &gorm.Config{Logger: logger.Discard})
		require.NoError(t, err)
		sqlDB, err := db.DB()
		require.NoError(t, err)
		t.Cleanup(func() { _ = sqlDB.Close() })
		var logs strings.Builder
		require.NoError(t, db.Use(Plugin(Config{Logger: slog.New(slog.NewTextHandler(&logs, nil))})))
		return logs.String()
	}
	got := install("")
	assert.Contains(t, got, "database is locked")
	assert.Contains(t, got, "WAL")
	assert.Contains(t, got, "_txlock=immediate")
	// The advice is spelled for the driver in use (the pure-Go driver
	// ignores the cgo driver's _journal_mode=WAL): following it silences
	// the warning.
	advice := regexp.MustCompile(`Add (\?\S+) to the DSN`).FindStringSubmatch(got)
	require.Len(t, advice, 2, "the warning names a DSN suffix: %s", got)
	assert.Empty(t, install(advice[1]), "no warning once the advice %s is followed", advice[1])
	assert.Empty(t, install(b.sqlite.settings), "no warning with the recommended settings")
}

// renamedDialector is SQLite under a name the outbox has no dialect for, as
// any other GORM driver would be.
type renamedDialector struct{ gorm.Dialector }

func (renamedDialector) Name() string { return "otherdb" }

// TestMemoryModeAnyDriver: memory mode runs no SQL of its own, so it works on
// a database the outbox has no dialect for; persistent mode refuses it.
func TestMemoryModeAnyDriver(t *testing.T) {
	t.Parallel()
	open := func() *gorm.DB {
		db, err := gorm.Open(renamedDialector{sqlite.Open(filepath.Join(t.TempDir(), "other.db"))}, &gorm.Config{Logger: logger.Discard})
		require.NoError(t, err)
		t.Cleanup(func() {
			if sqlDB, err := db.DB(); err == nil {
				_ = sqlDB.Close()
			}
		})
		return db
	}
	db := open()
	err := db.Use(Plugin(Config{}))
	require.ErrorIs(t, err, ErrUnsupportedDialect)
	assert.ErrorContains(t, err, "otherdb")

	db = open()
	ob := Plugin(Config{Mode: Memory})
	require.NoError(t, db.Use(ob))
	c := &collector{}
	ob.Handle("x", c.handle)
	require.NoError(t, db.AutoMigrate(&Order{}))
	require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
		order := Order{Total: 1}
		order.Record(Event{ID: "recorded", Type: "x"})
		if err := tx.Create(&order).Error; err != nil {
			return err
		}
		return Publish(tx, Event{ID: "published", Type: "x"})
	}))
	assert.Equal(t, []string{"recorded", "published"}, c.ids())
	_, err = ob.Stats(db.WithContext(t.Context()))
	assert.ErrorIs(t, err, ErrMemoryMode)
}
