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
	// Outcome is OutcomeRetry, OutcomeFailed, OutcomeReplayed or
	// OutcomeRetried.
	Outcome Outcome
	// Error is the handler's error (a replay's: the error the event had
	// when it was replayed).
	Error string
	// Actor is who replayed the event, as [WithActor] gave it; "" when
	// not given, and for attempts.
	Actor string
}

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
	h, ok := o.store.(store.History)
	if !ok {
		return nil, o.unsupported("History")
	}
	got, err := h.Attempts(ctx, db.Statement.ConnPool, id)
	if err != nil {
		return nil, fmt.Errorf("outbox: read the history of event %q: %w", id, err)
	}
	out := make([]HistoryEntry, len(got))
	for i, a := range got {
		out[i] = HistoryEntry{At: a.At, Attempt: a.Attempt, Outcome: Outcome(a.Outcome), Error: a.Error, Actor: a.Actor}
	}
	return out, nil
}

// historyFailed is engine.Table.OutcomeFailed: logged once per episode.
func (o *Outbox) historyFailed() func(error) {
	var failing engine.Episode
	return func(err error) {
		if failing.Begin() {
			o.logger.Warn("outbox: recording a failed attempt in the event history failed (the event itself is recorded; only its history entry is missing)", slog.Any("error", err))
		}
	}
}
