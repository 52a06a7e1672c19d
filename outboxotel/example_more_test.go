package outboxotel_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"time"

	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/propagation"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxotel"
)

// exampleOutbox opens a SQLite database in a temporary directory and
// installs an outbox configured by cfg on it.
func exampleOutbox(cfg outbox.Config) (*gorm.DB, *outbox.Outbox, func()) {
	dir, err := os.MkdirTemp("", "outboxotel-example")
	if err != nil {
		log.Fatal(err)
	}
	db, err := gorm.Open(sqlite.Open("file:"+filepath.Join(dir, "app.db")+outbox.SQLiteDSNOptions),
		&gorm.Config{Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	cfg.Logger = slog.New(slog.DiscardHandler)
	ob := outbox.Plugin(cfg)
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}
	return db, ob, func() {
		if sqlDB, err := db.DB(); err == nil {
			_ = sqlDB.Close()
		}
		_ = os.RemoveAll(dir)
	}
}

// deliverAll runs one relay pass, as a relay's Run loop would.
func deliverAll(db *gorm.DB, ob *outbox.Outbox) {
	relay, err := ob.Relay(db, outbox.RelayConfig{})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := relay.ProcessOnce(context.Background()); err != nil {
		log.Fatal(err)
	}
}

// WithLinkOnly starts every delivery in a trace of its own, linked to the
// publishing one: for events whose retries can span hours, where one trace
// stretching over them all would be hard to read.
func ExampleWithLinkOnly() {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer func() { _ = tp.Shutdown(context.Background()) }()
	db, ob, done := exampleOutbox(outbox.Config{})
	defer done()
	if err := outboxotel.Instrument(ob, outboxotel.WithTracerProvider(tp), outboxotel.WithLinkOnly()); err != nil {
		log.Fatal(err)
	}
	ob.Handle("report.requested", func(ctx context.Context, e outbox.Event) error { return nil })

	ctx, req := tp.Tracer("app").Start(context.Background(), "POST /reports")
	if err := outbox.PublishAlone(db.WithContext(ctx), outbox.Event{Type: "report.requested"}); err != nil {
		log.Fatal(err)
	}
	req.End()
	deliverAll(db, ob)

	for _, s := range spans.Ended() {
		if s.Name() != "process report.requested" {
			continue
		}
		sameTrace := s.SpanContext().TraceID() == req.SpanContext().TraceID()
		linked := len(s.Links()) == 1 && s.Links()[0].SpanContext.TraceID() == req.SpanContext().TraceID()
		fmt.Println("same trace as the request:", sameTrace)
		fmt.Println("linked to the request's trace:", linked)
	}
	// Output:
	// same trace as the request: false
	// linked to the request's trace: true
}

// WithStats adds gauges of the outbox table, the metrics to alert on: events
// by status and the age of the oldest pending one. They are read with
// Outbox.Stats at most once per WithStatsInterval, however often the
// metrics are collected.
func ExampleWithStats() {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	db, ob, done := exampleOutbox(outbox.Config{})
	defer done()
	err := outboxotel.Instrument(ob,
		outboxotel.WithMeterProvider(mp),
		outboxotel.WithStats(db),
		outboxotel.WithStatsInterval(time.Millisecond), // production: keep the 5s default or more
	)
	if err != nil {
		log.Fatal(err)
	}
	ob.Handle("order.created", func(ctx context.Context, e outbox.Event) error { return nil })
	for range 3 {
		if err := outbox.PublishAlone(db, outbox.Event{Type: "order.created"}); err != nil {
			log.Fatal(err)
		}
	}

	printEvents := func() {
		var rm metricdata.ResourceMetrics
		if err := reader.Collect(context.Background(), &rm); err != nil {
			log.Fatal(err)
		}
		var out []string
		for _, sm := range rm.ScopeMetrics {
			for _, m := range sm.Metrics {
				if g, ok := m.Data.(metricdata.Gauge[int64]); ok && m.Name == "outbox.events" {
					for _, dp := range g.DataPoints {
						status, _ := dp.Attributes.Value(outboxotel.StatusKey)
						out = append(out, fmt.Sprintf("%s=%d", status.AsString(), dp.Value))
					}
				}
			}
		}
		slices.Sort(out)
		fmt.Println("outbox.events:", out)
	}
	printEvents()
	deliverAll(db, ob)
	time.Sleep(2 * time.Millisecond) // let the reading age past the interval
	printEvents()

	// The gauges read the table, which memory mode does not keep.
	_, mem, memDone := exampleOutbox(outbox.Config{Mode: outbox.Memory})
	defer memDone()
	fmt.Println("memory mode:", outboxotel.Instrument(mem, outboxotel.WithMeterProvider(mp), outboxotel.WithStats(db)) != nil)
	// Output:
	// outbox.events: [failed=0 pending=3]
	// outbox.events: [failed=0 pending=0]
	// memory mode: true
}

// WithMeterProvider sends the delivery metrics to the application's meter
// provider: outbox.deliveries counts every attempt by event type and outcome.
func ExampleWithMeterProvider() {
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = mp.Shutdown(context.Background()) }()
	db, ob, done := exampleOutbox(outbox.Config{})
	defer done()
	if err := outboxotel.Instrument(ob, outboxotel.WithMeterProvider(mp)); err != nil {
		log.Fatal(err)
	}
	ob.Handle("order.created", func(ctx context.Context, e outbox.Event) error { return nil })
	ob.Handle("order.refunded", func(ctx context.Context, e outbox.Event) error {
		return outbox.Permanent(fmt.Errorf("refund %s: unknown payment", e.AggregateID))
	})
	for _, typ := range []string{"order.created", "order.created", "order.refunded"} {
		if err := outbox.PublishAlone(db, outbox.Event{Type: typ, AggregateID: "7"}); err != nil {
			log.Fatal(err)
		}
	}
	deliverAll(db, ob)

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		log.Fatal(err)
	}
	var out []string
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "outbox.deliveries" {
				for _, dp := range sum.DataPoints {
					typ, _ := dp.Attributes.Value("messaging.destination.name")
					outcome, _ := dp.Attributes.Value(outboxotel.OutcomeKey)
					out = append(out, fmt.Sprintf("%s %s: %d", typ.AsString(), outcome.AsString(), dp.Value))
				}
			}
		}
	}
	slices.Sort(out)
	for _, line := range out {
		fmt.Println(line)
	}
	// Output:
	// order.created sent: 2
	// order.refunded failed: 1
}

