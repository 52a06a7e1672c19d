package outbox

import (
	"context"
	"fmt"
	"log/slog"
	"time"
)

// retentionBatch is how many sent rows one DELETE removes: small enough to
// hold locks briefly, large enough to keep up with a busy relay.
const retentionBatch = 1000

// retain deletes sent rows older than RetainSent, in small batches, until
// ctx is done. Failed rows are never deleted.
func (r *Relay) retain(ctx context.Context) {
	every := min(r.cfg.RetainSent/10, time.Minute)
	t := time.NewTimer(0)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		_, err := r.DeleteSent(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil && !failing {
			r.o.logger.WarnContext(ctx, "outbox: deleting old sent events failed; will retry", slog.Any("error", err))
		}
		failing = err != nil
		t.Reset(every)
	}
}

// DeleteSent deletes sent rows older than RetainSent, in batches of 1000,
// and returns how many it deleted. Run calls it periodically; call it
// yourself when you run retention from a job of your own.
func (r *Relay) DeleteSent(ctx context.Context) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	sqlDB, err := rawDB(r.db)
	if err != nil {
		return 0, err
	}
	total := 0
	for ctx.Err() == nil {
		q := r.o.dialect.deleteSent(r.o.now().Add(-r.cfg.RetainSent), retentionBatch)
		sctx, cancel := context.WithTimeout(ctx, r.cfg.StatementTimeout)
		res, err := sqlDB.ExecContext(sctx, q.sql, q.args...)
		cancel()
		if err != nil {
			return total, fmt.Errorf("outbox: delete sent events: %w", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return total, fmt.Errorf("outbox: delete sent events: %w", err)
		}
		total += int(n)
		if n < retentionBatch {
			break
		}
	}
	return total, nil
}
