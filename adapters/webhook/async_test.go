package webhook_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/adapters/webhook"
	"github.com/gorm-outbox/outbox/outboxtest"
	"github.com/gorm-outbox/outbox/wire"
)

// handlerPaths are the Sender's two ways to deliver, each as a Handler and
// as a relay registration: Handler itself, and AsyncHandler, its start
// followed at once by its wait (what memory mode does) or registered with
// HandleAsync. The tests of the requests, the signatures and the errors
// run over both.
type handlerPath struct {
	name     string
	handler  func(*webhook.Sender) outbox.Handler
	register func(ob *outbox.Outbox, eventType string, s *webhook.Sender)
}

var handlerPaths = []handlerPath{
	{
		name:     "Handler",
		handler:  (*webhook.Sender).Handler,
		register: func(ob *outbox.Outbox, typ string, s *webhook.Sender) { ob.Handle(typ, s.Handler()) },
	},
	{
		name: "AsyncHandler",
		handler: func(s *webhook.Sender) outbox.Handler {
			h := s.AsyncHandler()
			return func(ctx context.Context, e outbox.Event) error { return h(ctx, e)() }
		},
		register: func(ob *outbox.Outbox, typ string, s *webhook.Sender) { ob.HandleAsync(typ, s.AsyncHandler()) },
	},
}

func newSender(t *testing.T, url string, cfg webhook.Config) *webhook.Sender {
	t.Helper()
	s, err := webhook.New(url, secret, cfg)
	require.NoError(t, err)
	return s
}

// publishIDs commits one event of type typ per ID, in one transaction.
func publishIDs(t *testing.T, db *gorm.DB, typ string, ids ...string) {
	t.Helper()
	events := make([]outbox.Event, len(ids))
	for i, id := range ids {
		events[i] = outbox.Event{ID: id, Type: typ, Payload: map[string]int{"n": i}}
	}
	require.NoError(t, db.Transaction(func(tx *gorm.DB) error { return outbox.Publish(tx, events...) }))
}

func seqIDs(prefix string, n int) []string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = fmt.Sprintf("%s-%03d", prefix, i)
	}
	return ids
}

// gate is a receiver that holds every request until want of them are in
// flight at once (want is called under the gate's lock), and then, by its
// mode:
//
//   - by default, lets the held requests and all later ones through;
//   - with rearm, lets the held ones through and holds the next ones until
//     want are in flight again (a relay's next wave);
//   - with total set, lets one request through (the oldest held) each
//     time want are in flight, and all of them once total have arrived:
//     a Sender that keeps want in flight sends its next request only when
//     one ends, so they arrive one at a time, in the order started.
//
// It records the most requests it ever had in flight and the events in
// the order they arrived. A request still held after 10 s is answered 500
// and fails the test: the Sender never had want requests in flight.
type gate struct {
	*httptest.Server
	t      *testing.T
	want   func() int
	rearm  bool
	total  int
	answer func(id string) int // the status for an event; 204 when nil

	mu       sync.Mutex
	inFlight int
	most     int
	opened   bool
	held     []chan struct{}
	seen     []string // in arrival order
}

func newGate(t *testing.T, want func() int) *gate {
	g := &gate{t: t, want: want}
	g.Server = httptest.NewServer(http.HandlerFunc(g.serve))
	t.Cleanup(g.Close)
	return g
}

func (g *gate) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	if err := webhook.Verify(secret, r.Header, body, time.Minute); err != nil {
		g.t.Errorf("unverified request: %v", err)
	}
	id := r.Header.Get(wire.EventID)
	release := make(chan struct{})
	g.mu.Lock()
	g.seen = append(g.seen, id)
	g.inFlight++
	g.most = max(g.most, g.inFlight)
	g.held = append(g.held, release)
	switch {
	case g.opened, g.total > 0 && len(g.seen) == g.total:
		g.opened = true
		g.releaseHeld(len(g.held))
	case g.inFlight < g.want():
	case g.total > 0:
		g.releaseHeld(1)
	default:
		g.opened = !g.rearm
		g.releaseHeld(len(g.held))
	}
	g.mu.Unlock()
	defer func() {
		g.mu.Lock()
		g.inFlight--
		g.mu.Unlock()
	}()
	select {
	case <-release:
	case <-r.Context().Done():
		return
	case <-time.After(10 * time.Second):
		g.t.Errorf("%s held 10s: the Sender never had %d requests in flight", id, g.want())
		w.WriteHeader(http.StatusInternalServerError)
		return
	}
	code := http.StatusNoContent
	if g.answer != nil {
		code = g.answer(id)
	}
	w.WriteHeader(code)
}

