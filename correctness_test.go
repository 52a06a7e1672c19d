package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	mysqlstore "github.com/gorm-outbox/outbox/internal/store/mysql"

	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/jackc/pglogrepl"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/mysql"
	"gorm.io/driver/postgres"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
	"gorm.io/plugin/dbresolver"
)

// correctnessTests are regression tests for defects found by using the
// library as a new user would (issue 10); each failed before its fix.
var correctnessTests = map[string]func(*testing.T, backend){
	"RecorderRetryAfterRollback":         testRecorderRetry,
	"RecorderSavepointRolledBack":        testRecorderSavepoint,
	"RecorderWithoutPluginFails":         testRecorderWithoutPlugin,
	"RecorderFillsAggregateFromModel":    testRecorderFillsAggregate,
	"HandlerErrorNotValidText":           testHandlerErrorText,
	"HugeFailedBatchIsRecorded":          testHugeFailedBatch,
	"RelayConfigLimits":                  testRelayConfigLimits,
	"DestinationUnavailableBurnsNothing": testUnavailableProcessOnce,
	"DestinationOutageUnderRun":          testUnavailableRun,
	"OutcomesWrittenAsWorkersFinish":     testOutcomesAsWorkersFinish,
	"RelayClaimsAheadAndHandsItBack":     testClaimsAhead,
	"MemoryModeIdempotencyKey":           testMemoryIdempotency,
	"EventIDReusedByAnotherEvent":        testIDReused,
	"FinishedTransaction":                testFinishedTransaction,
	"DryRun":                             testDryRun,
	"SQLTx":                              testSQLTx,
	"StartupDoesNotBlockPublishers":      testStartupDoesNotBlock,
	"DBResolverReadOnlyReplica":          testDBResolver,
	"OrderTiesFollowWriteOrder":          testOrderTies,
	"SchemaUpgradeFromVersion1":          testSchemaUpgrade,
	"UpgradeSQLByHand":                   testUpgradeSQLByHand,
}

// drain runs ProcessOnce until it claims nothing.
func drain(t *testing.T, r *Relay) {
	t.Helper()
	for range 1000 {
		n, err := r.ProcessOnce(t.Context())
		require.NoError(t, err)
		if n == 0 {
			return
		}
	}
	t.Fatal("the relay kept finding events")
}

// delivered returns what c received once everything due was delivered
// (persistent mode) or at once (memory mode).
func (e *testEnv) delivered(t *testing.T, c *collector) []string {
	t.Helper()
	if e.ob.mode != Memory {
		drain(t, e.relay(RelayConfig{Workers: 1}))
	}
	return c.ids()
}

func testRecorderRetry(t *testing.T, b backend) {
	for _, mode := range []Mode{Persistent, Memory} {
		t.Run(mode.String(), func(t *testing.T) {
			e := b.setup(t, withConfig(Config{Mode: mode}))
			c := &collector{}
			e.ob.Handle("*", c.handle)

			o := Order{Total: 1}
			o.Record(Event{Type: "order.created"}) // ID left to the library
			err := e.db.Transaction(func(tx *gorm.DB) error {
				require.NoError(t, tx.Create(&o).Error)
				return errors.New("could not serialize access") // the caller will retry
			})
			require.Error(t, err)
			require.Len(t, o.Recorded(), 1, "a rolled-back transaction leaves the events on the entity")
			id := o.Recorded()[0].ID
			require.NotEmpty(t, id, "the ID is fixed on the entity by the first attempt")
			assert.Empty(t, e.delivered(t, c))

			// The retry: the same entity, again.
			require.NoError(t, e.db.Transaction(func(tx *gorm.DB) error { return tx.Create(&o).Error }))
			assert.Empty(t, o.Recorded(), "cleared once committed")
			assert.Equal(t, []string{id}, e.delivered(t, c), "published once, with the first attempt's ID")

			// Saved twice in one transaction: published once.
			o.Record(Event{ID: "twice", Type: "order.updated"})
			require.NoError(t, e.db.Transaction(func(tx *gorm.DB) error {
				require.NoError(t, tx.Save(&o).Error)
				require.Len(t, o.Recorded(), 1, "not cleared before the commit")
				return tx.Model(&o).Update("total", 2).Error
			}))
			assert.Equal(t, []string{id, "twice"}, e.delivered(t, c))
			assert.Empty(t, o.Recorded())
		})
	}
}

func testRecorderSavepoint(t *testing.T, b backend) {
	for _, mode := range []Mode{Persistent, Memory} {
		t.Run(mode.String(), func(t *testing.T) {
			e := b.setup(t, withConfig(Config{Mode: mode}))
			c := &collector{}
			e.ob.Handle("*", c.handle)
			o := Order{Total: 1}
			o.Record(Event{ID: "outer", Type: "x"})
			require.NoError(t, e.db.Transaction(func(tx *gorm.DB) error {
				require.NoError(t, tx.Create(&o).Error)
				o.Record(Event{ID: "inner", Type: "x"})
				_ = tx.Transaction(func(sp *gorm.DB) error {
					require.NoError(t, sp.Save(&o).Error)
					return errors.New("roll back to the savepoint")
				})
				// The savepoint took "inner" with it; saving again publishes
				// it, and "outer" is not published twice.
				return tx.Save(&o).Error
			}))
			assert.Equal(t, []string{"outer", "inner"}, e.delivered(t, c))
			assert.Empty(t, o.Recorded())
		})
	}
}

