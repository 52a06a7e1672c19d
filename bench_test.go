package outbox

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"
)

// The benchmarks run on SQLite and, when OUTBOX_TEST_POSTGRES_DSN is set,
// on PostgreSQL. They are bounded by -benchtime; CI runs them as
//
//	go test -run '^$' -bench . -benchtime=100x .
//
// to keep them compiling. The side-by-side comparison with watermill-sql
// and the raw-SQL floors is the bench/ module (see BENCHMARKS.md).

var benchBackends = []string{"sqlite", "postgres"}

// benchOutbox opens a fresh database with the plugin installed and the
// Order table created.
func benchOutbox(b *testing.B, backend string, cfg Config) (*gorm.DB, *Outbox) {
	b.Helper()
	db := openBenchDB(b, backend)
	cfg.Logger = slog.New(slog.DiscardHandler)
	ob := Plugin(cfg)
	if err := db.Use(ob); err != nil {
		b.Fatalf("install: %v", err)
	}
	if err := db.AutoMigrate(&Order{}); err != nil {
		b.Fatalf("migrate: %v", err)
	}
	// OUTBOX_BENCH_FILLFACTOR measures the table's fillfactor on
	// PostgreSQL (room on the page lets the claim be a HOT update).
	if ff := os.Getenv("OUTBOX_BENCH_FILLFACTOR"); ff != "" && backend == "postgres" {
		if err := db.Exec("ALTER TABLE " + ob.Table() + " SET (fillfactor = " + strconv.Itoa(atoiOr(ff, 100)) + ")").Error; err != nil {
			b.Fatalf("fillfactor: %v", err)
		}
	}
	return db, ob
}

func atoiOr(s string, def int) int {
	if n, err := strconv.Atoi(s); err == nil {
		return n
	}
	return def
}

type benchPayload struct {
	OrderID uint `json:"order_id"`
	Total   int  `json:"total"`
}

// BenchmarkPublish is one business transaction: insert an Order and
// publish one event in it, at defaults and, on PostgreSQL, with
// DisableNotify: the difference is what the NOTIFY costs the writing
// process (cpu-ns/op is the process's CPU per transaction, its notifier
// goroutine's included; no relay runs, so every NOTIFY is sent).
func BenchmarkPublish(b *testing.B) {
	for _, backend := range benchBackends {
		b.Run(backend, func(b *testing.B) { benchPublish(b, backend, Config{}) })
		if backend == "postgres" {
			b.Run(backend+"/DisableNotify", func(b *testing.B) { benchPublish(b, backend, Config{DisableNotify: true}) })
		}
	}
}

func benchPublish(b *testing.B, backend string, cfg Config) {
	db, _ := benchOutbox(b, backend, cfg)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := processCPU(b)
	for i := range b.N {
		err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			o := Order{Total: i}
			if err := tx.Create(&o).Error; err != nil {
				return err
			}
			return Publish(tx, Event{
				Type: "order.created", AggregateType: "order", AggregateID: strconv.Itoa(int(o.ID)),
				Payload: benchPayload{OrderID: o.ID, Total: o.Total},
			})
		})
		if err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(processCPU(b)-cpu0)/float64(b.N), "cpu-ns/op")
}

// BenchmarkPublishCall is one Publish of one generated event inside an
// open transaction (rolled back at the end), beside the hand-written INSERT
// of the same row on the same transaction ("floor"): what Publish costs
// beyond the statement, without the commit, whose time on a shared
// machine varies more than that difference. The floor encodes its payload
// and draws its ID as Publish does.
func BenchmarkPublishCall(b *testing.B) {
	for _, backend := range benchBackends {
		b.Run(backend, func(b *testing.B) {
			db, ob := benchOutbox(b, backend, Config{DisableNotify: true})
			floorSQL := `INSERT INTO ` + ob.Table() + ` (id, event_type, aggregate_type, aggregate_id, payload, occurred_at) VALUES (?, ?, ?, ?, ?, ?)`
			if backend == "postgres" {
				floorSQL = `INSERT INTO ` + ob.Table() + ` (id, event_type, aggregate_type, aggregate_id, payload, occurred_at) VALUES ($1::uuid, $2, $3, $4, $5, $6)`
			}
			floor := func(tx *gorm.DB, i int) error {
				id, err := uuid.NewV7()
				if err != nil {
					return err
				}
				payload, err := json.Marshal(benchPayload{OrderID: uint(i), Total: i})
				if err != nil {
					return err
				}
				_, err = tx.Statement.ConnPool.ExecContext(tx.Statement.Context, floorSQL, id.String(), "order.created", "order",
					strconv.Itoa(i), string(payload), time.Now().UTC())
				return err
			}
			publish := func(tx *gorm.DB, i int) error {
				return Publish(tx, Event{Type: "order.created", AggregateType: "order", AggregateID: strconv.Itoa(i),
					Payload: benchPayload{OrderID: uint(i), Total: i}})
			}
			for _, c := range []struct {
				name string
				call func(*gorm.DB, int) error
			}{{"floor", floor}, {"publish", publish}} {
				b.Run(c.name, func(b *testing.B) {
					tx := db.WithContext(context.Background()).Begin()
					if tx.Error != nil {
						b.Fatal(tx.Error)
					}
					defer tx.Rollback()
					b.ReportAllocs()
					for i := 0; b.Loop(); i++ {
						if err := c.call(tx, i); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
		})
	}
}

// relayCycleBatch is the batch one BenchmarkRelayCycle iteration claims.
const relayCycleBatch = 100

// BenchmarkRelayCycle is one relay cycle: claim a batch of 100 due events,
// deliver them to a no-op handler, mark them sent. The 100 events are
// written before each iteration with the timer stopped.
func BenchmarkRelayCycle(b *testing.B) {
	for _, backend := range benchBackends {
		for _, kind := range []string{"handler", "async"} {
			b.Run(backend+"/"+kind, func(b *testing.B) { benchRelayCycle(b, backend, kind) })
		}
	}
}

// benchRelayCycle is one BenchmarkRelayCycle: the relay's own cost, with a
// no-op Handler (Workers goroutines) or a no-op AsyncHandler (one wave).
func benchRelayCycle(b *testing.B, backend, kind string) {
	db, ob := benchOutbox(b, backend, Config{DisableNotify: true, RetainSent: RetainForever})
	if kind == "async" {
		ok := func() error { return nil }
		ob.HandleAsync("order.created", func(context.Context, Event) func() error { return ok })
	} else {
		ob.Handle("order.created", func(context.Context, Event) error { return nil })
	}
	relay := mustRelay(b, ob, db, RelayConfig{BatchSize: relayCycleBatch})
	ctx := context.Background()
	events := make([]Event, relayCycleBatch)
	var (
		delivered int
		busy      time.Duration
	)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		for j := range events {
			events[j] = Event{Type: "order.created", AggregateType: "order",
				AggregateID: strconv.Itoa(i*relayCycleBatch + j), Payload: benchPayload{Total: j}}
		}
		if err := PublishAlone(db.WithContext(ctx), events...); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
		start := time.Now()
		n, err := relay.ProcessOnce(ctx)
		busy += time.Since(start)
		if err != nil {
			b.Fatal(err)
		}
		if n != relayCycleBatch {
			b.Fatalf("claimed %d events, want %d", n, relayCycleBatch)
		}
		delivered += n
	}
	b.ReportMetric(float64(delivered)/float64(b.N), "events/op")
	b.ReportMetric(float64(busy.Nanoseconds())/float64(delivered), "ns/event")
}
