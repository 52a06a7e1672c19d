package redis_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	outboxredis "github.com/gorm-outbox/outbox/adapters/redis"
	"github.com/gorm-outbox/outbox/internal/outagetest"
	"github.com/gorm-outbox/outbox/outboxtest"
	goredis "github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// sentinelRoundsEnv sets how many kill-and-restart rounds each case of
// TestSentinelFailover runs (default 3).
const sentinelRoundsEnv = "OUTBOX_REDIS_SENTINEL_ROUNDS"

// sentinelCase is one configuration TestSentinelFailover runs.
type sentinelCase struct {
	name string
	// lag, when positive, is the replication link's latency and makes a
	// kill a machine crash (see linkProxy); 0 is a plain SIGKILL of the
	// process on loopback.
	lag time.Duration
	// waitReplicas is Config.WaitReplicas.
	waitReplicas int
}

// TestSentinelFailover is issue 24's Redis part: a Sentinel set of
// test-owned processes on free loopback ports (a primary, two replicas,
// three sentinels with quorum 2, down-after-milliseconds 1500 and
// failover-timeout 2000), the Publisher on go-redis's
// redis.NewFailoverClient (Config.Timeout 1 s), and a relay delivering
// what a steady writer commits (one event per transaction every 10ms,
// SQLite) to one stream. Each round waits until the backlog is delivered,
// SIGKILLs the current primary at a random moment, waits until every
// sentinel names a promoted replica, restarts the killed node as a
// replica of it (as an orchestrator asking Sentinel would; Sentinel alone
// turns a returning primary into a replica only seconds later) and waits
// until the set is whole: all three sentinels agree on the primary and see
// both replicas linked to it, and the nodes say so too.
//
// The cases, run in parallel, each with its own processes:
//
//   - ProcessKill: SIGKILL of the primary process, Config defaults.
//   - MachineCrash: every node behind a proxy that delays what a primary
//     sends its replicas by 20 ms (a replica across a slow link); a kill
//     takes the node's network down with it and drops those bytes, as a
//     crashed machine's buffers are. Config defaults.
//   - MachineCrashWait: the same with Config.WaitReplicas 1
//     (WaitTimeout 500 ms).
//
// At the end, after the writer stops and the relay drains, the stream is
// read from the primary and counted per event ID: lost (committed, never
// in the stream), doubled, failed rows and attempts burned (attempts
// counted beyond one per event). Asserted: nothing failed and no attempt
// burned (a failover is an outage: the adapter reports it as
// outbox.Unavailable), no retry warning, delivery resumed within seconds of
// every kill; with WaitReplicas, nothing lost. Without it, Redis's
// asynchronous replication may lose an event the old primary acknowledged
// just before it died (the outbox marked it sent): such losses are counted,
// not failed on, but each must have been acknowledged within the link's
// lag (plus 500 ms of scheduling slack) before a kill; any other loss (a
// second failover, for one) fails the test. Per round it logs the
// promotion, the failovers the first sentinel announced, how long delivery
// paused (the longest gap between publish acks from the kill until the set
// was whole again) and the backlog; RESULT lines carry the totals and the
// pauses' min, median and max.
//
// Sizes: OUTBOX_REDIS_SENTINEL_ROUNDS=N rounds per case (default 3, about
// 30 s in all); OUTBOX_REDIS_SENTINEL_DOWN_AFTER=ms sets the sentinels'
// down-after-milliseconds (at 1000 or less they were seen to fail over a
// just-promoted primary again). A long run, one case at a time:
//
//	OUTBOX_REDIS_SENTINEL_ROUNDS=40 go test -race -count=1 -timeout 60m -run '^TestSentinelFailover$/^MachineCrash$' -v .
//
// Without redis-server in PATH the test skips, unless the run is strict
// (OUTBOX_TEST_FULL=1 or CI set): then it fails.
func TestSentinelFailover(t *testing.T) {
	long(t, "Sentinel sets of their own, primaries killed round after round")
	t.Parallel()
	rounds := 3
	if v := os.Getenv(sentinelRoundsEnv); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, "%s", sentinelRoundsEnv)
		require.Positive(t, n, "%s", sentinelRoundsEnv)
		rounds = n
	}
	for _, tc := range []sentinelCase{
		{name: "ProcessKill"},
		{name: "MachineCrash", lag: 20 * time.Millisecond},
		{name: "MachineCrashWait", lag: 20 * time.Millisecond, waitReplicas: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			runSentinelFailover(t, tc, rounds)
		})
	}
}

