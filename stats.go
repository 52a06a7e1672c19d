package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/gorm-outbox/outbox/internal/store"
	"gorm.io/gorm"
)

// Stats is the outbox table's state now, for metrics and alerts: what
// [Outbox.Overview] reports beside its window (an [Overview] embeds it),
// read the same way, through indexes, so that it costs the same with a
// million sent rows as with none and a gauge may poll it every few
// seconds.
type Stats struct {
	Pending int64 // waiting, scheduled for a retry, or claimed
	Failed  int64 // gave up; waiting for a human (see [Outbox.Replay])
	// OldestPending is the age of the oldest pending event, 0 when none is
	// pending. A value that keeps growing means delivery is stuck.
	OldestPending time.Duration
	// FailedLastHour counts the failed events that failed (or were last
	// changed) within the last hour: new failures, where Failed also
	// counts old ones nobody has replayed or purged yet.
	FailedLastHour int64
	// Relays are the relays that serve the table now, by name: those that
	// recorded themselves within the last 15 s (a relay records itself
	// every 5 s while it runs). None while events wait means nothing
	// delivers them.
	Relays []RelayStatus
	// LastDelivery is when a relay of the table last delivered an event,
	// as the relays recorded it; zero when none has. RelaySeen is when a
	// relay last recorded itself, alive or gone since; zero when none has
	// (a relay's row is kept for a day after it stops).
	LastDelivery, RelaySeen time.Time

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

// Stats reads the table's state now (pending and failed counts, the oldest
// pending event's age, the failures of the last hour) and, in Logical mode,
// the slot's. It errs with [ErrMemoryMode] in Memory mode. It reads
// through db's pool, outside any transaction db is in; db's context
// governs the reads.
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
	sqlDB, err := rawDB(db)
	if err != nil {
		return st, err
	}
	if err := o.counts(ctx, sqlDB, &st); err != nil {
		return st, fmt.Errorf("outbox: stats: %w", err)
	}
	return st, o.statsBeside(ctx, sqlDB, &st)
}

// counts reads the pending and failed rows into st: through the overview's
// indexed reads where the store has them, a count by status elsewhere.
func (o *Outbox) counts(ctx context.Context, db *sql.DB, st *Stats) error {
	now := o.now()
	ovs, ok := o.store.(store.Overview)
	if !ok {
		counts, err := o.store.Stats(ctx, db)
		if err != nil {
			return err
		}
		for _, c := range counts {
			switch Status(c.Status) {
			case StatusPending:
				st.Pending = c.N
				if !c.Oldest.IsZero() {
					st.OldestPending = max(now.Sub(c.Oldest), 0)
				}
			case StatusFailed:
				st.Failed = c.N
			}
		}
		return nil
	}
	rs, _, err := ovs.RollState(ctx, db)
	if err != nil {
		return err
	}
	rows, err := ovs.ReadOverview(ctx, db, store.OverviewQuery{Low: rs.Low, Now: true})
	if err != nil {
		return err
	}
	var oldest time.Time
	for _, g := range rows.Pending {
		st.Pending += g.N
		if oldest.IsZero() || g.Oldest.Before(oldest) {
			oldest = g.Oldest
		}
	}
	if !oldest.IsZero() {
		st.OldestPending = max(now.Sub(oldest), 0)
	}
	for _, g := range rows.Failed {
		st.Failed += g.N
	}
	return nil
}

// statsBeside adds to st, whose counts are read, what the counts do not
// say: the failures of the last hour, the slot, this process's counters.
func (o *Outbox) statsBeside(ctx context.Context, db *sql.DB, st *Stats) error {
	st.Dropped, st.SlotLost = o.dropped.Load(), o.slotLost.Load()
	if st.Failed > 0 {
		n, err := o.store.FailedSince(ctx, db, o.now().Add(-time.Hour))
		if err != nil {
			return fmt.Errorf("outbox: stats: %w", err)
		}
		st.FailedLastHour = n
	}
	if err := o.relayStatus(ctx, db, st); err != nil {
		return err
	}
	if o.wal != nil {
		ss, err := o.wal.SlotStats(ctx, db, o.slot)
		if err != nil {
			return fmt.Errorf("outbox: stats of slot %s: %w", o.slot, err)
		}
		st.SlotActive, st.SlotLagBytes = ss.Active, ss.LagBytes
	}
	return nil
}
