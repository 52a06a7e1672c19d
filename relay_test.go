package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

func publishN(t *testing.T, db *gorm.DB, typ string, n int) []string {
	t.Helper()
	ids := make([]string, n)
	events := make([]Event, n)
	for i := range n {
		ids[i] = fmt.Sprintf("%s-%05d", typ, i)
		events[i] = Event{ID: ids[i], Type: typ, Payload: i}
	}
	require.NoError(t, db.Transaction(func(tx *gorm.DB) error { return Publish(tx, events...) }))
	return ids
}

func testRelayDelivers(t *testing.T, b backend) {
	e := b.setup(t)
	c := &collector{}
	e.ob.Handle("order.created", c.handle)
	var ids []string
	batches := []int{3, 2, 0} // what each ProcessOnce delivers
	if b.logical {
		// A streamed batch holds whole transactions, up to BatchSize events
		// or just past it: transactions of 2, 2 and 1 events make batches
		// of 4 and 1.
		for i, n := range []int{2, 2, 1} {
			var events []Event
			for range n {
				ids = append(ids, fmt.Sprintf("order.created-%05d", len(ids)))
				events = append(events, Event{ID: ids[len(ids)-1], Type: "order.created", Payload: i})
			}
			require.NoError(t, e.db.Transaction(func(tx *gorm.DB) error { return Publish(tx, events...) }))
		}
		batches = []int{4, 1, 0}
	} else {
		ids = publishN(t, e.db, "order.created", 5)
	}

	r := e.relay(RelayConfig{BatchSize: 3, Workers: 1})
	for i, want := range batches {
		n, err := r.ProcessOnce(t.Context())
		require.NoError(t, err)
		assert.Equal(t, want, n, "ProcessOnce %d", i+1)
	}

	assert.Equal(t, ids, c.ids(), "oldest first")
	rec := e.record(ids[0])
	assert.Equal(t, StatusSent, rec.Status)
	require.NotNil(t, rec.SentAt)
	assert.WithinDuration(t, e.clock.Now(), *rec.SentAt, time.Second)
	assert.Nil(t, rec.LockedUntil)
	assert.Equal(t, 1, rec.Attempts)
	assert.EqualValues(t, 5, e.count("status = ?", StatusSent))
}

func testRelayRetries(t *testing.T, b backend) {
	e := b.setup(t)
	var calls atomic.Int32
	e.ob.Handle("x", func(context.Context, Event) error {
		calls.Add(1)
		return errors.New("downstream unavailable")
	})
	publishN(t, e.db, "x", 1)
	var backoffs []int
	r := e.relay(RelayConfig{MaxAttempts: 3, Backoff: func(attempt int) time.Duration {
		backoffs = append(backoffs, attempt)
		return time.Hour
	}})

	n, err := r.ProcessOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, n)
	rec := e.record("x-00000")
	assert.Equal(t, StatusPending, rec.Status)
	assert.Equal(t, 1, rec.Attempts)
	require.NotNil(t, rec.LastError)
	assert.Contains(t, *rec.LastError, "downstream unavailable")
	assert.WithinDuration(t, e.clock.Now().Add(time.Hour), rec.AvailableAt, time.Second)

	// Not due until the backoff has passed.
	n, err = r.ProcessOnce(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 0, n)

	for range 2 {
		e.clock.Advance(time.Hour + time.Second)
		n, err = r.ProcessOnce(t.Context())
		require.NoError(t, err)
		require.Equal(t, 1, n)
	}
	rec = e.record("x-00000")
	assert.Equal(t, StatusFailed, rec.Status, "failed after MaxAttempts")
	assert.Equal(t, 3, rec.Attempts)
	assert.Equal(t, []int{1, 2}, backoffs)
	assert.EqualValues(t, 3, calls.Load())

	e.clock.Advance(24 * time.Hour)
	n, err = r.ProcessOnce(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 0, n, "failed rows stay for a human")
}