// sentinelRound is what one kill did.
type sentinelRound struct {
	victim, promoted string
	killed           time.Time     // when the primary's network was cut
	promotedAfter    time.Duration // the kill to every sentinel naming the new primary
	rejoined         time.Duration // the kill to the set whole again
	firstAck         time.Duration // the kill to the next publish ack (may be one in flight at the kill)
	pause            time.Duration // the longest gap between acks from the kill to the rejoin
	drained          time.Duration // the kill to the backlog (committed until delivery resumed) acked
	unavailable      int64
	failovers        int // +switch-master announcements from the kill to the set whole again
	backlog          int // events committed until delivery resumed, not acked at the kill
}

func runSentinelFailover(t *testing.T, tc sentinelCase, rounds int) {
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, seed>>1))
	began := time.Now()
	set := newSentinelSet(t, tc.lag)
	primary := set.settle(30 * time.Second)
	t.Logf("%s: primary %s, replicas and sentinels up, %v after the start (seed %d)", tc.name, primary.name, time.Since(began).Round(time.Millisecond), seed)

	rdb := goredis.NewFailoverClient(&goredis.FailoverOptions{
		MasterName: masterName, SentinelAddrs: set.sentinelAddrs(),
		ContextTimeoutEnabled: true, DialTimeout: 500 * time.Millisecond,
	})
	t.Cleanup(func() { _ = rdb.Close() })
	const stream = "sentinel:events"
	r := newSentinelRig(t, 10*time.Millisecond, func() outbox.Handler {
		return newPublisher(t, rdb, outboxredis.Config{
			Stream: stream, Timeout: time.Second,
			WaitReplicas: tc.waitReplicas, WaitTimeout: 500 * time.Millisecond,
		}).Handler()
	})

	var results []sentinelRound
	for i := range rounds {
		roundBegan := time.Now()
		mark := len(r.Committed())
		waitFor(t, 60*time.Second, "the backlog to drain before the kill", func() bool { return r.ackedThrough(mark) })
		base := r.acks.count()
		waitFor(t, 30*time.Second, "deliveries before the kill", func() bool { return r.acks.count() >= base+20 })
		time.Sleep(time.Duration(rng.Int64N(int64(200 * time.Millisecond)))) // a random moment among the deliveries

		victim := primary
		unavailableBefore := r.unavailable.Load()
		res := sentinelRound{victim: victim.name}
		res.killed = set.kill(victim)
		promoted := set.promoted(victim, 30*time.Second)
		res.promoted, res.promotedAfter = promoted.name, time.Since(res.killed)
		set.start(victim, promoted)
		primary = set.settle(60 * time.Second)
		res.rejoined = time.Since(res.killed)
		res.failovers = set.switchesSince(res.killed)
		waitFor(t, 30*time.Second, "a publish ack after the kill", func() bool { return !r.acks.firstAfter(res.killed).IsZero() })
		backlog := r.committedBefore(r.acks.firstAfter(res.killed))
		waitFor(t, 60*time.Second, "the events committed until delivery resumed to be acked", func() bool { return r.ackedThrough(len(backlog)) })
		res.backlog = len(backlog) - r.acks.before(backlog, res.killed)

		res.firstAck = r.acks.firstAfter(res.killed).Sub(res.killed)
		res.pause = r.acks.maxGap(res.killed, res.killed.Add(res.rejoined))
		res.drained = max(0, r.acks.lastOf(backlog).Sub(res.killed))
		res.unavailable = r.unavailable.Load() - unavailableBefore
		results = append(results, res)
		t.Logf("%s round %d (%v in all): killed primary %s; %s promoted %v after the kill, the set whole again %v after it with %s the primary, %d failovers announced; %d publishes Unavailable; next ack %v after the kill, delivery paused %v; the backlog of %d events acked %v after the kill",
			tc.name, i+1, time.Since(roundBegan).Round(time.Millisecond), res.victim, res.promoted, res.promotedAfter.Round(time.Millisecond),
			res.rejoined.Round(time.Millisecond), primary.name, res.failovers, res.unavailable, res.firstAck.Round(time.Millisecond), res.pause.Round(time.Millisecond),
			res.backlog, res.drained.Round(time.Millisecond))
	}

	r.StopWriting()
	r.WaitSent(60 * time.Second)
	r.Stop()
	seen := readStream(t, primary, stream)
	rep, burned := r.Report(seen)
	r.CheckLogs()

	committed := r.Committed()
	var lost, unexplained []string
	var lostBefore []time.Duration // per lost event, how long before its kill it was acked
	lostPerKill := map[int]int{}
	for _, id := range committed {
		if seen[id] > 0 {
			continue
		}
		at := r.acks.firstOf(id)
		k := slices.IndexFunc(results, func(res sentinelRound) bool { return !res.killed.Before(at) })
		if k < 0 {
			unexplained = append(unexplained, id+" (acked after the last kill)")
			continue
		}
		before := results[k].killed.Sub(at)
		lost = append(lost, fmt.Sprintf("%s acked %v before kill %d", id, before.Round(100*time.Microsecond), k+1))
		lostBefore = append(lostBefore, before)
		lostPerKill[k+1]++
		if before > tc.lag+500*time.Millisecond {
			unexplained = append(unexplained, lost[len(lost)-1])
		}
	}
	if len(lost) > 0 {
		t.Logf("%s: lost events by kill %v; acked before the kill min/median/max %s", tc.name, lostPerKill, minMedMax(lostBefore))
		if len(lost) <= 20 {
			t.Logf("%s: lost %v", tc.name, lost)
		}
	}
	known := make(map[string]bool, len(committed))
	for _, id := range committed {
		known[id] = true
	}
	for id := range seen {
		if !known[id] {
			t.Errorf("the stream holds %q, which no one committed", id)
		}
	}
	pauses := make([]time.Duration, len(results))
	promotions := make([]time.Duration, len(results))
	for i, res := range results {
		pauses[i], promotions[i] = res.pause, res.promotedAfter
	}
	failovers := 0
	for _, res := range results {
		failovers += res.failovers
	}
	t.Logf("RESULT sentinel %s: %d rounds, %d kills of the primary, %d failovers announced, in %v; events %d, lost %d (in %d of the failovers), doubled %d, failed %d, attempts burned %d (sent rows by attempts %v); delivery paused per failover min/median/max %s, promotion %s; publish errors by kind %v",
		tc.name, rounds, len(results), failovers, time.Since(began).Round(time.Millisecond), rep.Events, rep.Lost, len(lostPerKill), rep.Duplicates, rep.Failed, burned, rep.Attempts,
		minMedMax(pauses), minMedMax(promotions), r.errorKinds())

	assert.Zero(t, rep.Failed)
	assert.Zero(t, burned, "a failover burns no attempt")
	assert.Equal(t, map[int]int{1: rep.Events}, rep.Attempts, "every event sent at its first counted attempt")
	assert.Zero(t, rep.RetryWarnings, "no per-event warnings")
	assert.Zero(t, rep.FailedLogs)
	assert.Equal(t, rep.Paused, rep.Resumed, "every pause ended")
	if tc.waitReplicas > 0 {
		assert.Zero(t, rep.Lost, "with WaitReplicas every acknowledged event survives the failover: %v", lost)
	} else {
		assert.Empty(t, unexplained, "a loss is an event acknowledged just before its primary died")
	}
	// A failover took 2 s to 3 s (down-after 1.5 s, Sentinel's random
	// start delay up to 1 s, the election, the promotion), once 6.9 s;
	// then comes, at most, one relay probe interval (0.5 s doubling to 5 s).
	const resumeBound = 15 * time.Second
	assert.Less(t, slices.Max(pauses), resumeBound, "delivery resumes within seconds of a kill")
}

