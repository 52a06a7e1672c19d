package outboxotel_test

import (
	"context"
	"log/slog"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxotel"
	"github.com/gorm-outbox/outbox/outboxtest"
)

// The overhead of the instrumentation, measured as BENCHMARKS.md records
// it, in Persistent mode on SQLite and on PostgreSQL (when
// OUTBOX_TEST_POSTGRES_DSN is set), and in Logical mode on a PostgreSQL
// cluster of the test binary's own with wal_level=logical (as
// logical_test.go starts it; skipped without the server binaries unless
// CI is set):
//
//	go test -run '^$' -bench . -benchtime=20000x ./outboxotel
//
// Besides the throughput, the relay and publish benchmarks report the
// process's CPU time per event (µs-cpu/event, µs-cpu/op: user and system,
// the exporter's goroutine included, the database server's not), which the
// load of other processes sways far less.
//
// "plain" is the outbox alone; "otel" is the same with Instrument on an SDK
// that samples every span and exports them to a discarding exporter
// through the batch span processor, and aggregates every metric (a manual
// reader, never collected: collection is a scrape's cost, not the relay's);
// "otel-unsampled" samples no trace (NeverSample, as for the requests a
// ratio sampler leaves out): trace context is still propagated and metrics
// recorded.

// discard is a span exporter that drops what it gets.
type discard struct{}

func (discard) ExportSpans(context.Context, []sdktrace.ReadOnlySpan) error { return nil }
func (discard) Shutdown(context.Context) error                             { return nil }

type benchSetup struct {
	db     *gorm.DB
	ob     *outbox.Outbox
	tracer trace.Tracer
}

// benchBackend opens a database and gives the Config of the outbox to
// install on it.
type benchBackend struct {
	name string
	open func(testing.TB) (*gorm.DB, outbox.Config)
}

// benchBackends: Persistent mode on SQLite and PostgreSQL, Logical mode on
// the logical cluster.
func benchBackends(b *testing.B) []benchBackend {
	var bs []benchBackend
	for _, bk := range backends(b)[:2] {
		bs = append(bs, benchBackend{bk.name, func(tb testing.TB) (*gorm.DB, outbox.Config) { return bk.open(tb), outbox.Config{} }})
	}
	return append(bs, benchBackend{"Logical", func(tb testing.TB) (*gorm.DB, outbox.Config) {
		db := logicalDB(tb)
		return db, logicalConfig(tb, db)
	}})
}

func benchOutbox(b *testing.B, bk benchBackend, instrumented, sampled bool) benchSetup {
	db, cfg := bk.open(b)
	cfg.Logger = slog.New(slog.DiscardHandler)
	ob := outbox.Plugin(cfg)
	if err := db.Use(ob); err != nil {
		b.Fatal(err)
	}
	sampler := sdktrace.AlwaysSample()
	if !sampled {
		sampler = sdktrace.NeverSample()
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discard{}), sdktrace.WithSampler(sampler))
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
	b.Cleanup(func() {
		_ = tp.Shutdown(context.Background())
		_ = mp.Shutdown(context.Background())
	})
	if instrumented {
		if err := outboxotel.Instrument(ob, outboxotel.WithTracerProvider(tp), outboxotel.WithMeterProvider(mp)); err != nil {
			b.Fatal(err)
		}
	}
	ob.Handle("*", func(context.Context, outbox.Event) error { return nil })
	// The request span exists in both cases, as in a traced service.
	return benchSetup{db: db, ob: ob, tracer: tp.Tracer("app")}
}

var benchVariants = []struct {
	name                  string
	instrumented, sampled bool
}{{"plain", false, true}, {"otel", true, true}, {"otel-unsampled", true, false}}

