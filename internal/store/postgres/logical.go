package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/gorm-outbox/outbox/internal/errs"
	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/gorm-outbox/outbox/internal/store/sqlbuild"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
)

// Logical mode's statements: the stream writes to the table only what is
// not delivered at once.

// minLogicalVersion is PostgreSQL 14, whose pgoutput can stream logical
// decoding messages (its "messages" option).
const minLogicalVersion = 140000

// CheckLogical implements store.Logical.
func (s *Store) CheckLogical(ctx context.Context, db *sql.DB) error {
	var (
		version  int
		walLevel string
		role     string
		canRepl  bool
	)
	err := db.QueryRowContext(ctx, `SELECT current_setting('server_version_num')::int, current_setting('wal_level'), current_user,
		COALESCE((SELECT rolreplication OR rolsuper FROM pg_roles WHERE rolname = current_user), false)`).
		Scan(&version, &walLevel, &role, &canRepl)
	if err != nil {
		return fmt.Errorf("outbox: check the server for Logical mode: %w", err)
	}
	return CheckLogicalServer(version, walLevel, role, canRepl)
}

// CheckLogicalServer judges what CheckLogical read from the server: its
// version number, wal_level, role and whether that role may replicate.
func CheckLogicalServer(version int, walLevel, role string, canRepl bool) error {
	switch {
	case version < minLogicalVersion:
		return fmt.Errorf("%w: Logical mode needs PostgreSQL 14 or later (pgoutput's messages option); this server is %d", errs.ErrUnsupportedVersion, version)
	case walLevel != "logical":
		return fmt.Errorf("%w: Logical mode needs wal_level = logical, the server has %s: set it (ALTER SYSTEM SET wal_level = logical) and restart PostgreSQL", errs.ErrServerSetting, walLevel)
	case !canRepl:
		return fmt.Errorf("%w: Logical mode streams from a replication slot and role %q may not: ALTER ROLE %q REPLICATION (or use a role that has it)", errs.ErrPrivilege, role, role)
	}
	return nil
}

// CreateSlot creates the publication pgoutput reads through (one with no
// tables: only the messages matter) and the slot, when missing. A slot
// created by another process meanwhile is fine; one of another plugin or
// database is not.
func (s *Store) CreateSlot(ctx context.Context, db *sql.DB, slot string, logger *slog.Logger) (replaced bool, err error) {
	var hasPub bool
	if err := db.QueryRowContext(ctx, "SELECT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = $1)", slot).Scan(&hasPub); err != nil {
		return false, fmt.Errorf("outbox: look for publication %s: %w", slot, err)
	}
	if !hasPub {
		if _, err := db.ExecContext(ctx, `CREATE PUBLICATION "`+slot+`"`); err != nil && !IsSQLState(err, "42710") {
			return false, fmt.Errorf("outbox: create publication %s: %w", slot, err)
		}
	}
	for range 2 {
		var plugin, database, current string
		err := db.QueryRowContext(ctx, "SELECT COALESCE(plugin, ''), COALESCE(database::text, ''), current_database() FROM pg_replication_slots WHERE slot_name = $1", slot).
			Scan(&plugin, &database, &current)
		switch {
		case err == nil && (plugin != "pgoutput" || database != current):
			return false, fmt.Errorf("%w: replication slot %s exists but is not a pgoutput slot of database %s (plugin %q, database %q): set Config.Logical.Slot to another name", errs.ErrInvalidConfig, slot, current, plugin, database)
		case err == nil:
			return false, nil
		case !errors.Is(err, sql.ErrNoRows):
			return false, fmt.Errorf("outbox: look for replication slot %s: %w", slot, err)
		}
		_, err = db.ExecContext(ctx, "SELECT pg_create_logical_replication_slot($1, 'pgoutput')", slot)
		switch {
		case err == nil && hasPub:
			// The publication is a catalog object, which a standby has;
			// the slot is not (before PostgreSQL 17's failover slots).
			logger.ErrorContext(ctx, "outbox: the logical replication slot was gone although its publication exists, and a new one is created: the old slot was lost (a failover to a standby that had no copy of it, or a DROP), and events committed before now that it had not streamed will never be delivered (docs/logical.md, \"Standbys and failover\")", "slot", slot)
			return true, nil
		case err == nil:
			logger.InfoContext(ctx, "outbox: created the logical replication slot; it keeps WAL until a relay confirms it", "slot", slot)
			return false, nil
		case !IsSQLState(err, "42710"): // 42710: created by another process meanwhile: look again
			return false, fmt.Errorf("outbox: create replication slot %s: %w", slot, err)
		}
	}
	return false, fmt.Errorf("outbox: replication slot %s: created and dropped concurrently", slot)
}

// IsSQLState reports whether err is a PostgreSQL error with that SQLSTATE.
func IsSQLState(err error, code string) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == code
}

// Emit implements store.Logical, from a query that yields no row, and so
// emits nothing, unless the slot exists, has found its consistent point
// (before that, a commit may not be decoded) and has not been invalidated.
// pg_get_replication_slots() rather than the pg_replication_slots view:
// the same rows without the view's join to pg_database, which every
// business transaction would pay for.
func (s *Store) Emit(ctx context.Context, db store.DB, slot, prefix string, content []byte) (bool, error) {
	n, err := s.Exec(ctx, db, sqlbuild.Query{SQL: "SELECT pg_logical_emit_message(true, $1, $2::text) FROM pg_get_replication_slots() s" +
		" WHERE s.slot_name = $3 AND s.confirmed_flush_lsn IS NOT NULL AND s.wal_status IS DISTINCT FROM 'lost'",
		Args: []any{prefix, string(content), slot}})
	return n == 1, err
}