func testRelayRetryAfterAndAttempt(t *testing.T, b backend) {
	e := b.setup(t)
	var attempts []int
	e.ob.Handle("x", func(ctx context.Context, _ Event) error {
		attempts = append(attempts, Attempt(ctx))
		return RetryAfter(errors.New("429 too many requests"), 2*time.Hour)
	})
	publishN(t, e.db, "x", 1)
	r := e.relay(RelayConfig{Backoff: func(int) time.Duration { return time.Second }})
	_, err := r.ProcessOnce(t.Context())
	require.NoError(t, err)
	rec := e.record("x-00000")
	assert.WithinDuration(t, e.clock.Now().Add(2*time.Hour), rec.AvailableAt, time.Second, "RetryAfter overrides Backoff")
	require.NotNil(t, rec.LastError)
	assert.Contains(t, *rec.LastError, "429 too many requests")

	e.clock.Advance(2*time.Hour + time.Second)
	_, err = r.ProcessOnce(t.Context())
	require.NoError(t, err)
	assert.Equal(t, []int{1, 2}, attempts)
	assert.Equal(t, 0, Attempt(t.Context()))
}

func testRelayPermanentAndReplay(t *testing.T, b backend) {
	e := b.setup(t)
	var fail atomic.Bool
	fail.Store(true)
	c := &collector{}
	e.ob.Handle("x", func(ctx context.Context, ev Event) error {
		if fail.Load() {
			return Permanent(errors.New("422 unprocessable"))
		}
		return c.handle(ctx, ev)
	})
	publishN(t, e.db, "x", 2)
	r := e.relay(RelayConfig{})
	_, err := r.ProcessOnce(t.Context())
	require.NoError(t, err)
	assert.EqualValues(t, 2, e.count("status = ?", StatusFailed), "a permanent error fails at once")

	fail.Store(false)
	n, err := e.ob.Replay(e.db, Filter{IDs: []string{"x-00000", "no-such-id"}})
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	rec := e.record("x-00000")
	assert.Equal(t, StatusPending, rec.Status)
	assert.Equal(t, 0, rec.Attempts)

	n, err = e.ob.Replay(e.db, Filter{IDs: []string{"no-such-id"}})
	require.NoError(t, err)
	assert.Equal(t, 0, n)

	_, err = r.ProcessOnce(t.Context())
	require.NoError(t, err)
	assert.Equal(t, []string{"x-00000"}, c.ids())
	assert.Equal(t, StatusSent, e.record("x-00000").Status)
	assert.Equal(t, StatusFailed, e.record("x-00001").Status)
}

func testRelayPanicAndNoHandler(t *testing.T, b backend) {
	logs := &syncBuffer{}
	e := b.setup(t, withConfig(Config{Logger: slog.New(slog.NewTextHandler(logs, nil))}))
	e.ob.Handle("panics", func(context.Context, Event) error { panic("nil map write") })
	publishN(t, e.db, "panics", 1)
	publishN(t, e.db, "unhandled", 1)
	c := &collector{}
	e.ob.Handle("fine", c.handle)
	publishN(t, e.db, "fine", 1)

	_, err := e.relay(RelayConfig{MaxAttempts: 5}).ProcessOnce(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 1, c.len(), "other events keep flowing")

	p := e.record("panics-00000")
	assert.Equal(t, StatusPending, p.Status)
	assert.Equal(t, 1, p.Attempts)
	require.NotNil(t, p.LastError)
	assert.Contains(t, *p.LastError, "handler panicked: nil map write at github.com/gorm-outbox/outbox.testRelayPanicAndNoHandler.func1 (relay_test.go:")
	// The stored error names where, not the whole stack: it is what the CLI
	// and the dashboard show, and a stack holds the build machine's paths.
	assert.NotContains(t, *p.LastError, "goroutine", "no stack trace in last_error")
	assert.NotContains(t, *p.LastError, "/relay_test.go", "no file paths in last_error")
	assert.Less(t, len(*p.LastError), 400)
	assert.Equal(t, 1, strings.Count(logs.String(), "[running]"), "the full stack is logged once:\n%s", logs.String())
	assert.Contains(t, logs.String(), "level=ERROR msg=\"outbox: handler panicked\"")

	u := e.record("unhandled-00000")
	assert.Equal(t, StatusPending, u.Status, "an event with no handler is never marked sent")
	require.NotNil(t, u.LastError)
	assert.Contains(t, *u.LastError, "no handler registered")
}

