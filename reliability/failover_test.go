package reliability

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
)

const (
	failoverRoundsEnv = "OUTBOX_FAILOVER_ROUNDS" // failovers per variant; default 2
	failoverSeedEnv   = "OUTBOX_FAILOVER_SEED"   // seed of the kill moments; default random

	failoverLease = 2 * time.Second
	failoverPoll  = 500 * time.Millisecond // RelayConfig's default
	failoverLoad  = 50                     // commits between two failovers before the kill moment is drawn

	foRelayApp = "outbox-fo-relay" // the relay's application_name
)

// claimSlack bounds how long after its lease expired (or the relay resumed,
// whichever is later) a claim the dead primary handed to the new one may
// wait: a poll, and a second of room, times the machine's load.
func claimSlack() time.Duration { return failoverPoll + byLoad(time.Second) }

// sweepBound bounds, with asynchronous replication, how long after its
// lease a row the new primary still has open waits when the relay's
// watermark (internal/engine/watermark.go), learnt on the old primary, has
// passed it: until the next sweep, every engine.SweepEvery (30s).
func sweepBound() time.Duration { return 30*time.Second + claimSlack() }

func failoverRelayConfig() outbox.RelayConfig {
	return outbox.RelayConfig{
		BatchSize:    10,
		Workers:      4,
		PollInterval: failoverPoll,
		Lease:        failoverLease,
		MaxAttempts:  1000, // failovers must not push a leased row to failed
		Backoff:      func(int) time.Duration { return 10 * time.Millisecond },
	}
}

// TestPostgresFailover runs a writer and a relay (Persistent mode) against
// a primary and a streaming standby through a multi-host DSN with
// target_session_attrs=read-write, and fails the primary over
// OUTBOX_FAILOVER_ROUNDS times (default 2) per variant: under load, at a
// random moment, the primary is stopped with an immediate shutdown, the
// standby is promoted (pg_ctl promote), and the old primary is rebuilt as
// the new standby (pg_basebackup -R into a fresh directory, same port).
// Writer and relay are left to find the new primary by themselves; they
// have separate Outboxes on separate pools, so that the relay learns of new
// events only through LISTEN/NOTIFY or its poll.
//
// With synchronous replication (synchronous_standby_names names the
// standby), every commit the writer saw succeed has its event delivered
// and nothing is delivered whose business row is absent from the final
// primary. With asynchronous replication each business row on the final
// primary has its event delivered and outbox row sent; the commits the
// writer saw succeed that the new primary lacks are counted (lost
// together with their outbox rows), and so are those of them whose event
// the relay had delivered before the kill (phantom: it read the primary
// ahead of the standby), which must be commits the writer made.
//
// Measured per failover: from the kill to the promotion, from the
// promotion to the relay's first delivery, to LISTEN attached again, the
// claims the dead primary handed over and how long after their lease they
// were delivered, and the push latency (commit to delivery) once LISTEN is
// back, which with synchronous replication must stay under half the poll
// interval. With asynchronous replication the relay's watermark, learnt on
// the old primary, can pass rows the new primary still has open; they wait
// for its sweep (engine.SweepEvery): bounded by sweepBound and reported.
func TestPostgresFailover(t *testing.T) {
	long(t, "primaries and standbys of its own, failed over under load")
	t.Parallel()
	rounds := envInt(t, failoverRoundsEnv, 2)
	seed := uint64(envInt(t, failoverSeedEnv, int(rand.Int32())))
	for _, v := range []struct {
		name        string
		sync, await bool
	}{{"sync", true, false}, {"async", false, false}, {"async-await", false, true}} {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			testFailover(t, v.sync, v.await, rounds, seed)
		})
	}
}

// foRound is what one failover measured.
type foRound struct {
	killedAt, promotedAt, resumedAt, listenAt time.Time
	caughtUpAt                                time.Time // the backlog of the outage delivered
	rebuild                                   time.Duration
	claims                                    []foClaim // handed over by the dead primary
}