const (
	parkColumns = "(id, named_id, event_type, aggregate_type, aggregate_id, idempotency_key, payload, headers, status, attempts, last_error, available_at, locked_until, occurred_at, created_at, updated_at)"
	parkParams  = 16
)

// Park implements store.Logical.
func (s *Store) Park(ctx context.Context, db store.DB, rows []store.ParkRow, now time.Time) (map[string]int64, error) {
	inserted := make(map[string]int64, len(rows))
	for chunk := range slices.Chunk(rows, s.PerStatement(s.Lim.InsertRows, parkParams, 0)) {
		err := s.Each(ctx, db, s.park(chunk, now), func(rs *sql.Rows) error {
			var (
				seq int64
				id  string
			)
			if err := rs.Scan(&seq, &id); err != nil {
				return err
			}
			inserted[id] = seq
			return nil
		})
		if err != nil {
			return nil, err
		}
	}
	return inserted, nil
}

func (s *Store) park(rows []store.ParkRow, now time.Time) sqlbuild.Query {
	b := s.Build()
	b.W("INSERT INTO ", s.Table, " ", parkColumns, " VALUES ")
	for i := range rows {
		p := &rows[i]
		var headers, lastErr, lease any
		if p.Event.Headers != nil {
			headers = string(p.Event.Headers)
		}
		if p.LastErr != "" {
			lastErr = p.LastErr
		}
		if !p.Lease.IsZero() {
			lease = p.Lease
		}
		if i > 0 {
			b.W(", ")
		}
		b.W("(", b.Arg(s.IDArg(store.RowID(p.Event.ID))), ", ", b.Arg(p.Event.ID), ", ", b.Arg(p.Event.Type), ", ", b.Arg(p.Event.AggregateType), ", ", b.Arg(p.Event.AggregateID),
			", ", b.Arg(sqlbuild.KeyArg(&p.Event)), ", ", b.Arg(string(p.Event.Payload)), ", ", b.Arg(headers),
			", ", s.StatusArg(b.Arg(p.Status)), ", ", b.Arg(p.Attempts), ", ", b.Arg(lastErr), ", ", b.Time(p.Due),
			", ", b.Arg(lease), "::timestamptz, ", b.Time(p.Event.OccurredAt), ", ", b.Time(p.Created), ", ", b.Time(now), ")")
	}
	b.W(" ON CONFLICT DO NOTHING RETURNING seq, named_id")
	return b.Query()
}

// Blocked implements store.Logical, through the ordering index.
func (s *Store) Blocked(ctx context.Context, db store.DB, aggs []store.Aggregate) (map[store.Aggregate]bool, error) {
	types, ids := make([]string, len(aggs)), make([]string, len(aggs))
	for i, a := range aggs {
		types[i], ids[i] = a.Type, a.ID
	}
	b := s.Build()
	q := b.W("SELECT DISTINCT aggregate_type, aggregate_id FROM ", s.Table,
		" WHERE status <> 'sent' AND (aggregate_type, aggregate_id) IN (SELECT * FROM unnest(",
		b.Arg(types), "::text[], ", b.Arg(ids), "::text[]))").Query()
	blocked := map[store.Aggregate]bool{}
	err := s.Each(ctx, db, q, func(rs *sql.Rows) error {
		var a store.Aggregate
		if err := rs.Scan(&a.Type, &a.ID); err != nil {
			return err
		}
		blocked[a] = true
		return nil
	})
	return blocked, err
}

// SlotStats implements store.Logical: the WAL kept for the slot, in bytes.
func (s *Store) SlotStats(ctx context.Context, db store.DB, slot string) (store.SlotStats, error) {
	var st store.SlotStats
	err := s.Row(ctx, db, sqlbuild.Query{
		SQL:  "SELECT active, COALESCE(pg_current_wal_lsn() - confirmed_flush_lsn, 0)::bigint FROM pg_replication_slots WHERE slot_name = $1",
		Args: []any{slot},
	}, &st.Active, &st.LagBytes)
	if errors.Is(err, sql.ErrNoRows) {
		return st, fmt.Errorf("%w: slot %s", errs.ErrNoSlot, slot)
	}
	return st, err
}

// WALPosition implements store.Logical.
func (s *Store) WALPosition(ctx context.Context, db store.DB) (uint64, error) {
	var lsn pglogrepl.LSN
	err := s.Row(ctx, db, sqlbuild.Query{SQL: "SELECT pg_current_wal_flush_lsn()"}, &lsn)
	return uint64(lsn), err
}

// SlotHeldBy implements store.Logical.
func (s *Store) SlotHeldBy(ctx context.Context, db store.DB, slot string, pid uint32) (bool, error) {
	var held bool
	err := s.Row(ctx, db, sqlbuild.Query{
		SQL:  "SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND active_pid = $2)",
		Args: []any{slot, int64(pid)},
	}, &held)
	return held, err
}
