package outbox

import (
	"context"
	"fmt"

	"github.com/gorm-outbox/outbox/internal/engine"
	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/gorm-outbox/outbox/internal/wal"
	"github.com/jackc/pgx/v5/pgconn"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
)

// Logical mode, the publishing side: events travel in the WAL as
// transactional logical decoding messages, one message per Publish call
// holding its events in order, emitted only while the slot that will read
// them exists.

// emit writes enc into the transaction's WAL as one message, unless the
// slot exists, has found its consistent point (before that, a commit may
// not be decoded) and has not been invalidated.
func (o *Outbox) emit(ctx context.Context, pool gorm.ConnPool, enc []encoded) error {
	rows := make([]store.Event, len(enc))
	for i := range enc {
		rows[i] = rowOf(&enc[i])
	}
	content, err := wal.Message(rows)
	if err != nil {
		return fmt.Errorf("outbox: encode %d events for the WAL: %w", len(enc), err)
	}
	emitted, err := o.wal.Emit(ctx, pool, o.slot, wal.Prefix(o.slot), content)
	if err != nil {
		if len(enc) == 1 {
			return fmt.Errorf("outbox: emit event %s (%s): %w", enc[0].Event.ID, enc[0].Event.Type, err)
		}
		return fmt.Errorf("outbox: emit %d events: %w", len(enc), err)
	}
	if !emitted {
		return fmt.Errorf("%w: slot %s", ErrNoSlot, o.slot)
	}
	return nil
}

// dropReusedID records the loss of a committed event whose ID another
// event took first: Logical mode's one way of losing an event, by the
// publisher's mistake, which Publish cannot see (docs/logical.md).
// It is logged at Error and counted in Stats.Dropped, once per process
// even when its batch is handled again.
func (o *Outbox) dropReusedID(ctx context.Context, e *engine.Event) {
	if !o.dropSeen.first(e.ID + "\x00" + e.IdempotencyKey) {
		return // a batch handled again (not confirmed the first time)
	}
	o.dropped.Add(1)
	o.logger.ErrorContext(ctx, "outbox: a committed event reuses the ID of another event with a different idempotency key; it cannot be stored under that ID and is dropped",
		eventAttrs(Event(*e), nil)...)
}

// replicationConfig is the replication connection's configuration: the
// DSN the *gorm.DB was opened with unless LogicalConfig.ReplicationDSN is
// set.
func (r *Relay) replicationConfig() (*pgconn.Config, error) {
	dsn := r.o.replicationDSN
	if dsn == "" {
		if d, ok := r.db.Dialector.(*postgres.Dialector); ok && d.Config != nil {
			dsn = d.Config.DSN
		}
	}
	if dsn == "" {
		return nil, fmt.Errorf("%w: Logical mode needs a replication connection and the *gorm.DB was not opened from a DSN: set Config.Logical.ReplicationDSN", ErrInvalidConfig)
	}
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		// The DSN may hold a password: name the field, not its value.
		return nil, fmt.Errorf("%w: the replication DSN does not parse (%T)", ErrInvalidConfig, err)
	}
	wal.Prepare(cfg)
	return cfg, nil
}