func testRecorderWithoutPlugin(t *testing.T, b backend) {
	db := b.open(t, &gorm.Config{})
	require.NoError(t, db.AutoMigrate(&Order{}))
	o := Order{Total: 1}
	o.Record(Event{Type: "order.created"})
	require.ErrorIs(t, db.Create(&o).Error, ErrNotInstalled, "saving recorded events nobody will publish must fail")
	assert.Len(t, o.Recorded(), 1)
	var n int64
	require.NoError(t, db.Model(&Order{}).Count(&n).Error)
	assert.EqualValues(t, 0, n, "nor write the row")
	require.ErrorIs(t, db.Delete(&Order{ID: 1, Recorder: o.Recorder}).Error, ErrNotInstalled)
	require.NoError(t, db.Create(&Order{Total: 2}).Error, "a model without recorded events is untouched")
}

func testRecorderFillsAggregate(t *testing.T, b backend) {
	e := b.setup(t)
	c := &collector{}
	e.ob.Handle(AnyEvent, c.handle)
	// stored returns the aggregate an event was stored with: its row, or in
	// Logical mode (a WAL message, no row) what the handler received.
	stored := func(id string) (typ, aggID string) {
		t.Helper()
		if !b.logical {
			r := e.record(id)
			return r.AggregateType, r.AggregateID
		}
		e.delivered(t, c)
		for _, d := range c.events {
			if d.ID == id {
				return d.AggregateType, d.AggregateID
			}
		}
		t.Fatalf("event %s was not delivered", id)
		return "", ""
	}
	o := Order{Total: 1}
	o.Record(Event{ID: "filled", Type: "order.created"},
		Event{ID: "kept", Type: "order.created", AggregateType: "order", AggregateID: "custom"})
	require.NoError(t, e.db.Create(&o).Error)
	require.NotZero(t, o.ID)
	typ, id := stored("filled")
	assert.Equal(t, fmt.Sprint(o.ID), id, "the auto-increment key, known after the INSERT")
	assert.Equal(t, "orders", typ)
	typ, id = stored("kept")
	assert.Equal(t, "custom", id)
	assert.Equal(t, "order", typ)

	batch := []Order{{Total: 2}, {Total: 3}}
	batch[0].Record(Event{ID: "b0", Type: "x"})
	batch[1].Record(Event{ID: "b1", Type: "x"})
	require.NoError(t, e.db.Create(&batch).Error)
	_, id = stored("b0")
	assert.Equal(t, fmt.Sprint(batch[0].ID), id)
	_, id = stored("b1")
	assert.Equal(t, fmt.Sprint(batch[1].ID), id)
}

func testHandlerErrorText(t *testing.T, b backend) {
	e := b.setup(t)
	e.ob.Handle("bad", func(context.Context, Event) error { return errors.New("bad \xff\xfe bytes and a \x00 NUL") })
	e.ob.Handle("ok", func(context.Context, Event) error { return nil })
	require.NoError(t, PublishAlone(e.db, Event{ID: "bad", Type: "bad"}, Event{ID: "ok", Type: "ok"}))
	n, err := e.relay(RelayConfig{Backoff: func(int) time.Duration { return time.Hour }}).ProcessOnce(t.Context())
	require.NoError(t, err, "the error text must not fail the batch's outcome write")
	assert.Equal(t, 2, n)
	rec := e.record("bad")
	assert.Equal(t, StatusPending, rec.Status)
	assert.Equal(t, 1, rec.Attempts)
	assert.Nil(t, rec.LockedUntil, "the retry is recorded, not left claimed until the lease ends")
	require.NotNil(t, rec.LastError)
	assert.True(t, utf8.ValidString(*rec.LastError))
	assert.NotContains(t, *rec.LastError, "\x00")
	assert.Contains(t, *rec.LastError, "bytes and a")
	assert.Equal(t, StatusSent, e.record("ok").Status)
}

