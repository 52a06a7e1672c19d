package outbox

import (
	"context"
	"fmt"
	"slices"

	"gorm.io/gorm"
)

// Replay puts failed events back to pending, due now, with their attempts
// reset, and returns how many it changed. IDs that are not failed are
// skipped. db may be a transaction.
func (o *Outbox) Replay(ctx context.Context, db *gorm.DB, ids ...string) (int, error) {
	if o.noTable != nil {
		return 0, o.noTable
	}
	if o.store == nil {
		return 0, ErrNotInstalled
	}
	total := 0
	now := o.now()
	for chunk := range slices.Chunk(ids, o.limits.OutcomeRows) {
		q := o.store.Replay(chunk, now)
		res, err := db.Statement.ConnPool.ExecContext(ctx, q.SQL, q.Args...)
		if err != nil {
			return total, fmt.Errorf("outbox: replay %d events: %w", len(ids), err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return total, fmt.Errorf("outbox: replay: %w", err)
		}
		total += int(n)
	}
	return total, nil
}
