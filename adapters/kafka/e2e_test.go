package kafka_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/adapters/kafka"
	"github.com/gorm-outbox/outbox/outboxtest"
)

// openOutbox returns a SQLite database with the outbox plugin installed.
func openOutbox(t *testing.T) (*gorm.DB, *outbox.Outbox) {
	return outboxtest.SQLite(t, outbox.Config{})
}

func record(t *testing.T, db *gorm.DB, id string) outbox.Record {
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
	n, err := ob.Relay(db, outbox.RelayConfig{}).ProcessOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, n)

	r := consume(t, c.ListenAddrs(), kafka.DefaultTopic, 1)[0]
	assert.Equal(t, "e2e-1", header(r, kafka.HeaderEventID))
	assert.Equal(t, "7", string(r.Key))
	assert.JSONEq(t, `{"total":12}`, string(r.Value))
	assert.Equal(t, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", header(r, "traceparent"))
	assert.Equal(t, outbox.StatusSent, record(t, db, "e2e-1").Status)
}

// TestBrokerOutage stops the cluster under a running outbox and starts it
// again, from its data directory, on the same port. Attempts during the
// outage fail within the handler timeout and stay pending; after the
// restart the relay's retries deliver them, in order per aggregate.
func TestBrokerOutage(t *testing.T) {
	t.Parallel()
	broker := newRestartable(t)
	c := broker.start()
	seeds := c.ListenAddrs()
	// A short metadata age lets the client find the restarted broker
	// quickly instead of after the default 5s.
	p := newProducer(t, seeds, kafka.Config{ClientOptions: []kgo.Opt{kgo.MetadataMinAge(100 * time.Millisecond)}})
	db, ob := openOutbox(t)
	ob.Handle(outbox.AnyEvent, p.Handler())
	relay := ob.Relay(db, outbox.RelayConfig{
		OrderByAggregate: true,
		HandlerTimeout:   2 * time.Second,
		// Retries are due at once and never run out, so the test needs no
		// waiting and cannot fail events for good while the client
		// reconnects.
		Backoff:     func(int) time.Duration { return 0 },
		MaxAttempts: 1000,
	})

	publishEvents(t, db, outbox.Event{ID: "before", Type: "order.created", AggregateID: "a"})
	_, err := relay.ProcessOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, outbox.StatusSent, record(t, db, "before").Status)

	c.Close() // the broker goes away

	var during []string
	for i := range 3 {
		for _, agg := range []string{"a", "b"} {
			id := fmt.Sprintf("during-%s-%d", agg, i)
			during = append(during, id)
			publishEvents(t, db, outbox.Event{ID: id, Type: "order.updated", AggregateID: agg, Payload: map[string]int{"seq": i}})
		}
	}
	_, err = relay.ProcessOnce(t.Context())
	require.NoError(t, err, "handler failures are recorded on the rows, not returned")
	for _, id := range []string{"during-a-0", "during-b-0"} {
		r := record(t, db, id)
		assert.Equal(t, outbox.StatusPending, r.Status, "a failed produce is retried, not dropped")
		assert.Equal(t, 1, r.Attempts)
		require.NotNil(t, r.LastError)
		assert.Contains(t, *r.LastError, "outbox/kafka: publish event "+id)
	}
	assert.Equal(t, 0, record(t, db, "during-a-1").Attempts, "OrderByAggregate holds back the rest of each aggregate")

	c2 := broker.start() // the broker is back, with its data
	require.Eventually(t, func() bool {
		_, err := relay.ProcessOnce(t.Context())
		require.NoError(t, err)
		var pending int64
		require.NoError(t, db.Table(outbox.DefaultTable).Where("status <> ?", outbox.StatusSent).Count(&pending).Error)
		return pending == 0
	}, 30*time.Second, 50*time.Millisecond)

	// At least once: every event is there; a produce whose ack the outage
	// swallowed may be there twice. Per aggregate, the first copies are in
	// order.
	total := stored(t, c2, kafka.DefaultTopic)
	require.GreaterOrEqual(t, total, int64(1+len(during)))
	recs := consume(t, seeds, kafka.DefaultTopic, int(total))
	counts := countIDs(recs)
	t.Logf("stored %d records for %d events", total, 1+len(during))
	for _, id := range append([]string{"before"}, during...) {
		assert.GreaterOrEqual(t, counts[id], 1, "event %s delivered", id)
	}
	next := map[string]int{"a": 0, "b": 0}
	seen := map[string]bool{}
	for _, r := range recs {
		id := header(r, kafka.HeaderEventID)
		if id == "before" || seen[id] {
			continue
		}
		seen[id] = true
		agg := string(r.Key)
		assert.Equal(t, fmt.Sprintf("during-%s-%d", agg, next[agg]), id, "aggregate %s in order", agg)
		next[agg]++
	}
}
