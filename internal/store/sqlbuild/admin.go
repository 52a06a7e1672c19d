package sqlbuild

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/google/uuid"
	"github.com/gorm-outbox/outbox/internal/store"
)

// Where writes the WHERE clause of f (and of the extra conditions, which
// come first); it writes nothing when nothing is selected.
func (s *Syntax) Where(b *Builder, f store.Filter, extra ...string) {
	conds := append([]string(nil), extra...)
	add := func(c string) { conds = append(conds, c) }
	if len(f.IDs) > 0 {
		add(s.MatchIDs(b, f.IDs))
	}
	if len(f.Keys) > 0 {
		add(s.MatchKeys(b, f.Keys))
	}
	if len(f.Statuses) > 0 {
		add(b.IDs(s.StatusText(), f.Statuses))
	}
	if len(f.Types) > 0 {
		add(b.IDs("event_type", f.Types))
	}
	if f.AggregateType != "" {
		add("aggregate_type = " + b.Arg(f.AggregateType))
	}
	if f.AggregateID != "" {
		add("aggregate_id = " + b.Arg(f.AggregateID))
	}
	if !f.CreatedSince.IsZero() {
		add(s.CreatedCol() + " >= " + b.Time(f.CreatedSince))
	}
	if !f.CreatedUntil.IsZero() {
		add(s.CreatedCol() + " < " + b.Time(f.CreatedUntil))
	}
	if f.ErrorContains != "" {
		// '!' escapes, not backslash: MySQL reads a backslash in a
		// literal as an escape itself, unless NO_BACKSLASH_ESCAPES is set.
		add("LOWER(last_error) LIKE LOWER(" + b.Arg(likeContains(f.ErrorContains)) + ") ESCAPE '!'")
	}
	if len(conds) > 0 {
		b.W(" WHERE ", strings.Join(conds, " AND "))
	}
}

// MatchIDs matches the rows with any of the event IDs: a chosen ID is
// named_id (indexed); a generated one, a UUID, is the id column (not
// indexed: an event looked up by a generated ID is found by a scan).
func (s *Syntax) MatchIDs(b *Builder, ids []string) string {
	var uuids []uuid.UUID
	for _, id := range ids {
		if u := store.RowID(id); u.String() == id {
			uuids = append(uuids, u)
		}
	}
	cond := b.IDs("named_id", ids)
	if len(uuids) == 0 {
		return cond
	}
	ph := make([]string, len(uuids))
	for i, u := range uuids {
		ph[i] = b.Arg(s.IDArg(u))
	}
	return "(" + cond + " OR (named_id IS NULL AND id IN (" + strings.Join(ph, ", ") + ")))"
}

// MatchKeys matches the rows with any of the idempotency keys: a key the
// publisher chose is idempotency_key (indexed); a key that is the event's
// ID is stored NULL, and found as the ID.
func (s *Syntax) MatchKeys(b *Builder, keys []string) string {
	return "(" + b.IDs("idempotency_key", keys) + " OR (idempotency_key IS NULL AND " + s.MatchIDs(b, keys) + "))"
}

// filterParams is how many parameters Where writes for f (the database's
// way: an ID list is one array parameter on PostgreSQL), and a few for the
// statement's own.
func (s *Syntax) filterParams(f store.Filter) int {
	b := s.Build()
	s.Where(b, f)
	return len(b.args) + 4
}

// StatusText reads the status as text.
func (s *Syntax) StatusText() string {
	if s.Arrays {
		return "status::text"
	}
	return "status"
}

// likeContains is the LIKE pattern matching text anywhere, with LIKE's
// wildcards in text taken literally.
func likeContains(text string) string {
	r := strings.NewReplacer("!", "!!", "%", "!%", "_", "!_")
	return "%" + r.Replace(text) + "%"
}

// RowColumns are the columns store.ScanRows reads, in its order.
func (s *Syntax) RowColumns() string {
	return "seq, " + s.IDCol + ", event_type, aggregate_type, aggregate_id, " + s.KeyCol() + ", payload, headers, " + s.StatusText() + ", attempts, last_error, " +
		s.TimeCol("COALESCE(available_at, created_at, occurred_at)") + ", " + s.TimeCol("locked_until") + ", " + s.TimeCol("occurred_at") + ", " +
		s.TimeCol(s.CreatedCol()) + ", " + s.TimeCol("COALESCE(updated_at, created_at, occurred_at)") + ", " + s.TimeCol("sent_at")
}

// List implements store.Store.
func (s *Syntax) List(ctx context.Context, db store.DB, p store.Page) ([]store.Row, error) {
	b := s.Build()
	b.W("SELECT ", s.RowColumns(), " FROM ", s.Table)
	var page []string
	if p.AfterSeq > 0 {
		page = append(page, "seq > "+b.Arg(p.AfterSeq))
	}
	if p.BeforeSeq > 0 {
		page = append(page, "seq < "+b.Arg(p.BeforeSeq))
	}
	s.Where(b, p.Filter, page...)
	order := " ORDER BY seq"
	if p.Newest {
		order += " DESC"
	}
	b.W(order, " LIMIT ", b.Arg(p.Limit))
	return s.queryRows(ctx, db, b.Query())
}

// Get implements store.Store.
func (s *Syntax) Get(ctx context.Context, db store.DB, id string) (store.Row, bool, error) {
	b := s.Build()
	b.W("SELECT ", s.RowColumns(), " FROM ", s.Table, " WHERE ")
	rows, err := s.queryRows(ctx, db, b.W(s.MatchIDs(b, []string{id})).Query())
	if err != nil || len(rows) == 0 {
		return store.Row{}, false, err
	}
	return rows[0], true, nil
}