func testHugeFailedBatch(t *testing.T, b backend) {
	e := b.setup(t)
	const n = 8200 // 2+4n placeholders is over SQLite's 32766
	events := make([]Event, n)
	for i := range events {
		events[i] = Event{ID: fmt.Sprintf("f%05d", i), Type: "x"}
	}
	require.NoError(t, PublishAlone(e.db, events...))
	if b.logical {
		// The rows are the relay's (the IDs are explicit): it streams the
		// transaction as one batch and records its failures in one go.
		e.ob.Handle("x", func(context.Context, Event) error { return errors.New("down") })
		// A long StatementTimeout: writing the 8,200 streamed rows to the
		// table outlasted the default on a loaded machine (CI, load 15).
		_, err := e.relay(RelayConfig{BatchSize: n, StatementTimeout: 50 * time.Second, Backoff: func(int) time.Duration { return time.Hour }}).ProcessOnce(t.Context())
		require.NoError(t, err)
		assert.EqualValues(t, n, e.count("status = ? AND attempts = 1 AND locked_until IS NULL AND last_error IS NOT NULL", StatusPending),
			"every failure is recorded")
		return
	}
	r := e.relay(RelayConfig{BatchSize: n})
	now := e.ob.now()
	lease := now.Add(time.Minute)
	batch, err := r.claim(t.Context(), now, lease, nil, n)
	require.NoError(t, err)
	require.Len(t, batch, n)
	outs := make([]outcome, n)
	for i, c := range batch {
		outs[i] = outcome{ID: c.Event.ID, Status: string(StatusPending), Err: "down", Due: now.Add(time.Hour)}
	}
	// One batch's failures, recorded at once (the relay records them in
	// one go when its handlers fail fast).
	require.NoError(t, r.markFailed(t.Context(), outs, lease))
	assert.EqualValues(t, n, e.count("status = ? AND attempts = 1 AND locked_until IS NULL AND last_error IS NOT NULL", StatusPending),
		"every failure is recorded")
}

func testRelayConfigLimits(t *testing.T, b backend) {
	e := b.setup(t)
	var logs syncBuffer
	ob := e.ob
	ob.logger = slog.New(slog.NewTextHandler(&logs, nil))
	for _, c := range []struct {
		cfg  RelayConfig
		what string
	}{
		{RelayConfig{Lease: time.Nanosecond}, "Lease 1ns"},
		{RelayConfig{Lease: 500 * time.Millisecond}, "Lease 500ms"},
		{RelayConfig{BatchSize: maxBatchSize + 1}, "BatchSize"},
		{RelayConfig{Workers: maxWorkers + 1}, "Workers"},
		{RelayConfig{PollInterval: time.Microsecond}, "PollInterval"},
		{RelayConfig{StatementTimeout: time.Microsecond}, "StatementTimeout"},
		{RelayConfig{Lease: 2 * time.Second, HandlerTimeout: 3 * time.Second}, "exceeds Lease"},
		{RelayConfig{HandlerTimeout: 2 * time.Minute}, "exceeds Lease"},
	} {
		r, err := ob.Relay(e.db, c.cfg)
		require.ErrorIs(t, err, ErrInvalidConfig, "returned at construction: %+v", c.cfg)
		assert.ErrorContains(t, err, c.what)
		assert.Nil(t, r, "no relay")
	}

	// A transaction is not a relay's database, and says so at once.
	tx := e.db.Begin()
	defer tx.Rollback()
	_, err := ob.Relay(tx, RelayConfig{})
	require.ErrorIs(t, err, ErrInvalidConfig)
	assert.ErrorContains(t, err, "not a transaction")

	_, err = ob.Relay(e.db, RelayConfig{Lease: time.Second, HandlerTimeout: time.Second, BatchSize: maxBatchSize})
	require.NoError(t, err, "the limits themselves are valid")
}

func testUnavailableProcessOnce(t *testing.T, b backend) {
	e := b.setup(t)
	var calls atomic.Int32
	var down atomic.Bool
	down.Store(true)
	e.ob.Handle("x", func(ctx context.Context, _ Event) error {
		calls.Add(1)
		if down.Load() {
			return Unavailable(errors.New("dial tcp: connection refused"))
		}
		assert.Equal(t, 1, Attempt(ctx), "the outage burned no attempt")
		return nil
	})
	ids := publishN(t, e.db, "x", 3)
	r := e.relay(RelayConfig{Workers: 1})
	n, err := r.ProcessOnce(t.Context())
	assert.Equal(t, 3, n)
	require.Error(t, err)
	assert.True(t, IsUnavailable(err), "ProcessOnce reports the destination down: %v", err)
	assert.EqualValues(t, 1, calls.Load(), "no delivery starts after the destination reported itself down")
	for _, id := range ids {
		rec := e.record(id)
		assert.Equal(t, StatusPending, rec.Status)
		assert.Equal(t, 0, rec.Attempts, "handed back without counting the attempt")
		assert.Nil(t, rec.LockedUntil)
		assert.Nil(t, rec.LastError)
	}
	down.Store(false)
	drain(t, r)
	assert.EqualValues(t, 3, e.count("status = ? AND attempts = 1", StatusSent))

	// Permanent wins over Unavailable.
	e.ob.Handle("p", func(context.Context, Event) error { return Permanent(Unavailable(errors.New("x"))) })
	publishN(t, e.db, "p", 1)
	_, err = r.ProcessOnce(t.Context())
	require.NoError(t, err)
	assert.Equal(t, StatusFailed, e.record("p-00000").Status)
}

