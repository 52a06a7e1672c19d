package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"testing"
	"time"
)

// BenchmarkOverview measures [Outbox.Overview], one call as the dashboard's
// overview page makes it, on a table of OUTBOX_BENCH_OVERVIEW_ROWS sent rows
// (default 10,000) spread over the last seven days, 12 event types, with 200
// failed and 500 pending rows, once the rollup is up to date (the relays
// keep it so), for each window the page offers; and FirstRollup, the one-off
// pass over a table's history the first call after the upgrade makes (only
// when OUTBOX_BENCH_OVERVIEW_ROWS is set). The
// figures BENCHMARKS.md gives are from
//
//	OUTBOX_BENCH_OVERVIEW_ROWS=1000000 go test -run '^$' -bench Overview -benchtime 20x .
//
// (with OUTBOX_TEST_POSTGRES_DSN and OUTBOX_TEST_MYSQL_DSN set); Stats,
// which counts the table by status with one scan, is beside it for scale.
func BenchmarkOverview(b *testing.B) {
	rows := atoiOr(os.Getenv("OUTBOX_BENCH_OVERVIEW_ROWS"), 10000)
	for _, backend := range []string{"sqlite", "postgres", "mysql"} {
		b.Run(backend, func(b *testing.B) {
			db, ob := benchOutbox(b, backend, Config{})
			t := ob.Table()
			for _, q := range overviewFill(backend, t, rows) {
				if err := db.Exec(q).Error; err != nil {
					b.Fatalf("fill: %v\n%s", err, q)
				}
			}
			sqlDB, err := db.DB()
			if err != nil {
				b.Fatal(err)
			}
			ctx := b.Context()
			reset := func() {
				for _, q := range []string{"DELETE FROM " + t + "_rollup", "DELETE FROM " + t + "_rollup_state"} {
					if err := db.Exec(q).Error; err != nil {
						b.Fatal(err)
					}
				}
			}
			b.Run("FirstRollup", func(b *testing.B) {
				if os.Getenv("OUTBOX_BENCH_OVERVIEW_ROWS") == "" {
					// A second or more an iteration: not for the smoke run
					// of every benchmark (.ci/run's -benchtime=100x).
					b.Skip("set OUTBOX_BENCH_OVERVIEW_ROWS to time the first pass")
				}
				for b.Loop() {
					b.StopTimer()
					reset()
					b.StartTimer()
					if err := rollupErr(ctx, ob, sqlDB); err != nil {
						b.Fatal(err)
					}
				}
			})
			ov, err := ob.Overview(db.WithContext(ctx), OverviewParams{Window: 7 * 24 * time.Hour})
			if err != nil {
				b.Fatal(err)
			}
			if ov.Delivered < int64(rows)*99/100 || ov.Pending != 500 || ov.Failed != 200 {
				b.Fatalf("the overview counts %d delivered, %d pending, %d failed: not the table's %d, 500, 200", ov.Delivered, ov.Pending, ov.Failed, rows)
			}
			for _, w := range []struct {
				name string
				d    time.Duration
			}{{"Hour", time.Hour}, {"Day", 24 * time.Hour}, {"Week", 7 * 24 * time.Hour}} {
				b.Run("Window"+w.name, func(b *testing.B) {
					for b.Loop() {
						// The relays keep the rollup up to date, off
						// the overview's clock.
						b.StopTimer()
						if err := rollupErr(ctx, ob, sqlDB); err != nil {
							b.Fatal(err)
						}
						b.StartTimer()
						if _, err := ob.Overview(db.WithContext(ctx), OverviewParams{Window: w.d}); err != nil {
							b.Fatal(err)
						}
					}
				})
			}
			b.Run("Stats", func(b *testing.B) {
				for b.Loop() {
					if _, err := ob.Stats(db.WithContext(ctx)); err != nil {
						b.Fatal(err)
					}
				}
			})
		})
	}
}

