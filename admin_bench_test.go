package outbox

import (
	"fmt"
	"os"
	"testing"
)

// BenchmarkAdmin measures the operating functions on a table of
// OUTBOX_BENCH_ADMIN_ROWS rows (default 10,000): 90% sent, 5% failed, 5%
// pending, as a table under retention looks. Each sub-benchmark is one
// call, as the outbox command or a dashboard page makes it:
//
//	OUTBOX_BENCH_ADMIN_ROWS=200000 go test -run '^$' -bench Admin -benchtime=20x .
func BenchmarkAdmin(b *testing.B) {
	rows := atoiOr(os.Getenv("OUTBOX_BENCH_ADMIN_ROWS"), 10000)
	for _, backend := range benchBackends {
		b.Run(backend, func(b *testing.B) {
			db, ob := benchOutbox(b, backend, Config{})
			events := make([]Event, 0, 1000)
			for i := range rows {
				events = append(events, Event{ID: fmt.Sprintf("e%07d", i), Type: fmt.Sprintf("type.%d", i%10),
					AggregateType: "order", AggregateID: fmt.Sprint(i % 1000), Payload: benchPayload{OrderID: uint(i), Total: i}})
				if len(events) == cap(events) || i == rows-1 {
					if err := PublishAlone(db, events...); err != nil {
						b.Fatal(err)
					}
					events = events[:0]
				}
			}
			t := ob.Table()
			mustExec := func(sql string) {
				if err := db.Exec(sql).Error; err != nil {
					b.Fatal(err)
				}
			}
			mustExec(`UPDATE "` + t + `" SET status = 'sent', sent_at = updated_at WHERE seq % 20 >= 2`)
			fail := `UPDATE "` + t + `" SET status = 'failed', last_error = 'permanent: 422 unprocessable', attempts = 1 WHERE seq % 20 = 1`
			mustExec(fail)
			mustExec("ANALYZE")
			ctx := b.Context()
			failed := Filter{Statuses: []Status{StatusFailed}}
			run := func(name string, fn func() error) {
				b.Run(name, func(b *testing.B) {
					for b.Loop() {
						if err := fn(); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
			run("ListFirstPage", func() error { _, err := ob.List(db.WithContext(ctx), ListParams{}); return err })
			run("ListNewestPage", func() error { _, err := ob.List(db.WithContext(ctx), ListParams{Newest: true}); return err })
			run("ListFailedPage", func() error { _, err := ob.List(db.WithContext(ctx), ListParams{Filter: failed}); return err })
			run("ListErrorContains", func() error {
				_, err := ob.List(db.WithContext(ctx), ListParams{Filter: Filter{ErrorContains: "UNPROCESSABLE"}})
				return err
			})
			run("CountFailed", func() error { _, err := ob.Count(db.WithContext(ctx), failed); return err })
			run("Get", func() error { _, err := ob.Get(db.WithContext(ctx), fmt.Sprintf("e%07d", rows/2)); return err })
			run("Stats", func() error { _, err := ob.Stats(db.WithContext(ctx)); return err })
			b.Run("ReplayAllFailed", func(b *testing.B) {
				for b.Loop() {
					b.StopTimer()
					mustExec(fail)
					b.StartTimer()
					n, err := ob.Replay(db.WithContext(ctx), failed)
					if err != nil || n != rows/20 {
						b.Fatalf("replayed %d of %d: %v", n, rows/20, err)
					}
				}
			})
		})
	}
}