// releaseHeld lets the n oldest held requests through.
func (g *gate) releaseHeld(n int) {
	for _, c := range g.held[:n] {
		close(c)
	}
	g.held = g.held[n:]
}

func (g *gate) stats() (most int, seen []string) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.most, slices.Clone(g.seen)
}

// TestAsyncPipelining: a relay at its defaults (4 Workers) delivers a batch
// of 20 events to one endpoint with exactly min(20, MaxInFlight) requests
// in flight at once: the receiver holds every request until it has seen
// that many, then lets one through at a time, each time that many are in
// flight again, and never sees more. Past the first MaxInFlight, a request
// is sent only when one ends, in batch order. With Handler a relay would
// have its 4 Workers' requests in flight, never 16.
func TestAsyncPipelining(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name        string
		maxInFlight int
		want        int
	}{
		{"Default", 0, webhook.DefaultMaxInFlight},
		{"Five", 5, 5},
		{"MoreThanTheBatch", 32, 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			g := newGate(t, func() int { return tc.want })
			g.total = 20
			db, ob := openDB(t)
			ob.HandleAsync(outbox.AnyEvent, newSender(t, g.URL, webhook.Config{MaxInFlight: tc.maxInFlight}).AsyncHandler())
			ids := seqIDs("pipe", 20)
			publishIDs(t, db, "order.created", ids...)

			n, err := outboxtest.Relay(t, ob, db, outbox.RelayConfig{}).ProcessOnce(t.Context())
			require.NoError(t, err)
			require.Equal(t, 20, n)
			most, seen := g.stats()
			assert.Equal(t, tc.want, most, "requests in flight at once")
			assert.ElementsMatch(t, ids, seen, "each event posted once")
			if len(seen) == len(ids) {
				assert.Equal(t, ids[tc.want:], seen[tc.want:], "each sent as one ended, in batch order")
			}
			for _, id := range ids {
				r := outboxtest.Row(t, db, id)
				assert.Equal(t, outbox.StatusSent, r.Status, id)
				assert.Equal(t, 1, r.Attempts, id)
			}
		})
	}
}

