package main

import (
	"context"
	"fmt"

	"gorm.io/gorm"
)

// seedHistory writes n events into table through insert, in transactions
// of 500, marks every row of the table sent and ANALYZEs it: the table a
// relay meets in production, with history and statistics. On a table just
// truncated, PostgreSQL plans the relay's prepared statements for an empty
// table and keeps those generic plans (sequential scans) while the table
// grows, until an ANALYZE; a 10 s measurement ends before autovacuum comes
// by, so without history it measures that transient, not the steady state.
func seedHistory(ctx context.Context, db *gorm.DB, table string, n int, insert func(tx *gorm.DB, i int) error) error {
	if n <= 0 {
		return nil
	}
	const batch = 500
	for start := 0; start < n; start += batch {
		err := db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			for i := start; i < min(start+batch, n); i++ {
				if err := insert(tx, -1-i); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("seed %s: %w", table, err)
		}
	}
	if err := db.WithContext(ctx).Exec(`UPDATE "` + table + `" SET status = 'sent', sent_at = now(), locked_until = NULL`).Error; err != nil {
		return fmt.Errorf("seed %s: mark sent: %w", table, err)
	}
	if err := db.WithContext(ctx).Exec(`ANALYZE "` + table + `"`).Error; err != nil {
		return fmt.Errorf("seed %s: analyze: %w", table, err)
	}
	return nil
}