func testRelayConcurrent(t *testing.T, b backend) {
	e := b.setup(t)
	var mu sync.Mutex
	seen := map[string]int{}
	e.ob.Handle("x", func(_ context.Context, ev Event) error {
		mu.Lock()
		seen[ev.ID]++
		mu.Unlock()
		return nil
	})
	const total = 400
	publishN(t, e.db, "x", total)

	var wg sync.WaitGroup
	errs := make(chan error, 4)
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r := mustRelay(t, e.ob, e.db, RelayConfig{BatchSize: 25})
			for {
				n, err := r.ProcessOnce(t.Context())
				if err != nil {
					errs <- err
					return
				}
				if n == 0 {
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		require.NoError(t, err)
	}
	assert.Len(t, seen, total)
	for id, n := range seen {
		if n != 1 {
			t.Errorf("event %s delivered %d times", id, n)
		}
	}
	assert.EqualValues(t, total, e.count("status = ?", StatusSent))
}

// testRelayStartedUnderALease: a relay started while a dead relay's lease
// holds rows below the newer ones claims them as soon as the lease passes,
// not at its next sweep (SweepEvery, 30 s, later): the first sweep set the
// watermark above them and nothing else looked at them.
func testRelayStartedUnderALease(t *testing.T, b backend) {
	e := b.setup(t)
	c := &collector{}
	e.ob.Handle("x", c.handle)
	// More rows than the first sweep's lookback (SweepLookback), so that
	// its watermark starts above the dead relay's rows.
	const rows = 1010
	publishN(t, e.db, "x", rows)
	if b.logical {
		e.parkInTable(t)
	}
	dead := e.relay(RelayConfig{})
	now := e.ob.now()
	lease := 10 * time.Second
	held, err := dead.claim(t.Context(), now, now.Add(lease), nil, 2)
	require.NoError(t, err)
	require.Len(t, held, 2)

	live := e.relay(RelayConfig{BatchSize: 1000}) // started now: its first sweep sees x-00002 open, x-00000 and x-00001 leased
	n, err := live.ProcessOnce(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 1000, n, "the rows no lease holds")
	n, err = live.ProcessOnce(t.Context())
	require.NoError(t, err)
	assert.Equal(t, rows-1002, n)

	e.clock.Advance(lease + time.Second) // well within SweepEvery
	n, err = live.ProcessOnce(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 2, n, "the dead relay's rows, once its lease passed")
	assert.Equal(t, rows, c.len())
}

func testRelayExpiredLease(t *testing.T, b backend) {
	e := b.setup(t)
	c := &collector{}
	e.ob.Handle("x", c.handle)
	publishN(t, e.db, "x", 2)
	if b.logical { // Logical mode's Publish writes no row: another relay parks the events in the table
		e.parkInTable(t)
	}

	// A relay claims the batch and dies before recording anything.
	dead := e.relay(RelayConfig{Lease: time.Minute})
	now := e.ob.now()
	batch, err := dead.claim(t.Context(), now, now.Add(time.Minute), nil, 100)
	require.NoError(t, err)
	require.Len(t, batch, 2)

	live := e.relay(RelayConfig{Lease: time.Minute})
	n, err := live.ProcessOnce(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 0, n, "a live claim is not handed out again")

	e.clock.Advance(time.Minute + time.Second)
	n, err = live.ProcessOnce(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 2, n, "an expired claim is claimed again")
	assert.Len(t, c.ids(), 2)
	assert.Equal(t, 2, e.record("x-00000").Attempts, "the lost claim counts as an attempt")

	// The dead relay's late outcome is ignored: its lease is no longer the
	// row's.
	require.NoError(t, dead.release(t.Context(), []string{"x-00000"}, now.Add(time.Minute)))
	assert.Equal(t, StatusSent, e.record("x-00000").Status)

	// A row whose relays keep dying is eventually failed, not retried forever.
	publishN(t, e.db, "y", 1)
	if b.logical {
		e.parkInTable(t)
	}
	for range 2 {
		now := e.ob.now()
		_, err := dead.claim(t.Context(), now, now.Add(time.Minute), nil, 100)
		require.NoError(t, err)
		e.clock.Advance(time.Minute + time.Second)
	}
	e.ob.Handle("y", c.handle)
	_, err = e.relay(RelayConfig{MaxAttempts: 2}).ProcessOnce(t.Context())
	require.NoError(t, err)
	y := e.record("y-00000")
	assert.Equal(t, StatusFailed, y.Status)
	require.NotNil(t, y.LastError)
	assert.Contains(t, *y.LastError, "abandoned")
	assert.Len(t, c.ids(), 2, "an abandoned row is not delivered")
}

func testRelayLeaseBudget(t *testing.T, b backend) {
	e := b.setup(t)
	const lease = 2 * time.Second
	var started []string
	var deadlines, calls []time.Time
	var mu sync.Mutex
	e.ob.Handle("x", func(ctx context.Context, ev Event) error {
		called := time.Now()
		mu.Lock()
		started = append(started, ev.ID)
		deadline, _ := ctx.Deadline()
		deadlines, calls = append(deadlines, deadline), append(calls, called)
		mu.Unlock()
		// A handler that blocks until its deadline: it must end before the
		// lease does.
		<-ctx.Done()
		return ctx.Err()
	})
	publishN(t, e.db, "x", 3)
	r := e.relay(RelayConfig{Lease: lease, Workers: 1})
	begin := time.Now()
	n, err := r.ProcessOnce(t.Context())
	require.NoError(t, err)
	mu.Lock()
	defer mu.Unlock()
	if b.logical {
		// ProcessOnce streams a batch, then claims one from the table: the
		// streamed batch spends its budget on x-00000 and hands the other
		// two to the table, due at once; the table's batch spends its own
		// on x-00001 and hands x-00002 back.
		assert.Equal(t, 3+2, n)
		assert.Equal(t, []string{"x-00000", "x-00001"}, started, "no delivery starts once its batch's lease budget is spent")
		for i := range deadlines {
			assert.True(t, deadlines[i].Before(calls[i].Add(lease)), "the handler's deadline ends before the lease: %v after the call", deadlines[i].Sub(calls[i]))
		}
		second := e.record("x-00001")
		assert.Equal(t, 1, second.Attempts, "the table's batch counts its one attempt")
		require.NotNil(t, second.LastError)
		assert.Contains(t, *second.LastError, "deadline exceeded")
	} else {
		assert.Equal(t, 3, n)
		assert.True(t, deadlines[0].Before(begin.Add(lease)), "the handler's deadline ends before the lease: %v after the claim", deadlines[0].Sub(begin))
		assert.Equal(t, []string{"x-00000"}, started, "no delivery starts once the lease budget is spent")
	}

	first := e.record("x-00000")
	assert.Equal(t, 1, first.Attempts)
	require.NotNil(t, first.LastError)
	assert.Contains(t, *first.LastError, "deadline exceeded")
	undelivered := []string{"x-00001", "x-00002"}
	if b.logical {
		undelivered = undelivered[1:]
	}
	for _, id := range undelivered {
		rec := e.record(id)
		assert.Equal(t, StatusPending, rec.Status)
		assert.Equal(t, 0, rec.Attempts, "an undelivered claim is handed back without counting an attempt")
		assert.Nil(t, rec.LockedUntil)
	}
}

func testRelayRun(t *testing.T, b backend) {
	e := b.setup(t)
	got := make(chan string, 10)
	e.ob.Handle("x", func(_ context.Context, ev Event) error { got <- ev.ID; return nil })
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- e.relay(RelayConfig{PollInterval: 10 * time.Millisecond}).Run(ctx) }()

	publishN(t, e.db, "x", 2)
	// Workers deliver a batch concurrently: any order.
	var ids []string
	for range 2 {
		select {
		case id := <-got:
			ids = append(ids, id)
		case <-time.After(10 * time.Second):
			t.Fatal("relay did not deliver")
		}
	}
	assert.ElementsMatch(t, []string{"x-00000", "x-00001"}, ids)
	cancel()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return after cancel")
	}
	require.Eventually(t, func() bool { return e.count("status = ?", StatusSent) == 2 }, 5*time.Second, 10*time.Millisecond)
}