// TestAsyncStartWaitsForRoom: with MaxInFlight requests in flight, a start
// waits until one ends, then sends; one whose context ends first is not
// sent, and its wait returns what Handler returns for a request made with
// that context: a plain error when cancelled, outbox.Unavailable past a
// deadline (no connection was made).
func TestAsyncStartWaitsForRoom(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	arrived := make(chan string, 10)
	rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request) {
		arrived <- r.Header.Get(wire.EventID)
		select {
		case <-release:
		case <-r.Context().Done():
		}
		w.WriteHeader(http.StatusNoContent)
	})
	var once sync.Once
	free := func() { once.Do(func() { close(release) }) }
	t.Cleanup(free) // before rc.Close, which waits for the handlers
	h := newSender(t, rc.URL, webhook.Config{MaxInFlight: 2}).AsyncHandler()
	event := func(id string) outbox.Event { e := sampleEvent(); e.ID = id; return e }

	wait1 := returns(t, func() func() error { return h(t.Context(), event("e1")) })
	wait2 := returns(t, func() func() error { return h(t.Context(), event("e2")) })
	assert.ElementsMatch(t, []string{"e1", "e2"}, []string{<-arrived, <-arrived})

	// No room: the start waits, within its context.
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := h(ctx, event("cancelled"))()
	require.Error(t, err)
	assert.ErrorIs(t, err, context.Canceled)
	assert.False(t, outbox.IsUnavailable(err), "%v", err)
	assert.False(t, outbox.IsPermanent(err), "%v", err)
	assert.Equal(t, "context canceled: POST "+rc.URL+" (outbox/webhook)", err.Error())

	ctx, cancel = context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	err = h(ctx, event("late"))()
	require.Error(t, err)
	assert.ErrorIs(t, err, context.DeadlineExceeded)
	assert.True(t, outbox.IsUnavailable(err), "never sent: %v", err)

	// A start made while both places are taken returns once one is free.
	started := make(chan func() error, 1)
	go func() { started <- h(t.Context(), event("e3")) }()
	select {
	case <-started:
		t.Fatal("the third start returned with MaxInFlight requests in flight")
	case id := <-arrived:
		t.Fatalf("%s sent with MaxInFlight requests in flight", id)
	default:
	}
	free()
	require.NoError(t, wait1())
	require.NoError(t, wait2())
	select {
	case wait := <-started:
		require.NoError(t, wait())
	case <-time.After(10 * time.Second):
		t.Fatal("the third start did not return once the first two requests ended")
	}
	assert.Equal(t, "e3", <-arrived)
	select {
	case id := <-arrived:
		t.Fatalf("%s was sent", id)
	default:
	}
	assert.Len(t, rc.requests(), 3, "the events whose context ended were never sent")
}

// TestAsyncWaitReturnsWhenContextEnds: a receiver that never answers holds
// the request until ctx is cancelled; wait then returns, with the error
// Handler returns (a plain retry: the receiver took the request), and the
// request's goroutine and place end with it (goleak checks the former,
// the next start with MaxInFlight 1 the latter).
func TestAsyncWaitReturnsWhenContextEnds(t *testing.T) {
	t.Parallel()
	held, stop := make(chan struct{}, 1), make(chan struct{})
	rc := newReceiver(t, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get(wire.EventID) == "next" {
			w.WriteHeader(http.StatusNoContent)
			return
		}
		held <- struct{}{}
		select { // never answers
		case <-r.Context().Done():
		case <-stop: // the test has failed: let rc.Close return
		}
	})
	t.Cleanup(func() { close(stop) })
	// Timeout well beyond the test's own limit: only ctx ends the request.
	h := newSender(t, rc.URL, webhook.Config{MaxInFlight: 1, Timeout: time.Hour}).AsyncHandler()
	ctx, cancel := context.WithCancel(t.Context())
	e := sampleEvent()
	wait := returns(t, func() func() error { return h(ctx, e) })
	<-held
	cancel()
	done := make(chan error, 1)
	go func() { done <- wait() }()
	select {
	case err := <-done:
		require.Error(t, err)
		assert.ErrorIs(t, err, context.Canceled)
		assert.False(t, outbox.IsUnavailable(err), "%v", err)
		assert.False(t, outbox.IsPermanent(err), "%v", err)
		assert.Equal(t, err, wait(), "wait may be called again")
	case <-time.After(10 * time.Second):
		t.Fatal("wait did not return once ctx was cancelled")
	}
	e.ID = "next"
	next, cancelNext := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancelNext()
	require.NoError(t, h(next, e)(), "the cancelled request's place is free")
}

// returns calls start and returns what it returns, or fails the test if it
// has not returned within 10 s: an AsyncHandler's start must not wait for
// its request.
func returns(t *testing.T, start func() func() error) func() error {
	t.Helper()
	c := make(chan func() error, 1)
	go func() { c <- start() }()
	select {
	case wait := <-c:
		return wait
	case <-time.After(10 * time.Second):
		t.Fatal("the start waited for its request")
		return nil
	}
}

