// Package wal is Logical mode's source of batches: events carried in
// PostgreSQL's WAL as logical decoding messages, streamed from a
// replication slot. It holds the message format (codec.go), the
// replication session (stream.go: the reader, its keepalives and silence
// limits, confirmation) and the batches the engine delivers (batch.go:
// whole transactions, routed to the table where a row must carry them,
// their outcomes made durable before the slot's position moves).
//
// It is internal: the root package's Relay configures it.
package wal

import (
	"context"
	"database/sql"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/gorm-outbox/outbox/internal/engine"
	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/jackc/pgx/v5/pgconn"
)

// Relay streams one slot for one relay.
type Relay struct {
	Slot    string
	Repl    *pgconn.Config // the replication connection (see Prepare)
	DB      *sql.DB        // the pool, for the table and the catalog
	Logical store.Logical
	Store   store.Store
	Table   *engine.Table
	Fanout  *engine.Fanout
	Logger  *slog.Logger
	Now     func() time.Time

	BatchSize        int
	Lease            time.Duration
	StatementTimeout time.Duration
	PollInterval     time.Duration
	Ordered          bool // OrderByAggregate

	// EnsureOrdering creates the ordering index (Ordered).
	EnsureOrdering func(ctx context.Context) error
	// Dropped reports a committed event dropped because another event
	// took its ID first.
	Dropped func(ctx context.Context, e *engine.Event)
	// SlotLost reports the slot found missing (Stats.SlotLost).
	SlotLost func()

	// delivered is the end of the last transaction whose outcomes a
	// session of this relay made durable: where a lost slot's window of
	// undelivered events starts, for the log.
	delivered atomic.Uint64
}