// BenchmarkRelayThroughput drains b.N pending events (published in a
// traced request beforehand) with one relay, batch 100, 4 workers, a
// handler that does nothing: the relay's own cost, where the
// instrumentation's share is largest. In Logical mode the relay streams
// them from the slot (ProcessOnce delivers what was committed before it).
func BenchmarkRelayThroughput(b *testing.B) {
	for _, bk := range benchBackends(b) {
		for _, v := range benchVariants {
			b.Run(bk.name+"/"+v.name, func(b *testing.B) {
				s := benchOutbox(b, bk, v.instrumented, v.sampled)
				ctx, span := s.tracer.Start(context.Background(), "request")
				events := make([]outbox.Event, 0, 1000)
				for i := 0; i < b.N; i += 1000 {
					events = events[:0]
					for j := i; j < min(i+1000, b.N); j++ {
						events = append(events, outbox.Event{Type: "order.created", Payload: map[string]int{"total": j}})
					}
					if err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error { return outbox.Publish(tx, events...) }); err != nil {
						b.Fatal(err)
					}
				}
				span.End()
				r := outboxtest.Relay(b, s.ob, s.db, outbox.RelayConfig{BatchSize: 100, Workers: 4})
				b.ResetTimer()
				cpu0 := cpuTime()
				total := 0
				for {
					n, err := r.ProcessOnce(context.Background())
					if err != nil {
						b.Fatal(err)
					}
					if n == 0 {
						break
					}
					total += n
				}
				b.StopTimer()
				cpu := cpuTime() - cpu0
				if total != b.N {
					b.Fatalf("delivered %d of %d", total, b.N)
				}
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
				b.ReportMetric(float64(cpu.Microseconds())/float64(b.N), "µs-cpu/event")
			})
		}
	}
}

// BenchmarkPublish is one business transaction publishing one event in a
// traced request (in Logical mode: emitting its WAL message).
func BenchmarkPublish(b *testing.B) {
	for _, bk := range benchBackends(b) {
		for _, v := range benchVariants {
			b.Run(bk.name+"/"+v.name, func(b *testing.B) {
				s := benchOutbox(b, bk, v.instrumented, v.sampled)
				b.ReportAllocs()
				b.ResetTimer()
				cpu0 := cpuTime()
				for i := range b.N {
					ctx, span := s.tracer.Start(context.Background(), "request")
					err := s.db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
						return outbox.Publish(tx, outbox.Event{Type: "order.created", Payload: map[string]int{"total": i}})
					})
					span.End()
					if err != nil {
						b.Fatal(err)
					}
				}
				b.StopTimer()
				b.ReportMetric(float64((cpuTime()-cpu0).Microseconds())/float64(b.N), "µs-cpu/op")
			})
		}
	}
}

// BenchmarkMemoryDispatch publishes one event outside a transaction in
// memory mode, which dispatches it at once and runs no SQL: the
// instrumentation's CPU per event (the create span, the process span,
// propagation, the metrics) against the outbox's own encoding and dispatch.
func BenchmarkMemoryDispatch(b *testing.B) {
	for _, v := range benchVariants {
		b.Run(v.name, func(b *testing.B) {
			db := backends(b)[0].open(b)
			ob := outbox.Plugin(outbox.Config{Mode: outbox.Memory, Logger: slog.New(slog.DiscardHandler)})
			if err := db.Use(ob); err != nil {
				b.Fatal(err)
			}
			sampler := sdktrace.AlwaysSample()
			if !v.sampled {
				sampler = sdktrace.NeverSample()
			}
			tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(discard{}), sdktrace.WithSampler(sampler))
			mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(sdkmetric.NewManualReader()))
			b.Cleanup(func() {
				_ = tp.Shutdown(context.Background())
				_ = mp.Shutdown(context.Background())
			})
			if v.instrumented {
				if err := outboxotel.Instrument(ob, outboxotel.WithTracerProvider(tp), outboxotel.WithMeterProvider(mp)); err != nil {
					b.Fatal(err)
				}
			}
			ob.Handle("*", func(context.Context, outbox.Event) error { return nil })
			ctx, span := tp.Tracer("app").Start(context.Background(), "request")
			defer span.End()
			tx := db.WithContext(ctx)
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if err := outbox.Publish(tx, outbox.Event{Type: "order.created", Payload: map[string]int{"total": i}}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