// minMedMax formats the min, median and max of ds.
func minMedMax(ds []time.Duration) string {
	if len(ds) == 0 {
		return "-"
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return fmt.Sprintf("%v / %v / %v", s[0].Round(time.Millisecond), s[len(s)/2].Round(time.Millisecond), s[len(s)-1].Round(time.Millisecond))
}

// readStream counts the stream's entries by event ID, reading them from n
// in pages.
func readStream(t *testing.T, n *redisNode, stream string) map[string]int {
	t.Helper()
	seen := map[string]int{}
	start := "-"
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		msgs, err := n.rdb.XRangeN(ctx, stream, start, "+", 1000).Result()
		cancel()
		require.NoError(t, err)
		for _, m := range msgs {
			id, _ := m.Values[outboxredis.FieldID].(string)
			seen[id]++
		}
		if len(msgs) < 1000 {
			return seen
		}
		start = "(" + msgs[len(msgs)-1].ID
	}
}

// sentinelRig is an outbox on a SQLite file with a writer committing one
// event per transaction every interval, a running relay whose handler is
// the adapter under test, and a record of every publish ack. Its Report is
// outagetest's, so that the figures match the other outage tests'.
type sentinelRig struct {
	t      *testing.T
	db     *gorm.DB
	Logs   *outagetest.LogRecorder
	cancel context.CancelFunc
	done   chan struct{}

	acks             ackLog
	calls            atomic.Int64
	unavailable      atomic.Int64
	errMu            sync.Mutex
	errKinds         map[string]int // publish errors, without the event ID, and how they were classified
	mu               sync.Mutex
	ids              []string
	at               []time.Time // when each of ids was committed
	stopW            chan struct{}
	writerW          sync.WaitGroup
	stopOnce, wrOnce sync.Once
}