// TestAsyncOrderByAggregate: with OrderByAggregate, 5 aggregates of 4
// events each reach the receiver in order, never two of an aggregate in
// flight at once, while the requests of different aggregates are (the
// receiver holds each wave's requests until it has seen one per aggregate
// still delivering). The receiver answers 500 to c's second event: none of
// c's later events is sent, and they stay pending without an attempt.
func TestAsyncOrderByAggregate(t *testing.T) {
	t.Parallel()
	aggs := []string{"a", "b", "c", "d", "e"}
	const perAgg = 4
	var (
		mu       sync.Mutex
		got      = map[string][]string{} // per aggregate, in arrival order
		inFlight = map[string]string{}   // aggregate -> its event in flight
		overlaps []string
		answered = map[string]int{} // 2xx answers per aggregate
		blocked  = map[string]bool{}
	)
	agg := func(id string) string { return id[:1] }
	// A wave holds the next event of each aggregate still delivering: the
	// previous wave's are all answered before it starts. want is called
	// under the gate's lock; mu nests inside it.
	g := newGate(t, func() int {
		mu.Lock()
		defer mu.Unlock()
		n := 0
		for _, a := range aggs {
			if !blocked[a] && answered[a] < perAgg {
				n++
			}
		}
		return n
	})
	g.rearm = true
	g.answer = func(id string) int {
		mu.Lock()
		defer mu.Unlock()
		delete(inFlight, agg(id))
		if id == "c2" {
			blocked["c"] = true
			return http.StatusInternalServerError
		}
		answered[agg(id)]++
		return http.StatusNoContent
	}
	// Arrivals are recorded before the gate counts the request: wrap its
	// handler.
	inner := g.Config.Handler
	g.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(wire.EventID)
		mu.Lock()
		if prev, ok := inFlight[agg(id)]; ok {
			overlaps = append(overlaps, prev+" and "+id)
		}
		inFlight[agg(id)] = id
		got[agg(id)] = append(got[agg(id)], id)
		mu.Unlock()
		inner.ServeHTTP(w, r)
	})

	db, ob := openDB(t)
	ob.HandleAsync(outbox.AnyEvent, newSender(t, g.URL, webhook.Config{}).AsyncHandler())
	var events []outbox.Event
	for k := 1; k <= perAgg; k++ { // interleaved: a1 b1 ... e1 a2 ...
		for _, a := range aggs {
			id := fmt.Sprintf("%s%d", a, k)
			events = append(events, outbox.Event{ID: id, Type: "order.updated", AggregateType: "order", AggregateID: a, Payload: map[string]string{"id": id}})
		}
	}
	require.NoError(t, db.Transaction(func(tx *gorm.DB) error { return outbox.Publish(tx, events...) }))
	relay := outboxtest.Relay(t, ob, db, outbox.RelayConfig{OrderByAggregate: true, Backoff: func(int) time.Duration { return time.Hour }})
	for range 20 {
		n, err := relay.ProcessOnce(t.Context())
		require.NoError(t, err)
		if n == 0 {
			break
		}
	}

	mu.Lock()
	defer mu.Unlock()
	for _, a := range aggs {
		want := []string{a + "1", a + "2", a + "3", a + "4"}
		if a == "c" {
			want = want[:2]
		}
		assert.Equal(t, want, got[a], "aggregate %s as the receiver got it", a)
	}
	assert.Empty(t, overlaps, "two events of an aggregate in flight at once")
	most, _ := g.stats()
	assert.Equal(t, len(aggs), most, "a wave's requests, one per aggregate, in flight together")
	for _, e := range events {
		r := outboxtest.Row(t, db, e.ID)
		switch e.ID {
		case "c2":
			assert.Equal(t, outbox.StatusPending, r.Status)
			assert.Equal(t, 1, r.Attempts)
			require.NotNil(t, r.LastError)
			assert.Equal(t, "500 Internal Server Error from POST "+g.URL+" (outbox/webhook)", *r.LastError)
		case "c3", "c4":
			assert.Equal(t, outbox.StatusPending, r.Status, e.ID)
			assert.Zero(t, r.Attempts, "%s: held behind c2, never claimed", e.ID)
		default:
			assert.Equal(t, outbox.StatusSent, r.Status, e.ID)
			assert.Equal(t, 1, r.Attempts, e.ID)
		}
	}
}

