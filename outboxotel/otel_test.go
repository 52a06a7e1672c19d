package outboxotel_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxotel"
	"github.com/gorm-outbox/outbox/outboxtest"
	"github.com/gorm-outbox/outbox/wire"
)

// fakeAdapter stands for a broker adapter with an instrumented client: it
// sends the headers wire.Headers gives (as every adapter does) and opens a
// span of its own from the handler's ctx.
type fakeAdapter struct {
	tracer trace.Tracer
	mu     sync.Mutex
	sent   []map[string]string
	ctxs   []trace.SpanContext
}

func (a *fakeAdapter) handle(ctx context.Context, e outbox.Event) error {
	_, span := a.tracer.Start(ctx, "send "+e.Type, trace.WithSpanKind(trace.SpanKindProducer))
	defer span.End()
	msg := map[string]string{}
	wire.Headers(e, func(k, v string) { msg[k] = v })
	a.mu.Lock()
	a.sent = append(a.sent, msg)
	a.ctxs = append(a.ctxs, trace.SpanContextFromContext(ctx))
	a.mu.Unlock()
	return nil
}

// linkedSpans lists the span IDs s links to, in order.
func linkedSpans(s sdktrace.ReadOnlySpan) []trace.SpanID {
	var ids []trace.SpanID
	for _, l := range s.Links() {
		ids = append(ids, l.SpanContext.SpanID())
	}
	return ids
}

func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// TestOneTrace follows one event from the request that publishes it,
// through the relay, to the message an adapter sends: one trace ID, each
// span the child of the one before. On SQLite, PostgreSQL and MariaDB.
func TestOneTrace(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			tel := newTelemetry(t)
			db := b.open(t)
			ob := tel.install(t, db, outbox.Config{})
			adapter := &fakeAdapter{tracer: tel.tp.Tracer("broker-client")}
			ob.Handle("order.created", adapter.handle)

			ctx, req := tel.tp.Tracer("app").Start(t.Context(), "POST /orders")
			id := "evt-1"
			require.NoError(t, db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
				return outbox.Publish(tx, outbox.Event{ID: id, Type: "order.created", Payload: map[string]int{"total": 3}})
			}))
			req.End()
			require.Equal(t, 1, outboxtest.Drain(t, outboxtest.Relay(t, ob, db, outbox.RelayConfig{})))

			traceID := req.SpanContext().TraceID()
			create := tel.span(t, "create order.created")
			assert.Equal(t, trace.SpanKindProducer, create.SpanKind())
			assert.Equal(t, traceID, create.SpanContext().TraceID())
			assert.Equal(t, req.SpanContext().SpanID(), create.Parent().SpanID(), "create is a child of the request")
			assert.Equal(t, "evt-1", attrs(create)["messaging.message.id"].AsString())

			row := outboxtest.Row(t, db, id)
			require.NotNil(t, row.Headers)
			assert.Contains(t, *row.Headers, create.SpanContext().SpanID().String(), "the stored traceparent names the create span")
			assert.NotContains(t, *row.Headers, "baggage")

			process := tel.span(t, "process order.created")
			assert.Equal(t, trace.SpanKindConsumer, process.SpanKind())
			assert.Equal(t, traceID, process.SpanContext().TraceID())
			assert.Equal(t, create.SpanContext().SpanID(), process.Parent().SpanID(), "process is a child of create")
			assert.Equal(t, []trace.SpanID{create.SpanContext().SpanID()}, linkedSpans(process), "and links it")
			a := attrs(process)
			assert.Equal(t, "outbox", a["messaging.system"].AsString())
			assert.Equal(t, "process", a["messaging.operation.type"].AsString())
			assert.Equal(t, "order.created", a["messaging.destination.name"].AsString())
			assert.Equal(t, id, a["messaging.message.id"].AsString())
			assert.Equal(t, int64(1), a[outboxotel.AttemptKey].AsInt64())
			assert.Equal(t, codes.Unset, process.Status().Code)

			send := tel.span(t, "send order.created")
			assert.Equal(t, traceID, send.SpanContext().TraceID())
			assert.Equal(t, process.SpanContext().SpanID(), send.Parent().SpanID(), "the adapter's span is a child of process")

			adapter.mu.Lock()
			defer adapter.mu.Unlock()
			require.Len(t, adapter.sent, 1)
			msgParent := parentOf(adapter.sent[0])
			assert.Equal(t, traceID, msgParent.TraceID(), "the message carries the trace")
			assert.Equal(t, process.SpanContext().SpanID(), msgParent.SpanID(), "a consumer continues from process")
			assert.Equal(t, process.SpanContext(), adapter.ctxs[0], "the handler's ctx carries process")

			rm := tel.collect(t)
			assertCount(t, rm, "outbox.deliveries", "order.created", outboxotel.OutcomeSent, 1)
			assertHistCount(t, rm, "messaging.process.duration", 1)
			assertHistCount(t, rm, "outbox.delivery.wait", 1)
			assertGauge(t, rm, outbox.StatusPending, 0)
			assertNoGauge(t, rm, outbox.StatusSent)
		})
	}
}

