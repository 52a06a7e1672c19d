package outbox

import (
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"time"

	"github.com/gorm-outbox/outbox/internal/engine"
	"github.com/gorm-outbox/outbox/internal/store"
	"gorm.io/gorm"
)

// HistoryEntry is one entry of an event's history ([Outbox.History]): a
// delivery attempt that failed, or a replay. Deliveries that succeed leave
// none (the row's SentAt says when), and neither does Publish: the history
// costs only the failure path and the operator's.
type HistoryEntry struct {
	// At is when the relay recorded the failure, or when the replay ran.
	At time.Time
	// Attempt is the attempt's number (1 for the first after the event
	// was written or replayed); 0 for a replay.
	Attempt int
	// Outcome is HistoryRetry, HistoryFailed or HistoryReplayed.
	Outcome string
	// Error is the handler's error (a replay's: the error the event had
	// when it was replayed).
	Error string
	// Actor is who replayed the event, as [WithActor] gave it; "" when
	// not given, and for attempts.
	Actor string
}

// The outcomes of a [HistoryEntry].
const (
	HistoryRetry    = "retry"    // failed; to be tried again
	HistoryFailed   = "failed"   // failed; the relay gave up (StatusFailed)
	HistoryReplayed = "replayed" // set pending again by Replay
)

type actorKey struct{}

// WithActor returns a context that names who acts, for the operating
// functions that record it: [Outbox.Replay] writes it into each replayed
// event's history. The dashboard passes its Options.Identity; a command
// or a script passes what identifies its operator. It is kept as given
// (up to 255 bytes): never put secrets in it.
func WithActor(ctx context.Context, actor string) context.Context {
	return context.WithValue(ctx, actorKey{}, actor)
}

func actorFrom(ctx context.Context) string {
	a, _ := ctx.Value(actorKey{}).(string)
	if len(a) > 255 {
		a = a[:255]
	}
	return a
}

// History returns the history of the event with the ID id, oldest first:
// its failed attempts and its replays, for as long as sent rows are kept
// (RelayConfig.RetainSent) and while its row exists. An event without
// failures has none. It errs with [ErrMemoryMode] in Memory mode.
func (o *Outbox) History(db *gorm.DB, id string) ([]HistoryEntry, error) {
	ctx := dbContext(db)
	if o.noTable != nil {
		return nil, o.noTable
	}
	if err := o.usable(db); err != nil {
		return nil, err
	}
	var out []HistoryEntry
	q := o.store.Attempts(id)
	err := eachRow(ctx, db.Statement.ConnPool, q, func(rows *sql.Rows) error {
		var (
			a          HistoryEntry
			at         store.DBTime
			errText, x *string
		)
		if err := rows.Scan(&at, &a.Attempt, &a.Outcome, &errText, &x); err != nil {
			return err
		}
		a.At = at.T
		if errText != nil {
			a.Error = *errText
		}
		if x != nil {
			a.Actor = *x
		}
		out = append(out, a)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("outbox: read the history of event %q: %w", id, err)
	}
	return out, nil
}

// forgetAttempts deletes the history entries older than olderThan, in
// batches, as retention deletes sent rows.
func (o *Outbox) forgetAttempts(ctx context.Context, db *gorm.DB, olderThan, stmtTimeout time.Duration) error {
	_, err := o.deleteBatches(ctx, db, stmtTimeout, func(batch int) store.Query { return o.store.ForgetAttempts(o.now().Add(-olderThan), batch) })
	if err != nil {
		return fmt.Errorf("outbox: delete old attempts: %w", err)
	}
	return nil
}

// historyFailed is engine.Table.HistoryFailed: logged once per episode.
func (o *Outbox) historyFailed() func(error) {
	var failing engine.Episode
	return func(err error) {
		if failing.Begin() {
			o.logger.Warn("outbox: recording a failed attempt in the event history failed (the event itself is recorded; only its history entry is missing)", slog.Any("error", err))
		}
	}
}
