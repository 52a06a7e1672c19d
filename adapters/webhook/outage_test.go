package webhook_test

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/adapters/webhook"
	"github.com/gorm-outbox/outbox/internal/outagetest"
	"github.com/gorm-outbox/outbox/wire"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// restartable is a receiver on a fixed address that can be stopped (its
// listener and connections closed: new requests are refused) and started
// again, or made to answer 503 as a load balancer does when the service
// behind it is down.
type restartable struct {
	t       *testing.T
	addr    string
	down503 atomic.Bool

	mu   sync.Mutex
	srv  *http.Server
	seen map[string]int // verified deliveries by event ID
}

func newRestartable(t *testing.T) *restartable {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	rr := &restartable{t: t, addr: l.Addr().String(), seen: map[string]int{}}
	rr.serve(l)
	t.Cleanup(rr.stop)
	return rr
}

func (rr *restartable) url() string { return "http://" + rr.addr + "/hooks" }

func (rr *restartable) serve(l net.Listener) {
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if rr.down503.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			return
		}
		body, err := io.ReadAll(r.Body)
		if err != nil || webhook.Verify(secret, r.Header, body, time.Minute) != nil {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		rr.mu.Lock()
		rr.seen[r.Header.Get(wire.EventID)]++
		rr.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})}
	rr.mu.Lock()
	rr.srv = srv
	rr.mu.Unlock()
	go func() { _ = srv.Serve(l) }()
}

func (rr *restartable) stop() {
	rr.mu.Lock()
	srv := rr.srv
	rr.srv = nil
	rr.mu.Unlock()
	if srv != nil {
		_ = srv.Close()
	}
}

func (rr *restartable) start() {
	rr.t.Helper()
	var l net.Listener
	waitFor(rr.t, 10*time.Second, "the receiver's port", func() bool {
		var err error
		l, err = net.Listen("tcp", rr.addr)
		return err == nil
	})
	rr.serve(l)
}

func (rr *restartable) received() map[string]int {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	m := make(map[string]int, len(rr.seen))
	for k, v := range rr.seen {
		m[k] = v
	}
	return m
}

// waitFor polls cond every 20ms until it holds or timeout passes.
func waitFor(t *testing.T, timeout time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestReceiverOutage takes the receiver away twice under a steady writer
// and a running relay: first it refuses connections (stopped), then it
// answers 503 (a load balancer with nothing behind it). Nothing is lost or
// failed, no attempt is spent on the outages, and the relay logs
// "destination unavailable" once per outage instead of a warning per
// event.
func TestReceiverOutage(t *testing.T) {
	t.Parallel()
	rr := newRestartable(t)
	r := outagetest.NewRig(t, "outbox/webhook:", "outage", 10*time.Millisecond, func(*slog.Logger) outbox.Handler {
		return newHandler(t, rr.url(), webhook.Config{Timeout: time.Second})
	})
	const down = 2 * time.Second
	outages := []struct {
		name       string
		begin, end func()
	}{
		{"connection refused", rr.stop, rr.start},
		{"503", func() { rr.down503.Store(true) }, func() { rr.down503.Store(false) }},
	}
	for i, o := range outages {
		waitFor(t, 30*time.Second, "deliveries before the outage", func() bool { return r.Statuses()[outbox.StatusSent] >= 20*(i+1) })
		o.begin()
		time.Sleep(down) // the outage itself
		o.end()
		waitFor(t, 60*time.Second, "the relay to resume after "+o.name, func() bool { return r.Logs.Count(outagetest.LogResumed) == i+1 })
	}
	r.StopWriting()
	r.WaitSent(60 * time.Second)
	r.Stop()

	rep := r.Report(rr.received())
	r.CheckLogs()
	assert.Zero(t, rep.Lost)
	assert.Zero(t, rep.Failed)
	assert.Equal(t, map[int]int{1: rep.Events}, rep.Attempts, "no attempt is counted for the outages")
	assert.Equal(t, len(outages), rep.Paused, "one \"destination unavailable\" per outage")
	assert.Equal(t, len(outages), rep.Resumed)
	assert.Zero(t, rep.RetryWarnings, "no per-event warnings")
	assert.Zero(t, rep.FailedLogs)
}
