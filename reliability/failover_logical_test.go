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
	"gorm.io/gorm/logger"
)

const (
	logicalFailoverRoundsEnv = "OUTBOX_LOGICAL_FAILOVER_ROUNDS" // failovers per variant; default 2

	lfoSlot     = "lfo_slot"
	lfoLoad     = 40 // commits between two failovers before the kill moment is drawn
	lfoPoll     = 100 * time.Millisecond
	lfoNoSlots  = 3 // ErrNoSlot refusals the writer must see on the new primary before a slot is created
	lfoRelayApp = "outbox-lfo-relay"

	// What the library logs (internal/wal/stream.go, internal/store/postgres/logical.go).
	lfoGoneLog     = "the replication slot is gone"
	lfoReplacedLog = "slot was gone although its publication exists"
	lfoNewSlotLog  = "in place of the lost one"
)

func lfoConfig(l *timedLog) outbox.Config {
	return outbox.Config{Mode: outbox.Logical, Logical: outbox.LogicalConfig{Slot: lfoSlot}, Logger: l.logger()}
}

// TestLogicalFailover is TestPostgresFailover's rig (a primary, a
// streaming standby, clients on a multi-host DSN with
// target_session_attrs=read-write) with wal_level=logical and the outbox in
// Logical mode. On PostgreSQL 15 a logical slot exists only on the
// primary: after the promotion the new primary has the publication but no
// slot, and the events committed on the old primary that the relay had not
// streamed cannot be decoded from the new one. Per failover it asserts
// what the library promises (docs/logical.md, "Standbys and failover"):
//
//   - a: Publish on the new primary fails with ErrNoSlot until a slot
//     exists: no commit succeeds there before one is created, and the
//     writer's errors there are ErrNoSlot;
//   - b: the relay logs at Error that the slot is gone, with
//     delivered_lsn, and its Outbox's Stats.SlotLost counts it, once;
//   - c: a new process installing the plugin (db.Use) creates the slot and
//     logs at Error that it replaces a lost one (its Stats.SlotLost is 1);
//   - d: the relay streams the new slot, says so at Error, and delivers
//     what is committed from then on.
//
// And it measures the window: the events whose commit the writer saw
// succeed on the old primary, whose business row the new primary has, and
// that were never delivered (the old slot had not streamed them), and,
// the other way round, the events delivered whose business row the new
// primary lacks (the relay decoded the old primary ahead of the standby).
// It fails on a phantom (an event delivered of a transaction rolled back
// or refused), on an event committed after the promotion and never
// delivered (emitted into the void), and on a gap (an event undelivered
// while a later commit of the same primary was delivered: the slot streams
// in commit order, so the window must be the tail of a primary's commits).
//
// Variants: synchronous and asynchronous replication, each with event IDs
// the outbox chooses (Logical mode's happy path: the relay writes no row)
// and with IDs the publisher chooses (the relay writes each event to the
// table under a lease before delivering it, to check the ID: a table
// write per batch on the primary, which a kill can cut).
// OUTBOX_LOGICAL_FAILOVER_ROUNDS failovers per variant (default 2), the
// kill moments drawn from OUTBOX_FAILOVER_SEED.
func TestLogicalFailover(t *testing.T) {
	long(t, "primaries and standbys of its own, failed over under load")
	t.Parallel()
	rounds := envInt(t, logicalFailoverRoundsEnv, 2)
	seed := uint64(envInt(t, failoverSeedEnv, int(rand.Int32())))
	for _, v := range []struct {
		name        string
		sync        bool
		explicitIDs bool
	}{{"sync", true, false}, {"async", false, false}, {"sync/explicit-ids", true, true}, {"async/explicit-ids", false, true}} {
		t.Run(v.name, func(t *testing.T) {
			t.Parallel()
			testLogicalFailover(t, v.sync, v.explicitIDs, rounds, seed)
		})
	}
}

// lfoRound is what one failover measured.
type lfoRound struct {
	oldPort, newPort int
	killedAt         time.Time
	promotedAt       time.Time
	goneAt           time.Time // the relay logged the slot gone
	deliveredLSN     string    // as it logged
	slotBegan        time.Time // the new process's db.Use began
	slotAt           time.Time // and returned: the slot exists
	streamingAt      time.Time // the relay logged that it streams the new slot
	resumedAt        time.Time // its first delivery since
	rebuild          time.Duration
}

