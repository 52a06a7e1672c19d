package sqlbuild

import (
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

// List implements store.Admin: ordered by seq so that paging with AfterSeq
// or BeforeSeq is stable while rows are added.
func (s *Syntax) List(p store.Page) store.Query {
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
	return b.Query()
}

// Get implements store.Admin.
func (s *Syntax) Get(id string) store.Query {
	b := s.Build()
	b.W("SELECT ", s.RowColumns(), " FROM ", s.Table, " WHERE ")
	return b.W(s.MatchIDs(b, []string{id})).Query()
}

// Count implements store.Admin.
func (s *Syntax) Count(f store.Filter) store.Query {
	b := s.Build()
	b.W("SELECT COUNT(*) FROM ", s.Table)
	s.Where(b, f)
	return b.Query()
}

// ReplaySelect implements store.Admin.
func (s *Syntax) ReplaySelect(f store.Filter, after int64, limit int) store.Query {
	b := s.Build()
	b.W("SELECT seq FROM ", s.Table)
	s.Where(b, f, "status = 'failed'", "seq > "+b.Arg(after))
	b.W(" ORDER BY seq LIMIT ", b.Arg(limit))
	return b.Query()
}

// ReplayUpdate implements store.Admin: the rows read beforehand that
// still match and are still failed (a replay never touches another
// status, whatever f says).
func (s *Syntax) ReplayUpdate(f store.Filter, seqs []int64, now time.Time) store.Query {
	u := s.Build()
	u.W("UPDATE ", s.Table, " SET status = 'pending', attempts = 0, available_at = ", u.Time(now),
		", updated_at = ", u.Time(now), ", locked_until = NULL")
	s.Where(u, f, "status = 'failed'", u.Seqs("seq", seqs))
	return u.Query()
}

// PurgeSelect implements store.Admin. No ORDER BY: deleted rows leave the
// selection, so each round takes whichever matching rows the database
// finds first (through the sent index, for sent rows).
func (s *Syntax) PurgeSelect(f store.Filter, limit int) store.Query {
	b := s.Build()
	b.W("SELECT seq FROM ", s.Table)
	s.Where(b, f)
	b.W(" LIMIT ", b.Arg(limit))
	return b.Query()
}

// PurgeDelete implements store.Admin: the rows read beforehand that still
// match.
func (s *Syntax) PurgeDelete(f store.Filter, seqs []int64) store.Query {
	d := s.Build()
	d.W("DELETE FROM ", s.Table)
	s.Where(d, f, d.Seqs("seq", seqs))
	return d.Query()
}
