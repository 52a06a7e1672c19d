// Command example traces one event from a request through the outbox relay
// and prints the spans and metrics with OpenTelemetry's stdout exporters:
//
//	cd outboxotel && go run ./example
//
// It writes an order and its event in one SQLite transaction inside a
// request span, lets a relay deliver the event to a handler that stands for
// a broker adapter, and prints the four spans (the request, "create
// order.created", "process order.created" and the handler's own), all in one
// trace, then the metrics, including the table's gauges.
package main

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"

	"go.opentelemetry.io/otel/exporters/stdout/stdoutmetric"
	"go.opentelemetry.io/otel/exporters/stdout/stdouttrace"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxotel"
)

type Order struct {
	ID    uint
	Total int
}

func main() {
	if err := run(context.Background()); err != nil {
		log.Fatal(err)
	}
}

func run(ctx context.Context) error {
	spans, err := stdouttrace.New(stdouttrace.WithPrettyPrint())
	if err != nil {
		return err
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(spans))
	metricsOut, err := stdoutmetric.New(stdoutmetric.WithPrettyPrint())
	if err != nil {
		return err
	}
	// The reader exports once, at Shutdown, so the output stays short.
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewPeriodicReader(metricsOut)))

	dir, err := os.MkdirTemp("", "outboxotel-example")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	db, err := gorm.Open(sqlite.Open("file:"+filepath.Join(dir, "app.db")+"?_journal_mode=WAL&_busy_timeout=10000&_txlock=immediate"),
		&gorm.Config{Logger: logger.Discard})
	if err != nil {
		return err
	}
	ob := outbox.Plugin(outbox.Config{Logger: slog.New(slog.DiscardHandler)})
	if err := db.Use(ob); err != nil {
		return err
	}
	// The one line.
	if err := outboxotel.Instrument(ob, outboxotel.WithTracerProvider(tp), outboxotel.WithMeterProvider(mp), outboxotel.WithStats(db)); err != nil {
		return err
	}
	if err := db.AutoMigrate(&Order{}); err != nil {
		return err
	}

	// A broker adapter would publish here; its client's span joins the trace.
	ob.Handle("order.created", func(ctx context.Context, e outbox.Event) error {
		_, span := tp.Tracer("broker-client").Start(ctx, "send order.created", trace.WithSpanKind(trace.SpanKindProducer))
		defer span.End()
		fmt.Fprintf(os.Stderr, "handler: event %s, traceparent %s\n", e.ID, e.Headers["traceparent"])
		return nil
	})

	reqCtx, req := tp.Tracer("app").Start(ctx, "POST /orders", trace.WithSpanKind(trace.SpanKindServer))
	err = db.WithContext(reqCtx).Transaction(func(tx *gorm.DB) error {
		o := Order{Total: 42}
		if err := tx.Create(&o).Error; err != nil {
			return err
		}
		return outbox.Publish(tx, outbox.Event{Type: "order.created", AggregateType: "order", AggregateID: fmt.Sprint(o.ID), Payload: o})
	})
	req.End()
	if err != nil {
		return err
	}

	relay, err := ob.Relay(db, outbox.RelayConfig{})
	if err != nil {
		return err
	}
	if _, err := relay.ProcessOnce(ctx); err != nil {
		return err
	}
	if err := tp.Shutdown(ctx); err != nil {
		return err
	}
	return mp.Shutdown(ctx)
}