func testRelayConfig(t *testing.T, b backend) {
	e := b.setup(t)
	for _, cfg := range []RelayConfig{{BatchSize: -1}, {PollInterval: -1}, {MaxAttempts: -1}, {Lease: -time.Second}} {
		r, err := e.ob.Relay(e.db, cfg)
		require.ErrorIs(t, err, ErrInvalidConfig, "returned at construction")
		assert.Nil(t, r, "with no relay")
	}
	other := Plugin(Config{})
	_, err := other.Relay(e.db, RelayConfig{})
	require.ErrorIs(t, err, ErrNotInstalled)
}

func TestNotifyGapBacksOffUnderSustainedWrites(t *testing.T) {
	gap := minNotifyGap
	var gaps []time.Duration
	for range 6 {
		gap = nextNotifyGap(gap, true)
		gaps = append(gaps, gap)
	}
	assert.Equal(t, []time.Duration{2 * time.Millisecond, 4 * time.Millisecond, 8 * time.Millisecond,
		maxNotifyGap, maxNotifyGap, maxNotifyGap}, gaps, "while wake-ups keep waiting the gap doubles up to its cap")
	assert.Equal(t, minNotifyGap, nextNotifyGap(maxNotifyGap, false), "a NOTIFY that finds nothing waiting resets the gap: a lone commit is not delayed")
}

