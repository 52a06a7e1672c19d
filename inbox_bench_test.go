package outbox

import (
	"context"
	"runtime"
	"strconv"
	"sync/atomic"
	"testing"

	"gorm.io/gorm"
)

// BenchmarkConsume is a consumer's transaction, one business row per
// message, bare and through Consume (the inbox's INSERT in the same
// transaction), by 1 and 8 concurrent consumers. Compare the two ns/op of
// one database and concurrency side by side, for example
//
//	go test -run '^$' -bench 'BenchmarkConsume/(postgres|mysql)' -count 5 .
//
// (bare/op ÷ inbox/op is the throughput the inbox keeps).
func BenchmarkConsume(b *testing.B) {
	for _, backend := range []string{"sqlite", "postgres", "mysql"} {
		b.Run(backend, func(b *testing.B) {
			db, _ := benchOutbox(b, backend, Config{})
			for _, consumers := range []int{1, 8} {
				for _, inbox := range []bool{false, true} {
					name := "bare"
					if inbox {
						name = "inbox"
					}
					b.Run(name+"/consumers="+strconv.Itoa(consumers), func(b *testing.B) {
						benchConsume(b, db, consumers, inbox)
					})
				}
			}
		})
	}
}

var benchMessages atomic.Int64

func benchConsume(b *testing.B, db *gorm.DB, consumers int, inbox bool) {
	ctx := context.Background()
	effect := func(tx *gorm.DB) error { return tx.Create(&Order{Total: 1}).Error }
	one := func() error {
		if !inbox {
			return db.WithContext(ctx).Transaction(effect)
		}
		id := "msg-" + strconv.FormatInt(benchMessages.Add(1), 10)
		return Consume(db.WithContext(ctx), "bench", id, effect)
	}
	b.ReportAllocs()
	b.ResetTimer()
	if consumers == 1 {
		for range b.N {
			if err := one(); err != nil {
				b.Fatal(err)
			}
		}
		return
	}
	// RunParallel runs GOMAXPROCS × parallelism goroutines: round up to
	// consumers.
	procs := runtime.GOMAXPROCS(0)
	b.SetParallelism((consumers + procs - 1) / procs)
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := one(); err != nil {
				b.Error(err)
				return
			}
		}
	})
}