func testUnavailableRun(t *testing.T, b backend) {
	e := b.setup(t)
	var logs syncBuffer
	e.ob.logger = slog.New(slog.NewTextHandler(&logs, nil))
	var calls atomic.Int32
	e.ob.Handle("x", func(context.Context, Event) error {
		switch calls.Add(1) {
		case 1, 2, 3, 5: // the first delivery and the probes find the broker down
			return Unavailable(errors.New("broker: connection refused"))
		case 4: // a probe that fails for another reason: still paused
			return errors.New("bad request")
		}
		return nil
	})
	publishN(t, e.db, "x", 20)
	runRelay(t, e.relay(RelayConfig{PollInterval: 10 * time.Millisecond, Backoff: func(int) time.Duration { return 0 }}))
	require.Eventually(t, func() bool { return e.count("status = ?", StatusSent) == 20 }, 30*time.Second, 10*time.Millisecond)
	assert.EqualValues(t, 19, e.count("attempts = 1"), "the outage burned no attempt")
	assert.EqualValues(t, 1, e.count("attempts = 2"), "the ordinary failure counted one")
	out := logs.String()
	assert.Equal(t, 1, strings.Count(out, "delivery paused"), "logged once per outage:\n%s", out)
	assert.Equal(t, 1, strings.Count(out, "delivery resumed"), out)
	assert.Equal(t, 1, strings.Count(out, "will retry"), "a warning for the ordinary failure only")
}

// Through a backlog a relay whose store keeps a watermark (PostgreSQL,
// SQLite: store.Walker) claims the next batch while it delivers one; one
// whose store does not (MySQL) claims one batch at a time. Stopped mid-batch,
// it hands back the rest of the batch and the batch it claimed ahead,
// counting no attempt for either.
func testClaimsAhead(t *testing.T, b backend) {
	if b.logical {
		t.Skip("the table's loop; Logical mode streams new events")
	}
	e := b.setup(t)
	const batch = 10
	leased := func() int64 { return e.count("status = ? AND locked_until IS NOT NULL", StatusPending) }
	var delivered atomic.Int32
	held := make(chan int64, 1)
	release := make(chan struct{})
	_, walks := e.ob.store.(store.Walker)
	e.ob.Handle("x", func(context.Context, Event) error {
		if delivered.Add(1) != 35 {
			return nil
		}
		// In the fourth batch: the fifth is claimed while it is delivered.
		n := leased()
		for deadline := time.Now().Add(10 * time.Second); walks && n <= batch && time.Now().Before(deadline); n = leased() {
			time.Sleep(5 * time.Millisecond)
		}
		held <- n
		<-release
		return nil
	})
	publishN(t, e.db, "x", 100)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	done := make(chan error, 1)
	r := e.relay(RelayConfig{BatchSize: batch, Workers: 1, PollInterval: time.Hour})
	go func() { done <- r.Run(ctx) }()
	var n int64
	select {
	case n = <-held:
	case <-time.After(30 * time.Second):
		t.Fatal("the relay did not reach the 35th event")
	}
	if walks {
		assert.Greater(t, n, int64(batch), "the next batch claimed while this one is delivered")
	} else {
		assert.LessOrEqual(t, n, int64(batch), "one batch claimed at a time")
	}
	cancel()
	close(release)
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	assert.EqualValues(t, 35, e.count("status = ?", StatusSent))
	assert.Zero(t, leased(), "the rest of the batch and the batch claimed ahead handed back")
	assert.EqualValues(t, 65, e.count("status = ? AND attempts = 0", StatusPending), "no attempt counted for them")
}

func testOutcomesAsWorkersFinish(t *testing.T, b backend) {
	e := b.setup(t)
	unblock := make(chan struct{})
	var delivered atomic.Int32
	e.ob.Handle("x", func(ctx context.Context, ev Event) error {
		if ev.ID == "x-00000" {
			<-unblock // a slow delivery holds one worker
		}
		delivered.Add(1)
		return nil
	})
	publishN(t, e.db, "x", 6)
	if b.logical {
		// Logical mode confirms a streamed batch as a whole, once every
		// outcome of it is durable: while x-00000 is in flight the other
		// five are delivered and the relay goes on reporting its position,
		// but one before the batch, so a crash now would replay the batch
		// in flight and no more (README, "Delivery").
		end := e.commitEnd(t, "x-00000")
		stop := runRelay(t, e.relay(RelayConfig{Workers: 2, PollInterval: time.Hour}))
		require.Eventually(t, func() bool { return delivered.Load() == 5 }, 10*time.Second, 5*time.Millisecond)
		since := time.Now()
		var flush, confirmed pglogrepl.LSN
		require.Eventually(t, func() bool {
			// A position report the relay sent after the five were delivered.
			reply, f, c := e.slotReport(t)
			flush, confirmed = f, c
			return reply.After(since)
		}, 10*time.Second, 5*time.Millisecond)
		assert.Less(t, flush, end, "the relay reports a position before the batch in flight")
		assert.Less(t, confirmed, end, "the slot keeps the batch in flight")
		close(unblock)
		require.Eventually(t, func() bool {
			_, _, c := e.slotReport(t)
			return c >= end
		}, 10*time.Second, 5*time.Millisecond, "the batch is confirmed once done")
		assert.EqualValues(t, 6, e.count("status = ?", StatusSent), "the rows the relay wrote for the explicit IDs")
		stop()
		return
	}
	done := make(chan error, 1)
	go func() {
		_, err := e.relay(RelayConfig{Workers: 2}).ProcessOnce(context.Background())
		done <- err
	}()
	// The other five are recorded while the slow one is still in flight: a
	// crash now would redeliver one event, not the batch.
	require.Eventually(t, func() bool { return e.count("status = ?", StatusSent) == 5 }, 10*time.Second, 5*time.Millisecond)
	assert.Equal(t, StatusPending, e.record("x-00000").Status)
	close(unblock)
	require.NoError(t, <-done)
	assert.EqualValues(t, 6, e.count("status = ?", StatusSent))
}

