package nats_test

import (
	"context"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	outboxnats "github.com/gorm-outbox/outbox/adapters/nats"
	"github.com/gorm-outbox/outbox/internal/outagetest"
	"github.com/gorm-outbox/outbox/outboxtest"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// clusterRoundsEnv sets how many kill-and-restart rounds
// TestClusterNodeLoss runs (default 4, about 30 s).
const clusterRoundsEnv = "OUTBOX_NATS_CLUSTER_ROUNDS"

// clusterOrder is the writer's business row; each has the event of the
// same ID, committed in the same transaction.
type clusterOrder struct {
	ID string `gorm:"primaryKey"`
	N  int
}

// TestClusterNodeLoss is issue 24 part 2: a JetStream cluster of three
// test-owned nats-servers (routes, cluster "outbox", servers n1..n3), a
// stream with 3 replicas (file storage, 2-minute duplicate window), the
// Publisher connected with all three URLs and nats.MaxReconnects(-1), and
// a relay delivering what a steady writer commits (a business row and its
// event in one transaction, every 10ms, on a SQLite file). Each round
// SIGKILLs one node (the stream leader every other round, starting with
// the first; a follower otherwise), keeps it down 0.3 s to 2 s, restarts it
// on the same store directory and waits until the stream has 3 current
// replicas again.
//
// At the end, after the writer stops and the relay drains: every business
// row's event is in the stream (0 lost), no event failed, every sent row
// took exactly one counted attempt (a node loss is an outage: the adapter
// reports it as outbox.Unavailable, or the client's reconnect absorbs it),
// the stream holds each event once (Nats-Msg-Id dedupe), no retry warning
// was logged, and after every kill a publish was acked again within
// seconds (the longest gap between publish acks after a kill stays under
// 20 s). Per round it logs when stream info named a leader again, how long
// delivery paused (that gap), the time to the next ack, and when the
// backlog (the events committed until delivery resumed) was all acked;
// RESULT lines carry the totals.
//
// A long run: OUTBOX_NATS_CLUSTER_ROUNDS=N (default 4), for example
//
//	OUTBOX_NATS_CLUSTER_ROUNDS=40 go test -race -count=1 -timeout 30m -run '^TestClusterNodeLoss$' -v .
func TestClusterNodeLoss(t *testing.T) {
	long(t, "a three-node cluster of its own, a node killed round after round")
	t.Parallel()
	testClusterNodeLoss(t, false)
}

// TestClusterNodeLossAsync is TestClusterNodeLoss with AsyncHandler: the
// publishes of a batch in flight when a node goes, acks lost with a stream
// leader included, end as Unavailable (the disconnect, or the ack timeout)
// and no ack stays pending in the Publisher afterwards.
func TestClusterNodeLossAsync(t *testing.T) {
	long(t, "a three-node cluster of its own, a node killed round after round")
	t.Parallel()
	testClusterNodeLoss(t, true)
}

func testClusterNodeLoss(t *testing.T, async bool) {
	rounds := 4
	if v := os.Getenv(clusterRoundsEnv); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, "%s", clusterRoundsEnv)
		require.Positive(t, n, "%s", clusterRoundsEnv)
		rounds = n
	}
	seed := uint64(time.Now().UnixNano())
	rng := rand.New(rand.NewPCG(seed, seed>>1))
	began := time.Now()

	c := newCluster(t)
	const stream = "CLUSTER"
	c.poll(30*time.Second, "the stream to be created", func() (bool, string) {
		ctx, cancel := contextTimeout(5 * time.Second)
		defer cancel()
		_, err := c.admin.CreateOrUpdateStream(ctx, jetstream.StreamConfig{
			Name: stream, Subjects: []string{"cluster.>"}, Storage: jetstream.FileStorage,
			Replicas: 3, Duplicates: 2 * time.Minute,
		})
		if err != nil {
			return false, err.Error()
		}
		return true, ""
	})
	c.waitReplicas(stream, 30*time.Second)
	t.Logf("cluster of 3 up, stream %s with 3 current replicas, %v after the start (seed %d)", stream, time.Since(began).Round(time.Millisecond), seed)

	nc, js := connectWith(t, c.urls(), natsgo.MaxReconnects(-1), natsgo.ReconnectWait(50*time.Millisecond), natsgo.Name(t.Name()))
	var pub *outboxnats.Publisher
	r := newClusterRig(t, 10*time.Millisecond, async, func(log *slog.Logger) *outboxnats.Publisher {
		pub = newPublisher(t, js, outboxnats.Config{SubjectPrefix: "cluster.", Timeout: time.Second, Logger: log})
		return pub
	})

	type roundResult struct {
		victim      string
		leader      bool          // the victim was the stream leader
		client      bool          // the victim was the server the Publisher was connected to
		down        time.Duration // killed to restarted
		firstAck    time.Duration // killed to the next publish ack (may be one in flight at the kill)
		maxGap      time.Duration // the longest gap between acks, from the kill to the rejoin: how long delivery paused
		drained     time.Duration // killed to the backlog (events committed until the next ack) acked
		rejoined    time.Duration // killed to 3 current replicas again
		inFlight    int           // the backlog's events not acked at the kill
		unavailable int64         // publishes reported as Unavailable in the round
		elected     time.Duration // killed to the first stream info naming a leader (not the victim while it is down)
		newLeader   string
	}
	var results []roundResult
	for i := range rounds {
		roundBegan := time.Now()
		// Steady state first: the backlog of the previous round delivered,
		// and deliveries flowing through the cluster.
		mark := r.Committed()
		waitFor(t, 60*time.Second, "the backlog to drain before the kill", func() bool { return r.acks.all(mark) })
		base := r.acks.count()
		waitFor(t, 30*time.Second, "deliveries before the kill", func() bool { return r.acks.count() >= base+20 })

		leader := c.leader(stream)
		victim := leader
		if i%2 == 1 {
			var followers []*node
			for _, n := range c.nodes {
				if n != leader {
					followers = append(followers, n)
				}
			}
			victim = followers[rng.IntN(len(followers))]
		}
		res := roundResult{victim: victim.name, leader: victim == leader, client: nc.ConnectedServerName() == victim.name}
		down := 300*time.Millisecond + time.Duration(rng.Int64N(int64(1700*time.Millisecond)))
		unavailableBefore := r.unavailable.Load()

		killed := time.Now()
		c.kill(victim)
		// The node loss itself; meanwhile, watch for the stream's next
		// leader (measured, not waited for).
		elected := func(restarted bool) {
			if res.elected != 0 {
				return
			}
			if info, err := c.streamInfo(stream); err == nil && info.Cluster != nil && info.Cluster.Leader != "" &&
				(restarted || info.Cluster.Leader != victim.name) {
				res.elected, res.newLeader = time.Since(killed), info.Cluster.Leader
			}
		}
		for time.Since(killed) < down {
			elected(false)
			time.Sleep(20 * time.Millisecond)
		}
		c.start(victim)
		res.down = time.Since(killed)
		c.poll(60*time.Second, "the stream to have a leader after the kill", func() (bool, string) { elected(true); return res.elected != 0, "no leader yet" })
		c.waitReplicas(stream, 60*time.Second)
		res.rejoined = time.Since(killed)
		waitFor(t, 30*time.Second, "a publish ack after the kill", func() bool { return !r.acks.firstAfter(killed).IsZero() })
		// The backlog: what was committed until delivery resumed.
		backlog := r.committedBefore(r.acks.firstAfter(killed))
		waitFor(t, 60*time.Second, "the events committed until delivery resumed to be acked", func() bool { return r.acks.all(backlog) })

		res.firstAck = r.acks.firstAfter(killed).Sub(killed)
		res.maxGap = r.acks.maxGap(killed, killed.Add(res.rejoined))
		res.drained = max(0, r.acks.lastOf(backlog).Sub(killed))
		res.inFlight = len(backlog) - r.acks.before(backlog, killed)
		res.unavailable = r.unavailable.Load() - unavailableBefore
		firstErr := "none"
		if at := r.errs.firstAfter(killed); !at.IsZero() {
			firstErr = at.Sub(killed).Round(time.Millisecond).String()
		}
		results = append(results, res)
		t.Logf("round %d (%v in all): killed %s (leader %v, the Publisher's server %v) for %v; stream leader %s seen %v after the kill, 3 current replicas again %v after it; first failed publish %v after the kill, %d publishes Unavailable; next ack %v after the kill, longest gap between acks %v; the %d events of the backlog (committed from the kill until delivery resumed, or pending at the kill) all acked %v after the kill",
			i+1, time.Since(roundBegan).Round(time.Millisecond), res.victim, res.leader, res.client, res.down.Round(time.Millisecond), res.newLeader, res.elected.Round(time.Millisecond), res.rejoined.Round(time.Millisecond),
			firstErr, res.unavailable,
			res.firstAck.Round(time.Millisecond), res.maxGap.Round(time.Millisecond), res.inFlight, res.drained.Round(time.Millisecond))
	}

	phase := time.Now()
	r.StopWriting()
	r.WaitSent(60 * time.Second)
	r.Stop()
	c.waitReplicas(stream, 60*time.Second)
	t.Logf("writer stopped, relay drained, 3 current replicas: %v", time.Since(phase).Round(time.Millisecond))
	if async {
		// Each publish ends with its ack or its ack timeout: none is
		// left holding a place among the MaxPending.
		waitFor(t, 10*time.Second, "no ack pending", func() bool { return outboxnats.AsyncPending(pub) == 0 })
	}
	phase = time.Now()
	seen := c.streamIDs(stream)
	t.Logf("stream read: %v", time.Since(phase).Round(time.Millisecond))
	rep := r.Report(seen)
	r.CheckLogs()

	var maxFirst, maxGap, maxDrain time.Duration
	for _, res := range results {
		maxFirst, maxGap, maxDrain = max(maxFirst, res.firstAck), max(maxGap, res.maxGap), max(maxDrain, res.drained)
	}
	var doubled []string
	for id, n := range seen {
		if n > 1 {
			doubled = append(doubled, fmt.Sprintf("%s×%d", id, n))
		}
	}
	slices.Sort(doubled)
	t.Logf("RESULT cluster (async %v): %d rounds (%d of them the leader) in %v; events %d, lost %d, failed %d, doubled %d %v, sent rows by attempts %v; next ack after a kill max %v, delivery paused (the longest gap between acks after a kill) max %v, backlog delivered max %v; publish errors by kind %v",
		async, rounds, (rounds+1)/2, time.Since(began).Round(time.Millisecond), rep.Events, rep.Lost, rep.Failed, rep.Duplicates, doubled, rep.Attempts,
		maxFirst.Round(time.Millisecond), maxGap.Round(time.Millisecond), maxDrain.Round(time.Millisecond), r.errorKinds())

	assert.Zero(t, rep.Lost, "every committed event is in the stream")
	assert.Zero(t, rep.Failed)
	assert.Zero(t, rep.Duplicates, "the duplicate window drops re-sends: %v", doubled)
	assert.Equal(t, map[int]int{1: rep.Events}, rep.Attempts, "a node loss burns no attempt")
	assert.Zero(t, rep.RetryWarnings, "no per-event warnings")
	assert.Zero(t, rep.FailedLogs)
	assert.Zero(t, rep.AdapterErrors)
	assert.Equal(t, rep.Paused, rep.Resumed, "every pause ended")
	// nats-server 2.9's election of a new stream leader (4 s to 8 s here)
	// plus, at most, one probe interval of the relay (0.5 s doubling to
	// 5 s); measured resumes are logged above.
	const resumeBound = 20 * time.Second
	assert.Less(t, maxGap, resumeBound, "delivery resumes within seconds of a kill")
	assert.Less(t, maxDrain, resumeBound+5*time.Second, "the backlog of a kill is delivered within seconds of the resume")
}

