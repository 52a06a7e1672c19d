package reliability

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// faultLease is the lease of the fault tests: rows a cut-off relay held
// become due again this long after their claim.
const faultLease = 2 * time.Second

// faultEnv is a PostgreSQL schema or a MySQL database with two views of
// it: direct (the writer and the test's own checks) and through a fault
// proxy (the relay).
type faultEnv struct {
	srv     server
	direct  *gorm.DB
	relayDB *gorm.DB
	ob      *outbox.Outbox // installed on relayDB
	wob     *outbox.Outbox // installed on direct, for Publish
	proxy   *faultProxy
	sink    *logSink
	got     *deliveries
}

// newFaultEnv sets up a schema or database on s. maxConns bounds the
// relay's pool (0: no bound); one connection makes "the connection the
// relay uses" definite.
func newFaultEnv(t *testing.T, s server, maxConns int) *faultEnv {
	return newFaultEnvDSN(t, s, s.fresh(t), maxConns)
}

func newFaultEnvDSN(t *testing.T, s server, dsn string, maxConns int) *faultEnv {
	e := &faultEnv{srv: s, sink: newLogSink(), got: newDeliveries()}
	e.direct = openGorm(t, s.open(dsn))
	e.wob = install(t, e.direct, outbox.Config{Logger: e.sink.logger()})
	e.proxy = newFaultProxy(t, s.addr(t, dsn))
	e.relayDB = openGorm(t, s.open(s.via(t, dsn, e.proxy.addr())))
	if maxConns > 0 {
		sqlDB, err := e.relayDB.DB()
		require.NoError(t, err)
		sqlDB.SetMaxOpenConns(maxConns)
	}
	e.ob = install(t, e.relayDB, outbox.Config{Logger: e.sink.logger(), DisableAutoMigrate: true, DisableNotify: true})
	return e
}

func (e *faultEnv) publish(t *testing.T, prefix string, n int) []string {
	t.Helper()
	ids := make([]string, n)
	events := make([]outbox.Event, n)
	for i := range n {
		ids[i] = fmt.Sprintf("%s-%03d", prefix, i)
		events[i] = outbox.Event{ID: ids[i], Type: "x", Payload: i}
	}
	require.NoError(t, e.direct.Transaction(func(tx *gorm.DB) error { return outbox.Publish(tx, events...) }))
	return ids
}

func (e *faultEnv) relay(t *testing.T, cfg outbox.RelayConfig) *outbox.Relay {
	cfg.Lease = faultLease
	cfg.Backoff = noBackoff
	return outboxtest.Relay(t, e.ob, e.relayDB, cfg)
}

// claimedRows counts rows held by a live or dead claim.
func (e *faultEnv) claimedRows(t *testing.T) int64 {
	var n int64
	require.NoError(t, e.direct.Table(e.ob.Table()).
		Where("status = ? AND locked_until IS NOT NULL", outbox.StatusPending).Count(&n).Error)
	return n
}

func (e *faultEnv) sentRows(t *testing.T) int64 {
	return statusCounts(t, e.direct, e.ob.Table())[outbox.StatusSent]
}

// holdAt shuts direction dir of the proxy as soon as the relay sends the
// wire message that begins step (the bytes that carry it are held too when
// dir is toServer).
func (e *faultEnv) holdAt(dir int, step wireStep) {
	e.proxy.holdWhen(dir, e.srv.starts(step))
}

// warmUp delivers one full batch (batch events) through the relay, so that
// its (single) connection is open and, on PostgreSQL, the claim and the mark
// statements are prepared on it. The batch's seqs have a hole (a row
// written and deleted among them): a full claim that did not take the rows
// from the watermark on, seq after seq, makes the relay's next cycle walk
// its watermark first, so that the claim is that cycle's second statement
// (servers_test.go, claimCommit); after a claim without a hole the next
// claim walks only if 100 ms have passed.
func (e *faultEnv) warmUp(t *testing.T, r *outbox.Relay, batch int) {
	t.Helper()
	ids := e.publish(t, "warmup", batch+1)
	require.NoError(t, e.direct.Exec("DELETE FROM "+e.ob.Table()+" WHERE named_id = ?", ids[1]).Error)
	n, err := r.ProcessOnce(context.Background())
	require.NoError(t, err)
	require.Equal(t, batch, n)
}

// waitHeld waits until the proxy holds bytes it did not hold at before:
// the request of what, or its answer (then the server has executed, and
// committed, what).
func (e *faultEnv) waitHeld(t *testing.T, before int64, what string) {
	t.Helper()
	eventually(t, 30*time.Second, func() error {
		if e.proxy.held.Load() == before {
			return fmt.Errorf("nothing of %s held yet", what)
		}
		return nil
	})
}