func newSentinelRig(t *testing.T, every time.Duration, handler func() outbox.Handler) *sentinelRig {
	t.Helper()
	r := &sentinelRig{t: t, Logs: outagetest.NewLogRecorder(), done: make(chan struct{}), stopW: make(chan struct{}), errKinds: map[string]int{}}
	var ob *outbox.Outbox
	r.db, ob = outboxtest.SQLite(t, outbox.Config{Logger: slog.New(r.Logs)})
	h := handler()
	ob.Handle(outbox.AnyEvent, func(ctx context.Context, e outbox.Event) error {
		err := h(ctx, e)
		r.calls.Add(1)
		if err == nil {
			r.acks.add(e.ID)
			return nil
		}
		kind := "retry"
		switch {
		case outbox.IsUnavailable(err):
			kind = "unavailable"
			r.unavailable.Add(1)
		case outbox.IsPermanent(err):
			kind = "permanent"
		}
		r.errMu.Lock()
		r.errKinds[kind+": "+errorKind(err)]++
		r.errMu.Unlock()
		return err
	})
	relay, err := ob.Relay(r.db, outbox.RelayConfig{PollInterval: 50 * time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { defer close(r.done); _ = relay.Run(ctx) }()
	t.Cleanup(r.Stop)

	r.writerW.Add(1)
	go func() {
		defer r.writerW.Done()
		tick := time.NewTicker(every)
		defer tick.Stop()
		for n := 0; ; n++ {
			select {
			case <-r.stopW:
				return
			case <-tick.C:
			}
			id := fmt.Sprintf("sentinel-%06d", n)
			err := r.db.Transaction(func(tx *gorm.DB) error {
				return outbox.Publish(tx, outbox.Event{ID: id, Type: "order.created", AggregateID: fmt.Sprintf("sentinel-agg-%d", n%5),
					Payload: map[string]any{"n": n, "marker": outagetest.PayloadMarker}})
			})
			if err != nil {
				t.Errorf("commit %s: %v", id, err)
				return
			}
			r.mu.Lock()
			r.ids = append(r.ids, id)
			r.at = append(r.at, time.Now())
			r.mu.Unlock()
		}
	}()
	return r
}

var (
	errEntryRE = regexp.MustCompile(`\b\d+-\d+\b`)
	errPortRE  = regexp.MustCompile(`127\.0\.0\.1:\d+`)
)

// errorKind is err's text without what changes from one event to the
// next: entry IDs, ports (the event ID is not in it).
func errorKind(err error) string {
	s := errEntryRE.ReplaceAllString(err.Error(), "N-N")
	return errPortRE.ReplaceAllString(s, "127.0.0.1:P")
}

// StopWriting stops the writer.
func (r *sentinelRig) StopWriting() {
	r.wrOnce.Do(func() { close(r.stopW) })
	r.writerW.Wait()
}

// Stop stops the writer and the relay.
func (r *sentinelRig) Stop() {
	r.StopWriting()
	r.stopOnce.Do(func() { r.cancel(); <-r.done })
}

// Committed returns the IDs the writer committed so far.
func (r *sentinelRig) Committed() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ids)
}

