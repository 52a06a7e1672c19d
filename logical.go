package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/gorm-outbox/outbox/internal/errs"
	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/jackc/pgx/v5/pgconn"
	"gorm.io/gorm"
)

// Logical mode, the publishing side: events travel in the WAL as
// transactional logical decoding messages, one message per Publish call
// holding its events in order, emitted only while the slot that will read
// them exists.

// ErrNoSlot is returned by Publish in [Logical] mode when the outbox's
// replication slot does not exist (or PostgreSQL has invalidated it): an
// event written then would never be decoded. Return it from the
// transaction function so that the business writes roll back with it;
// db.Use (or a restart of the service) creates the slot again.
var ErrNoSlot = errs.ErrNoSlot

// logical returns the store's Logical mode statements.
func (o *Outbox) logical() store.Logical {
	l, _ := o.store.(store.Logical)
	return l
}

// isSQLState reports whether err is a PostgreSQL error with that SQLSTATE.
func isSQLState(err error, code string) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == code
}

// logicalPrefix prefixes the outbox's WAL messages. Every slot of the
// database decodes every message; the prefix tells the outbox's own.
func logicalPrefix(slot string) string { return "gorm-outbox:" + slot }

// walEvent is an event as it travels in a WAL message.
type walEvent struct {
	ID            string          `json:"id"`
	Type          string          `json:"type"`
	AggregateType string          `json:"aggregate_type,omitempty"`
	AggregateID   string          `json:"aggregate_id,omitempty"`
	Key           string          `json:"key,omitempty"` // omitted when it is the ID
	Payload       json.RawMessage `json:"payload"`
	Headers       json.RawMessage `json:"headers,omitempty"`
	OccurredAt    time.Time       `json:"occurred_at"`
	// Checked is set when the publisher chose the ID or the key: the relay
	// enforces first-committed-wins for such events only, since a
	// generated ID cannot repeat.
	Checked bool `json:"checked,omitempty"`
}

// emit writes enc into the transaction's WAL as one message, from a query
// that yields no row, and so emits nothing, unless the slot exists, has
// found its consistent point (before that, a commit may not be decoded)
// and has not been invalidated.
func (o *Outbox) emit(ctx context.Context, pool gorm.ConnPool, enc []encoded) error {
	msg := make([]walEvent, len(enc))
	for i := range enc {
		e := &enc[i]
		msg[i] = walEvent{
			ID: e.ID, Type: e.Type, AggregateType: e.AggregateType, AggregateID: e.AggregateID,
			Payload: e.PayloadJSON, Headers: e.HeadersJSON, OccurredAt: e.OccurredAt, Checked: !e.Generated,
		}
		if e.IdempotencyKey != e.ID {
			msg[i].Key = e.IdempotencyKey
		}
	}
	content, err := json.Marshal(msg)
	if err != nil {
		return fmt.Errorf("outbox: encode %d events for the WAL: %w", len(enc), err)
	}
	emitted, err := o.logical().Emit(ctx, pool, o.slot, logicalPrefix(o.slot), content)
	if err != nil {
		if len(enc) == 1 {
			return fmt.Errorf("outbox: emit event %s (%s): %w", enc[0].ID, enc[0].Type, err)
		}
		return fmt.Errorf("outbox: emit %d events: %w", len(enc), err)
	}
	if !emitted {
		return fmt.Errorf("%w: slot %s", ErrNoSlot, o.slot)
	}
	return nil
}