func testMemoryIdempotency(t *testing.T, b backend) {
	e := b.setup(t, withConfig(Config{Mode: Memory}))
	c := &collector{}
	e.ob.Handle("*", c.handle)
	require.NoError(t, e.db.Transaction(func(tx *gorm.DB) error {
		return Publish(tx, Event{ID: "a", Type: "x", IdempotencyKey: "k"}, Event{ID: "b", Type: "x", IdempotencyKey: "k"})
	}))
	require.NoError(t, PublishAlone(e.db, Event{ID: "c", Type: "x", IdempotencyKey: "k"}))
	require.NoError(t, PublishAlone(e.db, Event{ID: "d", Type: "x", IdempotencyKey: "other"}))
	assert.Equal(t, []string{"a", "d"}, c.ids(), "the first write wins, as in persistent mode")

	// A rolled-back key is not remembered.
	_ = e.db.Transaction(func(tx *gorm.DB) error {
		require.NoError(t, Publish(tx, Event{ID: "e", Type: "x", IdempotencyKey: "fresh"}))
		return errors.New("rollback")
	})
	require.NoError(t, PublishAlone(e.db, Event{ID: "f", Type: "x", IdempotencyKey: "fresh"}))
	assert.Equal(t, []string{"a", "d", "f"}, c.ids())
}

func testIDReused(t *testing.T, b backend) {
	e := b.setup(t)
	var logs syncBuffer
	e.ob.logger = slog.New(slog.NewTextHandler(&logs, nil))
	c := &collector{}
	e.ob.Handle(AnyEvent, c.handle)
	require.NoError(t, PublishAlone(e.db, Event{ID: "same", Type: "first", IdempotencyKey: "k1"}))
	require.NoError(t, PublishAlone(e.db, Event{ID: "same", Type: "first", IdempotencyKey: "k1"}), "the same event again: a no-op")
	err := PublishAlone(e.db, Event{ID: "same", Type: "second", IdempotencyKey: "k2"})
	if b.logical {
		// Publish cannot see the table in Logical mode: both commit, and
		// the relay delivers the first, drops the later one, logs it at
		// Error and counts it (README, "Logical mode").
		require.NoError(t, err)
		require.Equal(t, []string{"same"}, e.delivered(t, c), "delivered once")
		assert.Equal(t, "first", c.events[0].Type)
		assert.Equal(t, 1, strings.Count(logs.String(), "level=ERROR msg=\"outbox: a committed event reuses the ID of another event"), "the loss is logged once:\n%s", logs.String())
		st, err := e.ob.Stats(e.db.WithContext(t.Context()))
		require.NoError(t, err)
		assert.EqualValues(t, 1, st.Dropped, "the repeat of the same event is no loss; the other one is")
	} else {
		require.Error(t, err, "a different event reusing an ID must not vanish without a word")
		assert.ErrorContains(t, err, "already used by an event with another idempotency key")
		assert.ErrorIs(t, err, ErrInvalidEvent, "a validation failure, as README says every one is")
		assert.ErrorIs(t, err, ErrIDConflict)
	}
	assert.EqualValues(t, 1, e.count(""))
	assert.Equal(t, "first", e.record("same").EventType)
}

func testFinishedTransaction(t *testing.T, b backend) {
	for _, mode := range []Mode{Persistent, Memory} {
		t.Run(mode.String(), func(t *testing.T) {
			e := b.setup(t, withConfig(Config{Mode: mode}))
			tx := e.db.Begin()
			require.NoError(t, tx.Commit().Error)
			require.ErrorIs(t, Publish(tx, Event{Type: "x"}), sql.ErrTxDone, "publishing on a committed transaction fails")
			ran := false
			AfterCommit(tx, func() { ran = true })
			require.ErrorIs(t, tx.Error, sql.ErrTxDone)
			assert.False(t, ran)

			// AfterCommit on a database without the plugin names that.
			plain := b.open(t, &gorm.Config{})
			ptx := plain.Begin()
			AfterCommit(ptx, func() {})
			require.ErrorIs(t, ptx.Error, ErrNotInstalled)
			ptx.Rollback()
		})
	}
}

