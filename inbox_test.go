package outbox

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// inboxTests run on every backend, in the backend's table mode and in
// Memory mode.
var inboxTests = map[string]func(*testing.T, backend){
	"ConsumeRunsOnce":                 forInboxModes(testConsumeOnce),
	"ConsumeConcurrentDuplicates":     forInboxModes(testConsumeConcurrent),
	"ConsumeWaitsForRolledBackFirst":  forInboxModes(testConsumeWaitsForFirst),
	"ConsumeManyWaitForRolledBack":    forInboxModes(testConsumeManyWaitForRolledBackFirst),
	"ConsumeErrorAndPanicRecordNone":  forInboxModes(testConsumeErrorAndPanic),
	"ConsumeTwoConsumersBothRun":      forInboxModes(testConsumeTwoConsumers),
	"ConsumePublishCommitsWithEffect": forInboxModes(testConsumePublish),
	"ConsumeInCallersTransaction":     forInboxModes(testConsumeInTransaction),
	"ConsumeBadInput":                 forInboxModes(testConsumeBadInput),
	"ConsumeIDsKeptExactly":           forInboxModes(testConsumeIDsKeptExactly),
	"ConsumeNested":                   forInboxModes(testConsumeNested),
	"ConsumePreparedSession":          forInboxModes(testConsumePreparedSession),
	"ConsumeLeavesConnectionClean":    testConsumeLeavesConnectionClean,
	"ConsumeRetention":                testConsumeRetention,
	"ConsumeWithoutPlugin":            testConsumeWithoutPlugin,
}

// forInboxModes runs test on the backend's table mode and on Memory mode.
func forInboxModes(test func(*testing.T, *testEnv)) func(*testing.T, backend) {
	return func(t *testing.T, b backend) {
		for _, mode := range []Mode{Persistent, Memory} {
			t.Run(mode.String(), func(t *testing.T) {
				test(t, b.setup(t, withConfig(Config{Mode: mode})))
			})
		}
	}
}

// effects counts the business rows fn wrote for message id (Order.Total).
func (e *testEnv) effects(total int) int64 {
	e.t.Helper()
	var n int64
	require.NoError(e.t, e.db.Model(&Order{}).Where("total = ?", total).Count(&n).Error)
	return n
}

// inboxRows counts the inbox's records of consumer, or all with "".
func (e *testEnv) inboxRows(consumer string) int64 {
	e.t.Helper()
	if e.ob.Mode() == Memory {
		e.ob.memInbox.mu.Lock()
		defer e.ob.memInbox.mu.Unlock()
		var n int64
		for k, v := range e.ob.memInbox.ents {
			if v.consumed && (consumer == "" || k.consumer == consumer) {
				n++
			}
		}
		return n
	}
	q := e.db.Table(e.ob.inbox)
	if consumer != "" {
		q = q.Where("consumer = ?", consumer)
	}
	var n int64
	require.NoError(e.t, q.Count(&n).Error)
	return n
}

// effect is a consumer's function: one business row of total.
func effect(total int, calls *atomic.Int64) func(tx *gorm.DB) error {
	return func(tx *gorm.DB) error {
		calls.Add(1)
		return tx.Create(&Order{Total: total}).Error
	}
}

func testConsumeOnce(t *testing.T, e *testEnv) {
	var calls atomic.Int64
	for range 3 {
		require.NoError(t, Consume(e.db, "billing", "msg-1", effect(101, &calls)))
	}
	assert.EqualValues(t, 1, calls.Load(), "fn runs once")
	assert.EqualValues(t, 1, e.effects(101))
	assert.EqualValues(t, 1, e.inboxRows("billing"))
	// IDs are compared exactly: another case is another message.
	require.NoError(t, Consume(e.db, "billing", "MSG-1", effect(101, &calls)))
	assert.EqualValues(t, 2, calls.Load())
}