type processResult struct {
	n   int
	err error
}

func processAsync(r *outbox.Relay) <-chan processResult {
	ch := make(chan processResult, 1)
	go func() {
		n, err := r.ProcessOnce(context.Background())
		ch <- processResult{n, err}
	}()
	return ch
}

func waitResult(t *testing.T, ch <-chan processResult) processResult {
	t.Helper()
	select {
	case res := <-ch:
		return res
	case <-time.After(bound(t, 60*time.Second)):
		t.Fatal("ProcessOnce did not return after the connection was cut")
	}
	return processResult{}
}

// checkAllDeliveredOnce asserts every id was delivered, and returns the
// number of redundant deliveries.
func (e *faultEnv) checkDelivered(t *testing.T, ids []string) (dups int) {
	t.Helper()
	for _, id := range ids {
		n := e.got.count(id)
		assert.Positive(t, n, "event %s lost", id)
		if n > 1 {
			dups += n - 1
		}
	}
	c := statusCounts(t, e.direct, e.ob.Table())
	assert.Zero(t, c[outbox.StatusPending], "rows left pending: %v", c)
	assert.Zero(t, c[outbox.StatusFailed], "rows failed: %v", c)
	return dups
}

// TestFaultCutMidClaim cuts the relay's connection at the round trip that
// commits its claim: PostgreSQL's UPDATE ... RETURNING, MySQL's COMMIT
// (after its locking SELECT and UPDATE). Either the claim committed on the
// server and its answer is lost, or the request never reached the server.
// The relay must report the error and deliver nothing. A committed claim's
// rows are claimed again once the orphaned lease expires, and that claim
// counts as an attempt; a claim that never committed leaves nothing behind
// (MySQL rolls its transaction back when the connection drops). Either way
// every event is delivered exactly once.
func TestFaultCutMidClaim(t *testing.T) {
	long(t, "cuts connections through a proxy and waits out leases")
	t.Parallel()
	forEachServer(t, func(t *testing.T, s server) {
		for _, tc := range []struct {
			name      string
			dir       int
			committed bool
		}{
			{"AnswerLost", toClient, true},
			{"RequestLost", toServer, false},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				const batch = 10
				e := newFaultEnv(t, s, 1)
				e.ob.Handle("x", e.got.handle)
				r := e.relay(t, outbox.RelayConfig{BatchSize: batch})
				e.warmUp(t, r, batch)
				ids := e.publish(t, "claim", 20)

				heldBefore := e.proxy.held.Load()
				e.holdAt(tc.dir, claimCommit)
				res := processAsync(r)
				e.waitHeld(t, heldBefore, "the claim")
				if tc.committed {
					require.EqualValues(t, batch, e.claimedRows(t), "the claim answered, so it committed")
				}
				e.proxy.cut()
				e.proxy.unhold(tc.dir)
				got := waitResult(t, res)
				require.Error(t, got.err, "the claim's answer was lost")
				for _, id := range ids {
					require.Zero(t, e.got.count(id), "nothing may be delivered from a claim the relay never saw")
				}

				start := time.Now()
				drain(t, e.direct, e.ob.Table(), r, 30*time.Second)
				dups := e.checkDelivered(t, ids)
				assert.Zero(t, dups, "a lost claim causes no duplicate")
				var reclaimed int64
				require.NoError(t, e.direct.Table(e.ob.Table()).Where("named_id IN ? AND attempts = 2", ids).Count(&reclaimed).Error)
				if tc.committed {
					assert.EqualValues(t, batch, reclaimed, "the lost claim counts as an attempt")
				} else {
					assert.Zero(t, reclaimed, "a claim that never committed counts no attempt")
				}
				t.Logf("FAULT-RESULT server=%s scenario=cut-mid-claim/%s events=%d delivered=%d lost=0 duplicated=%d reclaimed=%d claim_error=%q recovered_in=%v",
					s.name, tc.name, len(ids), len(ids), dups, reclaimed, got.err, time.Since(start).Round(time.Millisecond))
			})
		}
	})
}

// TestFaultCutMidDelivery cuts every connection while handlers are running
// and refuses new ones until they have returned, so the relay cannot record
// that it delivered the batch. Nothing may be lost: once the lease expires
// the batch is delivered again (at least once), and the redundant deliveries
// are at most one batch.
func TestFaultCutMidDelivery(t *testing.T) {
	long(t, "cuts connections through a proxy and waits out leases")
	t.Parallel()
	forEachServer(t, testFaultCutMidDelivery)
}