func assertCount(t *testing.T, rm metricdata.ResourceMetrics, name, eventType, outcome string, want int64) {
	t.Helper()
	m, ok := findMetric(rm, name)
	require.True(t, ok, "metric %s", name)
	assert.Equal(t, "{delivery}", m.Unit)
	sum := m.Data.(metricdata.Sum[int64])
	for _, dp := range sum.DataPoints {
		typ, _ := dp.Attributes.Value("messaging.destination.name")
		out, _ := dp.Attributes.Value(outboxotel.OutcomeKey)
		if typ.AsString() == eventType && out.AsString() == outcome {
			assert.Equal(t, want, dp.Value, "%s{%s,%s}", name, eventType, outcome)
			_, hasID := dp.Attributes.Value("messaging.message.id")
			assert.False(t, hasID, "no event ID as a metric attribute")
			return
		}
	}
	if want != 0 {
		t.Errorf("no %s data point for %s/%s", name, eventType, outcome)
	}
}

func assertHistCount(t *testing.T, rm metricdata.ResourceMetrics, name string, want uint64) {
	t.Helper()
	m, ok := findMetric(rm, name)
	require.True(t, ok, "metric %s", name)
	assert.Equal(t, "s", m.Unit)
	var n uint64
	for _, dp := range m.Data.(metricdata.Histogram[float64]).DataPoints {
		n += dp.Count
	}
	assert.Equal(t, want, n, "%s count", name)
}

func assertGauge(t *testing.T, rm metricdata.ResourceMetrics, status outbox.Status, want int64) {
	t.Helper()
	m, ok := findMetric(rm, "outbox.events")
	require.True(t, ok, "metric outbox.events")
	for _, dp := range m.Data.(metricdata.Gauge[int64]).DataPoints {
		if v, _ := dp.Attributes.Value(outboxotel.StatusKey); v.AsString() == string(status) {
			assert.Equal(t, want, dp.Value, "outbox.events{%s}", status)
			return
		}
	}
	t.Errorf("no outbox.events data point for %s", status)
}

// assertNoGauge asserts outbox.events has no data point for status.
func assertNoGauge(t *testing.T, rm metricdata.ResourceMetrics, status outbox.Status) {
	t.Helper()
	m, ok := findMetric(rm, "outbox.events")
	require.True(t, ok, "metric outbox.events")
	for _, dp := range m.Data.(metricdata.Gauge[int64]).DataPoints {
		v, _ := dp.Attributes.Value(outboxotel.StatusKey)
		assert.NotEqual(t, string(status), v.AsString(), "outbox.events has no %s data point", status)
	}
}

