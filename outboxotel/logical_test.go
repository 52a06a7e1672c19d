package outboxotel_test

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/internal/pgtest"
	"github.com/gorm-outbox/outbox/outboxotel"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
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
func logicalDB(t *testing.T) *gorm.DB {
	t.Helper()
	logicalServer.once.Do(func() {
		logicalServer.s, logicalServer.err = pgtest.Start("wal_level=logical")
	})
	if err := logicalServer.err; err != nil {
		if errors.Is(err, pgtest.ErrNoBinaries) && os.Getenv("CI") == "" {
			t.Skipf("Logical mode needs a PostgreSQL installation: %v", err)
		}
		t.Fatalf("cannot start a PostgreSQL with wal_level=logical: %v", err)
	}
	return openGorm(t, postgres.Open(logicalServer.s.DSN("postgres")))
}

func TestMain(m *testing.M) {
	code := m.Run()
	if logicalServer.s != nil {
		logicalServer.s.Close()
	}
	os.Exit(code)
}

// TestOneTraceLogical: in Logical mode the trace context travels in the
// WAL message, and the slot's gauges are reported.
func TestOneTraceLogical(t *testing.T) {
	t.Parallel()
	db := logicalDB(t)
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	slot := "otel_" + hex.EncodeToString(b)
	t.Cleanup(func() {
		for range 50 {
			if db.Exec("SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE slot_name = ?", slot).Error == nil {
				break
			}
			time.Sleep(100 * time.Millisecond) // the walsender exits a moment after its connection closes
		}
	})
	tel := newTelemetry(t)
	ob := tel.install(t, db, outbox.Config{Mode: outbox.Logical, Table: "t_" + hex.EncodeToString(b), Slot: slot}, outboxotel.WithStatsInterval(time.Millisecond))
	adapter := &fakeAdapter{tracer: tel.tp.Tracer("broker-client")}
	ob.Handle("order.created", adapter.handle)

	ctx, req := tel.tp.Tracer("app").Start(t.Context(), "POST /orders")
	require.NoError(t, db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		return outbox.Publish(tx, outbox.Event{Type: "order.created", Payload: map[string]int{"total": 3}})
	}))
	req.End()
	r := ob.Relay(db, outbox.RelayConfig{})
	n, err := r.ProcessOnce(t.Context())
	require.NoError(t, err)
	require.Equal(t, 1, n)

	traceID := req.SpanContext().TraceID()
	create := tel.span(t, "create order.created")
	process := tel.span(t, "process order.created")
	send := tel.span(t, "send order.created")
	assert.Equal(t, traceID, process.SpanContext().TraceID())
	assert.Equal(t, create.SpanContext().SpanID(), process.Parent().SpanID(), "the stored context came through the WAL")
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
