package outboxotel_test

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/pgtest"
	"github.com/gorm-outbox/outbox/outboxotel"
	"github.com/gorm-outbox/outbox/outboxtest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	"go.opentelemetry.io/otel/trace"
	"go.uber.org/goleak"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
)

var logicalServer struct {
	once sync.Once
	s    *pgtest.Server
	err  error
}

// logicalDB opens a database on a cluster this test binary owns, with
// wal_level=logical (the shared server has replica).
func logicalDB(t testing.TB) *gorm.DB {
	t.Helper()
	long(t, "a PostgreSQL cluster of its own, with wal_level=logical")
	logicalServer.once.Do(func() {
		logicalServer.s, logicalServer.err = pgtest.Start("wal_level=logical")
	})
	if err := logicalServer.err; err != nil {
		if errors.Is(err, pgtest.ErrNoBinaries) && !strict() {
			t.Skipf("Logical mode needs a PostgreSQL installation: %v", err)
		}
		t.Fatalf("cannot start a PostgreSQL with wal_level=logical: %v", err)
	}
	return openGorm(t, postgres.Open(logicalServer.s.DSN("postgres")))
}

// TestMain fails the run if a test leaves goroutines behind, once the
// logical cluster the tests started is stopped.
func TestMain(m *testing.M) { goleak.VerifyTestMain(stopsServer{m}) }

// stopsServer stops the PostgreSQL cluster the tests started once they are
// done.
type stopsServer struct{ m *testing.M }

func (s stopsServer) Run() int {
	code := s.m.Run()
	if logicalServer.s != nil {
		logicalServer.s.Close()
	}
	return code
}

// installLogical opens a database on the logical cluster and installs an
// instrumented Logical mode outbox on it, with a table and slot of its own
// that are dropped at cleanup.
func installLogical(t *testing.T, tel *telemetry, extra ...outboxotel.Option) (*gorm.DB, *outbox.Outbox) {
	t.Helper()
	db := logicalDB(t)
	ob := tel.install(t, db, logicalConfig(t, db), extra...)
	return db, ob
}

// logicalConfig is the Config of a Logical mode outbox on db with a table
// and slot of its own, dropped at cleanup.
func logicalConfig(t testing.TB, db *gorm.DB) outbox.Config {
	t.Helper()
	name := "otel_" + randomName()
	t.Cleanup(func() {
		// Cleanups run last in, first out: by now the relay's connections
		// are closed, but a walsender exits a moment after its connection
		// does; pg_terminate_backend with a timeout waits until it is gone
		// (and the slot released) rather than polling.
		_ = db.Exec("SELECT pg_terminate_backend(active_pid, 10000) FROM pg_replication_slots WHERE slot_name = ? AND active_pid IS NOT NULL", name).Error
		assert.NoError(t, db.Exec("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = ?", name).Error)
		_ = db.Exec(`DROP PUBLICATION IF EXISTS "` + name + `"`).Error
		_ = db.Exec(`DROP TABLE IF EXISTS "` + name + `"`).Error
	})
	return outbox.Config{Mode: outbox.Logical, Table: name, Logical: outbox.LogicalConfig{Slot: name}}
}

// TestOneTraceLogical: in Logical mode the trace context travels in the
// WAL message, and the slot's gauges are reported.
func TestOneTraceLogical(t *testing.T) {
	t.Parallel()
	tel := newTelemetry(t)
	db, ob := installLogical(t, tel, outboxotel.WithStatsInterval(time.Millisecond))
	adapter := &fakeAdapter{tracer: tel.tp.Tracer("broker-client")}
	ob.Handle("order.created", adapter.handle)

	ctx, req := tel.tp.Tracer("app").Start(t.Context(), "POST /orders")
	require.NoError(t, db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		return outbox.Publish(tx, outbox.Event{Type: "order.created", Payload: map[string]int{"total": 3}})
	}))
	req.End()
	r := outboxtest.Relay(t, ob, db, outbox.RelayConfig{})
	n, err := r.ProcessOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, n)

	traceID := req.SpanContext().TraceID()
	create := tel.span(t, "create order.created")
	process := tel.span(t, "process order.created")
	send := tel.span(t, "send order.created")
	assert.Equal(t, traceID, process.SpanContext().TraceID())
	assert.Equal(t, create.SpanContext().SpanID(), process.Parent().SpanID(), "the stored context came through the WAL")
	assert.Equal(t, []trace.SpanID{create.SpanContext().SpanID()}, linkedSpans(process), "process links create too")
	assert.Equal(t, process.SpanContext().SpanID(), send.Parent().SpanID())
	adapter.mu.Lock()
	require.Len(t, adapter.sent, 1)
	assert.Equal(t, process.SpanContext().SpanID(), parentOf(adapter.sent[0]).SpanID(), "a consumer continues from process")
	adapter.mu.Unlock()

	rm := tel.collect(t)
	assertCount(t, rm, "outbox.deliveries", "order.created", outboxotel.OutcomeSent, 1)
	m, ok := findMetric(rm, "outbox.slot.lag")
	require.True(t, ok, "outbox.slot.lag")
	assert.Equal(t, "By", m.Unit)
	require.Len(t, m.Data.(metricdata.Gauge[int64]).DataPoints, 1)
	_, ok = findMetric(rm, "outbox.slot.active")
	assert.True(t, ok, "outbox.slot.active")
}