func testConsumeConcurrent(t *testing.T, e *testEnv) {
	const n = 8
	var (
		calls atomic.Int64
		wg    sync.WaitGroup
		start = make(chan struct{})
		errs  = make([]error, n)
	)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			errs[i] = Consume(e.db, "billing", "msg-concurrent", func(tx *gorm.DB) error {
				calls.Add(1)
				if err := tx.Create(&Order{Total: 202}).Error; err != nil {
					return err
				}
				// Hold the transaction open so that the others arrive
				// while it runs.
				time.Sleep(20 * time.Millisecond)
				return nil
			})
		}()
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		assert.NoError(t, err, "delivery %d", i)
	}
	assert.EqualValues(t, 1, e.effects(202), "the effect is committed once")
	assert.EqualValues(t, 1, calls.Load(), "fn runs once")
	assert.EqualValues(t, 1, e.inboxRows("billing"))
}

// testConsumeWaitsForFirst: a second delivery arriving while the first
// runs waits for it; the first rolls back, so the second runs fn, after the
// first has ended.
func testConsumeWaitsForFirst(t *testing.T, e *testEnv) {
	first := e.holdDelivery(t, "msg-wait", func(tx *gorm.DB) error { return tx.Create(&Order{Total: 303}).Error })
	secondErr := make(chan error, 1)
	var secondRanAfterFirst atomic.Bool
	var secondCalls atomic.Int64
	go func() {
		secondErr <- Consume(e.db, "billing", "msg-wait", func(tx *gorm.DB) error {
			secondCalls.Add(1)
			secondRanAfterFirst.Store(first.returned.Load())
			return tx.Create(&Order{Total: 303}).Error
		})
	}()
	// Else the second would run after the first trivially.
	first.waitQueued(t, 1, secondErr)
	first.release()
	require.ErrorIs(t, <-first.err, errHeld)
	require.NoError(t, <-secondErr)
	assert.EqualValues(t, 1, secondCalls.Load())
	assert.True(t, secondRanAfterFirst.Load(), "the second ran fn only after the first's had returned")
	assert.EqualValues(t, 1, e.effects(303))
	assert.EqualValues(t, 1, e.inboxRows("billing"))
}

// heldDelivery is a delivery whose fn keeps its transaction open until
// released and then fails: deliveries of the same message that arrive
// meanwhile queue behind its inbox record, and run once it rolls back.
type heldDelivery struct {
	release   func()       // lets fn return errHeld; idempotent, and run at the test's cleanup
	err       chan error   // Consume's result
	returned  atomic.Bool  // set when fn returns, before the rollback
	blockedBy func() int64 // the sessions waiting on its locks; nil where none can say
}

var errHeld = errors.New("held delivery fails")

// holdDelivery starts a delivery of msg to "billing" whose fn runs effect
// and then holds, and returns once fn holds. However the test ends, it is
// released: its transaction must not hold the test database's cleanup.
func (e *testEnv) holdDelivery(t *testing.T, msg string, effect func(tx *gorm.DB) error) *heldDelivery {
	t.Helper()
	h := &heldDelivery{err: make(chan error, 1)}
	started, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	h.release = func() { once.Do(func() { close(release) }) }
	t.Cleanup(h.release)
	go func() {
		h.err <- Consume(e.db, "billing", msg, func(tx *gorm.DB) error {
			if err := effect(tx); err != nil {
				return err
			}
			h.blockedBy = e.lockWaiters(tx)
			close(started)
			<-release
			h.returned.Store(true)
			return errHeld
		})
	}()
	select {
	case <-started:
	case err := <-h.err:
		t.Fatalf("held delivery ended before running fn: %v", err)
	}
	return h
}

// waitQueued waits until n deliveries queue on h's lock, as the server
// says (SQLite and Memory mode cannot, and get a while), and fails if one
// of them, reporting on done, finished meanwhile.
func (h *heldDelivery) waitQueued(t *testing.T, n int64, done <-chan error) {
	t.Helper()
	if h.blockedBy != nil {
		require.Eventually(t, func() bool { return h.blockedBy() >= n }, 10*time.Second, 10*time.Millisecond,
			"deliveries queue on the held delivery's lock")
	} else {
		time.Sleep(300 * time.Millisecond) // no way to observe them waiting
	}
	select {
	case err := <-done:
		t.Fatalf("a delivery finished while the held one still ran: %v", err)
	default:
	}
}