// TestOutcomes counts each outcome and marks failed spans.
func TestOutcomes(t *testing.T) {
	t.Parallel()
	tel := newTelemetry(t)
	db := backends(t)[0].open(t)
	ob := tel.install(t, db, outbox.Config{})
	ob.Handle("ok", func(context.Context, outbox.Event) error { return nil })
	ob.Handle("flaky", func(context.Context, outbox.Event) error { return errors.New("try later") })
	ob.Handle("bad", func(context.Context, outbox.Event) error { return outbox.Permanent(errors.New("malformed")) })
	ob.Handle("down", func(context.Context, outbox.Event) error { return outbox.Unavailable(errors.New("broker down")) })
	outboxtest.Publish(t, db,
		outbox.Event{Type: "ok"}, outbox.Event{Type: "flaky"}, outbox.Event{Type: "bad"},
		outbox.Event{Type: "orphan"}, outbox.Event{Type: "down"})
	_, err := outboxtest.Relay(t, ob, db, outbox.RelayConfig{Workers: 1}).ProcessOnce(t.Context())
	require.True(t, outbox.IsUnavailable(err), "the last event reports its destination down: %v", err)

	rm := tel.collect(t)
	assertCount(t, rm, "outbox.deliveries", "ok", outboxotel.OutcomeSent, 1)
	assertCount(t, rm, "outbox.deliveries", "flaky", outboxotel.OutcomeRetry, 1)
	assertCount(t, rm, "outbox.deliveries", "bad", outboxotel.OutcomeFailed, 1)
	assertCount(t, rm, "outbox.deliveries", "orphan", outboxotel.OutcomeNoHandler, 1)
	assertCount(t, rm, "outbox.deliveries", "down", outboxotel.OutcomeUnavailable, 1)
	assertHistCount(t, rm, "messaging.process.duration", 5)
	assertHistCount(t, rm, "outbox.delivery.wait", 2) // only the attempts that ended a wait: ok and bad
	assertGauge(t, rm, outbox.StatusFailed, 1)
	assertGauge(t, rm, outbox.StatusPending, 3)
	m, ok := findMetric(rm, "outbox.pending.oldest_age")
	require.True(t, ok)
	assert.Equal(t, "s", m.Unit)

	for typ, want := range map[string]string{"flaky": "_OTHER", "bad": "permanent", "orphan": "no_handler", "down": "unavailable"} {
		s := tel.span(t, "process "+typ)
		assert.Equal(t, codes.Error, s.Status().Code, typ)
		assert.Equal(t, want, attrs(s)["error.type"].AsString(), typ)
		require.NotEmpty(t, s.Events(), "%s: the error is recorded", typ)
		assert.Equal(t, "exception", s.Events()[0].Name)
	}
	assert.Equal(t, codes.Unset, tel.span(t, "process ok").Status().Code)
}

// TestMemoryMode: the dispatch after commit runs in a process span, a
// child of create and linked to the request that committed.
func TestMemoryMode(t *testing.T) {
	t.Parallel()
	tel := newTelemetry(t)
	db := backends(t)[0].open(t)
	ob := tel.install(t, db, outbox.Config{Mode: outbox.Memory})
	adapter := &fakeAdapter{tracer: tel.tp.Tracer("broker-client")}
	ob.Handle("order.created", adapter.handle)

	ctx, req := tel.tp.Tracer("app").Start(t.Context(), "POST /orders")
	require.NoError(t, db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		return outbox.Publish(tx, outbox.Event{Type: "order.created"})
	}))
	req.End()

	create := tel.span(t, "create order.created")
	process := tel.span(t, "process order.created")
	assert.Equal(t, req.SpanContext().TraceID(), process.SpanContext().TraceID())
	assert.Equal(t, create.SpanContext().SpanID(), process.Parent().SpanID())
	assert.Equal(t, []trace.SpanID{create.SpanContext().SpanID(), req.SpanContext().SpanID()}, linkedSpans(process),
		"linked to create, its parent, and to the committing request")
	assert.Equal(t, int64(0), attrs(process)[outboxotel.AttemptKey].AsInt64())
	assert.Equal(t, process.SpanContext().SpanID(), parentOf(adapter.sent[0]).SpanID())

	rm := tel.collect(t)
	assertCount(t, rm, "outbox.deliveries", "order.created", outboxotel.OutcomeSent, 1)
	_, ok := findMetric(rm, "outbox.events")
	assert.False(t, ok, "no table gauges in memory mode")
	assert.ErrorIs(t, outboxotel.Instrument(ob, outboxotel.WithStats(db)), outbox.ErrMemoryMode)
}

