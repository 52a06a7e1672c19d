package kafka_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/adapters/kafka"
	"github.com/gorm-outbox/outbox/internal/outagetest"
	"github.com/gorm-outbox/outbox/outboxtest"
	"github.com/gorm-outbox/outbox/wire"
)

// openOutbox returns a SQLite database with the outbox plugin installed.
func openOutbox(t *testing.T) (*gorm.DB, *outbox.Outbox) {
	return outboxtest.SQLite(t, outbox.Config{})
}

func record(t *testing.T, db *gorm.DB, id string) outbox.Row {
	t.Helper()
	return outboxtest.Row(t, db, id)
}

func publishEvents(t *testing.T, db *gorm.DB, events ...outbox.Event) {
	t.Helper()
	outboxtest.Publish(t, db, events...)
}

func TestEndToEnd(t *testing.T) {
	t.Parallel()
	c := newCluster(t)
	p := newProducer(t, c.ListenAddrs(), kafka.Config{})
	db, ob := openOutbox(t)
	ob.Handle("order.created", p.Handler())

	publishEvents(t, db, outbox.Event{
		ID: "e2e-1", Type: "order.created", AggregateType: "order", AggregateID: "7",
		Payload: map[string]any{"total": 12}, Headers: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
	})
	n, err := outboxtest.Relay(t, ob, db, outbox.RelayConfig{}).ProcessOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, n)

	r := consume(t, c.ListenAddrs(), kafka.DefaultTopic, 1)[0]
	assert.Equal(t, "e2e-1", header(r, wire.EventID))
	assert.Equal(t, "7", string(r.Key))
	assert.JSONEq(t, `{"total":12}`, string(r.Value))
	assert.Equal(t, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", header(r, "traceparent"))
	assert.Equal(t, outbox.StatusSent, record(t, db, "e2e-1").Status)
}

// TestBrokerOutage stops the cluster twice for 4 s under a steady writer
// and a running relay (OrderByAggregate, 5 aggregates, HandlerTimeout 2 s)
// and starts it again each time, from its data directory, on the same port. Nothing is lost or
// failed, no attempt is spent on the outages (every event is sent at its
// first counted attempt), the relay logs "destination unavailable" once
// per outage instead of a warning per event, and each aggregate's first
// copies are in order. A record stored twice (an ack the outage
// swallowed) is allowed: at least once.
func TestBrokerOutage(t *testing.T) {
	long(t, "the broker stopped twice for 4 s under load")
	t.Parallel()
	broker := newRestartable(t)
	c := broker.start()
	seeds := c.ListenAddrs()
	// A short metadata age lets the client find the restarted broker
	// quickly instead of after the default 5s.
	p := newProducer(t, seeds, kafka.Config{ClientOptions: []kgo.Opt{kgo.MetadataMinAge(100 * time.Millisecond)}})
	r := outagetest.NewRig(t, "outbox/kafka:", "outage", 10*time.Millisecond, func(*slog.Logger) outbox.Handler { return p.Handler() },
		func(rc *outbox.RelayConfig) {
			rc.OrderByAggregate = true
			// franz-go retries an unreachable broker until the context
			// ends: this is how long an attempt waits before the relay
			// pauses.
			rc.HandlerTimeout = 2 * time.Second
		})

	// Down for twice the handler's timeout, so that attempts do time out
	// while it is down.
	const outages, down = 2, 4 * time.Second
	for i := range outages {
		waitFor(t, 30*time.Second, "deliveries before the outage", func() bool { return r.Statuses()[outbox.StatusSent] >= 20*(i+1) })
		c.Close() // the broker goes away
		time.Sleep(down)
		c = broker.start() // back, with its data
		waitFor(t, 60*time.Second, "the relay to resume", func() bool { return r.Logs.Count(outagetest.LogResumed) == i+1 })
	}
	r.StopWriting()
	r.WaitSent(60 * time.Second)
	r.Stop()

	total := stored(t, c, kafka.DefaultTopic)
	recs := consume(t, seeds, kafka.DefaultTopic, int(total))
	rep := r.Report(countIDs(recs))
	r.CheckLogs()
	assert.Zero(t, rep.Lost)
	assert.Zero(t, rep.Failed)
	assert.Equal(t, map[int]int{1: rep.Events}, rep.Attempts, "no attempt is counted for the outages")
	assert.Equal(t, outages, rep.Paused, "one \"destination unavailable\" per outage")
	assert.Equal(t, outages, rep.Resumed)
	assert.Zero(t, rep.RetryWarnings, "no per-event warnings")
	assert.Zero(t, rep.FailedLogs)

	// Per aggregate, the first copies are in the order the events were
	// written (their IDs sort that way).
	last := map[string]string{}
	seen := map[string]bool{}
	for _, rec := range recs {
		id := header(rec, wire.EventID)
		if seen[id] {
			continue
		}
		seen[id] = true
		agg := string(rec.Key)
		assert.Less(t, last[agg], id, "aggregate %s in order", agg)
		last[agg] = id
	}
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