func testConsumeErrorAndPanic(t *testing.T, e *testEnv) {
	boom := errors.New("handler failed")
	err := Consume(e.db, "billing", "msg-err", func(tx *gorm.DB) error {
		if err := tx.Create(&Order{Total: 404}).Error; err != nil {
			return err
		}
		return boom
	})
	require.ErrorIs(t, err, boom)
	assert.EqualValues(t, 0, e.inboxRows(""), "nothing recorded after an error")
	assert.EqualValues(t, 0, e.effects(404))

	func() {
		defer func() { assert.Equal(t, "handler panicked", recover()) }()
		_ = Consume(e.db, "billing", "msg-err", func(tx *gorm.DB) error {
			if err := tx.Create(&Order{Total: 404}).Error; err != nil {
				return err
			}
			panic("handler panicked")
		})
		t.Error("Consume returned from a panicking fn")
	}()
	assert.EqualValues(t, 0, e.inboxRows(""), "nothing recorded after a panic")
	assert.EqualValues(t, 0, e.effects(404))

	// The redelivery runs fn.
	var calls atomic.Int64
	require.NoError(t, Consume(e.db, "billing", "msg-err", effect(404, &calls)))
	assert.EqualValues(t, 1, calls.Load())
	assert.EqualValues(t, 1, e.effects(404))
}

func testConsumeTwoConsumers(t *testing.T, e *testEnv) {
	var a, b atomic.Int64
	require.NoError(t, Consume(e.db, "billing", "msg-shared", effect(505, &a)))
	require.NoError(t, Consume(e.db, "shipping", "msg-shared", effect(505, &b)))
	require.NoError(t, Consume(e.db, "shipping", "msg-shared", effect(505, &b)))
	assert.EqualValues(t, 1, a.Load())
	assert.EqualValues(t, 1, b.Load())
	assert.EqualValues(t, 2, e.effects(505))
}

// testConsumePublish: what fn publishes onward commits with the effect and
// the record, never without them, and a duplicate publishes nothing.
func testConsumePublish(t *testing.T, e *testEnv) {
	var delivered atomic.Int64
	e.ob.Handle("order.shipped", func(context.Context, Event) error { delivered.Add(1); return nil })
	onward := func(fail bool) func(tx *gorm.DB) error {
		return func(tx *gorm.DB) error {
			if err := tx.Create(&Order{Total: 606}).Error; err != nil {
				return err
			}
			if err := Publish(tx, Event{Type: "order.shipped", Payload: map[string]int{"total": 606}}); err != nil {
				return err
			}
			if fail {
				return errors.New("fails after publishing")
			}
			return nil
		}
	}
	require.Error(t, Consume(e.db, "shipping", "msg-onward", onward(true)))
	assert.EqualValues(t, 0, e.onward(), "no onward event without the effect")
	require.NoError(t, Consume(e.db, "shipping", "msg-onward", onward(false)))
	require.NoError(t, Consume(e.db, "shipping", "msg-onward", onward(false)))
	assert.EqualValues(t, 1, e.effects(606))
	switch e.ob.Mode() {
	case Memory:
		assert.EqualValues(t, 1, delivered.Load(), "the onward event is dispatched once, after the commit")
	case Logical:
		// The WAL carries it: a relay streams exactly one.
		r := e.relay(RelayConfig{})
		require.Eventually(t, func() bool {
			_, err := r.ProcessOnce(t.Context())
			require.NoError(t, err)
			return delivered.Load() >= 1
		}, 10*time.Second, 10*time.Millisecond)
		_, err := r.ProcessOnce(t.Context())
		require.NoError(t, err)
		assert.EqualValues(t, 1, delivered.Load(), "one onward event")
	default:
		assert.EqualValues(t, 1, e.onward(), "one onward event")
	}
}

// onward counts the order.shipped events in the table (Persistent mode;
// the other modes keep none there).
func (e *testEnv) onward() int64 {
	if e.ob.Mode() != Persistent {
		return 0
	}
	return e.count("event_type = ?", "order.shipped")
}

