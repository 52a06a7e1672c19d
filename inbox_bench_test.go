package outbox

import (
	"context"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"gorm.io/gorm"
)

// BenchmarkConsume is a consumer's transaction (one business row per
// message), bare and through Consume (the inbox's INSERT in the same
// transaction), by 1 and 8 concurrent consumers. Each consumer alternates
// the two, one of each per iteration, so that both see the same machine:
// the metrics are each one's mean time and "kept", bare ÷ inbox, the share
// of the bare transaction's throughput that Consume keeps. Run it as
//
//	go test -run '^$' -bench 'BenchmarkConsume/(postgres|mysql)' -benchtime=2000x -count 3 .
func BenchmarkConsume(b *testing.B) {
	for _, backend := range []string{"sqlite", "postgres", "mysql"} {
		b.Run(backend, func(b *testing.B) {
			db, _ := benchOutbox(b, backend, Config{})
			for _, consumers := range []int{1, 8} {
				b.Run("consumers="+strconv.Itoa(consumers), func(b *testing.B) {
					benchConsume(b, db, consumers)
				})
			}
		})
	}
}

var benchMessages atomic.Int64

func benchConsume(b *testing.B, db *gorm.DB, consumers int) {
	ctx := context.Background()
	effect := func(tx *gorm.DB) error { return tx.Create(&Order{Total: 1}).Error }
	var (
		mu          sync.Mutex
		bare, inbox time.Duration
		failed      atomic.Bool
		wg          sync.WaitGroup
		next        atomic.Int64
	)
	b.ReportAllocs()
	b.ResetTimer()
	for range consumers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			var tb, ti time.Duration
			for next.Add(1) <= int64(b.N) && !failed.Load() {
				t0 := time.Now()
				err := db.WithContext(ctx).Transaction(effect)
				t1 := time.Now()
				if err == nil {
					err = Consume(db.WithContext(ctx), "bench", "msg-"+strconv.FormatInt(benchMessages.Add(1), 10), effect)
				}
				if err != nil {
					failed.Store(true)
					b.Error(err)
					return
				}
				tb, ti = tb+t1.Sub(t0), ti+time.Since(t1)
			}
			mu.Lock()
			bare, inbox = bare+tb, inbox+ti
			mu.Unlock()
		}()
	}
	wg.Wait()
	b.StopTimer()
	if b.N > 0 && inbox > 0 {
		b.ReportMetric(float64(bare.Nanoseconds())/float64(b.N), "bare-ns/op")
		b.ReportMetric(float64(inbox.Nanoseconds())/float64(b.N), "inbox-ns/op")
		b.ReportMetric(float64(bare)/float64(inbox), "kept")
	}
}
