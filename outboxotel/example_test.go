package outboxotel_test

import (
	"context"
	"fmt"
	"log"
	"log/slog"
	"os"
	"path/filepath"

	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"gorm.io/driver/sqlite"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxotel"
)

// Instrument an outbox, publish in a traced request and deliver: the
// request, the create span Publish starts and the relay's process span
// share one trace, and the handler's event carries the process span's
// context for the broker.
func ExampleInstrument() {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))

	dir, err := os.MkdirTemp("", "outboxotel")
	if err != nil {
		log.Fatal(err)
	}
	defer os.RemoveAll(dir)
	db, err := gorm.Open(sqlite.Open("file:"+filepath.Join(dir, "app.db")+"?_journal_mode=WAL&_busy_timeout=10000&_txlock=immediate"),
		&gorm.Config{Logger: logger.Discard})
	if err != nil {
		log.Fatal(err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		log.Fatal(err)
	}
	defer sqlDB.Close()
	ob := outbox.Plugin(outbox.Config{Logger: slog.New(slog.DiscardHandler)})
	if err := db.Use(ob); err != nil {
		log.Fatal(err)
	}
	if err := outboxotel.Instrument(ob, outboxotel.WithTracerProvider(tp), outboxotel.WithStats(db)); err != nil {
		log.Fatal(err)
	}
	var sentWith string
	ob.Handle("order.created", func(ctx context.Context, e outbox.Event) error {
		sentWith = e.Headers["traceparent"] // what an adapter puts on the message
		return nil
	})

	ctx, req := tp.Tracer("app").Start(context.Background(), "POST /orders")
	err = db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		return outbox.Publish(tx, outbox.Event{Type: "order.created", Payload: map[string]int{"total": 42}})
	})
	req.End()
	if err != nil {
		log.Fatal(err)
	}
	relay, err := ob.Relay(db, outbox.RelayConfig{})
	if err != nil {
		log.Fatal(err)
	}
	if _, err := relay.ProcessOnce(context.Background()); err != nil {
		log.Fatal(err)
	}

	trace := req.SpanContext().TraceID()
	for _, s := range spans.Ended() {
		fmt.Printf("%-22s %-8s same trace: %v\n", s.Name(), s.SpanKind(), s.SpanContext().TraceID() == trace)
	}
	process := spans.Ended()[2]
	fmt.Println("message continues from process:", sentWith == fmt.Sprintf("00-%s-%s-01", trace, process.SpanContext().SpanID()))
	// Output:
	// create order.created   producer same trace: true
	// POST /orders           internal same trace: true
	// process order.created  consumer same trace: true
	// message continues from process: true
}