// testConsumeInTransaction: in the caller's transaction the record commits
// and rolls back with it; a second Consume of the pair in the same
// transaction skips fn.
func testConsumeInTransaction(t *testing.T, e *testEnv) {
	var calls atomic.Int64
	outerFails := errors.New("outer transaction fails")
	err := e.db.Transaction(func(tx *gorm.DB) error {
		require.NoError(t, Consume(tx, "billing", "msg-tx", effect(707, &calls)))
		return outerFails
	})
	require.ErrorIs(t, err, outerFails)
	assert.EqualValues(t, 0, e.inboxRows(""), "rolled back with the caller's transaction")
	assert.EqualValues(t, 0, e.effects(707))

	require.NoError(t, e.db.Transaction(func(tx *gorm.DB) error {
		if err := Consume(tx, "billing", "msg-tx", effect(707, &calls)); err != nil {
			return err
		}
		return Consume(tx, "billing", "msg-tx", effect(707, &calls))
	}))
	assert.EqualValues(t, 2, calls.Load(), "once per transaction that committed or not, never twice in one")
	assert.EqualValues(t, 1, e.effects(707))
	assert.EqualValues(t, 1, e.inboxRows("billing"))

	// fn failing inside the caller's transaction rolls back to the
	// savepoint: the caller's own work survives, the pair is not recorded.
	require.NoError(t, e.db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Create(&Order{Total: 708}).Error; err != nil {
			return err
		}
		err := Consume(tx, "billing", "msg-tx-2", func(tx *gorm.DB) error {
			if err := tx.Create(&Order{Total: 709}).Error; err != nil {
				return err
			}
			return errors.New("fn fails")
		})
		require.Error(t, err)
		return nil
	}))
	assert.EqualValues(t, 1, e.effects(708))
	assert.EqualValues(t, 0, e.effects(709))
	require.NoError(t, Consume(e.db, "billing", "msg-tx-2", effect(709, &calls)))
	assert.EqualValues(t, 1, e.effects(709), "the pair was not recorded: the redelivery runs")
}

func testConsumeBadInput(t *testing.T, e *testEnv) {
	var calls atomic.Int64
	fn := effect(808, &calls)
	long := strings.Repeat("é", MaxInboxIDLen+1)
	for _, c := range []struct{ consumer, message string }{
		{"", "m"}, {"c", ""}, {long, "m"}, {"c", long}, {"c", "bad\xff"}, {"c", "nul\x00"},
	} {
		err := Consume(e.db, c.consumer, c.message, fn)
		assert.ErrorIs(t, err, ErrInvalidInboxID, "consumer %q message %q", c.consumer, c.message)
	}
	assert.ErrorIs(t, Consume(e.db, "c", "m", nil), ErrInvalidEvent)
	assert.EqualValues(t, 0, calls.Load())
	// The longest accepted fits the column on every database.
	require.NoError(t, Consume(e.db, strings.Repeat("é", MaxInboxIDLen), strings.Repeat("ü", MaxInboxIDLen), fn))
	assert.EqualValues(t, 1, calls.Load())
}

// TestCheckInboxID: the check the adapters use is Consume's own.
func TestCheckInboxID(t *testing.T) {
	for _, bad := range []string{"", strings.Repeat("é", MaxInboxIDLen+1), "bad\xff", "nul\x00"} {
		assert.ErrorIs(t, CheckInboxID(bad), ErrInvalidInboxID, "%q", bad)
	}
	assert.NoError(t, CheckInboxID(strings.Repeat("é", MaxInboxIDLen)))
	assert.NoError(t, CheckInboxID("evt-0192"))
}

func testConsumeWithoutPlugin(t *testing.T, b backend) {
	db := b.open(t, &gorm.Config{})
	fn := func(*gorm.DB) error { t.Error("fn ran without the plugin"); return nil }
	assert.ErrorIs(t, Consume(db, "c", "m", fn), ErrNotInstalled)
	assert.ErrorIs(t, db.Transaction(func(tx *gorm.DB) error { return Consume(tx, "c", "m", fn) }), ErrNotInstalled)
	assert.ErrorIs(t, Consume(nil, "c", "m", fn), ErrNotInstalled)
}

