package outboxotel_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxotel"
	"github.com/gorm-outbox/outbox/outboxtest"
)

// gauge returns the one data point of a gauge without attributes other
// than messaging.system, and whether there is one.
func gauge[N int64 | float64](t *testing.T, rm metricdata.ResourceMetrics, name, unit string) (N, bool) {
	t.Helper()
	m, ok := findMetric(rm, name)
	if !ok {
		return 0, false
	}
	assert.Equal(t, unit, m.Unit, name)
	points := m.Data.(metricdata.Gauge[N]).DataPoints
	if len(points) == 0 {
		return 0, false
	}
	require.Len(t, points, 1, name)
	sys, _ := points[0].Attributes.Value("messaging.system")
	assert.Equal(t, outboxotel.System, sys.AsString(), name)
	return points[0].Value, true
}

// TestRelayGauges: outbox.relays counts the relays alive and
// outbox.last_delivery.age is the time since one delivered, from the same
// cached Stats reading as the other gauges; the age is not reported
// before any delivery. On SQLite, PostgreSQL and MariaDB.
func TestRelayGauges(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			tel := newTelemetry(t)
			db := b.open(t)
			ob := tel.install(t, db, outbox.Config{}, outboxotel.WithStatsInterval(time.Nanosecond))
			ob.Handle("order.created", func(context.Context, outbox.Event) error { return nil })

			rm := tel.collect(t)
			n, ok := gauge[int64](t, rm, "outbox.relays", "{relay}")
			assert.True(t, ok, "outbox.relays is reported")
			assert.Zero(t, n, "no relay runs")
			_, ok = gauge[float64](t, rm, "outbox.last_delivery.age", "s")
			assert.False(t, ok, "no delivery yet: no age, rather than a zero that looks healthy")

			// Two relays run; one delivers.
			stop := runRelays(t, ob, db, "relay-a", "relay-b")
			outboxtest.Publish(t, db, outbox.Event{Type: "order.created"})
			var age float64
			require.Eventually(t, func() bool {
				rm := tel.collect(t)
				n, _ := gauge[int64](t, rm, "outbox.relays", "{relay}")
				age, ok = gauge[float64](t, rm, "outbox.last_delivery.age", "s")
				return n == 2 && ok
			}, 30*time.Second, 20*time.Millisecond, "two relays alive, and a delivery recorded")
			assert.GreaterOrEqual(t, age, 0.0)
			assert.Less(t, age, 60.0)

			// Gone: not alive; the last delivery stays, older.
			stop()
			st, err := ob.Stats(db.WithContext(t.Context()))
			require.NoError(t, err)
			require.False(t, st.LastDelivery.IsZero())
			rm = tel.collect(t)
			age2, ok := gauge[float64](t, rm, "outbox.last_delivery.age", "s")
			require.True(t, ok)
			assert.GreaterOrEqual(t, age2, age, "the age grows while nothing delivers")
		})
	}
}

// runRelays runs relays with these names until stop (or the test's end),
// and waits until each has recorded itself.
func runRelays(t *testing.T, ob *outbox.Outbox, db *gorm.DB, names ...string) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{}, len(names))
	for _, name := range names {
		r := outboxtest.Relay(t, ob, db, outbox.RelayConfig{Name: name, PollInterval: 50 * time.Millisecond})
		go func() { _ = r.Run(ctx); done <- struct{}{} }()
	}
	stopped := false
	stop = func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		for range names {
			<-done
		}
	}
	t.Cleanup(stop)
	require.Eventually(t, func() bool {
		st, err := ob.Stats(db.WithContext(context.Background()))
		return err == nil && len(st.Relays) == len(names)
	}, 30*time.Second, 20*time.Millisecond, "the relays recorded themselves")
	return stop
}

// TestInboxDuplicates: a message Consume skips as consumed already counts
// once in outbox.inbox.duplicates, by consumer, with no message ID; a
// first delivery and a failed one count nothing. On SQLite, PostgreSQL and
// MariaDB.
func TestInboxDuplicates(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			tel := newTelemetry(t)
			db := b.open(t)
			tel.install(t, db, outbox.Config{})
			ok := func(*gorm.DB) error { return nil }
			require.Error(t, outbox.Consume(db, "billing", "m-1", func(*gorm.DB) error { return errors.New("timeout") }), "a failure records nothing")
			require.NoError(t, outbox.Consume(db, "billing", "m-1", ok))
			m, found := findMetric(tel.collect(t), "outbox.inbox.duplicates")
			if found {
				assert.Empty(t, m.Data.(metricdata.Sum[int64]).DataPoints, "no duplicate yet")
			}
			for range 2 {
				require.NoError(t, outbox.Consume(db, "billing", "m-1", ok)) // redelivered
			}
			require.NoError(t, outbox.Consume(db, "shipping", "m-1", ok)) // another consumer's first
			require.NoError(t, outbox.Consume(db, "shipping", "m-1", ok))

			rm := tel.collect(t)
			m, found = findMetric(rm, "outbox.inbox.duplicates")
			require.True(t, found)
			assert.Equal(t, "{message}", m.Unit)
			sum := m.Data.(metricdata.Sum[int64])
			assert.True(t, sum.IsMonotonic)
			assert.Len(t, sum.DataPoints, 2, "a series per consumer")
			assert.Equal(t, int64(2), counterSum(t, rm, "outbox.inbox.duplicates", outboxotel.ConsumerKey.String("billing")))
			assert.Equal(t, int64(1), counterSum(t, rm, "outbox.inbox.duplicates", outboxotel.ConsumerKey.String("shipping")))
			for _, p := range sum.DataPoints {
				assert.ElementsMatch(t, []attribute.Key{"messaging.system", outboxotel.ConsumerKey}, keys(p.Attributes), "no message ID")
			}
		})
	}
}

func keys(s attribute.Set) []attribute.Key {
	var out []attribute.Key
	for _, kv := range s.ToSlice() {
		out = append(out, kv.Key)
	}
	return out
}