// clusterRig is an outbox on a SQLite file with a writer committing a
// business row and its event in one transaction every interval, a running
// relay whose handler is the adapter under test, and a record of every
// publish ack. Its Report is outagetest's, so that the figures match the
// other outage tests'.
type clusterRig struct {
	t      *testing.T
	db     *gorm.DB
	Logs   *outagetest.LogRecorder
	cancel context.CancelFunc
	done   chan struct{}

	acks             ackLog
	errs             ackLog // failed publishes
	calls            atomic.Int64
	unavailable      atomic.Int64
	errMu            sync.Mutex
	errKinds         map[string]int // publish errors (which name no event) and how they were classified
	mu               sync.Mutex
	ids              []string
	at               []time.Time // when each of ids was committed
	stopW            chan struct{}
	writerW          sync.WaitGroup
	stopOnce, wrOnce sync.Once
}

func newClusterRig(t *testing.T, every time.Duration, async bool, publisher func(*slog.Logger) *outboxnats.Publisher) *clusterRig {
	t.Helper()
	r := &clusterRig{t: t, Logs: outagetest.NewLogRecorder(), done: make(chan struct{}), stopW: make(chan struct{}), errKinds: map[string]int{}}
	log := slog.New(r.Logs)
	var ob *outbox.Outbox
	r.db, ob = outboxtest.SQLite(t, outbox.Config{Logger: log})
	require.NoError(t, r.db.AutoMigrate(&clusterOrder{}))
	observe := func(e outbox.Event, err error) error {
		r.calls.Add(1)
		if err == nil {
			r.acks.add(e.ID)
			return nil
		}
		r.errs.add(e.ID)
		kind := "retry"
		switch {
		case outbox.IsUnavailable(err):
			kind = "unavailable"
			r.unavailable.Add(1)
		case outbox.IsPermanent(err):
			kind = "permanent"
		}
		r.errMu.Lock()
		r.errKinds[kind+": "+err.Error()]++ // the text names no event: equal failures count together
		r.errMu.Unlock()
		return err
	}
	pub := publisher(log)
	if async {
		h := pub.AsyncHandler()
		ob.HandleAsync(outbox.AnyEvent, func(ctx context.Context, e outbox.Event) func() error {
			wait := h(ctx, e)
			return func() error { return observe(e, wait()) }
		})
	} else {
		h := pub.Handler()
		ob.Handle(outbox.AnyEvent, func(ctx context.Context, e outbox.Event) error { return observe(e, h(ctx, e)) })
	}
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
			id := fmt.Sprintf("cluster-%06d", n)
			err := r.db.Transaction(func(tx *gorm.DB) error {
				if err := tx.Create(&clusterOrder{ID: id, N: n}).Error; err != nil {
					return err
				}
				return outbox.Publish(tx, outbox.Event{ID: id, Type: "order.created", AggregateID: fmt.Sprintf("cluster-agg-%d", n%5),
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

// StopWriting stops the writer.
func (r *clusterRig) StopWriting() {
	r.wrOnce.Do(func() { close(r.stopW) })
	r.writerW.Wait()
}

// Stop stops the writer and the relay.
func (r *clusterRig) Stop() {
	r.StopWriting()
	r.stopOnce.Do(func() { r.cancel(); <-r.done })
}

// Committed returns the IDs the writer committed so far.
func (r *clusterRig) Committed() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ids)
}

// committedBefore returns the IDs committed before t.
func (r *clusterRig) committedBefore(t time.Time) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	i, _ := slices.BinarySearchFunc(r.at, t, func(x, t time.Time) int { return x.Compare(t) })
	return slices.Clone(r.ids[:i])
}

// WaitSent waits until every committed row is sent.
func (r *clusterRig) WaitSent(timeout time.Duration) {
	r.t.Helper()
	want := len(r.Committed())
	waitFor(r.t, timeout, fmt.Sprintf("all %d events sent", want), func() bool { return r.statuses()[outbox.StatusSent] == want })
}

func (r *clusterRig) statuses() map[outbox.Status]int {
	r.t.Helper()
	var rows []struct {
		Status outbox.Status
		N      int
	}
	require.NoError(r.t, r.db.Table(outbox.DefaultTable).Select("status, count(*) AS n").Group("status").Scan(&rows).Error)
	m := map[outbox.Status]int{}
	for _, row := range rows {
		m[row.Status] = row.N
	}
	return m
}

// Report checks that the business rows are the committed IDs, and counts,
// from the outbox table, the stream (seen: event ID to copies) and the
// logs, what became of the events.
func (r *clusterRig) Report(seen map[string]int) outagetest.Report {
	r.t.Helper()
	ids := r.Committed()
	var orders []string
	require.NoError(r.t, r.db.Model(&clusterOrder{}).Order("id").Pluck("id", &orders).Error)
	require.Equal(r.t, ids, orders, "the business rows are the committed IDs")

	var rows []struct {
		Status   outbox.Status
		Attempts int
		N        int
	}
	require.NoError(r.t, r.db.Table(outbox.DefaultTable).Select("status, attempts, count(*) AS n").Group("status, attempts").Scan(&rows).Error)
	rep := outagetest.Report{Events: len(ids), Attempts: map[int]int{}}
	total := 0
	for _, row := range rows {
		total += row.N
		switch row.Status {
		case outbox.StatusSent:
			rep.Attempts[row.Attempts] += row.N
		case outbox.StatusFailed:
			rep.Failed += row.N
		}
	}
	assert.Equal(r.t, len(ids), total, "one outbox row per business row")
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
		if rec.Level >= slog.LevelError && strings.HasPrefix(rec.Msg, "outbox/nats:") {
			rep.AdapterErrors++
		}
		if strings.HasPrefix(rec.Msg, outagetest.LogRetry) || strings.HasPrefix(rec.Msg, outagetest.LogFailed) {
			r.t.Logf("cluster: %s", rec.Text)
		}
	}
	rep.Calls, rep.Unavailable = r.calls.Load(), r.unavailable.Load()
	r.t.Logf("RESULT cluster rows: events %d (business rows %d), delivered %d, lost %d, failed %d, duplicates %d, sent rows by attempts %v; handler calls %d, %d of them Unavailable; log lines: %q %d, %q %d, %q %d, %q %d, adapter errors %d",
		rep.Events, len(orders), rep.Delivered, rep.Lost, rep.Failed, rep.Duplicates, rep.Attempts, rep.Calls, rep.Unavailable,
		"destination unavailable", rep.Paused, "delivery resumed", rep.Resumed, "will retry", rep.RetryWarnings, "failed for good", rep.FailedLogs, rep.AdapterErrors)
	return rep
}

// CheckLogs asserts that no record carries a payload.
func (r *clusterRig) CheckLogs() {
	r.t.Helper()
	for _, rec := range r.Logs.Records() {
		assert.NotContains(r.t, rec.Text, outagetest.PayloadMarker, "a log record carries a payload")
	}
}

// errorKinds is the publish errors seen, by classification and text.
func (r *clusterRig) errorKinds() map[string]int {
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
	mu    sync.Mutex
	first map[string]time.Time
	times []time.Time // in order
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
			gap = max(gap, at.Sub(prev)) // the gap that spans to
			return gap
		}
		gap, prev = max(gap, at.Sub(prev)), at
	}
	return max(gap, to.Sub(prev))
}

// all reports whether every one of ids has been acked.
func (a *ackLog) all(ids []string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, id := range ids {
		if _, ok := a.first[id]; !ok {
			return false
		}
	}
	return true
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