// TestNotifyCredit: a NOTIFY after a quiet spell skips the gap after it,
// the next one right behind it does not; and NOTIFYs sent as fast as the
// notifier lets them, one round trip each, stay at one per minNotifyGap
// over time, plus the burst.
func TestNotifyCredit(t *testing.T) {
	var c notifyCredit
	t0 := time.Unix(1_000_000, 0)
	assert.True(t, c.spend(t0), "the first NOTIFY skips the gap")
	assert.False(t, c.spend(t0.Add(100*time.Microsecond)), "the next, right behind it, waits the gap")
	assert.True(t, c.spend(t0.Add(time.Second)), "a NOTIFY after a quiet spell skips it again")

	for _, rtt := range []time.Duration{10 * time.Microsecond, 200 * time.Microsecond, 900 * time.Microsecond} {
		var c notifyCredit
		now, sent, free := t0, 0, 0
		end := t0.Add(time.Second)
		for now.Before(end) {
			now = now.Add(rtt) // the NOTIFY's round trip
			sent++
			if c.spend(now) {
				free++
			} else {
				now = now.Add(minNotifyGap) // the gap
			}
		}
		limit := int(time.Second/minNotifyGap) + notifyBurst
		assert.LessOrEqual(t, sent, limit, "round trip %v: NOTIFYs in 1 s", rtt)
		assert.Less(t, free, sent, "round trip %v: most NOTIFYs wait the gap", rtt)
	}
}

// TestCommitRate: wake-ups at the push latency's rate (500 a second) never
// make the pool busy, whatever the NOTIFYs' timing; faster than
// busyCommitRate they do, from the first whole window on, and a pool that
// slows down is judged quiet again one window later.
func TestCommitRate(t *testing.T) {
	t0 := time.Unix(1_000_000, 0)
	// run feeds wake-ups every interval for dur, observed each notifyEvery
	// (the NOTIFYs' pace), and returns the verdicts after the first window.
	run := func(r *commitRate, start time.Time, interval, notifyEvery, dur time.Duration) (busy, quiet int, end time.Time) {
		var pending uint64
		next := start
		for now := start; now.Before(start.Add(dur)); now = now.Add(interval) {
			pending++
			if now.Before(next) {
				continue
			}
			next = now.Add(notifyEvery)
			if b := r.observe(now, pending); now.Sub(start) > 2*rateWindow {
				if b {
					busy++
				} else {
					quiet++
				}
			}
			pending = 0
		}
		return busy, quiet, start.Add(dur)
	}
	for _, notifyEvery := range []time.Duration{0, minNotifyGap, 3 * time.Millisecond} {
		var r commitRate
		busy, quiet, _ := run(&r, t0, 2*time.Millisecond, notifyEvery, time.Second)
		assert.Zero(t, busy, "500 wake-ups a second, NOTIFYs every %v: never busy", notifyEvery)
		assert.NotZero(t, quiet)
	}
	var r commitRate
	busy, quiet, end := run(&r, t0, 400*time.Microsecond, minNotifyGap, time.Second)
	assert.Zero(t, quiet, "2,500 wake-ups a second: busy from the first window on")
	assert.NotZero(t, busy)
	busy, quiet, _ = run(&r, end, 5*time.Millisecond, busyGap, time.Second)
	assert.Zero(t, busy, "200 a second after the burst: quiet again after a window")
	assert.NotZero(t, quiet)
}