func testDryRun(t *testing.T, b backend) {
	e := b.setup(t)
	// A DryRun session builds statements without running them: Publish
	// writes nothing either.
	dry := e.db.Session(&gorm.Session{DryRun: true})
	require.NoError(t, Publish(dry, Event{ID: "dry", Type: "x"}))
	assert.EqualValues(t, 0, e.count(""))

	// Installing on a DryRun database neither panics nor touches it.
	db := b.open(t, &gorm.Config{DryRun: true})
	require.NotPanics(t, func() { require.NoError(t, db.Use(Plugin(Config{Table: "dry_outbox"}))) })
	sqlDB, err := db.DB()
	require.NoError(t, err)
	d, err := store.Open(t.Context(), b.name, nil, "dry_outbox")
	require.NoError(t, err)
	created, err := d.Exists(t.Context(), sqlDB, "dry_outbox")
	require.NoError(t, err)
	assert.False(t, created, "no DDL under DryRun")
}

func testSQLTx(t *testing.T, b backend) {
	for _, prepare := range []bool{false, true} {
		t.Run(fmt.Sprint("PrepareStmt=", prepare), func(t *testing.T) {
			e := b.setup(t, withGorm(&gorm.Config{PrepareStmt: prepare}))
			c := &collector{}
			e.ob.Handle("x", c.handle)
			_, ok := SQLTx(e.db)
			assert.False(t, ok, "no transaction outside one")
			require.NoError(t, e.db.Transaction(func(tx *gorm.DB) error {
				stx, ok := SQLTx(tx)
				require.True(t, ok)
				// Another library writing through the same transaction.
				_, err := stx.ExecContext(t.Context(), "INSERT INTO orders (total) VALUES (42)")
				require.NoError(t, err)
				return Publish(tx, Event{ID: "with-sqltx", Type: "x"})
			}))
			var n int64
			require.NoError(t, e.db.Model(&Order{}).Where("total = 42").Count(&n).Error)
			assert.EqualValues(t, 1, n)
			if b.logical { // Logical mode's Publish writes a WAL message in the transaction, no row
				assert.EqualValues(t, 0, e.count(""))
				assert.Equal(t, []string{"with-sqltx"}, e.delivered(t, c), "committed with the other library's write")
				return
			}
			assert.EqualValues(t, 1, e.count("named_id = ?", "with-sqltx"))
		})
	}
}

// testStartupDoesNotBlock: an instance starting (db.Use) while another holds
// a publishing transaction open must neither wait for it nor make later
// publishers wait.
func testStartupDoesNotBlock(t *testing.T, b backend) {
	e := b.setup(t)
	open := e.db.Begin()
	require.NoError(t, Publish(open, Event{ID: "open", Type: "x"}))
	defer open.Rollback()

	started := make(chan error, 1)
	go func() {
		db := e.reopen(t)
		started <- db.Use(Plugin(Config{Logger: slog.New(slog.DiscardHandler)}))
	}()
	select {
	case err := <-started:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("db.Use waited for a publishing transaction")
	}
	if b.name != "postgres" {
		return
	}
	// The ordering index is built concurrently: other publishers go on
	// while the build waits for the open transaction.
	indexed := make(chan error, 1)
	go func() {
		_, err := e.relay(RelayConfig{OrderByAggregate: true}).ProcessOnce(context.Background())
		indexed <- err
	}()
	published := make(chan error, 1)
	go func() {
		published <- e.db.Transaction(func(tx *gorm.DB) error {
			return Publish(tx, Event{ID: "meanwhile", Type: "x"})
		})
	}()
	select {
	case err := <-published:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("a publisher waited for the ordering index")
	}
	require.NoError(t, open.Commit().Error)
	require.NoError(t, <-indexed)
}

// readOnlyDSN returns a DSN of the test's database whose sessions cannot
// write, as a read-only replica's are.
func readOnlyDSN(t *testing.T, b backend, e *testEnv) gorm.Dialector {
	v, ok := dsns.Load(e.db)
	require.True(t, ok)
	dsn := v.(string)
	sep := "?"
	if strings.Contains(dsn, "?") {
		sep = "&"
	}
	switch e.name {
	case "postgres":
		return postgres.Open(dsn + sep + "options=" + url.QueryEscape("-c default_transaction_read_only=on"))
	case "mysql":
		return mysql.Open(dsn + sep + "tx_read_only=1")
	default:
		return b.sqlite.open(dsn + sep + "mode=ro")
	}
}