// By default only the W3C trace context is stored with an event. A
// propagator that includes baggage stores that too, so consumers receive it;
// choose it knowingly, since the table then holds whatever the baggage
// carries.
func ExampleWithPropagator() {
	tp := sdktrace.NewTracerProvider()
	defer func() { _ = tp.Shutdown(context.Background()) }()
	db, ob, done := exampleOutbox(outbox.Config{})
	defer done()
	err := outboxotel.Instrument(ob,
		outboxotel.WithTracerProvider(tp),
		outboxotel.WithPropagator(propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})),
	)
	if err != nil {
		log.Fatal(err)
	}
	ob.Handle("order.created", func(ctx context.Context, e outbox.Event) error {
		fmt.Println("baggage:", e.Headers["baggage"])
		fmt.Println("has traceparent:", e.Headers["traceparent"] != "")
		return nil
	})

	member, err := baggage.NewMember("tenant", "acme")
	if err != nil {
		log.Fatal(err)
	}
	bag, err := baggage.New(member)
	if err != nil {
		log.Fatal(err)
	}
	ctx, req := tp.Tracer("app").Start(baggage.ContextWithBaggage(context.Background(), bag), "POST /orders")
	if err := outbox.PublishAlone(db.WithContext(ctx), outbox.Event{Type: "order.created"}); err != nil {
		log.Fatal(err)
	}
	req.End()
	deliverAll(db, ob)
	// Output:
	// baggage: tenant=acme
	// has traceparent: true
}