// Count implements store.Store.
func (s *Syntax) Count(ctx context.Context, db store.DB, f store.Filter) (int64, error) {
	b := s.Build()
	b.W("SELECT COUNT(*) FROM ", s.Table)
	s.Where(b, f)
	var n int64
	err := s.Row(ctx, db, b.Query(), &n)
	return n, err
}

// adminScan is how many rows one Replay or Purge pass reads, and
// adminBatch how many one of its statements changes: never many row locks
// at once.
const (
	adminScan  = 10000
	adminBatch = 1000
)

// adminChunk is how many seqs one Replay or Purge statement with f takes.
func (s *Syntax) adminChunk(f store.Filter) int {
	return s.PerStatement(adminBatch, 1, s.filterParams(f))
}

// Replay implements store.Store: each batch an UPDATE of the rows read
// beforehand in seq order that still match and are still failed, so that
// a row that fails again while it runs is not replayed twice, then the
// history entries of the rows it replayed.
func (s *Syntax) Replay(ctx context.Context, db store.DB, r store.Replay) (int, error) {
	total := 0
	var after int64
	for {
		b := s.Build()
		b.W("SELECT seq FROM ", s.Table)
		s.Where(b, r.Filter, "status = 'failed'", "seq > "+b.Arg(after))
		b.W(" ORDER BY seq LIMIT ", b.Arg(adminScan))
		seqs, err := s.seqList(ctx, db, b.Query())
		if err != nil {
			return total, err
		}
		for batch := range slices.Chunk(seqs, s.adminChunk(r.Filter)) {
			now := r.Now()
			u := s.Build()
			u.W("UPDATE ", s.Table, " SET status = 'pending', attempts = 0, available_at = ", u.Time(now),
				", updated_at = ", u.Time(now), ", locked_until = NULL")
			s.Where(u, r.Filter, "status = 'failed'", u.Seqs("seq", batch))
			n, err := s.Exec(ctx, db, u.Query())
			if err != nil {
				return total, fmt.Errorf("replay %d events: %w", len(batch), err)
			}
			total += int(n)
			if n > 0 {
				// In the replay's transaction when db is one; on its own
				// otherwise, after the replay (the entry, not the event,
				// is what a failure here loses: it is reported).
				if _, err := s.Exec(ctx, db, s.recordReplays(batch, now, r.Actor)); err != nil {
					return total, fmt.Errorf("replayed %d events but could not record it in their history: %w", n, err)
				}
			}
		}
		if len(seqs) < adminScan {
			return total, nil
		}
		after = seqs[len(seqs)-1]
	}
}

// RetryNow implements store.Store: each batch an UPDATE of the rows read
// beforehand in seq order that are still pending, due later and not
// leased (a relay holding one is delivering it), then their history
// entries.
func (s *Syntax) RetryNow(ctx context.Context, db store.DB, r store.Replay) (int, error) {
	total := 0
	var after int64
	waiting := func(b *Builder, now time.Time) []string {
		return []string{"status = 'pending'", "available_at > " + b.Time(now),
			"(locked_until IS NULL OR locked_until <= " + b.Time(now) + ")"}
	}
	for {
		b := s.Build()
		b.W("SELECT seq FROM ", s.Table)
		s.Where(b, r.Filter, append(waiting(b, r.Now()), "seq > "+b.Arg(after))...)
		b.W(" ORDER BY seq LIMIT ", b.Arg(adminScan))
		seqs, err := s.seqList(ctx, db, b.Query())
		if err != nil {
			return total, err
		}
		for batch := range slices.Chunk(seqs, s.adminChunk(r.Filter)) {
			now := r.Now()
			u := s.Build()
			u.W("UPDATE ", s.Table, " SET available_at = ", u.Time(now), ", updated_at = ", u.Time(now))
			s.Where(u, r.Filter, append(waiting(u, now), u.Seqs("seq", batch))...)
			n, err := s.Exec(ctx, db, u.Query())
			if err != nil {
				return total, fmt.Errorf("retry %d events now: %w", len(batch), err)
			}
			total += int(n)
			if n > 0 {
				if _, err := s.Exec(ctx, db, s.recordRetried(batch, now, r.Actor)); err != nil {
					return total, fmt.Errorf("retried %d events now but could not record it in their history: %w", n, err)
				}
			}
		}
		if len(seqs) < adminScan {
			return total, nil
		}
		after = seqs[len(seqs)-1]
	}
}

// Purge implements store.Store. No ORDER BY: deleted rows leave the
// selection, so each round takes whichever matching rows the database
// finds first (through the sent index, for sent rows).
func (s *Syntax) Purge(ctx context.Context, db store.DB, f store.Filter) (int, error) {
	total := 0
	for {
		b := s.Build()
		b.W("SELECT seq FROM ", s.Table)
		s.Where(b, f)
		b.W(" LIMIT ", b.Arg(adminScan))
		seqs, err := s.seqList(ctx, db, b.Query())
		if err != nil {
			return total, err
		}
		deleted := 0
		for batch := range slices.Chunk(seqs, s.adminChunk(f)) {
			d := s.Build()
			d.W("DELETE FROM ", s.Table)
			s.Where(d, f, d.Seqs("seq", batch))
			n, err := s.Exec(ctx, db, d.Query())
			if err != nil {
				return total + deleted, fmt.Errorf("purge %d events: %w", len(batch), err)
			}
			deleted += int(n)
			if n > 0 {
				if _, err := s.Exec(ctx, db, s.purgeAttempts(batch)); err != nil {
					return total + deleted, fmt.Errorf("purged %d events but not their history: %w", n, err)
				}
			}
		}
		total += deleted
		// deleted == 0: every row selected changed under us; stop rather
		// than select them again.
		if len(seqs) < adminScan || deleted == 0 {
			return total, nil
		}
	}
}