// TestAsyncOutage: with AsyncHandler, an endpoint that refuses connections,
// or answers 503, hands the whole batch back (the relay's error satisfies
// outbox.IsUnavailable) without counting an attempt, also for the events
// of the batch that were in flight when it went down; once it is back the
// events are delivered, each at its first counted attempt.
func TestAsyncOutage(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name       string
		begin, end func(rr *restartable)
	}{
		{"ConnectionRefused", (*restartable).stop, (*restartable).start},
		{"503", func(rr *restartable) { rr.down503.Store(true) }, func(rr *restartable) { rr.down503.Store(false) }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rr := newRestartable(t)
			db, ob := openDB(t)
			ob.HandleAsync(outbox.AnyEvent, newSender(t, rr.url(), webhook.Config{MaxInFlight: 4, Timeout: 5 * time.Second}).AsyncHandler())
			relay := outboxtest.Relay(t, ob, db, outbox.RelayConfig{})
			ids := seqIDs("out", 30)

			tc.begin(rr)
			publishIDs(t, db, "order.created", ids...)
			n, err := relay.ProcessOnce(t.Context())
			require.Equal(t, 30, n)
			require.Error(t, err)
			assert.True(t, outbox.IsUnavailable(err), "%v", err)
			assert.Contains(t, err.Error(), "(outbox/webhook)")
			for _, id := range ids {
				r := outboxtest.Row(t, db, id)
				assert.Equal(t, outbox.StatusPending, r.Status, id)
				assert.Zero(t, r.Attempts, "%s: handed back, no attempt counted", id)
			}
			assert.Empty(t, rr.received(), "nothing delivered while down")

			tc.end(rr)
			assert.Equal(t, 30, outboxtest.Drain(t, relay))
			seen := rr.received()
			for _, id := range ids {
				r := outboxtest.Row(t, db, id)
				assert.Equal(t, outbox.StatusSent, r.Status, id)
				assert.Equal(t, 1, r.Attempts, "%s: sent at its first counted attempt", id)
				assert.Equal(t, 1, seen[id], id)
			}
		})
	}

	// Down in the middle of a batch: the events answered before are sent,
	// the others handed back uncounted.
	t.Run("MidBatch", func(t *testing.T) {
		t.Parallel()
		var (
			mu      sync.Mutex
			answers int
		)
		g := newGate(t, func() int { return 4 })
		g.answer = func(string) int {
			mu.Lock()
			defer mu.Unlock()
			if answers++; answers > 6 {
				return http.StatusServiceUnavailable
			}
			return http.StatusNoContent
		}
		db, ob := openDB(t)
		ob.HandleAsync(outbox.AnyEvent, newSender(t, g.URL, webhook.Config{MaxInFlight: 4}).AsyncHandler())
		ids := seqIDs("mid", 20)
		publishIDs(t, db, "order.created", ids...)
		_, err := outboxtest.Relay(t, ob, db, outbox.RelayConfig{}).ProcessOnce(t.Context())
		require.Error(t, err)
		assert.True(t, outbox.IsUnavailable(err), "%v", err)
		sent := 0
		for _, id := range ids {
			r := outboxtest.Row(t, db, id)
			if r.Status == outbox.StatusSent {
				sent++
				assert.Equal(t, 1, r.Attempts, id)
				continue
			}
			assert.Equal(t, outbox.StatusPending, r.Status, id)
			assert.Zero(t, r.Attempts, "%s: handed back, no attempt counted", id)
		}
		assert.Equal(t, 6, sent, "the events answered 204")
		most, seen := g.stats()
		assert.Equal(t, 4, most)
		assert.ElementsMatch(t, ids, seen, "the wave's requests all sent, each once")
	})
}