// committedBefore returns the IDs committed before t.
func (r *sentinelRig) committedBefore(t time.Time) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	i, _ := slices.BinarySearchFunc(r.at, t, func(x, t time.Time) int { return x.Compare(t) })
	return slices.Clone(r.ids[:i])
}

// ackedThrough reports whether the first n events committed have all been
// acked. It resumes where its last call stopped (the committed IDs only
// grow), so that polling it costs little however many events there are:
// it shares the lock every ack takes.
func (r *sentinelRig) ackedThrough(n int) bool {
	r.mu.Lock()
	ids := r.ids[:n:n]
	r.mu.Unlock()
	a := &r.acks
	a.mu.Lock()
	defer a.mu.Unlock()
	for a.prefix < n {
		if _, ok := a.first[ids[a.prefix]]; !ok {
			return false
		}
		a.prefix++
	}
	return true
}

// WaitSent waits until every committed row is sent.
func (r *sentinelRig) WaitSent(timeout time.Duration) {
	r.t.Helper()
	want := len(r.Committed())
	waitFor(r.t, timeout, fmt.Sprintf("all %d events sent", want), func() bool {
		var n int64
		require.NoError(r.t, r.db.Table(outbox.DefaultTable).Where("status = ?", outbox.StatusSent).Count(&n).Error)
		return int(n) == want
	})
}