type foClaim struct {
	id          string
	lockedUntil time.Time
}

// await runs the relay with RelayConfig.WaitReplicas 1 (asynchronous
// replication): no event may then be delivered whose business row the
// final primary lacks.
func testFailover(t *testing.T, syncRep, await bool, rounds int, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, seed))
	t.Logf("failover test (sync=%v, await=%v): %d rounds, seed %d (%s=%d reproduces the kill moments)", syncRep, await, rounds, seed, failoverSeedEnv, seed)
	start := time.Now()
	relayLog := &timedLog{}
	cl := startPgCluster(t, syncRep)

	writerDB := openGorm(t, postgres.Open(cl.dsn("outbox-fo-writer")))
	install(t, writerDB, outbox.Config{Logger: (&timedLog{}).logger()})
	require.NoError(t, writerDB.Exec(`CREATE TABLE fo_orders (id text PRIMARY KEY)`).Error)

	relayDB := openGorm(t, postgres.Open(cl.dsn(foRelayApp)))
	ob := install(t, relayDB, outbox.Config{Logger: relayLog.logger()})
	rec := newFoRecorder()
	ob.Handle("order.created", rec.handle)
	rcfg := failoverRelayConfig()
	if await {
		rcfg.WaitReplicas = 1
	}
	relay, err := ob.Relay(relayDB, rcfg)
	require.NoError(t, err)
	relayCtx, cancelRelay := context.WithCancel(context.Background())
	relayDone := make(chan error, 1)
	go func() { relayDone <- relay.Run(relayCtx) }()
	relayStopped := false
	stopRelay := func() {
		if !relayStopped {
			relayStopped = true
			cancelRelay()
			assert.NoError(t, <-relayDone)
		}
	}
	t.Cleanup(stopRelay)

	w := startFoWriter(t, writerDB)
	load := func() {
		t.Helper()
		base := w.committed()
		eventually(t, 60*time.Second, func() error {
			if n := w.committed(); n < base+failoverLoad {
				return fmt.Errorf("the writer committed %d of %d transactions", n-base, failoverLoad)
			}
			return nil
		})
	}

	var rs []foRound
	for range rounds {
		load()
		waitKillMoment(time.Duration(rng.IntN(700)) * time.Millisecond)
		var r foRound
		r.killedAt = time.Now()
		cl.kill(t)
		cl.promote(t)
		r.promotedAt = time.Now()
		r.claims = handedOverClaims(t, cl, ob, r.killedAt)
		began := time.Now()
		cl.rebuild(t)
		r.rebuild = time.Since(began)
		eventually(t, 60*time.Second, func() error {
			var ok bool
			if r.resumedAt, ok = rec.firstCallAfter(r.promotedAt); !ok {
				return errors.New("the relay has delivered nothing since the promotion")
			}
			if r.listenAt, ok = relayLog.firstAfter(r.killedAt, "listening for notifications again"); !ok {
				return errors.New("the relay has not attached LISTEN again since the kill")
			}
			// And it listens on the new primary.
			var listening int64
			if err := cl.queryRowArgs(`SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND query LIKE 'LISTEN %'`,
				[]any{foRelayApp}, &listening); err != nil {
				return err
			}
			if listening != 1 {
				return fmt.Errorf("the relay has %d LISTEN sessions on the new primary", listening)
			}
			return nil
		})
		// Caught up: no unclaimed pending row committed before now. The
		// push latency is measured from here on.
		mark := time.Now()
		eventually(t, 60*time.Second, func() error {
			var due int64
			if err := cl.queryRowArgs(`SELECT count(*) FROM `+ob.Table()+` WHERE status = $1 AND locked_until IS NULL AND created_at <= $2`,
				[]any{string(outbox.StatusPending), mark}, &due); err != nil {
				return err
			}
			if due > 0 {
				return fmt.Errorf("%d events committed before the relay resumed still due", due)
			}
			return nil
		})
		r.caughtUpAt = time.Now()
		rs = append(rs, r)
	}
	load() // committed and delivered with LISTEN back after the last failover
	load()
	w.stop()

	// Drain on the final primary: every row sent (claims of the dead
	// primary once their lease expired).
	eventually(t, 60*time.Second, func() error {
		var open int64
		if err := cl.queryRowArgs(`SELECT count(*) FROM `+ob.Table()+` WHERE status <> $1`, []any{string(outbox.StatusSent)}, &open); err != nil {
			return err
		}
		if open > 0 {
			return fmt.Errorf("%d outbox rows not sent", open)
		}
		return nil
	})
	stopRelay()

	// What the final primary holds.
	business := cl.ids(t, `SELECT id FROM fo_orders`)
	events := cl.ids(t, `SELECT `+ob.IDColumn()+` FROM `+ob.Table())
	n, first, _ := rec.snapshot()
	acked, unknown := w.outcomes()
	require.NotEmpty(t, acked, "the writer committed nothing: the test proves nothing")

	count := func(set map[string]bool, pred func(string) bool) (c int) {
		for id := range set {
			if pred(id) {
				c++
			}
		}
		return c
	}
	ackedSet := map[string]bool{}
	for id := range acked {
		ackedSet[id] = true
	}
	delivered := map[string]bool{}
	dup := 0
	for id, k := range n {
		delivered[id] = true
		dup += k - 1
	}
	assert.Zero(t, count(business, func(id string) bool { return !events[id] }), "a business row on the final primary has no outbox row")
	assert.Zero(t, count(events, func(id string) bool { return !business[id] }), "an outbox row on the final primary has no business row")
	undelivered := count(business, func(id string) bool { return !delivered[id] })
	assert.Zero(t, undelivered, "a business row on the final primary has its event undelivered")
	phantom := count(delivered, func(id string) bool { return !business[id] })
	assert.Zero(t, count(delivered, func(id string) bool { return strings.HasPrefix(id, "rb-") }), "an event of a rolled-back transaction was delivered")
	if syncRep || await {
		assert.Zero(t, phantom, "an event was delivered whose business row is absent from the final primary")
	} else {
		// Asynchronous replication: the relay reads the primary, which
		// commits before its WAL reaches the standby, so an event
		// delivered in the primary's last moments can lose its business
		// row with the primary (lost together, but delivered: the library
		// cannot prevent it). Each such event must be a commit of the old
		// primary that the writer made; counted and reported.
		for id := range delivered {
			if !business[id] {
				assert.True(t, ackedSet[id] || unknown[id], "event %s was delivered but never written", id)
			}
		}
	}
	absent := count(ackedSet, func(id string) bool { return !business[id] }) // lost together (async)
	lost := count(ackedSet, func(id string) bool { return !delivered[id] })  // committed, event never delivered
	if syncRep {
		assert.Zero(t, absent, "synchronous replication: a commit the writer saw succeed is absent from the final primary")
		assert.Zero(t, lost, "synchronous replication: a commit the writer saw succeed has its event undelivered")
	}
	unknownCommitted := count(unknown, func(id string) bool { return business[id] })
	assert.Zero(t, count(business, func(id string) bool { return !ackedSet[id] && !unknown[id] }), "a business row the writer never wrote")

	// Per failover: the relay resumed, LISTEN came back, and the claims
	// handed over were delivered after their lease and soon after it (or
	// marked sent by the dead primary's relay, its outcome write retried
	// onto the new primary).
	var (
		promote, resume, outage, listen, rebuild, catchUp []time.Duration
		claims                                            []int
		pastLease                                         time.Duration
		markedLate                                        int // handed over, then marked sent by the outcome write of a delivery before the kill
		sweptLate                                         int // async: handed over and found only by the watermark's sweep
		released                                          int // await: handed over, then handed back undelivered by its relay
	)
	for i, r := range rs {
		promote = append(promote, r.promotedAt.Sub(r.killedAt).Round(time.Millisecond))
		resume = append(resume, r.resumedAt.Sub(r.promotedAt).Round(time.Millisecond))
		outage = append(outage, r.resumedAt.Sub(r.killedAt).Round(time.Millisecond))
		listen = append(listen, r.listenAt.Sub(r.promotedAt).Round(time.Millisecond))
		rebuild = append(rebuild, r.rebuild.Round(time.Millisecond))
		catchUp = append(catchUp, r.caughtUpAt.Sub(r.resumedAt).Round(time.Millisecond))
		claims = append(claims, len(r.claims))
		for _, c := range r.claims {
			at, ok := rec.callAfter(c.id, r.promotedAt)
			if !ok {
				// Delivered before the kill, and its outcome write, which
				// the relay retries for engine.RecordWindow, reached the
				// new primary: sent without a second delivery.
				_, before := rec.callAfter(c.id, time.Time{})
				assert.True(t, before, "failover %d: claim %s handed over was never delivered", i+1, c.id)
				markedLate++
				continue
			}
			if first, _ := rec.callAfter(c.id, time.Time{}); await && !first.Before(r.promotedAt) {
				// WaitReplicas: the relay claimed it on the old primary,
				// waited for the standby, and handed it back undelivered
				// on the new one: the lease's holder gave it up, so it is
				// due before the lease's end (and delivered once).
				released++
				continue
			}
			assert.False(t, at.Before(c.lockedUntil), "failover %d: claim %s delivered at %v, before its lease ended at %v", i+1, c.id, at, c.lockedUntil)
			due := c.lockedUntil
			if r.resumedAt.After(due) {
				due = r.resumedAt
			}
			if syncRep {
				assert.LessOrEqual(t, at.Sub(due), claimSlack(), "failover %d: claim %s waited %v past its lease and the relay's return", i+1, c.id, at.Sub(due))
			} else {
				// Known: a row whose mark the new primary lost waits for the
				// watermark's sweep (see sweepBound); reported, bounded.
				assert.LessOrEqual(t, at.Sub(due), sweepBound(), "failover %d: claim %s waited %v past its lease and the relay's return", i+1, c.id, at.Sub(due))
				if at.Sub(due) > claimSlack() {
					sweptLate++
				}
			}
			pastLease = max(pastLease, at.Sub(c.lockedUntil))
		}
	}

	// Push latency: commit to first delivery of the events committed while
	// LISTEN was attached, before the first failover and after each (once
	// the relay caught up with the outage's backlog).
	firstDelivery, _ := rec.firstCallAfter(start)
	windows := [][2]time.Time{{firstDelivery, rs[0].killedAt}}
	for i, r := range rs {
		end := time.Now()
		if i+1 < len(rs) {
			end = rs[i+1].killedAt
		}
		windows = append(windows, [2]time.Time{r.caughtUpAt, end})
	}
	var pushP50, pushMax []time.Duration
	for i, win := range windows {
		var lat []time.Duration
		for id, at := range acked {
			if at.After(win[0]) && at.Before(win[1]) {
				if f, ok := first[id]; ok {
					lat = append(lat, max(0, f.Sub(at)))
				}
			}
		}
		if !assert.NotEmpty(t, lat, "window %d: no commit while LISTEN was attached", i) {
			continue
		}
		slices.Sort(lat)
		p50 := lat[len(lat)/2]
		pushP50 = append(pushP50, p50.Round(100*time.Microsecond))
		pushMax = append(pushMax, lat[len(lat)-1].Round(time.Millisecond))
		// With the writer's NOTIFY off (the relay polls) the medians were
		// 0.3-0.9s; with LISTEN attached, 1-5ms, up to 80ms on a loaded
		// machine, 360ms on one loaded 14 times over its CPUs: there the
		// bound grows with the load (and the log's "listening for
		// notifications again", checked above, still says LISTEN is back).
		// With asynchronous replication rows the watermark passed on the
		// old primary wait for its sweep (sweepBound): reported only.
		if syncRep {
			assert.Less(t, p50, byLoad(failoverPoll/2), "window %d: the median push latency is %v: the relay polls, LISTEN is not back", i, p50)
		}
	}

	cannotReach := relayLog.count("relay cannot reach the outbox table")
	recovered := relayLog.count("relay recovered")
	listenLost := relayLog.count("LISTEN connection lost")
	assert.LessOrEqual(t, cannotReach, rounds, "the relay logged an outage more than once per failover")
	assert.Empty(t, relayLog.errors("relay cannot reach the outbox table"), "the relay logged errors other than the outages")
	if await {
		// Until the old primary is rebuilt as the new standby, the new
		// primary has none: delivery waits, and says so once per failover.
		assert.LessOrEqual(t, relayLog.count("delivery paused until the standbys"), rounds+1)
	}

	if t.Failed() {
		// The timeline, for a failure seen once in a long run.
		for i, r := range rs {
			t.Logf("failover %d: killed %v promoted %v resumed %v listening %v caught up %v (since start)", i+1,
				r.killedAt.Sub(start), r.promotedAt.Sub(start), r.resumedAt.Sub(start), r.listenAt.Sub(start), r.caughtUpAt.Sub(start))
		}
		relayLog.mu.Lock()
		for _, rec := range relayLog.recs {
			t.Logf("relay log %v %v %s %s", rec.at.Sub(start), rec.level, rec.msg, rec.attrs)
		}
		relayLog.mu.Unlock()
	}
	variant := "async"
	if syncRep {
		variant = "sync"
	} else if await {
		variant = "async-await"
	}
	t.Logf("FAILOVER-RESULT variant=%s rounds=%d acked=%d unknown_outcome=%d unknown_committed=%d business_rows=%d delivered=%d lost=%d phantom=%d undelivered=%d lost_together=%d duplicated=%d kill_to_promoted=%v promoted_to_first_delivery=%v kill_to_first_delivery=%v promoted_to_listen=%v rebuild=%v caught_up_after=%v claims_handed_over=%v claims_marked_on_new_primary=%d claims_found_by_sweep=%d claims_handed_back=%d max_past_lease=%v push_p50=%v push_max=%v cannot_reach_logs=%d recovered_logs=%d listen_lost_logs=%d lease=%v poll=%v total=%v",
		variant, rounds, len(acked), len(unknown), unknownCommitted, len(business), len(delivered), lost, phantom, undelivered, absent, dup,
		promote, resume, outage, listen, rebuild, catchUp, claims, markedLate, sweptLate, released, pastLease.Round(time.Millisecond), pushP50, pushMax,
		cannotReach, recovered, listenLost, failoverLease, failoverPoll, time.Since(start).Round(time.Millisecond))
}

