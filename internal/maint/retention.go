package maint

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/gorm-outbox/outbox/internal/store"
)

// Retention deletes the sent rows older than keep, and the history entries
// as old (the history is kept as long as the sent rows), in batches of the
// store's RetentionBatch, each within timeout. Failed rows are never
// deleted. h is nil for a store without a history.
func Retention(s store.Store, h store.History, db *sql.DB, keep, timeout time.Duration, now func() time.Time) Service {
	batch := s.Limits().RetentionBatch
	return Service{
		Name:  "deleting old sent events",
		Every: min(keep/10, time.Minute),
		Pass: func(ctx context.Context) (int64, error) {
			n, err := Batches(ctx, batch, timeout, func(ctx context.Context, batch int) (int64, error) {
				return s.DeleteSent(ctx, db, now().Add(-keep), batch)
			})
			if err != nil {
				return n, fmt.Errorf("delete sent events: %w", err)
			}
			if h == nil {
				return n, nil
			}
			m, err := Batches(ctx, batch, timeout, func(ctx context.Context, batch int) (int64, error) {
				return h.ForgetAttempts(ctx, db, now().Add(-keep), batch)
			})
			if err != nil {
				return n + m, fmt.Errorf("delete old attempts: %w", err)
			}
			return n + m, nil
		},
	}
}

// InboxExpiry deletes one batch of the inbox's records consumed before the
// retention window keep, within timeout: Consume runs a pass at most once a
// minute per process, after its transaction has committed, and again on
// its next call while a pass deletes a full batch.
func InboxExpiry(in store.Inbox, db *sql.DB, table string, batch int, keep, timeout time.Duration, now func() time.Time) Service {
	return Service{
		Name:  "deleting expired inbox entries",
		Every: time.Minute,
		Pass: func(ctx context.Context) (int64, error) {
			ctx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			n, err := in.ForgetConsumed(ctx, db, table, now().Add(-keep), batch)
			if err != nil {
				return n, fmt.Errorf("delete expired inbox entries of %s: %w", table, err)
			}
			return n, nil
		},
	}
}
