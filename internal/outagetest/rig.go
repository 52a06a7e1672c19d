package outagetest

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"regexp"
	"slices"
	"strings"
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

// PayloadMarker is in every payload the outage tests publish; no log line
// may contain it.
const PayloadMarker = "payload-marker-never-logged"

// Rig is an outbox on SQLite with a steady writer and a running
// Relay.Run, for the outage tests: it publishes one event every interval
// until stopped, and reports what became of them.
type Rig struct {
	t      *testing.T
	name   string
	prefix string // the adapter's log messages start with it
	db     *gorm.DB
	Logs   *LogRecorder // the relay's and the adapter's records
	cancel context.CancelFunc
	done   chan struct{} // the relay's Run returned

	calls, down atomic.Int64 // handler calls, and those that returned Unavailable

	mu      sync.Mutex
	ids     []string // committed, in order
	stopW   chan struct{}
	writerW sync.WaitGroup
}

// NewRig starts the relay and the writer. handler builds the handler with
// the rig's logger, which records the relay's and the adapter's messages;
// cfg, when given, adjusts the relay's configuration. IDs are
// name-NNNNNN, so that rigs sharing a stream do not collide; the events
// belong to 5 aggregates, name-agg-0 to name-agg-4, in turn.
func NewRig(t *testing.T, adapterLogPrefix, name string, every time.Duration, handler func(*slog.Logger) outbox.Handler, cfg ...func(*outbox.RelayConfig)) *Rig {
	t.Helper()
	r := &Rig{t: t, name: name, prefix: adapterLogPrefix, Logs: NewLogRecorder(), stopW: make(chan struct{}), done: make(chan struct{})}
	var ob *outbox.Outbox
	log := slog.New(r.Logs)
	r.db, ob = outboxtest.SQLite(t, outbox.Config{Logger: log})
	h := handler(log)
	ob.Handle(outbox.AnyEvent, func(ctx context.Context, e outbox.Event) error {
		err := h(ctx, e)
		r.calls.Add(1)
		if outbox.IsUnavailable(err) {
			r.down.Add(1)
		}
		return err
	})
	rc := outbox.RelayConfig{PollInterval: 50 * time.Millisecond}
	for _, f := range cfg {
		f(&rc)
	}
	relay, err := ob.Relay(r.db, rc)
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
			id := fmt.Sprintf("%s-%06d", name, n)
			err := r.db.Transaction(func(tx *gorm.DB) error {
				return outbox.Publish(tx, outbox.Event{ID: id, Type: "order.created", AggregateID: fmt.Sprintf("%s-agg-%d", name, n%5),
					Payload: map[string]any{"n": n, "marker": PayloadMarker}})
			})
			if err != nil {
				t.Errorf("publish %s: %v", id, err)
				return
			}
			r.mu.Lock()
			r.ids = append(r.ids, id)
			r.mu.Unlock()
		}
	}()
	return r
}

// StopWriting stops the writer and returns the IDs it committed.
func (r *Rig) StopWriting() []string {
	select {
	case <-r.stopW:
	default:
		close(r.stopW)
	}
	r.writerW.Wait()
	return r.Committed()
}

// Name is the rig's name, the prefix of its event IDs.
func (r *Rig) Name() string { return r.name }

// Committed returns the IDs the writer committed so far.
func (r *Rig) Committed() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.ids)
}

// Stop stops the writer and the relay.
func (r *Rig) Stop() {
	r.StopWriting()
	r.cancel()
	<-r.done
}