// TestLinkOnly: the delivery starts a trace of its own, linked to the
// publishing one.
func TestLinkOnly(t *testing.T) {
	t.Parallel()
	tel := newTelemetry(t)
	db := backends(t)[0].open(t)
	ob := tel.install(t, db, outbox.Config{}, outboxotel.WithLinkOnly())
	ob.Handle("*", func(context.Context, outbox.Event) error { return nil })
	ctx, req := tel.tp.Tracer("app").Start(t.Context(), "request")
	require.NoError(t, outbox.PublishAlone(db.WithContext(ctx), outbox.Event{Type: "x"}))
	req.End()
	outboxtest.Drain(t, outboxtest.Relay(t, ob, db, outbox.RelayConfig{}))

	create := tel.span(t, "create x")
	process := tel.span(t, "process x")
	assert.NotEqual(t, create.SpanContext().TraceID(), process.SpanContext().TraceID())
	assert.False(t, process.Parent().IsValid(), "a root")
	assert.Equal(t, []trace.SpanID{create.SpanContext().SpanID()}, linkedSpans(process))
}

// TestNoActiveSpan: without a span at Publish nothing is stored; the
// delivery starts a trace, which the messages still carry.
func TestNoActiveSpan(t *testing.T) {
	t.Parallel()
	tel := newTelemetry(t)
	db := backends(t)[0].open(t)
	ob := tel.install(t, db, outbox.Config{})
	adapter := &fakeAdapter{tracer: tel.tp.Tracer("broker-client")}
	ob.Handle("*", adapter.handle)
	require.NoError(t, outbox.PublishAlone(db, outbox.Event{ID: "e", Type: "x"}))
	assert.Nil(t, outboxtest.Row(t, db, "e").Headers, "no trace context stored")
	assert.Empty(t, tel.spansNamed("create x"))
	outboxtest.Drain(t, outboxtest.Relay(t, ob, db, outbox.RelayConfig{}))

	process := tel.span(t, "process x")
	assert.False(t, process.Parent().IsValid())
	assert.Equal(t, process.SpanContext().SpanID(), parentOf(adapter.sent[0]).SpanID())
}

// TestExistingTraceparent: an event that already carries trace context
// keeps it, and is delivered as its child.
func TestExistingTraceparent(t *testing.T) {
	t.Parallel()
	tel := newTelemetry(t)
	db := backends(t)[0].open(t)
	ob := tel.install(t, db, outbox.Config{})
	ob.Handle("*", func(context.Context, outbox.Event) error { return nil })
	const tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
	ctx, req := tel.tp.Tracer("app").Start(t.Context(), "request")
	require.NoError(t, outbox.PublishAlone(db.WithContext(ctx), outbox.Event{ID: "e", Type: "x", Headers: map[string]string{"Traceparent": tp}}))
	req.End()
	assert.Empty(t, tel.spansNamed("create x"))
	outboxtest.Drain(t, outboxtest.Relay(t, ob, db, outbox.RelayConfig{}))
	process := tel.span(t, "process x")
	assert.Equal(t, "0af7651916cd43dd8448eb211c80319c", process.SpanContext().TraceID().String())
	assert.Equal(t, "b7ad6b7169203331", process.Parent().SpanID().String())
	require.Len(t, process.Links(), 1, "the stored context is linked too")
	assert.Equal(t, process.Parent(), process.Links()[0].SpanContext)
}

