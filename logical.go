package outbox

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

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
var ErrNoSlot = errors.New("outbox: the replication slot does not exist; the event would be lost")

// minLogicalVersion is PostgreSQL 14, whose pgoutput can stream logical
// decoding messages (its "messages" option).
const minLogicalVersion = 140000

// checkLogical refuses a server that cannot carry the outbox in its WAL,
// naming the setting to change.
func (o *Outbox) checkLogical(ctx context.Context, db *gorm.DB) error {
	sqlDB, err := rawDB(db)
	if err != nil {
		return err
	}
	var (
		version  int
		walLevel string
		role     string
		canRepl  bool
	)
	err = sqlDB.QueryRowContext(ctx, `SELECT current_setting('server_version_num')::int, current_setting('wal_level'), current_user,
		COALESCE((SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user), false)`).
		Scan(&version, &walLevel, &role, &canRepl)
	if err != nil {
		return fmt.Errorf("outbox: check the server for Logical mode: %w", err)
	}
	switch {
	case version < minLogicalVersion:
		return fmt.Errorf("%w: Logical mode needs PostgreSQL 14 or later (pgoutput's messages option); this server is %d", ErrUnsupportedDialect, version)
	case walLevel != "logical":
		return fmt.Errorf("%w: Logical mode needs wal_level = logical, the server has %s: set it (ALTER SYSTEM SET wal_level = logical) and restart PostgreSQL", ErrUnsupportedDialect, walLevel)
	case !canRepl:
		return fmt.Errorf("%w: Logical mode streams from a replication slot and role %q may not: ALTER ROLE %q REPLICATION (or use a role that has it)", ErrUnsupportedDialect, role, role)
	}
	return nil
}

// createSlot creates the publication pgoutput reads through (one with no
// tables: only the messages matter) and the slot, when missing. A slot
// created by another process meanwhile is fine; one of another plugin or
// database is not.
func (o *Outbox) createSlot(ctx context.Context, db *gorm.DB) error {
	sqlDB, err := rawDB(db)
	if err != nil {
		return err
	}
	var hasPub bool
	if err := sqlDB.QueryRowContext(ctx, "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)", o.slot).Scan(&hasPub); err != nil {
		return fmt.Errorf("outbox: look for publication %s: %w", o.slot, err)
	}
	if !hasPub {
		if _, err := sqlDB.ExecContext(ctx, `CREATE PUBLICATION "`+o.slot+`"`); err != nil && !isSQLState(err, "42710") {
			return fmt.Errorf("outbox: create publication %s: %w", o.slot, err)
		}
	}
	for range 2 {
		var plugin, database, current string
		err := sqlDB.QueryRowContext(ctx, "SELECT COALESCE(plugin, ''), COALESCE(database::text, ''), current_database() FROM pg_replication_slots WHERE slot_name = $1", o.slot).
			Scan(&plugin, &database, &current)
		switch {
		case err == nil && (plugin != "pgoutput" || database != current):
			return fmt.Errorf("%w: replication slot %s exists but is not a pgoutput slot of database %s (plugin %q, database %q): set Config.Slot to another name", ErrInvalidConfig, o.slot, current, plugin, database)
		case err == nil:
			return nil
		case !errors.Is(err, sql.ErrNoRows):
			return fmt.Errorf("outbox: look for replication slot %s: %w", o.slot, err)
		}
		_, err = sqlDB.ExecContext(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", o.slot)
		if err == nil {
			o.logger.InfoContext(ctx, "outbox: created the logical replication slot; it keeps WAL until a relay confirms it", "slot", o.slot)
			return nil
		}
		if !isSQLState(err, "42710") { // created by another process meanwhile: look again
			return fmt.Errorf("outbox: create replication slot %s: %w", o.slot, err)
		}
	}
	return fmt.Errorf("outbox: replication slot %s: created and dropped concurrently", o.slot)
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
			Payload: e.payload, Headers: e.headers, OccurredAt: e.OccurredAt, Checked: !e.generated,
		}
		if e.IdempotencyKey != e.ID {
			msg[i].Key = e.IdempotencyKey
		}
	}
	content, err := json.Marshal(msg)
	if err != nil {
		return fmt.Errorf("outbox: encode %d events for the WAL: %w", len(enc), err)
	}
	// pg_get_replication_slots() rather than the pg_replication_slots view:
	// the same rows without the view's join to pg_database, which every
	// business transaction would pay for.
	res, err := pool.ExecContext(ctx, "SELECT pg_logical_emit_message(true, $1, $2::text) FROM pg_get_replication_slots() s"+
		" WHERE s.slot_name = $3 AND s.confirmed_flush_lsn IS NOT NULL AND s.wal_status IS DISTINCT FROM 'lost'",
		logicalPrefix(o.slot), string(content), o.slot)
	if err != nil {
		if len(enc) == 1 {
			return fmt.Errorf("outbox: emit event %s (%s): %w", enc[0].ID, enc[0].Type, err)
		}
		return fmt.Errorf("outbox: emit %d events: %w", len(enc), err)
	}
	if n, err := res.RowsAffected(); err != nil || n != 1 {
		return fmt.Errorf("%w: slot %s (emitted %d messages, %v)", ErrNoSlot, o.slot, n, err)
	}
	return nil
}
