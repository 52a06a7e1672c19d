//go:build outbox_postgres || !(outbox_mysql || outbox_sqlite)

package outbox

import (
	"database/sql"
	"fmt"

	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/gorm-outbox/outbox/internal/store/postgres"
	"github.com/gorm-outbox/outbox/internal/wal"
	"github.com/jackc/pgx/v5/pgconn"
	pgdialect "gorm.io/driver/postgres"
)

// The PostgreSQL store, and Logical mode's machinery, which only it can
// serve. Every store is linked unless the build names some with the tags
// outbox_postgres, outbox_mysql and outbox_sqlite: then only those
// (docs/databases.md, "Linking only your database").
func init() {
	store.Register(postgres.Driver)
	logical = pgLogical{}
}

type pgLogical struct{}

// message is the WAL message of rows, and its prefix.
func (pgLogical) message(rows []store.Event, slot string) ([]byte, string, error) {
	content, err := wal.Message(rows)
	return content, wal.Prefix(slot), err
}

// stream is the relay's stream of the slot.
func (pgLogical) stream(r *Relay, sqlDB *sql.DB) (stream, error) {
	repl, err := r.replicationConfig()
	if err != nil {
		return nil, err
	}
	o := r.o
	return &wal.Relay{
		Slot: o.slot, Repl: repl, DB: sqlDB, Logical: o.wal, Store: o.store, Table: r.table,
		Fanout: r.fanout(), Logger: o.logger, Now: o.now,
		BatchSize: r.cfg.BatchSize, Lease: r.cfg.Lease, StatementTimeout: r.cfg.StatementTimeout,
		PollInterval: r.cfg.PollInterval, Ordered: r.cfg.OrderByAggregate,
		EnsureOrdering: r.ensureOrdering, Dropped: o.dropReusedID,
		SlotLost: func() { o.slotLost.Add(1) },
	}, nil
}

// replicationConfig is the replication connection's configuration: the
// DSN the *gorm.DB was opened with unless LogicalConfig.ReplicationDSN is
// set.
func (r *Relay) replicationConfig() (*pgconn.Config, error) {
	dsn := r.o.replicationDSN
	if dsn == "" {
		if d, ok := r.db.Dialector.(*pgdialect.Dialector); ok && d.Config != nil {
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