// TestBaggageOnlyWhenAsked: the default propagator stores no baggage.
func TestBaggageOnlyWhenAsked(t *testing.T) {
	t.Parallel()
	member, err := baggage.NewMember("user.email", "someone@example.com")
	require.NoError(t, err)
	bag, err := baggage.New(member)
	require.NoError(t, err)
	for _, withBaggage := range []bool{false, true} {
		tel := newTelemetry(t)
		db := backends(t)[0].open(t)
		var extra []outboxotel.Option
		if withBaggage {
			extra = append(extra, outboxotel.WithPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})))
		}
		ob := tel.install(t, db, outbox.Config{}, extra...)
		var seen baggage.Baggage
		ob.Handle("x", func(ctx context.Context, _ outbox.Event) error { seen = baggage.FromContext(ctx); return nil })
		ctx, req := tel.tp.Tracer("app").Start(baggage.ContextWithBaggage(t.Context(), bag), "request")
		require.NoError(t, outbox.PublishAlone(db.WithContext(ctx), outbox.Event{ID: "e", Type: "x"}))
		req.End()
		h := outboxtest.Row(t, db, "e").Headers
		require.NotNil(t, h)
		assert.Contains(t, *h, "traceparent")
		outboxtest.Drain(t, outboxtest.Relay(t, ob, db, outbox.RelayConfig{Workers: 1}))
		if withBaggage {
			assert.Contains(t, *h, "someone")
			assert.Equal(t, "someone@example.com", seen.Member("user.email").Value(), "the handler's ctx carries the baggage")
		} else {
			assert.NotContains(t, *h, "someone", "baggage is not written unless asked")
			assert.Zero(t, seen.Len())
		}
	}
}

// TestStatsCached: collecting often does not query the table each time.
func TestStatsCached(t *testing.T) {
	t.Parallel()
	tel := newTelemetry(t)
	db := backends(t)[0].open(t)
	tel.install(t, db, outbox.Config{}, outboxotel.WithStatsInterval(time.Hour))
	outboxtest.Publish(t, db, outbox.Event{Type: "x"})
	assertGauge(t, tel.collect(t), outbox.StatusPending, 1)
	outboxtest.Publish(t, db, outbox.Event{Type: "x"})
	assertGauge(t, tel.collect(t), outbox.StatusPending, 1) // the reading is an hour old at most

	fresh := newTelemetry(t)
	db2 := backends(t)[0].open(t)
	fresh.install(t, db2, outbox.Config{}, outboxotel.WithStatsInterval(time.Nanosecond))
	outboxtest.Publish(t, db2, outbox.Event{Type: "x"})
	assertGauge(t, fresh.collect(t), outbox.StatusPending, 1)
	outboxtest.Publish(t, db2, outbox.Event{Type: "x"})
	assertGauge(t, fresh.collect(t), outbox.StatusPending, 2)
}

// TestCreateSpanOnlyWhenStored: Publish records a create span for the
// events it stores, none for those it does not: a call refused for an
// invalid event (the valid one beside it included), an event whose
// idempotency key is taken (Persistent mode skips it), a dry run. On
// SQLite, PostgreSQL and MariaDB; Logical mode in
// TestCreateSpanOnlyWhenStoredLogical.
func TestCreateSpanOnlyWhenStored(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			tel := newTelemetry(t)
			db := b.open(t)
			ob := tel.install(t, db, outbox.Config{})
			checkCreateOnlyWhenStored(t, tel, db, ob, true)
		})
	}
}

// checkCreateOnlyWhenStored publishes stored and unstored events in a
// traced request and checks which have a create span; duplicates says
// whether the mode skips an event whose idempotency key is taken at
// Publish (Persistent) rather than at delivery.
func checkCreateOnlyWhenStored(t *testing.T, tel *telemetry, db *gorm.DB, ob *outbox.Outbox, duplicates bool) {
	t.Helper()
	var delivered []string
	var mu sync.Mutex
	ob.Handle("*", func(_ context.Context, e outbox.Event) error {
		mu.Lock()
		defer mu.Unlock()
		delivered = append(delivered, e.Type)
		return nil
	})
	ctx, req := tel.tp.Tracer("app").Start(t.Context(), "request")
	db = db.WithContext(ctx)
	require.NoError(t, outbox.PublishAlone(db, outbox.Event{Type: "kept", IdempotencyKey: "k"}))
	if duplicates {
		require.NoError(t, outbox.PublishAlone(db, outbox.Event{Type: "duplicate", IdempotencyKey: "k"}))
	}
	err := outbox.PublishAlone(db, outbox.Event{Type: "beside-invalid"}, outbox.Event{Type: "invalid", Payload: make(chan int)})
	require.ErrorIs(t, err, outbox.ErrInvalidEvent)
	require.NoError(t, outbox.Publish(db.Session(&gorm.Session{DryRun: true}), outbox.Event{Type: "dry"}))
	require.NoError(t, db.Transaction(func(tx *gorm.DB) error {
		return outbox.Publish(tx, outbox.Event{Type: "kept-in-tx"}, outbox.Event{Type: "kept-in-tx"})
	}))
	req.End()
	assert.Zero(t, tel.waiting(), "every create span ended or dropped")

	assert.Len(t, tel.spansNamed("create kept"), 1)
	assert.Len(t, tel.spansNamed("create kept-in-tx"), 2)
	for _, typ := range []string{"duplicate", "beside-invalid", "invalid", "dry"} {
		assert.Empty(t, tel.spansNamed("create "+typ), "%s: not stored, no create span", typ)
	}
	outboxtest.Drain(t, outboxtest.Relay(t, ob, db, outbox.RelayConfig{}))
	mu.Lock()
	assert.ElementsMatch(t, []string{"kept", "kept-in-tx", "kept-in-tx"}, delivered, "what was stored")
	mu.Unlock()
}