func testFaultCutMidDelivery(t *testing.T, s server) {
	e := newFaultEnv(t, s, 0)
	entered := make(chan struct{})
	release := make(chan struct{})
	var once sync.Once
	var blocking atomic.Bool
	blocking.Store(true)
	e.ob.Handle("x", func(ctx context.Context, ev outbox.Event) error {
		_ = e.got.handle(ctx, ev)
		if blocking.Load() {
			once.Do(func() { close(entered) })
			<-release
		}
		return nil
	})
	const batch = 10
	r := e.relay(t, outbox.RelayConfig{BatchSize: batch})
	ids := e.publish(t, "delivery", 25)

	res := processAsync(r)
	<-entered
	resume := e.proxy.outage()
	blocking.Store(false)
	close(release)
	got := waitResult(t, res)
	require.Error(t, got.err, "the outcome could not be recorded")
	assert.Equal(t, batch, got.n)
	resume()

	start := time.Now()
	drain(t, e.direct, e.ob.Table(), r, 30*time.Second)
	dups := e.checkDelivered(t, ids)
	assert.LessOrEqual(t, dups, batch, "redundant deliveries are bounded by the batch in flight")
	t.Logf("FAULT-RESULT server=%s scenario=cut-mid-delivery events=%d delivered=%d lost=0 duplicated=%d mark_error=%q recovered_in=%v",
		s.name, len(ids), len(ids), dups, got.err, time.Since(start).Round(time.Millisecond))
}

// TestFaultCutMidMark cuts the relay's connection while it records that a
// batch was delivered, at the mark's execution (on MySQL its preparation
// goes through): once after the server committed the mark (its answer is
// lost), once before the mark reached the server. The first costs nothing;
// the second redelivers at most the batch.
func TestFaultCutMidMark(t *testing.T) {
	long(t, "cuts connections through a proxy and waits out leases")
	t.Parallel()
	forEachServer(t, testFaultCutMidMark)
}

func testFaultCutMidMark(t *testing.T, s server) {
	for _, tc := range []struct {
		name      string
		dir       int
		committed bool
	}{
		{"AnswerLost", toClient, true},
		{"RequestLost", toServer, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			const batch = 10
			e := newFaultEnv(t, s, 1)
			var delivered atomic.Int64
			var arm atomic.Bool
			e.ob.Handle("x", func(ctx context.Context, ev outbox.Event) error {
				_ = e.got.handle(ctx, ev)
				if arm.Load() && delivered.Add(1) == batch {
					// The last handler of the batch returns: the next
					// statement the relay executes is the mark.
					e.holdAt(tc.dir, outcomeExec)
				}
				return nil
			})
			r := e.relay(t, outbox.RelayConfig{BatchSize: batch, Workers: 1})
			e.warmUp(t, r, batch)
			ids := e.publish(t, "mark", 20)
			heldBefore := e.proxy.held.Load()
			arm.Store(true)
			res := processAsync(r)
			e.waitHeld(t, heldBefore, "the mark")
			if tc.committed {
				// All of the batch, unless a slow delivery let the relay
				// write the first outcomes early and the held mark is the
				// rest's.
				require.Greater(t, e.sentRows(t), int64(1), "the mark answered, so it committed") // 1: the warm-up event
			}
			arm.Store(false)
			e.proxy.cut()
			e.proxy.unhold(tc.dir)
			// The relay retries an outcome statement on a fresh connection
			// (it is guarded by the lease, so repeating it is safe): the
			// cut may be invisible to ProcessOnce, and then nothing at all
			// is delivered twice.
			got := waitResult(t, res)

			drain(t, e.direct, e.ob.Table(), r, 30*time.Second)
			dups := e.checkDelivered(t, ids)
			if tc.committed || got.err == nil {
				assert.Zero(t, dups, "a mark that committed, or was retried, is not redone")
			} else {
				assert.LessOrEqual(t, dups, batch)
			}
			t.Logf("FAULT-RESULT server=%s scenario=cut-mid-mark/%s events=%d delivered=%d lost=0 duplicated=%d mark_error=%q",
				s.name, tc.name, len(ids), len(ids), dups, got.err)
		})
	}
}

// outageReport is what a Run-under-outages scenario measured.
type outageReport struct {
	published, delivered, duplicated int
	attempts                         []int64 // connection attempts during each outage
	cannotReach, recovered           int
}

