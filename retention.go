package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/gorm-outbox/outbox/internal/engine"
	"gorm.io/gorm"
)

// RetainForever, as RelayConfig.RetainSent, keeps sent rows: Run deletes
// none.
const RetainForever time.Duration = -1

// retain deletes sent rows older than RetainSent, in small batches, until
// ctx is done. Failed rows are never deleted.
func (r *Relay) retain(ctx context.Context) {
	every := min(r.cfg.RetainSent/10, time.Minute)
	t := time.NewTimer(0)
	defer t.Stop()
	var failing engine.Episode
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		_, err := r.o.deleteSent(ctx, r.db, r.cfg.RetainSent, r.cfg.StatementTimeout)
		if ctx.Err() != nil {
			return
		}
		switch {
		case err != nil && failing.Begin():
			r.o.logger.WarnContext(ctx, "outbox: deleting old sent events failed; will retry", slog.Any("error", err))
		case err == nil:
			failing.End()
		}
		t.Reset(every)
	}
}

// DeleteSent deletes the sent rows older than olderThan from db's outbox
// table, in batches of 1000 so that it never holds many row locks at once,
// and returns how many it deleted. A relay's Run does this by itself every
// so often (RelayConfig.RetainSent); call it when retention runs as a job
// of your own. Failed rows are never deleted. db is the *gorm.DB the
// plugin is installed on, not a transaction.
func (o *Outbox) DeleteSent(ctx context.Context, db *gorm.DB, olderThan time.Duration) (int, error) {
	if o.noTable != nil {
		return 0, o.noTable
	}
	if o.store == nil || fromDB(db) != o {
		return 0, ErrNotInstalled
	}
	if olderThan < 0 {
		return 0, fmt.Errorf("%w: DeleteSent olderThan %v is negative", ErrInvalidConfig, olderThan)
	}
	return o.deleteSent(ctx, db, olderThan, defaultStatementTimeout)
}

func (o *Outbox) deleteSent(ctx context.Context, db *gorm.DB, olderThan, stmtTimeout time.Duration) (int, error) {
	sqlDB, err := rawDB(db)
	if err != nil {
		return 0, err
	}
	total := 0
	batch := o.limits.RetentionBatch
	for ctx.Err() == nil {
		q := o.store.DeleteSent(o.now().Add(-olderThan), batch)
		sctx, cancel := context.WithTimeout(ctx, stmtTimeout)
		res, err := sqlDB.ExecContext(sctx, q.SQL, q.Args...)
		cancel()
		if err != nil {
			return total, fmt.Errorf("outbox: delete sent events: %w", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return total, fmt.Errorf("outbox: delete sent events: %w", err)
		}
		total += int(n)
		if n < int64(batch) {
			break
		}
	}
	return total, nil
}