func testLogicalFailover(t *testing.T, syncRep, explicitIDs bool, rounds int, seed uint64) {
	rng := rand.New(rand.NewPCG(seed, seed))
	variant := map[bool]string{true: "sync", false: "async"}[syncRep]
	if explicitIDs {
		variant += "/explicit-ids"
	}
	t.Logf("logical failover test (%s): %d rounds, seed %d (%s=%d reproduces the kill moments)", variant, rounds, seed, failoverSeedEnv, seed)
	start := time.Now()
	cl := startLogicalPgCluster(t, syncRep)

	// The writer's process: it creates the publication and the slot.
	writerDB := openGorm(t, postgres.Open(cl.dsn("outbox-lfo-writer")))
	install(t, writerDB, lfoConfig(&timedLog{}))
	require.NoError(t, writerDB.Exec(`CREATE TABLE lfo_orders (id text PRIMARY KEY, port integer NOT NULL)`).Error)

	// The relay's process: an Outbox and a pool of its own.
	relayLog := &timedLog{}
	relayDB := openGorm(t, postgres.Open(cl.dsn(lfoRelayApp)))
	ob := install(t, relayDB, lfoConfig(relayLog))
	// Deliveries are recorded by order (the event's aggregate ID): with
	// explicitIDs the event ID is the order's too.
	rec := newFoRecorder()
	ob.Handle("order.created", func(ctx context.Context, e outbox.Event) error {
		e.ID = e.AggregateID
		return rec.handle(ctx, e)
	})
	relay, err := ob.Relay(relayDB, outbox.RelayConfig{
		BatchSize: 10, Workers: 4, PollInterval: lfoPoll, Lease: 2 * time.Second, MaxAttempts: 1000,
		Backoff: func(int) time.Duration { return 10 * time.Millisecond },
	})
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
	relayStats := func() (outbox.Stats, error) {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		return ob.Stats(relayDB.WithContext(ctx))
	}

	var rs []lfoRound
	dumpOnFailure := func() {
		if !t.Failed() {
			return
		}
		for i, r := range rs {
			t.Logf("failover %d: ports %d->%d killed %v promoted %v gone %v slot %v..%v streaming %v resumed %v (since start)", i+1, r.oldPort, r.newPort,
				r.killedAt.Sub(start), r.promotedAt.Sub(start), r.goneAt.Sub(start), r.slotBegan.Sub(start), r.slotAt.Sub(start),
				r.streamingAt.Sub(start), r.resumedAt.Sub(start))
		}
		relayLog.mu.Lock()
		for _, r := range relayLog.recs {
			t.Logf("relay log %v %v %s %s", r.at.Sub(start), r.level, r.msg, r.attrs)
		}
		relayLog.mu.Unlock()
	}
	t.Cleanup(dumpOnFailure)

	w := startLfoWriter(t, writerDB, explicitIDs)
	load := func() {
		t.Helper()
		base := w.committed()
		eventually(t, 60*time.Second, func() error {
			if n := w.committed(); n < base+lfoLoad {
				return fmt.Errorf("the writer committed %d of %d transactions", n-base, lfoLoad)
			}
			return nil
		})
	}

	for i := range rounds {
		load()
		waitKillMoment(time.Duration(rng.IntN(700)) * time.Millisecond)
		var r lfoRound
		r.oldPort = cl.nodes[cl.primary].Port()
		r.killedAt = time.Now()
		cl.kill(t)
		cl.promote(t)
		r.promotedAt = time.Now()
		r.newPort = cl.nodes[cl.primary].Port()

		// b: the relay says the slot is gone, at Error, and counts it; a:
		// meanwhile the writer is refused with ErrNoSlot.
		eventually(t, 30*time.Second, func() error {
			gone, ok := relayLog.recordAfter(r.killedAt, lfoGoneLog)
			if !ok {
				return errors.New("the relay has not logged the slot gone")
			}
			r.goneAt = gone.at
			// (Commits there instead are counted as void below.)
			if n, c := w.noSlotSince(r.promotedAt), w.ackedOnSince(r.newPort, r.promotedAt); n < lfoNoSlots && c < lfoNoSlots {
				return fmt.Errorf("the writer was refused with ErrNoSlot %d times on the new primary", n)
			}
			st, err := relayStats()
			if !errors.Is(err, outbox.ErrNoSlot) {
				return fmt.Errorf("the relay's Stats: %v, want ErrNoSlot", err)
			}
			if st.SlotLost != int64(i+1) {
				return fmt.Errorf("the relay's Stats.SlotLost is %d, want %d", st.SlotLost, i+1)
			}
			return nil
		})
		gone, _ := relayLog.recordAfter(r.killedAt, lfoGoneLog)
		assert.Equal(t, "ERROR", gone.level.String(), "failover %d: the slot's loss is logged at Error", i+1)
		r.deliveredLSN = attrValue(gone.attrs, "delivered_lsn")
		assert.NotEmpty(t, r.deliveredLSN, "failover %d: the slot's loss names delivered_lsn: %s", i+1, gone.attrs)
		assert.NotEqual(t, "0/0", r.deliveredLSN, "failover %d: the relay had delivered", i+1)

		// c: a new process installs the plugin, which creates the slot
		// and says that it replaces a lost one.
		npLog := &timedLog{}
		r.slotBegan = time.Now()
		npDB, err := gorm.Open(postgres.Open(cl.dsn("outbox-lfo-newproc")), &gorm.Config{Logger: logger.Discard})
		require.NoError(t, err)
		npOb := outbox.Plugin(lfoConfig(npLog))
		require.NoError(t, npDB.Use(npOb), "failover %d: db.Use on the new primary", i+1)
		r.slotAt = time.Now()
		replaced, ok := npLog.recordAfter(time.Time{}, lfoReplacedLog)
		if assert.True(t, ok, "failover %d: db.Use did not say that the slot replaces a lost one", i+1) {
			assert.Equal(t, "ERROR", replaced.level.String(), "failover %d: the replaced slot is logged at Error", i+1)
		}
		npStats, err := npOb.Stats(npDB)
		assert.NoError(t, err, "failover %d: Stats once the slot exists", i+1)
		assert.EqualValues(t, 1, npStats.SlotLost, "failover %d: the new process counts the slot it replaced", i+1)
		if sqlDB, err := npDB.DB(); err == nil {
			_ = sqlDB.Close()
		}

		// d: the relay streams the new slot, says so, and delivers.
		eventually(t, 30*time.Second, func() error {
			streaming, ok := relayLog.recordAfter(r.goneAt, lfoNewSlotLog)
			if !ok {
				return errors.New("the relay has not logged that it streams a new slot")
			}
			r.streamingAt = streaming.at
			// The first delivery of a commit made once the slot existed.
			rec.mu.Lock()
			defer rec.mu.Unlock()
			for _, c := range rec.calls {
				if at, ok := w.ackedAt(c.id); ok && at.After(r.slotBegan) {
					r.resumedAt = c.at
					return nil
				}
			}
			return errors.New("the relay has delivered nothing committed since the slot was created")
		})
		streaming, _ := relayLog.recordAfter(r.goneAt, lfoNewSlotLog)
		assert.Equal(t, "ERROR", streaming.level.String(), "failover %d: streaming a new slot is logged at Error", i+1)

		began := time.Now()
		cl.rebuild(t)
		r.rebuild = time.Since(began)
		rs = append(rs, r)
	}
	load() // committed and delivered after the last failover
	load()
	w.stop()

	acked, order, refused, unknown, werrs := w.snapshot()
	require.NotEmpty(t, acked, "the writer committed nothing: the test proves nothing")
	// epoch: the primary a commit ran on, 0 the first; epoch j >= 1 is the
	// new primary of failover j.
	epochOf := func(at time.Time) int {
		j := 0
		for _, r := range rs {
			if r.promotedAt.Before(at) {
				j++
			}
		}
		return j
	}
	epochPort := func(j int) int {
		if j == 0 {
			return rs[0].oldPort
		}
		return rs[j-1].newPort
	}
	last := rounds // the final primary's epoch

	// Drain: every commit on the final primary since db.Use returned with
	// its slot delivered (one before, or during the slot's creation,
	// undelivered is counted as void below).
	eventually(t, 60*time.Second, func() error {
		n, _, _ := rec.snapshot()
		missing := 0
		for _, id := range order {
			if at := acked[id].at; epochOf(at) == last && at.After(rs[last-1].slotAt) && n[id] == 0 {
				missing++
			}
		}
		if missing > 0 {
			return fmt.Errorf("%d events committed on the final primary not delivered", missing)
		}
		return nil
	})
	stopRelay()

	business := lfoPorts(t, cl) // id -> port
	n, _, _ := rec.snapshot()
	dup := 0
	for _, k := range n {
		dup += k - 1
	}

	// Phantoms: a delivery of a transaction rolled back (on purpose, or
	// refused with ErrNoSlot) or never written.
	phantom := 0
	for id := range n {
		switch {
		case strings.HasPrefix(id, "rb-"), refused[id]:
			phantom++
			t.Errorf("phantom: event %s was delivered, its transaction rolled back", id)
		case acked[id].at.IsZero() && unknown[id].IsZero():
			phantom++
			t.Errorf("phantom: event %s was delivered but never written", id)
		}
	}

	var (
		// Per epoch (the last, the final primary's, must stay 0).
		window, windowUnknown, deliveredAbsent, lostTogether = make([]int, rounds+1), make([]int, rounds+1), make([]int, rounds+1), make([]int, rounds+1)
		deliveredAbsentUnknown                               = make([]int, rounds+1) // the writer's COMMIT failed: not an acknowledged commit lost
		void, gaps, wrongServer                              int
		noSlots, otherErrs                                   = make([]int, rounds), make([]int, rounds)
	)
	// report fails the test, printing the first few of each kind.
	reported := map[string]int{}
	report := func(kind, format string, args ...any) {
		t.Helper()
		if reported[kind]++; reported[kind] <= 5 {
			t.Errorf(format, args...)
		} else {
			t.Fail()
		}
	}
	// Per epoch, in commit order (the writer is sequential).
	undeliveredSeen := make([]bool, rounds+1)
	for _, id := range order {
		a := acked[id]
		j := epochOf(a.at)
		if j < rounds && a.port == epochPort(j+1) && a.at.After(rs[j].killedAt) {
			j++ // on the new primary, before pg_ctl promote's wait returned
		}
		if a.port != epochPort(j) {
			wrongServer++
			report("wrong server", "event %s committed at %v on port %d, the primary was on %d", id, a.at.Sub(start), a.port, epochPort(j))
			continue
		}
		if j > 0 && a.at.Before(rs[j-1].slotBegan) {
			void++
			report("void", "failover %d: event %s committed on the new primary %v after the promotion, before any slot existed (emitted into the void)",
				j, id, a.at.Sub(rs[j-1].promotedAt))
			continue
		}
		present, delivered := business[id] != 0, n[id] > 0
		switch {
		case !present && delivered:
			deliveredAbsent[j]++
		case !present:
			lostTogether[j]++
		case !delivered && j == last:
			void++
			report("void", "event %s committed on the final primary and never delivered", id)
		case !delivered:
			window[j]++
			undeliveredSeen[j] = true
		case undeliveredSeen[j]:
			gaps++
			report("gap", "failover %d: event %s was delivered after an earlier commit of the same primary was not", j+1, id)
		}
	}
	// Outcomes unknown (COMMIT lost with the old primary): the epoch of
	// the error, or the one before when the row is on the other server.
	for id, at := range unknown {
		j := min(epochOf(at), last)
		if p, ok := business[id]; ok && p != epochPort(j) && j > 0 {
			j--
		}
		switch present, delivered := business[id] != 0, n[id] > 0; {
		case present && !delivered:
			windowUnknown[j]++
		case !present && delivered:
			deliveredAbsentUnknown[j]++
		}
	}
	for i, r := range rs {
		var firstNoSlot time.Time
		for _, e := range werrs {
			if !e.at.After(r.promotedAt) || !e.at.Before(r.slotBegan) {
				continue
			}
			if e.noSlot {
				noSlots[i]++
				if firstNoSlot.IsZero() {
					firstNoSlot = e.at
				}
				continue
			}
			if !firstNoSlot.IsZero() {
				otherErrs[i]++
				t.Errorf("failover %d: the writer, refused with ErrNoSlot on the new primary, then failed otherwise: %s", i+1, e.msg)
			}
		}
	}
	// (windowUnknown[last] may count the writer's last transaction, whose
	// context its stop cancelled during COMMIT: not waited for.)
	assert.Zero(t, deliveredAbsent[last]+lostTogether[last], "the final primary lost its own commits")
	window, windowUnknown, deliveredAbsent, lostTogether = window[:rounds], windowUnknown[:rounds], deliveredAbsent[:rounds], lostTogether[:rounds]
	deliveredAbsentUnknown = deliveredAbsentUnknown[:rounds]
	if syncRep {
		assert.Zero(t, sum(lostTogether)+sum(deliveredAbsent), "synchronous replication: a commit the writer saw succeed is absent from the new primary")
	}
	st, err := relayStats()
	assert.NoError(t, err)
	assert.EqualValues(t, rounds, st.SlotLost, "the relay counts each loss once")
	assert.Equal(t, rounds, relayLog.count(lfoGoneLog), "the relay logs each loss once")
	assert.Equal(t, rounds, relayLog.count(lfoNewSlotLog), "the relay logs each new slot once")
	assert.Empty(t, relayLog.errors(lfoGoneLog, lfoNewSlotLog, "cannot stream the replication slot", "the replication stream broke",
		"relay cannot reach the outbox table"), // its table side: retries of failed deliveries, rows of explicit IDs
		"the relay logged other errors")

	var promote, gone, slot, streamAfter, resume, outage, rebuild []time.Duration
	var lsns []string
	for _, r := range rs {
		ms := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
		promote = append(promote, ms(r.promotedAt.Sub(r.killedAt)))
		gone = append(gone, ms(r.goneAt.Sub(r.killedAt)))
		slot = append(slot, ms(r.slotAt.Sub(r.promotedAt)))
		streamAfter = append(streamAfter, ms(r.streamingAt.Sub(r.slotAt)))
		resume = append(resume, ms(r.resumedAt.Sub(r.slotAt)))
		outage = append(outage, ms(r.resumedAt.Sub(r.killedAt)))
		rebuild = append(rebuild, ms(r.rebuild))
		lsns = append(lsns, r.deliveredLSN)
	}
	unknownCommitted := 0
	for id := range unknown {
		if business[id] != 0 {
			unknownCommitted++
		}
	}
	t.Logf("LOGICAL-FAILOVER-RESULT variant=%s rounds=%d acked=%d unknown_outcome=%d unknown_committed=%d refused_no_slot=%v other_errors_in_no_slot_window=%v business_rows=%d delivered=%d duplicated=%d window=%v window_unknown_outcome=%v delivered_absent=%v delivered_absent_unknown_outcome=%v lost_together=%v phantom=%d void=%d gaps=%d wrong_server=%d delivered_lsn=%v kill_to_promoted=%v kill_to_gone_logged=%v promoted_to_slot_created=%v slot_created_to_streaming_logged=%v slot_created_to_first_delivery=%v kill_to_first_delivery=%v rebuild=%v total=%v",
		variant, rounds, len(acked), len(unknown), unknownCommitted, noSlots, otherErrs, len(business), len(n), dup,
		window, windowUnknown, deliveredAbsent, deliveredAbsentUnknown, lostTogether, phantom, void, gaps, wrongServer, lsns,
		promote, gone, slot, streamAfter, resume, outage, rebuild, time.Since(start).Round(time.Millisecond))
}