// overviewFill is the SQL that fills the table: rows sent rows over the last
// seven days (delays of 0 to 300 ms), 200 failed over the last hours, 500
// pending over the last minutes, as a table under retention looks.
func overviewFill(backend, t string, rows int) []string {
	span := 7 * 24 * 3600 * 1000000 / rows // microseconds between two sent rows
	switch backend {
	case "postgres":
		return []string{
			fmt.Sprintf(`INSERT INTO %[1]s (id, event_type, aggregate_type, aggregate_id, payload, status, attempts, occurred_at, sent_at, updated_at)
SELECT gen_random_uuid(), 'type.' || (i %% 12), 'order', (i %% 50000)::text, '{"order_id":1,"total":2}', 'sent', 1,
  now() - interval '7 days' + i * interval '%[2]d microseconds',
  now() - interval '7 days' + i * interval '%[2]d microseconds' + (i %% 100) * interval '3 milliseconds',
  now() - interval '7 days' + i * interval '%[2]d microseconds' + (i %% 100) * interval '3 milliseconds'
FROM generate_series(1, %[3]d) i`, t, span, rows),
			fmt.Sprintf(`INSERT INTO %s (id, event_type, payload, status, attempts, last_error, occurred_at, updated_at)
SELECT gen_random_uuid(), 'type.' || (i %% 12), '{}', 'failed', 5, 'boom', now() - i * interval '1 minute', now() - i * interval '1 minute'
FROM generate_series(1, 200) i`, t),
			fmt.Sprintf(`INSERT INTO %s (id, event_type, payload, occurred_at)
SELECT gen_random_uuid(), 'type.' || (i %% 12), '{}', now() - i * interval '1 second' FROM generate_series(1, 500) i`, t),
			"VACUUM ANALYZE " + t,
		}
	case "sqlite":
		series := func(n int) string {
			return fmt.Sprintf("WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < %d) ", n)
		}
		at := func(expr string) string {
			return "strftime('%Y-%m-%d %H:%M:%f+00:00', 'now', " + expr + ")"
		}
		sent := at(fmt.Sprintf("'-7 days', '+' || (i * %d / 1000.0) || ' seconds'", span/1000))
		return []string{
			fmt.Sprintf(`INSERT INTO %s (id, event_type, aggregate_type, aggregate_id, payload, status, attempts, occurred_at, sent_at, updated_at) %s
SELECT lower(hex(randomblob(16))), 'type.' || (i %% 12), 'order', i %% 50000, '{"order_id":1,"total":2}', 'sent', 1, %s, %s, %s FROM s`,
				t, series(rows), sent, at(fmt.Sprintf("'-7 days', '+' || ((i * %d + (i %% 100) * 3) / 1000.0) || ' seconds'", span/1000)), sent),
			fmt.Sprintf(`INSERT INTO %s (id, event_type, payload, status, attempts, last_error, occurred_at, updated_at) %s
SELECT lower(hex(randomblob(16))), 'type.' || (i %% 12), '{}', 'failed', 5, 'boom', %s, %s FROM s`, t, series(200), at("'-' || i || ' minutes'"), at("'-' || i || ' minutes'")),
			fmt.Sprintf(`INSERT INTO %s (id, event_type, payload, occurred_at) %s
SELECT lower(hex(randomblob(16))), 'type.' || (i %% 12), '{}', %s FROM s`, t, series(500), at("'-' || i || ' seconds'")),
			"ANALYZE",
		}
	case "mysql":
		// MariaDB's sequence engine (seq_1_to_N); available_at is the
		// sent time of a sent row, as the relay writes it.
		sent := fmt.Sprintf("UTC_TIMESTAMP(6) - INTERVAL 7 DAY + INTERVAL (seq * %d) MICROSECOND", span)
		done := sent + " + INTERVAL ((seq % 100) * 3000) MICROSECOND"
		return []string{
			fmt.Sprintf(`INSERT INTO %s (id, event_type, aggregate_type, aggregate_id, payload, status, attempts, available_at, occurred_at, sent_at, updated_at)
SELECT UNHEX(REPLACE(UUID(), '-', '')), CONCAT('type.', seq %% 12), 'order', seq %% 50000, '{"order_id":1,"total":2}', 'sent', 1, %s, %s, %s, %s FROM seq_1_to_%d`,
				t, done, sent, done, done, rows),
			fmt.Sprintf(`INSERT INTO %s (id, event_type, payload, status, attempts, last_error, available_at, occurred_at, updated_at)
SELECT UNHEX(REPLACE(UUID(), '-', '')), CONCAT('type.', seq %% 12), '{}', 'failed', 5, 'boom', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6) - INTERVAL seq MINUTE, UTC_TIMESTAMP(6) - INTERVAL seq MINUTE FROM seq_1_to_200`, t),
			fmt.Sprintf(`INSERT INTO %s (id, event_type, payload, available_at, occurred_at)
SELECT UNHEX(REPLACE(UUID(), '-', '')), CONCAT('type.', seq %% 12), '{}', UTC_TIMESTAMP(6) - INTERVAL seq SECOND, UTC_TIMESTAMP(6) - INTERVAL seq SECOND FROM seq_1_to_500`, t),
			"ANALYZE TABLE " + t,
		}
	}
	panic(backend)
}

func rollupErr(ctx context.Context, o *Outbox, db *sql.DB) error {
	_, err := o.rollup(db, time.Minute).Pass(ctx)
	return err
}
