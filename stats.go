package outbox

import (
	"fmt"
	"time"

	"gorm.io/gorm"
)

// Stats is a snapshot of the outbox table, for metrics and alerts.
type Stats struct {
	Pending int64 // waiting, scheduled for a retry, or claimed
	Sent    int64 // delivered and not yet deleted by retention
	Failed  int64 // gave up; waiting for a human (see [Outbox.Replay])
	// OldestPending is the age of the oldest pending event, 0 when none is
	// pending. A value that keeps growing means delivery is stuck.
	OldestPending time.Duration
	// FailedLastHour counts the failed events that failed (or were last
	// changed) within the last hour: new failures, where Failed also
	// counts old ones nobody has replayed or purged yet.
	FailedLastHour int64

	// Logical mode only: SlotLagBytes is how much WAL the replication slot
	// keeps because no relay has confirmed it yet; SlotActive reports
	// whether a relay is streaming the slot now. A lag that keeps growing
	// while the slot is inactive means no relay runs, and the WAL fills the
	// disk until max_slot_wal_keep_size (if set) invalidates the slot.
	SlotLagBytes int64
	SlotActive   bool
	// Dropped counts the committed events this process's relays dropped
	// since it started, Logical mode's one way of losing an event: one
	// whose ID another event (with another idempotency key) took first,
	// which Publish cannot refuse in that mode (docs/logical.md).
	// Each is also logged at Error. Unlike the other fields it is not read
	// from the database: every process counts its own.
	Dropped int64
	// SlotLost counts the times, since this process started, that it found
	// the Logical mode replication slot lost: a relay found it missing, or
	// db.Use created one where its publication showed an earlier slot had
	// been. Each is a window of committed events that were never streamed
	// and never will be (a failover to a standby without the slot, before
	// PostgreSQL 17's failover slots; docs/logical.md), logged at Error
	// with the position the relay had confirmed. Like Dropped it is this
	// process's count, set even when Stats returns an error (as it does
	// while the slot is missing, with [ErrNoSlot]): alert on any increase.
	SlotLost int64
}

// Stats counts the outbox rows by status. It scans the table's rows (a
// GROUP BY over status), so poll it every few seconds at most, not per
// request.
func (o *Outbox) Stats(db *gorm.DB) (Stats, error) {
	ctx := dbContext(db)
	var st Stats
	if o.noTable != nil {
		return st, o.noTable
	}
	st.Dropped, st.SlotLost = o.dropped.Load(), o.slotLost.Load()
	if err := o.usable(db); err != nil {
		return st, err
	}
	pool := db.Statement.ConnPool
	counts, err := o.store.Stats(ctx, pool)
	if err != nil {
		return st, fmt.Errorf("outbox: stats: %w", err)
	}
	for _, c := range counts {
		switch Status(c.Status) {
		case StatusPending:
			st.Pending = c.N
			if !c.Oldest.IsZero() {
				st.OldestPending = max(o.now().Sub(c.Oldest), 0)
			}
		case StatusSent:
			st.Sent = c.N
		case StatusFailed:
			st.Failed = c.N
		}
	}
	if st.Failed > 0 {
		if st.FailedLastHour, err = o.store.FailedSince(ctx, pool, o.now().Add(-time.Hour)); err != nil {
			return st, fmt.Errorf("outbox: stats: %w", err)
		}
	}
	if o.wal != nil {
		ss, err := o.wal.SlotStats(ctx, pool, o.slot)
		if err != nil {
			return st, fmt.Errorf("outbox: stats of slot %s: %w", o.slot, err)
		}
		st.SlotActive, st.SlotLagBytes = ss.Active, ss.LagBytes
	}
	return st, nil
}
