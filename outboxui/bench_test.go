package outboxui_test

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"testing"

	"github.com/stretchr/testify/require"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/outboxui"
)

// BenchmarkPages measures one request of each page on a table of
// OUTBOXUI_BENCH_ROWS rows (default 10000: 90% sent, 5% failed, 5%
// pending), on every database the tests run on:
//
//	OUTBOXUI_BENCH_ROWS=1000000 go test -run '^$' -bench Pages ./outboxui
func BenchmarkPages(b *testing.B) {
	n := 10000
	if s := os.Getenv("OUTBOXUI_BENCH_ROWS"); s != "" {
		var err error
		n, err = strconv.Atoi(s)
		require.NoError(b, err, "OUTBOXUI_BENCH_ROWS")
	}
	for _, be := range backends(b) {
		b.Run(be.name, func(b *testing.B) {
			e := setup(b, be, outboxui.Options{})
			seedMany(b, e, n)
			// The library calls the pages make, to see which dominates.
			ctx := b.Context()
			for name, call := range map[string]func() error{
				"Stats": func() error { _, err := e.ob.Stats(e.db.WithContext(ctx)); return err },
				"Count": func() error { _, err := e.ob.Count(e.db.WithContext(ctx), outbox.Filter{}); return err },
				"CountFailed": func() error {
					_, err := e.ob.Count(e.db.WithContext(ctx), outbox.Filter{Statuses: []outbox.Status{outbox.StatusFailed}})
					return err
				},
				"List": func() error { _, err := e.ob.List(e.db.WithContext(ctx), outbox.ListParams{Limit: 51}); return err },
				"ListFailed": func() error {
					_, err := e.ob.List(e.db.WithContext(ctx), outbox.ListParams{Limit: 51, Filter: outbox.Filter{Statuses: []outbox.Status{outbox.StatusFailed}}})
					return err
				},
			} {
				b.Run(name, func(b *testing.B) {
					for b.Loop() {
						if err := call(); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
			for _, page := range []string{"", "events", "events?status=failed", "events?status=failed&order=newest", "events?type=t7", "event?id=e" + strconv.Itoa(n/2)} {
				b.Run(fmt.Sprintf("%q", page), func(b *testing.B) {
					for b.Loop() {
						resp, err := e.client.Get(e.base + page)
						if err != nil {
							b.Fatal(err)
						}
						_, _ = io.Copy(io.Discard, resp.Body)
						resp.Body.Close()
						if resp.StatusCode != http.StatusOK {
							b.Fatalf("%s: %s", page, resp.Status)
						}
					}
				})
			}
		})
	}
}

// seedMany publishes n events and marks 90% sent and 5% failed, with SQL
// (the relay would take long, and its speed is not measured here).
func seedMany(b testing.TB, e *env, n int) {
	const batch = 1000
	for i := 0; i < n; i += batch {
		evs := make([]outbox.Event, 0, batch)
		for j := i; j < min(i+batch, n); j++ {
			evs = append(evs, outbox.Event{ID: "e" + strconv.Itoa(j), Type: "t" + strconv.Itoa(j%10), Payload: map[string]int{"n": j}})
		}
		require.NoError(b, e.db.Session(&gorm.Session{}).Transaction(func(tx *gorm.DB) error { return outbox.Publish(tx, evs...) }))
	}
	tbl := e.ob.Table()
	require.NoError(b, e.db.Exec("UPDATE "+tbl+" SET status = 'sent', attempts = 1 WHERE seq % 20 >= 2").Error)
	require.NoError(b, e.db.Exec("UPDATE "+tbl+" SET status = 'failed', attempts = 5, last_error = 'permanent: broker said no' WHERE seq % 20 = 1").Error)
	if e.b.name == "postgres" {
		require.NoError(b, e.db.Exec("ANALYZE "+tbl).Error)
	}
}
