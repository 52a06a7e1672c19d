package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/gorm-outbox/outbox/internal/engine"
	"github.com/gorm-outbox/outbox/internal/store"
	"gorm.io/gorm"
)

// RetainForever, as RelayConfig.RetainSent, keeps sent rows: Run deletes
// none.
const RetainForever time.Duration = -1

// retain deletes sent rows older than RetainSent, in small batches, until
// ctx is done. Failed rows are never deleted.
func (r *Relay) retain(ctx context.Context) {
	r.periodically(ctx, min(r.cfg.RetainSent/10, time.Minute), "outbox: deleting old sent events failed; will retry", func(ctx context.Context) error {
		if _, err := r.o.deleteSent(ctx, r.db, r.cfg.RetainSent, r.cfg.StatementTimeout); err != nil {
			return err
		}
		// The history is kept as long as the sent rows.
		return r.o.forgetAttempts(ctx, r.db, r.cfg.RetainSent, r.cfg.StatementTimeout)
	})
}

// periodically runs fn at once and then every interval until ctx is done,
// logging a failure once per episode (warn says what failed).
func (r *Relay) periodically(ctx context.Context, every time.Duration, warn string, fn func(context.Context) error) {
	t := time.NewTimer(0)
	defer t.Stop()
	var failing engine.Episode
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := fn(ctx)
		if ctx.Err() != nil {
			return
		}
		switch {
		case err != nil && failing.Begin():
			r.o.logger.WarnContext(ctx, warn, slog.Any("error", err))
		case err == nil:
			failing.End()
		}
		t.Reset(every)
	}
}

func (o *Outbox) deleteSent(ctx context.Context, db *gorm.DB, olderThan, stmtTimeout time.Duration) (int, error) {
	n, err := o.deleteBatches(ctx, db, stmtTimeout, func(batch int) store.Query { return o.store.DeleteSent(o.now().Add(-olderThan), batch) })
	if err != nil {
		return n, fmt.Errorf("outbox: delete sent events: %w", err)
	}
	return n, nil
}

// deleteBatches runs the DELETE of up to a batch of rows that q builds
// until one deletes fewer, each within stmtTimeout, and returns how many
// rows they deleted.
func (o *Outbox) deleteBatches(ctx context.Context, db *gorm.DB, stmtTimeout time.Duration, q func(batch int) store.Query) (int, error) {
	sqlDB, err := rawDB(db)
	if err != nil {
		return 0, err
	}
	total := 0
	batch := o.limits.RetentionBatch
	for ctx.Err() == nil {
		qq := q(batch)
		sctx, cancel := context.WithTimeout(ctx, stmtTimeout)
		res, err := sqlDB.ExecContext(sctx, qq.SQL, qq.Args...)
		cancel()
		if err != nil {
			return total, err
		}
		n, err := res.RowsAffected()
		if err != nil {
			return total, err
		}
		total += int(n)
		if n < int64(batch) {
			break
		}
	}
	return total, nil
}