// testConsumeRetention: pairs older than InboxRetention are deleted by a
// later Consume, and a redelivery after the window runs fn again;
// RetainForever deletes none.
func testConsumeRetention(t *testing.T, b backend) {
	for _, keep := range []time.Duration{time.Hour, RetainForever} {
		t.Run(fmt.Sprint(keep), func(t *testing.T) {
			e := b.setup(t, withConfig(Config{InboxRetention: keep}))
			var calls atomic.Int64
			require.NoError(t, Consume(e.db, "billing", "old", effect(909, &calls)))
			e.clock.Advance(2 * time.Hour)
			e.ob.inboxForgetAt.Store(0) // the first Consume set the once-a-minute gate
			require.NoError(t, Consume(e.db, "billing", "new", effect(910, &calls)))
			var left []string
			require.NoError(t, e.db.Table(e.ob.inbox).Order("message_id").Pluck("message_id", &left).Error)
			if keep == RetainForever {
				assert.Equal(t, []string{"new", "old"}, left)
				require.NoError(t, Consume(e.db, "billing", "old", effect(909, &calls)))
				assert.EqualValues(t, 2, calls.Load(), "kept: the redelivery is a duplicate")
				return
			}
			assert.Equal(t, []string{"new"}, left, "the expired pair is deleted")
			require.NoError(t, Consume(e.db, "billing", "old", effect(909, &calls)))
			assert.EqualValues(t, 3, calls.Load(), "a redelivery after the window runs fn again")
		})
	}
}

// testConsumeIDsKeptExactly: IDs that quoting could get wrong are recorded
// as they are and deduplicated. On MySQL the inbox INSERT's values travel
// as literals (with and without multiStatements).
func testConsumeIDsKeptExactly(t *testing.T, e *testEnv) {
	ids := []string{
		`it's`, `back\slash`, `\'`, `'); DROP TABLE orders; --`, `\'); DROP TABLE orders; --`,
		`$1`, `?`, `$$`, `$q$`, `E'x'`, "tab\there", "new\nline", "ünï©ødé 🎉", `%s`, `X'41'`, `_utf8mb4 'a'`,
	}
	var calls atomic.Int64
	for _, id := range ids {
		for range 2 {
			require.NoError(t, Consume(e.db, "c'o\\n", id, effect(909, &calls)), "message %q", id)
		}
	}
	assert.EqualValues(t, len(ids), calls.Load(), "each message once")
	assert.EqualValues(t, len(ids), e.effects(909))
	if e.ob.Mode() == Memory {
		return
	}
	var got []string
	require.NoError(t, e.db.Table(e.ob.inbox).Where("consumer = ?", "c'o\\n").Order("message_id").Pluck("message_id", &got).Error)
	assert.ElementsMatch(t, ids, got, "recorded exactly as given")
}