// TestAsyncSignaturesOverRelay: the requests a relay sends through
// AsyncHandler verify with the official Standard Webhooks library, under
// either key of a rotation, in every format; webhook-id is the event ID.
func TestAsyncSignaturesOverRelay(t *testing.T) {
	t.Parallel()
	for _, format := range []wire.Format{wire.Native, wire.CloudEvents, wire.CloudEventsJSON} {
		t.Run(format.String(), func(t *testing.T) {
			t.Parallel()
			rc := newReceiver(t, status(http.StatusNoContent))
			db, ob := openDB(t)
			ob.HandleAsync(outbox.AnyEvent, newSender(t, rc.URL, webhook.Config{Format: format, Secrets: [][]byte{rotatedKey}}).AsyncHandler())
			ids := seqIDs("sig", 10)
			publishIDs(t, db, "order.created", ids...)
			n, err := outboxtest.Relay(t, ob, db, outbox.RelayConfig{}).ProcessOnce(t.Context())
			require.NoError(t, err)
			require.Equal(t, 10, n)
			var got []string
			for _, r := range rc.requests() {
				id := r.header.Get(webhook.HeaderWebhookID)
				got = append(got, id)
				assert.Len(t, strings.Fields(r.header.Get(webhook.HeaderWebhookSignature)), 2, "one v1 entry per key")
				for _, key := range [][]byte{secret, rotatedKey} {
					require.NoError(t, officialVerify(t, key, r.header, r.body), id)
					assert.True(t, specVerify(key, r.header, r.body), id)
				}
			}
			assert.ElementsMatch(t, ids, got)
		})
	}
}

// TestAsyncMemoryMode: in memory mode an AsyncHandler is started and
// waited for at once, after the commit.
func TestAsyncMemoryMode(t *testing.T) {
	t.Parallel()
	rc := newReceiver(t, status(http.StatusNoContent))
	db, ob := outboxtest.SQLite(t, outbox.Config{Mode: outbox.Memory})
	ob.HandleAsync(outbox.AnyEvent, newSender(t, rc.URL, webhook.Config{}).AsyncHandler())
	publishIDs(t, db, "order.created", "m1", "m2")
	reqs := rc.requests()
	require.Len(t, reqs, 2)
	for i, r := range reqs {
		assert.Equal(t, []string{"m1", "m2"}[i], r.header.Get(wire.EventID))
		require.NoError(t, webhook.Verify(secret, r.header, r.body, time.Minute))
	}
}

func TestNewRefusesNegativeMaxInFlight(t *testing.T) {
	t.Parallel()
	_, err := webhook.New("https://example.com/h", secret, webhook.Config{MaxInFlight: -1})
	assert.EqualError(t, err, "outbox/webhook: negative MaxInFlight -1; use 0 for the default")
}

// officialVerify checks a request with the Standard Webhooks Go library.
func officialVerify(t *testing.T, key []byte, h http.Header, body []byte) error {
	t.Helper()
	wh, err := standardwebhooks.NewWebhookRaw(key)
	require.NoError(t, err)
	return wh.Verify(body, h)
}

// TestAsyncKeepsItsConnections: the default Client keeps MaxInFlight idle
// connections to the endpoint, so a relay's batches reuse the connections
// the first one opened instead of closing all but 2 (net/http's default)
// after each and opening them again: 10 batches over 8 connections open
// about 8, not 60 or more.
func TestAsyncKeepsItsConnections(t *testing.T) {
	t.Parallel()
	var (
		mu    sync.Mutex
		conns int
	)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(status(http.StatusNoContent)))
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			mu.Lock()
			conns++
			mu.Unlock()
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	db, ob := openDB(t)
	ob.HandleAsync(outbox.AnyEvent, newSender(t, srv.URL, webhook.Config{MaxInFlight: 8}).AsyncHandler())
	publishIDs(t, db, "order.created", seqIDs("conn", 200)...)
	assert.Equal(t, 200, outboxtest.Drain(t, outboxtest.Relay(t, ob, db, outbox.RelayConfig{BatchSize: 20})))
	mu.Lock()
	defer mu.Unlock()
	assert.LessOrEqual(t, conns, 16, "connections opened for 10 batches of 20 with MaxInFlight 8")
	t.Logf("%d connections", conns)
}