// A pool committing faster than busyCommitRate waits busyGap after each
// NOTIFY: the writers' commits share NOTIFYs instead of sending one a
// millisecond. The commits here come every 200 µs, each after the NOTIFY
// before it has returned, so without the rule the gap would stay at
// minNotifyGap.
func TestBusyPoolNotifiesLess(t *testing.T) {
	db := openSQLite(t, cgoSQLite, &gorm.Config{Logger: logger.Discard})
	sqlDB, err := db.DB()
	require.NoError(t, err)
	counter := &countingNotifier{}
	n := newNotifier(Plugin(Config{}), counter, sqlDB)
	const dur = 400 * time.Millisecond
	start := time.Now()
	signals := 0
	// time.Sleep's resolution is about a millisecond here: pace by the clock.
	for next := start; time.Since(start) < dur; next = next.Add(200 * time.Microsecond) {
		for time.Now().Before(next) {
			runtime.Gosched()
		}
		n.signal()
		signals++
	}
	elapsed := time.Since(start)
	if rate := float64(signals) / elapsed.Seconds(); rate < 2*busyCommitRate {
		t.Skipf("the machine paced %.0f commits a second, too few to judge (want %d)", rate, 2*busyCommitRate)
	}
	// Counted once the notifier has stopped: its last NOTIFY may follow
	// the last commit.
	require.Eventually(t, func() bool { return !n.running.Load() }, 10*time.Second, time.Millisecond)
	sent := int(counter.sent.Load())
	// The first window at up to one NOTIFY per minNotifyGap (and the
	// burst), then one per busyGap at most, and the one after the last
	// commit.
	limit := int(2*rateWindow/minNotifyGap) + notifyBurst + int(elapsed/busyGap) + 2
	assert.LessOrEqual(t, sent, limit, "%d commits in %v", signals, elapsed)
	assert.Positive(t, sent)
}

// countingNotifier is a store.Notifier whose NOTIFY only counts.
type countingNotifier struct {
	store.Notifier
	sent atomic.Int32
}

func (c *countingNotifier) PrepareNotify(context.Context, store.DB) (func(context.Context, store.DB) error, error) {
	return func(context.Context, store.DB) error { c.sent.Add(1); return nil }, nil
}

// A commit whose process runs a relay on the database wakes that relay and
// sends no NOTIFY: the NOTIFY would cost the writer and wake no relay that
// the woken one does not stand for. Without one, it notifies.
func TestNoNotifyWhenARelayOfThisProcessIsWoken(t *testing.T) {
	db := openSQLite(t, cgoSQLite, &gorm.Config{Logger: logger.Discard})
	sqlDB, err := db.DB()
	require.NoError(t, err)
	o := Plugin(Config{})
	s := o.siteOf(sqlDB)
	counter := &countingNotifier{}
	s.notifier = newNotifier(o, counter, sqlDB)
	w := s.wakers.add()
	o.published(s, nil)
	select {
	case <-w.wake:
	default:
		t.Fatal("the relay of this process was not woken")
	}
	assert.False(t, s.notifier.running.Load(), "no NOTIFY")
	assert.Empty(t, s.notifier.poke)

	s.wakers.remove(w)
	o.published(s, nil)
	require.Eventually(t, func() bool { return counter.sent.Load() == 1 }, 10*time.Second, time.Millisecond, "no relay here: NOTIFY")
	require.Eventually(t, func() bool { return !s.notifier.running.Load() }, 10*time.Second, time.Millisecond)
}