// testDBResolver installs go-gorm/dbresolver with a read-only replica after
// the plugin: dbresolver opens the replica with the same plugins, so the
// outbox's Initialize runs on a connection that cannot write, and must not
// try DDL there.
func testDBResolver(t *testing.T, b backend) {
	e := b.setup(t)
	// The replica really refuses writes.
	ro, err := gorm.Open(readOnlyDSN(t, b, e), &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	t.Cleanup(func() { closeDB(ro) })
	require.Error(t, ro.Exec("CREATE TABLE ro_probe (id integer)").Error)
	// dbresolver never closes what it opens: hand it this pool.
	conn, err := ro.DB()
	require.NoError(t, err)
	var replica gorm.Dialector
	switch b.name {
	case "postgres":
		replica = postgres.New(postgres.Config{Conn: conn})
	case "mysql":
		replica = mysql.New(mysql.Config{Conn: conn})
	default:
		replica = b.sqlite.conn(conn)
	}

	require.NoError(t, e.db.Use(dbresolver.Register(dbresolver.Config{Replicas: []gorm.Dialector{replica}})),
		"registering dbresolver with a read-only replica")
	c := &collector{}
	e.ob.Handle("x", c.handle)
	require.NoError(t, e.db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Create(&Order{Total: 1}).Error; err != nil {
			return err
		}
		return Publish(tx, Event{ID: "resolved", Type: "x"})
	}))
	var orders []Order
	require.NoError(t, e.db.Find(&orders).Error, "reads go to the replica")
	assert.Len(t, orders, 1)
	drain(t, e.relay(RelayConfig{}))
	assert.Equal(t, []string{"resolved"}, c.ids())
}

func closeDB(db *gorm.DB) {
	if sqlDB, err := db.DB(); err == nil {
		_ = sqlDB.Close()
	}
}

// nonComparablePool is a custom connection pool of a type == cannot
// compare (it holds a slice), as some wrappers are.
type nonComparablePool struct {
	gorm.ConnPool
	tags []string
}

func TestNonComparableConnPool(t *testing.T) {
	t.Parallel()
	sqlDB, err := sql.Open("sqlite3", filepath.Join(t.TempDir(), "pool.db"))
	require.NoError(t, err)
	t.Cleanup(func() { _ = sqlDB.Close() })
	db, err := gorm.Open(sqlite.Dialector{Conn: nonComparablePool{ConnPool: sqlDB, tags: []string{"x"}}}, &gorm.Config{Logger: logger.Discard})
	require.NoError(t, err)
	ob := Plugin(Config{Mode: Memory})
	require.NotPanics(t, func() { require.NoError(t, db.Use(ob)) })
	c := &collector{}
	ob.Handle("x", c.handle)
	require.NoError(t, PublishAlone(db, Event{ID: "np", Type: "x"}))
	assert.Equal(t, []string{"np"}, c.ids())
}

// testOrderTies: events of one aggregate written in one Publish call share
// their created_at, and a writer whose clock is behind writes older times;
// per-aggregate order must follow write order all the same, not the IDs'
// alphabetical order or the clocks.
func testOrderTies(t *testing.T, b backend) {
	e := b.setup(t)
	c := &collector{}
	e.ob.Handle("x", c.handle)
	var events []Event
	for v := 1; v <= 12; v++ { // acct-7-v10 sorts before acct-7-v9
		events = append(events, Event{ID: fmt.Sprintf("acct-7-v%d", v), Type: "x", AggregateType: "acct", AggregateID: "7"})
	}
	require.NoError(t, PublishAlone(e.db, events...))
	// A second writer whose clock is an hour behind writes the next ones.
	skewed := &fakeClock{t: e.clock.Now().Add(-time.Hour)}
	e.ob.clock = skewed.Now
	require.NoError(t, PublishAlone(e.db, Event{ID: "acct-7-v13", Type: "x", AggregateType: "acct", AggregateID: "7"}))
	e.ob.clock = e.clock.Now

	r := e.relay(RelayConfig{OrderByAggregate: true, Workers: 4})
	drain(t, r)
	want := make([]string, 13)
	for i := range want {
		want[i] = fmt.Sprintf("acct-7-v%d", i+1)
	}
	assert.Equal(t, want, c.ids(), "delivered in write order")
}

// testSchemaUpgrade creates a table with the first release's DDL, fills it
// with pending (two ordered aggregates among them), failed and sent rows as
// that release wrote them, then installs the plugin: the table is upgraded
// in place and every row keeps its state; the pending ones are delivered in
// their original order.
func testSchemaUpgrade(t *testing.T, b backend) {
	for _, from := range []int{1, 2} {
		t.Run(fmt.Sprintf("from-v%d", from), func(t *testing.T) {
			if from == 1 && b.name == "mysql" {
				t.Skip("no release created a version 1 table on MySQL")
			}
			schemaUpgradeFrom(t, b, from)
		})
	}
}

// oldSchema is the DDL of schema version v, as that release shipped it.
func oldSchema(t *testing.T, name string, v int) string {
	ddl, err := os.ReadFile(filepath.Join("internal", "store", "storetest", fmt.Sprintf("schema-v%d", v), name+".sql"))
	require.NoError(t, err)
	return string(ddl)
}