// TestCreateSpanOnlyWhenStoredLogical is TestCreateSpanOnlyWhenStored in
// Logical mode, which tells duplicates apart only at delivery (the core
// reports them stored).
func TestCreateSpanOnlyWhenStoredLogical(t *testing.T) {
	t.Parallel()
	tel := newTelemetry(t)
	db, ob := installLogical(t, tel)
	checkCreateOnlyWhenStored(t, tel, db, ob, false)
}

// TestFailedOnLastAttemptLogical is TestFailedOnLastAttempt in Logical
// mode: the first attempts come from the stream, the last from the table.
func TestFailedOnLastAttemptLogical(t *testing.T) {
	t.Parallel()
	tel := newTelemetry(t)
	db, ob := installLogical(t, tel)
	checkFailedOnLastAttempt(t, tel, db, ob)
}

// TestDroppedLogical: an event Logical mode drops because another event
// took its ID first is counted by outbox.events.dropped.
func TestDroppedLogical(t *testing.T) {
	t.Parallel()
	tel := newTelemetry(t)
	db, ob := installLogical(t, tel, outboxotel.WithStatsInterval(time.Nanosecond))
	ob.Handle("x", func(context.Context, outbox.Event) error { return nil })
	require.NoError(t, outbox.PublishAlone(db, outbox.Event{ID: "same", Type: "x", IdempotencyKey: "k1"}))
	require.NoError(t, outbox.PublishAlone(db, outbox.Event{ID: "same", Type: "x", IdempotencyKey: "k2"}))
	outboxtest.Drain(t, outboxtest.Relay(t, ob, db, outbox.RelayConfig{}))

	m, ok := findMetric(tel.collect(t), "outbox.events.dropped")
	require.True(t, ok, "outbox.events.dropped")
	sum := m.Data.(metricdata.Sum[int64])
	assert.True(t, sum.IsMonotonic)
	require.Len(t, sum.DataPoints, 1)
	assert.EqualValues(t, 1, sum.DataPoints[0].Value)
}

// TestSlotLostLogical: a relay that finds its slot gone (a failover to a
// standby without it) counts it in outbox.slot.lost, which is reported
// while Stats fails with ErrNoSlot.
func TestSlotLostLogical(t *testing.T) {
	t.Parallel()
	tel := newTelemetry(t)
	db := logicalDB(t)
	cfg := logicalConfig(t, db)
	cfg.Logger = slog.New(slog.DiscardHandler)
	ob := outbox.Plugin(cfg)
	require.NoError(t, db.Use(ob))
	require.NoError(t, outboxotel.Instrument(ob, tel.options(outboxotel.WithStats(db), outboxotel.WithStatsInterval(time.Nanosecond))...))
	require.NoError(t, db.Exec("SELECT pg_drop_replication_slot(?)", cfg.Logical.Slot).Error)

	_, err := outboxtest.Relay(t, ob, db, outbox.RelayConfig{}).ProcessOnce(t.Context())
	require.ErrorIs(t, err, outbox.ErrNoSlot)
	r := outboxtest.Relay(t, ob, db, outbox.RelayConfig{PollInterval: 10 * time.Millisecond})
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() { cancel(); <-done }()

	require.Eventually(t, func() bool {
		m, ok := findMetric(tel.collect(t), "outbox.slot.lost")
		if !ok {
			return false
		}
		sum := m.Data.(metricdata.Sum[int64])
		return sum.IsMonotonic && len(sum.DataPoints) == 1 && sum.DataPoints[0].Value == 1
	}, 10*time.Second, 20*time.Millisecond, "outbox.slot.lost = 1")
}