// runThroughOutages runs Relay.Run through the proxy while a writer
// publishes steadily, calls outage(i) for each of n outages (it must return
// once the database is back), then checks that everything committed was
// delivered, that Run neither exited nor spun, and that it logged each
// outage once.
func runThroughOutages(t *testing.T, e *faultEnv, n int, outage func(i int)) outageReport {
	const batch = 20
	e.ob.Handle("x", e.got.handle)
	r := outboxtest.Relay(t, e.ob, e.relayDB, outbox.RelayConfig{
		BatchSize: batch, PollInterval: 50 * time.Millisecond, Lease: faultLease, Backoff: noBackoff,
	})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	runDone := make(chan error, 1)
	go func() { runDone <- r.Run(ctx) }()

	// The writer publishes an event every 5ms straight to the database; an
	// error (the server is down) just skips the tick. What committed is read
	// back from the table at the end.
	stopWriter := make(chan struct{})
	writerDone := make(chan struct{})
	var seq atomic.Int64
	go func() {
		defer close(writerDone)
		tick := time.NewTicker(5 * time.Millisecond)
		defer tick.Stop()
		for {
			select {
			case <-stopWriter:
				return
			case <-tick.C:
			}
			id := fmt.Sprintf("run-%06d", seq.Add(1))
			_ = e.direct.Transaction(func(tx *gorm.DB) error {
				return outbox.Publish(tx, outbox.Event{ID: id, Type: "x"})
			})
		}
	}()
	// progress waits until the relay has delivered two more batches.
	progress := func() {
		d0, _ := e.got.summary()
		eventually(t, 60*time.Second, func() error {
			if d, _ := e.got.summary(); d < d0+2*batch {
				return fmt.Errorf("%d delivered, waiting for %d", d, d0+2*batch)
			}
			return nil
		})
	}

	var rep outageReport
	progress()
	for i := range n {
		before := e.proxy.refused.Load()
		outage(i)
		rep.attempts = append(rep.attempts, e.proxy.refused.Load()-before)
		select {
		case err := <-runDone:
			t.Fatalf("Run returned during outage %d: %v", i+1, err)
		default:
		}
		progress()
	}
	close(stopWriter)
	<-writerDone

	var committed []string
	require.NoError(t, e.direct.Table(e.ob.Table()).Where("event_type = ?", "x").Pluck("named_id", &committed).Error)
	eventually(t, 60*time.Second, func() error {
		c := statusCounts(t, e.direct, e.ob.Table())
		if c[outbox.StatusPending] > 0 || c[outbox.StatusFailed] > 0 {
			return fmt.Errorf("statuses %v", c)
		}
		return nil
	})
	select {
	case err := <-runDone:
		t.Fatalf("Run returned before it was cancelled: %v", err)
	default:
	}
	cancel()
	select {
	case err := <-runDone:
		require.NoError(t, err)
	case <-time.After(bound(t, 30*time.Second)):
		t.Fatal("Run did not return after cancel")
	}

	rep.published = len(committed)
	for _, id := range committed {
		c := e.got.count(id)
		require.Positive(t, c, "committed event %s was never delivered", id)
		rep.duplicated += c - 1
	}
	rep.delivered, _ = e.got.summary()
	require.Equal(t, rep.published, rep.delivered, "an event was delivered that never committed")
	rep.cannotReach = e.sink.count("relay cannot reach the outbox table")
	rep.recovered = e.sink.count("relay recovered")
	assert.Equal(t, n, rep.cannotReach, "logged once per outage, not per attempt")
	assert.Equal(t, n, rep.recovered)
	assert.LessOrEqual(t, rep.duplicated, n*batch, "redundant deliveries: at most one batch per outage")
	return rep
}

// maxAttemptsPerOutage bounds the connections a relay may try during one
// outage of the lengths used here (about 1.5 s): Run backs off from
// PollInterval (50ms) doubling, so about six claims, each of which may try
// a few connections, plus the LISTEN connection's own backoff. A relay
// retrying without backoff would make thousands.
const maxAttemptsPerOutage = 40

// TestRelayRunSurvivesConnectionOutages cuts every connection of a running
// relay and refuses new ones for 1.5 s, twice, while events keep being
// committed.
func TestRelayRunSurvivesConnectionOutages(t *testing.T) {
	long(t, "connection outages under a running relay")
	t.Parallel()
	forEachServer(t, testRelayRunSurvivesConnectionOutages)
}

func testRelayRunSurvivesConnectionOutages(t *testing.T, s server) {
	e := newFaultEnv(t, s, 0)
	const outages = 2
	rep := runThroughOutages(t, e, outages, func(int) {
		resume := e.proxy.outage()
		timer := time.NewTimer(1500 * time.Millisecond) // the outage's length
		<-timer.C
		resume()
	})
	for i, a := range rep.attempts {
		assert.LessOrEqual(t, a, int64(maxAttemptsPerOutage), "outage %d: the relay spun", i+1)
	}
	t.Logf("FAULT-RESULT server=%s scenario=run-through-cuts outages=%d attempts_per_outage=%v events=%d delivered=%d lost=0 duplicated=%d cannot_reach_logs=%d recovered_logs=%d",
		s.name, outages, rep.attempts, rep.published, rep.delivered, rep.duplicated, rep.cannotReach, rep.recovered)
}