func schemaUpgradeFrom(t *testing.T, b backend, from int) {
	db := b.open(t, &gorm.Config{})
	require.NoError(t, db.Exec(oldSchema(t, b.name, from)).Error)
	base := time.Now().UTC().Add(-time.Hour).Truncate(time.Microsecond)
	row := func(id, aggID string, status Status, attempts int, at time.Duration) {
		var ts any = base.Add(at)
		if b.name == "mysql" {
			ts = mysqlstore.Time(base.Add(at))
		}
		var sentAt any
		if status == StatusSent {
			sentAt = ts
		}
		require.NoError(t, db.Exec(`INSERT INTO outbox_events (id, event_type, aggregate_type, aggregate_id, idempotency_key, payload,
			status, attempts, available_at, occurred_at, created_at, updated_at, sent_at) VALUES (?, 'x', 'acct', ?, ?, '{"v":1}', ?, ?, ?, ?, ?, ?, ?)`,
			id, aggID, "key-"+id, status, attempts, ts, ts, ts, ts, sentAt).Error)
	}
	row("sent-1", "", StatusSent, 1, 0)
	row("failed-1", "", StatusFailed, 10, time.Second)
	// Written in this order, with IDs that sort the other way.
	row("b-3", "B", StatusPending, 0, 2*time.Second)
	row("b-2", "B", StatusPending, 0, 3*time.Second)
	row("b-1", "B", StatusPending, 0, 4*time.Second)
	row("a-2", "A", StatusPending, 2, 5*time.Second)
	row("a-1", "A", StatusPending, 0, 6*time.Second)

	// A team with its own migrations is told what to run.
	err := db.Use(Plugin(Config{DisableAutoMigrate: true}))
	require.ErrorIs(t, err, ErrInvalidConfig)
	assert.ErrorContains(t, err, "UpgradeSQL")

	// Two instances start at once: one upgrades, the other finds it done.
	var wg sync.WaitGroup
	errs := make([]error, 2)
	first := &testEnv{t: t, db: db, name: b.name}
	dbs := []*gorm.DB{first.reopen(t), first.reopen(t)}
	obs := []*Outbox{Plugin(Config{Logger: slog.New(slog.DiscardHandler)}), Plugin(Config{Logger: slog.New(slog.DiscardHandler)})}
	for i := range 2 {
		wg.Add(1)
		go func() { defer wg.Done(); errs[i] = dbs[i].Use(obs[i]) }()
	}
	wg.Wait()
	require.NoError(t, errs[0])
	require.NoError(t, errs[1])
	ob := obs[0]
	sqlDB, err := db.DB()
	require.NoError(t, err)
	v, err := ob.store.Version(t.Context(), sqlDB)
	require.NoError(t, err)
	assert.Equal(t, store.SchemaVersion, v)

	c := &collector{}
	ob.Handle("x", c.handle)
	drain(t, mustRelay(t, ob, dbs[0], RelayConfig{OrderByAggregate: true, Workers: 4}))
	assert.Equal(t, []string{"b-3", "b-2", "b-1"}, filterPrefix(c.ids(), "b-"))
	assert.Equal(t, []string{"a-2", "a-1"}, filterPrefix(c.ids(), "a-"))
	st, err := ob.Stats(dbs[0].WithContext(t.Context()))
	require.NoError(t, err)
	assert.Equal(t, int64(6), sentRows(t, dbs[0], ob))
	assert.Equal(t, int64(1), st.Failed)
	n, err := ob.Replay(dbs[0], Filter{IDs: []string{"failed-1"}})
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	drain(t, mustRelay(t, ob, dbs[0], RelayConfig{}))
	assert.Contains(t, c.ids(), "failed-1")

	// Idempotency keys of the old rows still hold, new events get on.
	require.NoError(t, PublishAlone(dbs[0], Event{ID: "dup", Type: "x", IdempotencyKey: "key-a-1"}))
	require.NoError(t, PublishAlone(dbs[0], Event{ID: "new", Type: "x"}))
	var count int64
	require.NoError(t, db.Table("outbox_events").Where("named_id IN ?", []string{"dup", "new"}).Count(&count).Error)
	assert.EqualValues(t, 1, count)
}

// testUpgradeSQLByHand: a team that runs its own migrations applies
// UpgradeSQL to a version 1 table; db.Use then accepts it.
func testUpgradeSQLByHand(t *testing.T, b backend) {
	from := 1
	if b.name == "mysql" {
		from = 2 // no release created a version 1 table on MySQL
	}
	db := b.open(t, &gorm.Config{})
	require.NoError(t, db.Exec(oldSchema(t, b.name, from)).Error)
	up, err := UpgradeSQLFrom(b.name, DefaultTable, from)
	require.NoError(t, err)
	require.NotEmpty(t, up)
	if b.name == "mysql" {
		// One statement at a time: the DSN does not allow several.
		for _, st := range strings.Split(up, ";\n") {
			if st = strings.TrimSpace(st); st != "" {
				require.NoError(t, db.Exec(st).Error)
			}
		}
	} else {
		require.NoError(t, db.Exec(up).Error)
	}
	ob := Plugin(Config{DisableAutoMigrate: true})
	require.NoError(t, db.Use(ob))
	require.NoError(t, PublishAlone(db, Event{ID: "after", Type: "x"}))
	c := &collector{}
	ob.Handle("x", c.handle)
	drain(t, mustRelay(t, ob, db, RelayConfig{}))
	assert.Equal(t, []string{"after"}, c.ids())
}