// TestFailedOnLastAttempt: the attempt after which an event is failed for
// good counts outcome failed whatever the cause, no handler included;
// the attempts before it count retry, or no_handler. Every span keeps the
// cause as error.type. On SQLite, PostgreSQL and MariaDB; Logical mode in
// TestFailedOnLastAttemptLogical; memory mode, which does not retry,
// counts an event no handler matches as failed at once.
func TestFailedOnLastAttempt(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			tel := newTelemetry(t)
			db := b.open(t)
			ob := tel.install(t, db, outbox.Config{})
			checkFailedOnLastAttempt(t, tel, db, ob)
		})
	}
	t.Run("Memory", func(t *testing.T) {
		t.Parallel()
		tel := newTelemetry(t)
		db := backends(t)[0].open(t)
		tel.install(t, db, outbox.Config{Mode: outbox.Memory})
		require.NoError(t, outbox.PublishAlone(db, outbox.Event{Type: "orphan"}))
		rm := tel.collect(t)
		assertCount(t, rm, "outbox.deliveries", "orphan", outboxotel.OutcomeFailed, 1)
		assertCount(t, rm, "outbox.deliveries", "orphan", outboxotel.OutcomeNoHandler, 0)
		assert.Equal(t, "no_handler", attrs(tel.span(t, "process orphan"))["error.type"].AsString())
	})
}

// checkFailedOnLastAttempt delivers an event no handler matches and one
// whose handler fails, with two attempts each.
func checkFailedOnLastAttempt(t *testing.T, tel *telemetry, db *gorm.DB, ob *outbox.Outbox) {
	t.Helper()
	ob.Handle("flaky", func(context.Context, outbox.Event) error { return errors.New("try later") })
	outboxtest.Publish(t, db, outbox.Event{Type: "orphan"}, outbox.Event{Type: "flaky"})
	r := outboxtest.Relay(t, ob, db, outbox.RelayConfig{MaxAttempts: 2, Backoff: func(int) time.Duration { return 0 }})
	require.Equal(t, 4, outboxtest.Drain(t, r), "two attempts each")

	rm := tel.collect(t)
	assertCount(t, rm, "outbox.deliveries", "orphan", outboxotel.OutcomeNoHandler, 1)
	assertCount(t, rm, "outbox.deliveries", "orphan", outboxotel.OutcomeFailed, 1)
	assertCount(t, rm, "outbox.deliveries", "flaky", outboxotel.OutcomeRetry, 1)
	assertCount(t, rm, "outbox.deliveries", "flaky", outboxotel.OutcomeFailed, 1)
	assertHistCount(t, rm, "outbox.delivery.wait", 2) // the attempts that failed them for good
	for typ, want := range map[string]string{"orphan": "no_handler", "flaky": "_OTHER"} {
		spans := tel.spansNamed("process " + typ)
		require.Len(t, spans, 2, typ)
		for _, s := range spans {
			assert.Equal(t, want, attrs(s)["error.type"].AsString(), typ)
		}
	}
}
