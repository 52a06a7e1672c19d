package engine

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/gorm-outbox/outbox/internal/errs"
	"github.com/gorm-outbox/outbox/internal/store"
)

// A Gate holds a batch before its first delivery, whatever its source;
// an error hands the whole batch back undelivered, no attempt counted,
// and is the batch's down error (the relay pauses on it).

// Standbys is RelayConfig.WaitReplicas' gate: a batch is delivered only
// once at least Want standbys have flushed the WAL up to where it is when
// the gate opens, which holds every event of the batch (each committed
// before the claim, or streamed after its commit), so that a failover to
// one of them cannot lose a delivered event's business row.
type Standbys struct {
	Replicas store.Replicas
	DB       *sql.DB
	Want     int
	// Timeout bounds the wait; past it the batch is handed back with an
	// error wrapping errs.ErrReplicasBehind.
	Timeout time.Duration
}

// Wait polls, every few milliseconds, until Want standbys have flushed the
// WAL up to its position now.
func (s *Standbys) Wait(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, s.Timeout)
	defer cancel()
	lsn, err := s.Replicas.WALInsertPosition(ctx, s.DB)
	if err != nil {
		return fmt.Errorf("outbox: read the WAL position to await the standbys: %w", err)
	}
	wait := time.Millisecond
	flushed := 0 // by the last count that answered
	for {
		n, err := s.Replicas.ReplicasFlushed(ctx, s.DB, lsn)
		switch {
		case err == nil && n >= s.Want:
			return nil
		case err == nil:
			flushed = n
		case ctx.Err() == nil:
			return fmt.Errorf("outbox: read the standbys' positions: %w", err)
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w: %d of the %d standbys RelayConfig.WaitReplicas asks for flushed WAL position %s within %v; the batch is handed back undelivered",
				errs.ErrReplicasBehind, flushed, s.Want, lsn, s.Timeout)
		case <-t.C:
		}
		wait = min(2*wait, 20*time.Millisecond)
	}
}