func sum(xs []int) (s int) {
	for _, x := range xs {
		s += x
	}
	return s
}

// attrValue returns the value of key in a timedRecord's attrs (" k=v ...").
func attrValue(attrs, key string) string {
	for _, f := range strings.Fields(attrs) {
		if v, ok := strings.CutPrefix(f, key+"="); ok {
			return v
		}
	}
	return ""
}

// lfoWriter commits a business row (with the port of the server it ran
// on) and its event per transaction, every seventh rolled back on
// purpose, in Logical mode. The event's aggregate ID is the order's; with
// explicitIDs its event ID is too, otherwise the outbox chooses one. A
// Publish refused with ErrNoSlot rolls its transaction back (refused);
// another error leaves the outcome unknown, settled from the business
// table.
type lfoWriter struct {
	mu      sync.Mutex
	acked   map[string]lfoAck
	order   []string // acked, in commit order
	refused map[string]bool
	unknown map[string]time.Time // outcome unknown: when the error came
	errs    []lfoErr
	cancel  context.CancelFunc
	done    chan struct{}
}

type lfoAck struct {
	at   time.Time // COMMIT returned
	port int       // inet_server_port() of the transaction
}

type lfoErr struct {
	at     time.Time
	noSlot bool
	msg    string
}

func startLfoWriter(t *testing.T, db *gorm.DB, explicitIDs bool) *lfoWriter {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	w := &lfoWriter{acked: map[string]lfoAck{}, refused: map[string]bool{}, unknown: map[string]time.Time{}, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for seq := 0; ctx.Err() == nil; seq++ {
			id := fmt.Sprintf("lf-%06d", seq)
			rollback := seq%7 == 6
			if rollback {
				id = "rb-" + id
			}
			var port int
			txCtx, txCancel := context.WithTimeout(ctx, 10*time.Second)
			err := db.WithContext(txCtx).Transaction(func(tx *gorm.DB) error {
				if err := tx.Raw(`INSERT INTO lfo_orders (id, port) VALUES (?, inet_server_port()) RETURNING port`, id).Scan(&port).Error; err != nil {
					return err
				}
				e := outbox.Event{Type: "order.created", AggregateType: "order", AggregateID: id, Payload: map[string]any{"seq": seq}}
				if explicitIDs {
					e.ID = id // the relay checks it against the table: written there before delivery
				}
				if err := outbox.Publish(tx, e); err != nil {
					return err
				}
				if rollback {
					return errRollback
				}
				return nil
			})
			txCancel()
			now := time.Now()
			w.mu.Lock()
			switch {
			case errors.Is(err, outbox.ErrNoSlot):
				w.refused[id] = true
				w.errs = append(w.errs, lfoErr{at: now, noSlot: true, msg: err.Error()})
			case rollback && errors.Is(err, errRollback):
			case err != nil:
				w.unknown[id] = now
				w.errs = append(w.errs, lfoErr{at: now, msg: err.Error()})
			default:
				w.acked[id] = lfoAck{at: now, port: port}
				w.order = append(w.order, id)
			}
			w.mu.Unlock()
			if err != nil && !errors.Is(err, errRollback) {
				sleepOrDone(ctx, 20*time.Millisecond) // no primary, or no slot: try again shortly
			} else {
				sleepOrDone(ctx, 2*time.Millisecond) // a steady writer, not a flood
			}
		}
	}()
	t.Cleanup(w.stop)
	return w
}

