package rabbitmq

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
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
	f := newFixture(t)
	d := f.consume("order.*")
	p := f.publisher(Config{})
	db, ob := openOutbox(t)
	ob.Handle("order.created", p.Handler())

	publishEvents(t, db, outbox.Event{
		ID: "e2e-1", Type: "order.created", AggregateType: "order", AggregateID: "7",
		Payload: map[string]any{"total": 12}, Headers: map[string]string{"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"},
	})
	n, err := outboxtest.Relay(t, ob, db, outbox.RelayConfig{}).ProcessOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, n)

	m := receive(t, d)
	assert.Equal(t, "e2e-1", m.MessageId)
	assert.Equal(t, "order.created", m.RoutingKey)
	assert.JSONEq(t, `{"total":12}`, string(m.Body))
	assert.Equal(t, "7", m.Headers[wire.AggregateID])
	assert.Equal(t, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", m.Headers["traceparent"])
	assert.Equal(t, outbox.StatusSent, record(t, db, "e2e-1").Status)
}

// TestOutageWithRelay takes the broker away under an outbox: the
// connection drops and reconnecting is refused. The publish fails as
// Unavailable, so the relay hands the batch back without counting
// attempts and ProcessOnce says so; once the broker is back the next pass
// delivers them, at least once each, at their first counted attempt.
func TestOutageWithRelay(t *testing.T) {
	t.Parallel()
	f := newFixture(t)
	d := f.consume("#")
	var o outage
	p := f.publisher(Config{AMQP: amqpConfigWithDial(o.dial)})
	db, ob := openOutbox(t)
	ob.Handle(outbox.AnyEvent, p.Handler())
	// Retries are due at once, so the test needs no waiting.
	relay := outboxtest.Relay(t, ob, db, outbox.RelayConfig{Backoff: func(int) time.Duration { return 0 }})

	publishEvents(t, db, outbox.Event{ID: "before", Type: "order.created"})
	_, err := relay.ProcessOnce(t.Context())
	require.NoError(t, err)
	assert.Equal(t, outbox.StatusSent, record(t, db, "before").Status)

	// The broker goes away.
	o.down.Store(true)
	require.NoError(t, p.conn().Close())

	publishEvents(t, db,
		outbox.Event{ID: "during-1", Type: "order.created"},
		outbox.Event{ID: "during-2", Type: "order.paid"})
	n, err := relay.ProcessOnce(t.Context())
	require.True(t, outbox.IsUnavailable(err), "the relay reports the broker down: %v", err)
	require.Equal(t, 2, n)
	assert.Contains(t, err.Error(), `dial: dial tcp: connection refused (simulated outage): exchange "`+f.exchange+`", routing key "order.`, "the cause first, then the destination")
	assert.Contains(t, err.Error(), `" (outbox/rabbitmq)`)
	for _, id := range []string{"during-1", "during-2"} {
		r := record(t, db, id)
		assert.Equal(t, outbox.StatusPending, r.Status, "a failed publish is retried, not dropped")
		assert.Equal(t, 0, r.Attempts, "handed back: the outage costs no attempt")
	}

	// The broker is back: the next pass delivers what the outage held up.
	o.down.Store(false)
	require.Eventually(t, func() bool {
		_, err := relay.ProcessOnce(t.Context())
		require.NoError(t, err)
		return record(t, db, "during-1").Status == outbox.StatusSent && record(t, db, "during-2").Status == outbox.StatusSent
	}, 10*time.Second, 20*time.Millisecond)
	assert.Equal(t, 1, record(t, db, "during-1").Attempts)
	assert.Equal(t, 1, record(t, db, "during-2").Attempts)

	receiveIDs(t, d, "before", "during-1", "during-2")
}