// testConsumeLeavesConnectionClean: however Consume's transaction ends
// (its INSERT failing, a statement of fn aborting the transaction on
// PostgreSQL, the context cancelled), nothing is recorded and the
// connection goes back to the pool outside any transaction: the next
// statement on it (the pool's only one) commits on its own.
func testConsumeLeavesConnectionClean(t *testing.T, b backend) {
	visible := func(t *testing.T, e *testEnv, total int) {
		t.Helper()
		// Without GORM's own transaction around it, whose BEGIN would end
		// (on MySQL, commit) one left open.
		require.NoError(t, e.db.Session(&gorm.Session{SkipDefaultTransaction: true}).Create(&Order{Total: total}).Error)
		var n int64
		require.NoError(t, e.reopen(t).Model(&Order{}).Where("total = ?", total).Count(&n).Error)
		assert.EqualValues(t, 1, n, "the statement after Consume committed on its own")
		sqlDB, err := e.db.DB()
		require.NoError(t, err)
		assert.Zero(t, sqlDB.Stats().InUse, "every connection is back in the pool")
	}
	setup := func(t *testing.T) *testEnv {
		e := b.setup(t)
		sqlDB, err := e.db.DB()
		require.NoError(t, err)
		sqlDB.SetMaxOpenConns(1)
		return e
	}

	t.Run("TheTransactionIsOrIsNotASQLTx", func(t *testing.T) {
		e := setup(t)
		var isSQLTx bool
		require.NoError(t, Consume(e.db, "billing", "m", func(tx *gorm.DB) error {
			_, isSQLTx = SQLTx(tx)
			return tx.Create(&Order{Total: 1}).Error
		}))
		// The inbox INSERT travels with the BEGIN on a connection held
		// out of the pool, which database/sql cannot make a *sql.Tx of.
		assert.Equal(t, !b.lead, isSQLTx)
		visible(t, e, 2)
	})
	t.Run("InboxInsertFails", func(t *testing.T) {
		e := setup(t)
		require.NoError(t, e.db.Migrator().DropTable(e.ob.inbox))
		var calls atomic.Int64
		err := Consume(e.db, "billing", "m", effect(3, &calls))
		require.Error(t, err)
		assert.Contains(t, err.Error(), "record message")
		assert.Zero(t, calls.Load())
		visible(t, e, 4)
	})
	t.Run("ContextCancelledInFn", func(t *testing.T) {
		e := setup(t)
		ctx, cancel := context.WithCancel(t.Context())
		err := Consume(e.db.WithContext(ctx), "billing", "m", func(tx *gorm.DB) error {
			if err := tx.Create(&Order{Total: 5}).Error; err != nil {
				return err
			}
			cancel()
			return nil
		})
		require.Error(t, err)
		assert.Zero(t, e.inboxRows(""))
		assert.Zero(t, e.effects(5))
		visible(t, e, 6)
	})
	if b.name != "postgres" {
		return
	}
	t.Run("FnIgnoresAFailedStatement", func(t *testing.T) {
		e := setup(t)
		err := Consume(e.db, "billing", "m", func(tx *gorm.DB) error {
			if err := tx.Create(&Order{Total: 7}).Error; err != nil {
				return err
			}
			// PostgreSQL aborts the transaction; its COMMIT then rolls back.
			_ = tx.Exec("SELECT 1/0").Error
			return nil
		})
		require.Error(t, err, "a COMMIT that rolled back is no success")
		assert.Zero(t, e.inboxRows(""))
		assert.Zero(t, e.effects(7))
		visible(t, e, 8)
	})
}

// testConsumeNested: inside fn, a nested transaction is a savepoint whose
// rollback keeps fn's other work, and AfterCommit runs once, after the
// commit.
func testConsumeNested(t *testing.T, e *testEnv) {
	var ran atomic.Int64
	require.NoError(t, Consume(e.db, "billing", "m-nested", func(tx *gorm.DB) error {
		AfterCommit(tx, func() { ran.Add(1) })
		if err := tx.Create(&Order{Total: 11}).Error; err != nil {
			return err
		}
		err := tx.Transaction(func(tx *gorm.DB) error {
			AfterCommit(tx, func() { ran.Add(100) })
			if err := tx.Create(&Order{Total: 12}).Error; err != nil {
				return err
			}
			return errors.New("inner fails")
		})
		require.Error(t, err)
		assert.Zero(t, ran.Load(), "nothing runs before the commit")
		return nil
	}))
	assert.EqualValues(t, 1, ran.Load(), "the outer hook ran once; the rolled-back savepoint's did not")
	assert.EqualValues(t, 1, e.effects(11))
	assert.Zero(t, e.effects(12))
	assert.EqualValues(t, 1, e.inboxRows("billing"))
}

// testConsumePreparedSession: a PrepareStmt session inside fn works in
// Consume's transaction, also with the statements GORM cached in an earlier
// one (whose connection has gone back to the pool).
func testConsumePreparedSession(t *testing.T, e *testEnv) {
	for i, msg := range []string{"m-prep-1", "m-prep-2", "m-prep-3"} {
		require.NoError(t, Consume(e.db, "billing", msg, func(tx *gorm.DB) error {
			return tx.Session(&gorm.Session{PrepareStmt: true}).Create(&Order{Total: 1200 + i}).Error
		}))
	}
	err := Consume(e.db, "billing", "m-prep-4", func(tx *gorm.DB) error {
		if err := tx.Session(&gorm.Session{PrepareStmt: true}).Create(&Order{Total: 1204}).Error; err != nil {
			return err
		}
		return errors.New("rolls back")
	})
	require.Error(t, err)
	for i := range 3 {
		assert.EqualValues(t, 1, e.effects(1200+i))
	}
	assert.Zero(t, e.effects(1204), "the prepared statement ran in the transaction that rolled back")
	assert.EqualValues(t, 3, e.inboxRows("billing"))
}