// Statuses counts the rows by status.
func (r *Rig) Statuses() map[outbox.Status]int {
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

// Attempts counts the rows of a status by their attempts column: for sent
// rows, the attempts the delivery took (a hand-back does not count).
func (r *Rig) Attempts(status outbox.Status) map[int]int {
	r.t.Helper()
	var rows []struct {
		Attempts int
		N        int
	}
	require.NoError(r.t, r.db.Table(outbox.DefaultTable).Select("attempts, count(*) AS n").
		Where("status = ?", status).Group("attempts").Scan(&rows).Error)
	m := map[int]int{}
	for _, row := range rows {
		m[row.Attempts] = row.N
	}
	return m
}

// WaitSent waits until every committed row is sent.
func (r *Rig) WaitSent(timeout time.Duration) {
	r.t.Helper()
	want := len(r.Committed())
	deadline := time.Now().Add(timeout)
	for {
		st := r.Statuses()
		if st[outbox.StatusSent] == want {
			return
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("%s: after %v, %d of %d events sent (statuses %v)", r.name, timeout, st[outbox.StatusSent], want, st)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// Report is what an outage test measured, in the shape RELIABILITY.md
// records.
type Report struct {
	Events, Delivered, Lost, Failed, Duplicates int
	Attempts                                    map[int]int // sent rows by attempts
	Paused, Resumed, RetryWarnings, FailedLogs  int
	AdapterErrors                               int      // error records the adapter logged
	Calls, Unavailable                          int64    // handler calls, and those that said Unavailable
	PausedFor                                   []string // the "paused" durations the relay logged on resuming
}

var pausedAttr = regexp.MustCompile(`paused=(\S+)`)

// CheckLogs asserts that no record carries a payload.
func (r *Rig) CheckLogs() {
	r.t.Helper()
	for _, rec := range r.Logs.Records() {
		assert.NotContains(r.t, rec.Text, PayloadMarker, "%s: a log record carries a payload", r.name)
	}
}

// Report builds the figures from the rows, the logs and seen (event ID to
// how many copies the broker holds).
func (r *Rig) Report(seen map[string]int) Report {
	r.t.Helper()
	ids := r.Committed()
	rep := Report{Events: len(ids), Attempts: r.Attempts(outbox.StatusSent)}
	for _, id := range ids {
		switch n := seen[id]; {
		case n == 0:
			rep.Lost++
		default:
			rep.Delivered++
			rep.Duplicates += n - 1
		}
	}
	rep.Failed = r.Statuses()[outbox.StatusFailed]
	rep.Paused = r.Logs.Count(LogPaused)
	rep.Resumed = r.Logs.Count(LogResumed)
	rep.RetryWarnings = r.Logs.Count(LogRetry)
	rep.FailedLogs = r.Logs.Count(LogFailed)
	for _, rec := range r.Logs.Records() {
		if rec.Level >= slog.LevelError && strings.HasPrefix(rec.Msg, r.prefix) {
			rep.AdapterErrors++
		}
		if strings.HasPrefix(rec.Msg, LogRetry) || strings.HasPrefix(rec.Msg, LogFailed) {
			// The error text says which failure the adapter did not
			// classify, which a count alone cannot.
			r.t.Logf("%s: %s", r.name, rec.Text)
		}
		if strings.HasPrefix(rec.Msg, LogResumed) {
			if m := pausedAttr.FindStringSubmatch(rec.Text); m != nil {
				rep.PausedFor = append(rep.PausedFor, m[1])
			}
		}
	}
	rep.Calls, rep.Unavailable = r.calls.Load(), r.down.Load()
	r.t.Logf("RESULT %s: events %d, delivered %d, lost %d, failed %d, duplicates %d, sent rows by attempts %v; handler calls %d, %d of them Unavailable; log lines: %q %d, %q %d (paused %v), %q %d, %q %d, adapter errors %d",
		r.name, rep.Events, rep.Delivered, rep.Lost, rep.Failed, rep.Duplicates, fmtHist(rep.Attempts),
		rep.Calls, rep.Unavailable,
		"destination unavailable", rep.Paused, "delivery resumed", rep.Resumed, rep.PausedFor,
		"will retry", rep.RetryWarnings, "failed for good", rep.FailedLogs, rep.AdapterErrors)
	return rep
}

func fmtHist(m map[int]int) string {
	var parts []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		parts = append(parts, fmt.Sprintf("%d:%d", k, m[k]))
	}
	return "{" + strings.Join(parts, " ") + "}"
}
