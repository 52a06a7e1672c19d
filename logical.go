package outbox

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/gorm-outbox/outbox/internal/engine"
	"github.com/gorm-outbox/outbox/internal/store"
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
	content, prefix, err := logical.message(rows, o.slot)
	if err != nil {
		return fmt.Errorf("outbox: encode %d events for the WAL: %w", len(enc), err)
	}
	emitted, err := o.wal.Emit(ctx, pool, o.slot, prefix, content)
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

// stream is Logical mode's source of new events for one relay: it streams
// the slot (Run), or delivers what was committed before the call (Once,
// ProcessOnce's streaming side).
type stream interface {
	Run(ctx context.Context)
	Once(ctx context.Context) (int, error)
}

// logical is Logical mode's machinery, set by store_postgres.go: the WAL
// message, and a relay's stream. A program built without the PostgreSQL
// store (build tags, docs/databases.md) links none of it, nor the
// replication protocol's packages; Logical mode then fails at db.Use, as
// on any database without the store.Logical role.
var logical interface {
	message(rows []store.Event, slot string) (content []byte, prefix string, err error)
	stream(r *Relay, sqlDB *sql.DB) (stream, error)
}