// Report counts, from the outbox table, the stream (seen: event ID to
// copies) and the logs, what became of the events; burned is the attempts
// counted beyond the one that sent each event, on every row.
func (r *sentinelRig) Report(seen map[string]int) (rep outagetest.Report, burned int) {
	r.t.Helper()
	ids := r.Committed()
	var rows []struct {
		Status   outbox.Status
		Attempts int
		N        int
	}
	require.NoError(r.t, r.db.Table(outbox.DefaultTable).Select("status, attempts, count(*) AS n").Group("status, attempts").Scan(&rows).Error)
	rep = outagetest.Report{Events: len(ids), Attempts: map[int]int{}}
	total := 0
	for _, row := range rows {
		total += row.N
		switch row.Status {
		case outbox.StatusSent:
			rep.Attempts[row.Attempts] += row.N
			burned += max(0, row.Attempts-1) * row.N
		case outbox.StatusFailed:
			rep.Failed += row.N
			burned += row.Attempts * row.N
		default:
			burned += row.Attempts * row.N
		}
	}
	assert.Equal(r.t, len(ids), total, "one outbox row per committed event")
	for _, id := range ids {
		if n := seen[id]; n == 0 {
			rep.Lost++
		} else {
			rep.Delivered++
			rep.Duplicates += n - 1
		}
	}
	rep.Paused = r.Logs.Count(outagetest.LogPaused)
	rep.Resumed = r.Logs.Count(outagetest.LogResumed)
	rep.RetryWarnings = r.Logs.Count(outagetest.LogRetry)
	rep.FailedLogs = r.Logs.Count(outagetest.LogFailed)
	for _, rec := range r.Logs.Records() {
		if strings.HasPrefix(rec.Msg, outagetest.LogRetry) || strings.HasPrefix(rec.Msg, outagetest.LogFailed) {
			r.t.Logf("sentinel: %s", rec.Text)
		}
	}
	rep.Calls, rep.Unavailable = r.calls.Load(), r.unavailable.Load()
	r.t.Logf("RESULT sentinel rows: events %d, delivered %d, lost %d, failed %d, duplicates %d, sent rows by attempts %v, attempts burned %d; handler calls %d, %d of them Unavailable; log lines: %q %d, %q %d, %q %d, %q %d",
		rep.Events, rep.Delivered, rep.Lost, rep.Failed, rep.Duplicates, rep.Attempts, burned, rep.Calls, rep.Unavailable,
		"destination unavailable", rep.Paused, "delivery resumed", rep.Resumed, "will retry", rep.RetryWarnings, "failed for good", rep.FailedLogs)
	return rep, burned
}

// CheckLogs asserts that no record carries a payload.
func (r *sentinelRig) CheckLogs() {
	r.t.Helper()
	for _, rec := range r.Logs.Records() {
		assert.NotContains(r.t, rec.Text, outagetest.PayloadMarker, "a log record carries a payload")
	}
}

// errorKinds is the publish errors seen, by classification and text.
func (r *sentinelRig) errorKinds() map[string]int {
	r.errMu.Lock()
	defer r.errMu.Unlock()
	m := make(map[string]int, len(r.errKinds))
	for k, v := range r.errKinds {
		m[k] = v
	}
	return m
}

// ackLog records when each publish was acked (the first ack of each event
// ID, and the time of every ack).
type ackLog struct {
	mu     sync.Mutex
	first  map[string]time.Time
	times  []time.Time // in order
	prefix int         // the first prefix committed events are acked (see ackedThrough)
}

func (a *ackLog) add(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	at := time.Now() // under the lock: times stay in order
	if a.first == nil {
		a.first = map[string]time.Time{}
	}
	if _, ok := a.first[id]; !ok {
		a.first[id] = at
	}
	a.times = append(a.times, at)
}

func (a *ackLog) count() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.times)
}

// firstOf is id's first ack, or zero.
func (a *ackLog) firstOf(id string) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.first[id]
}

// firstAfter is the first ack after t, or zero.
func (a *ackLog) firstAfter(t time.Time) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	i, _ := slices.BinarySearchFunc(a.times, t, func(x, t time.Time) int { return x.Compare(t) })
	for ; i < len(a.times); i++ {
		if a.times[i].After(t) {
			return a.times[i]
		}
	}
	return time.Time{}
}

// maxGap is the longest time without an ack between from and to (from
// to the first ack, between acks, the last ack to to).
func (a *ackLog) maxGap(from, to time.Time) time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	prev, gap := from, time.Duration(0)
	for _, at := range a.times {
		if !at.After(from) {
			continue
		}
		if at.After(to) {
			return max(gap, at.Sub(prev)) // the gap that spans to
		}
		gap, prev = max(gap, at.Sub(prev)), at
	}
	return max(gap, to.Sub(prev))
}

// before counts the ids acked before t.
func (a *ackLog) before(ids []string, t time.Time) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, id := range ids {
		if at, ok := a.first[id]; ok && at.Before(t) {
			n++
		}
	}
	return n
}

// lastOf is the latest first ack among ids.
func (a *ackLog) lastOf(ids []string) time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	var last time.Time
	for _, id := range ids {
		if at := a.first[id]; at.After(last) {
			last = at
		}
	}
	return last
}