// handedOverClaims returns the claims the new primary holds that the relay
// took on the dead primary: pending rows whose lease began before the
// kill (it ends at most Lease after it; a claim on the new primary ends
// later).
func handedOverClaims(t *testing.T, cl *pgCluster, ob *outbox.Outbox, killedAt time.Time) []foClaim {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, cl.primaryDSN())
	require.NoError(t, err)
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT `+ob.IDColumn()+`, locked_until FROM `+ob.Table()+
		` WHERE status = $1 AND locked_until IS NOT NULL AND locked_until <= $2`,
		string(outbox.StatusPending), killedAt.Add(failoverLease))
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (foClaim, error) {
		var c foClaim
		err := row.Scan(&c.id, &c.lockedUntil)
		return c, err
	})
	require.NoError(t, err)
	return out
}

// ids returns the first column of query's rows on the primary, as a set.
func (c *pgCluster) ids(t *testing.T, query string) map[string]bool {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, c.primaryDSN())
	require.NoError(t, err)
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, query)
	require.NoError(t, err)
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	require.NoError(t, err)
	out := make(map[string]bool, len(ids))
	for _, id := range ids {
		out[id] = true
	}
	return out
}

// foWriter commits a business row and its event per transaction (every
// seventh rolled back on purpose) through a multi-host DSN, tolerating the
// errors of a failover: a transaction whose COMMIT failed has an unknown
// outcome, settled from the business table on the final primary.
type foWriter struct {
	mu      sync.Mutex
	acked   map[string]time.Time // committed, at the moment COMMIT returned
	unknown map[string]bool
	cancel  context.CancelFunc
	done    chan struct{}
}

func startFoWriter(t *testing.T, db *gorm.DB) *foWriter {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &foWriter{acked: map[string]time.Time{}, unknown: map[string]bool{}, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for seq := 0; ctx.Err() == nil; seq++ {
			id := fmt.Sprintf("fo-%06d", seq)
			rollback := seq%7 == 6
			if rollback {
				id = "rb-" + id
			}
			txCtx, txCancel := context.WithTimeout(ctx, 10*time.Second)
			err := db.WithContext(txCtx).Transaction(func(tx *gorm.DB) error {
				if err := tx.Exec(`INSERT INTO fo_orders (id) VALUES (?)`, id).Error; err != nil {
					return err
				}
				err := outbox.Publish(tx, outbox.Event{
					ID: id, Type: "order.created", AggregateType: "order", AggregateID: id,
					Payload: map[string]any{"seq": seq},
				})
				if err != nil {
					return err
				}
				if rollback {
					return errRollback
				}
				return nil
			})
			txCancel()
			switch {
			case rollback && errors.Is(err, errRollback):
			case err != nil:
				w.mu.Lock()
				w.unknown[id] = true
				w.mu.Unlock()
				sleepOrDone(ctx, 20*time.Millisecond) // the primary is away: try again shortly
			default:
				w.mu.Lock()
				w.acked[id] = time.Now()
				w.mu.Unlock()
				sleepOrDone(ctx, 2*time.Millisecond) // a steady writer, not a flood
			}
		}
	}()
	t.Cleanup(w.stop)
	return w
}

// stop stops the writer and waits for its last transaction.
func (w *foWriter) stop() {
	w.cancel()
	<-w.done
}

func (w *foWriter) committed() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.acked)
}

// outcomes returns copies of the commits seen to succeed and of those whose
// outcome is unknown.
func (w *foWriter) outcomes() (acked map[string]time.Time, unknown map[string]bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	acked = make(map[string]time.Time, len(w.acked))
	for k, v := range w.acked {
		acked[k] = v
	}
	unknown = make(map[string]bool, len(w.unknown))
	for k := range w.unknown {
		unknown[k] = true
	}
	return acked, unknown
}

// foRecorder is the relay's handler: it records every delivery's event ID
// and time.
type foRecorder struct {
	mu    sync.Mutex
	calls []foCall
}

type foCall struct {
	at time.Time
	id string
}

func newFoRecorder() *foRecorder { return &foRecorder{} }

func (r *foRecorder) handle(_ context.Context, e outbox.Event) error {
	r.mu.Lock()
	r.calls = append(r.calls, foCall{time.Now(), e.ID})
	r.mu.Unlock()
	return nil
}

// firstCallAfter returns the time of the first delivery after t.
func (r *foRecorder) firstCallAfter(t time.Time) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.calls {
		if c.at.After(t) {
			return c.at, true
		}
	}
	return time.Time{}, false
}

// callAfter returns the time of the first delivery of id after t.
func (r *foRecorder) callAfter(id string, t time.Time) (time.Time, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range r.calls {
		if c.id == id && c.at.After(t) {
			return c.at, true
		}
	}
	return time.Time{}, false
}

// snapshot returns the deliveries per event ID and the time of each
// event's first and last delivery.
func (r *foRecorder) snapshot() (n map[string]int, first, last map[string]time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	n, first, last = map[string]int{}, map[string]time.Time{}, map[string]time.Time{}
	for _, c := range r.calls {
		if n[c.id] == 0 {
			first[c.id] = c.at
		}
		n[c.id]++
		last[c.id] = c.at
	}
	return n, first, last
}