// testConsumeManyWaitForRolledBackFirst: several deliveries waiting on a
// first one that rolls back all end without an error, and one of them runs
// fn. On MySQL the waiters' duplicate checks hold shared locks that their
// inserts then wait on, one another's: InnoDB ends all but one of them in
// a deadlock, which Consume retries (its record was the transaction's first
// statement, so nothing of fn ran).
func testConsumeManyWaitForRolledBackFirst(t *testing.T, e *testEnv) {
	const waiters = 4
	first := e.holdDelivery(t, "msg-many", func(*gorm.DB) error { return nil })
	var calls atomic.Int64
	errs := make(chan error, waiters)
	for range waiters {
		go func() { errs <- Consume(e.db, "billing", "msg-many", effect(1301, &calls)) }()
	}
	// All the waiters must queue behind the first before it rolls back.
	first.waitQueued(t, waiters, errs)
	first.release()
	require.ErrorIs(t, <-first.err, errHeld)
	for range waiters {
		assert.NoError(t, <-errs)
	}
	assert.EqualValues(t, 1, calls.Load(), "one of the waiters runs fn")
	assert.EqualValues(t, 1, e.effects(1301))
	assert.EqualValues(t, 1, e.inboxRows("billing"))
}

// lockWaiters returns a count of the sessions waiting on a lock that tx's
// session holds (PostgreSQL; on MySQL/MariaDB, the sessions of the test's
// database stuck in the inbox INSERT), in table mode, or nil.
func (e *testEnv) lockWaiters(tx *gorm.DB) func() int64 {
	if e.ob.Mode() == Memory {
		return nil
	}
	var (
		query  string
		holder int64
	)
	switch e.name {
	case "postgres":
		query = "SELECT count(*) FROM pg_stat_activity WHERE ? = ANY(pg_blocking_pids(pid))"
		if err := tx.Raw("SELECT pg_backend_pid()").Scan(&holder).Error; err != nil {
			return nil
		}
	case "mysql":
		// information_schema's InnoDB tables show a waiting transaction
		// only now and then; the process list shows every session still
		// executing the inbox INSERT, which returns at once unless it waits.
		query = "SELECT count(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE() AND COMMAND = 'Query'" +
			" AND INFO LIKE '%INSERT IGNORE INTO `" + e.ob.inbox + "`%' AND ? >= 0"
	default:
		return nil
	}
	return func() int64 {
		var n int64
		if err := e.db.Raw(query, holder).Scan(&n).Error; err != nil {
			e.t.Errorf("count lock waiters: %v", err)
		}
		return n
	}
}

func init() {
	inboxTests["ConsumeDuplicateTold"] = forInboxModes(testConsumeDuplicateTold)
}

// testConsumeDuplicateTold: a redelivery of a consumed message calls the
// Duplicate hooks (and logs at debug); the first delivery, and a delivery
// after one that failed, do not.
func testConsumeDuplicateTold(t *testing.T, e *testEnv) {
	var mu sync.Mutex
	var told []string
	e.ob.AddHooks(Hooks{Duplicate: func(_ context.Context, consumer, id string) {
		mu.Lock()
		defer mu.Unlock()
		told = append(told, consumer+"/"+id)
	}})
	var calls atomic.Int64
	fn := effect(901, &calls)
	require.Error(t, Consume(e.db, "c", "m-1", func(*gorm.DB) error { return errors.New("not yet") }))
	require.NoError(t, Consume(e.db, "c", "m-1", fn))
	require.NoError(t, Consume(e.db, "c", "m-1", fn))
	require.NoError(t, Consume(e.db, "other", "m-1", fn))
	require.NoError(t, Consume(e.db, "c", "m-1", fn))
	assert.EqualValues(t, 2, calls.Load())
	mu.Lock()
	defer mu.Unlock()
	assert.Equal(t, []string{"c/m-1", "c/m-1"}, told, "each redelivery, nothing else")
}