func (w *lfoWriter) stop() {
	w.cancel()
	<-w.done
}

func (w *lfoWriter) committed() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.acked)
}

// ackedAt returns when id's commit was seen to succeed.
func (w *lfoWriter) ackedAt(id string) (time.Time, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	a, ok := w.acked[id]
	return a.at, ok
}

// ackedOnSince counts the commits seen to succeed on the server on port
// after t.
func (w *lfoWriter) ackedOnSince(port int, t time.Time) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	c := 0
	for _, a := range w.acked {
		if a.port == port && a.at.After(t) {
			c++
		}
	}
	return c
}

// noSlotSince counts the refusals with ErrNoSlot after t.
func (w *lfoWriter) noSlotSince(t time.Time) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	c := 0
	for _, e := range w.errs {
		if e.noSlot && e.at.After(t) {
			c++
		}
	}
	return c
}

// snapshot returns copies of what the writer recorded.
func (w *lfoWriter) snapshot() (acked map[string]lfoAck, order []string, refused map[string]bool, unknown map[string]time.Time, errs []lfoErr) {
	w.mu.Lock()
	defer w.mu.Unlock()
	acked = make(map[string]lfoAck, len(w.acked))
	for k, v := range w.acked {
		acked[k] = v
	}
	refused, unknown = map[string]bool{}, map[string]time.Time{}
	for k := range w.refused {
		refused[k] = true
	}
	for k, v := range w.unknown {
		unknown[k] = v
	}
	return acked, slices.Clone(w.order), refused, unknown, slices.Clone(w.errs)
}

// lfoPorts returns the business rows of the primary: the port of the
// server each committed on, by ID.
func lfoPorts(t *testing.T, cl *pgCluster) map[string]int {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, cl.primaryDSN())
	require.NoError(t, err)
	defer conn.Close(context.Background())
	rows, err := conn.Query(ctx, `SELECT id, port FROM lfo_orders`)
	require.NoError(t, err)
	out := map[string]int{}
	var (
		id   string
		port int
	)
	_, err = pgx.ForEachRow(rows, []any{&id, &port}, func() error {
		out[id] = port
		return nil
	})
	require.NoError(t, err)
	return out
}
