package sqlbuild

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gorm-outbox/outbox/internal/store"
)

// Dialect is how a database spells the overview's arithmetic.
type Dialect struct {
	// MinuteOf is the whole minutes since the Unix epoch of a time
	// column, in UTC whatever the session's time zone.
	MinuteOf func(col string) string
	// MillisBetween is the milliseconds from time a to time b.
	MillisBetween func(a, b string) string
	// IntDiv divides two integers, rounding down (both are >= 0).
	IntDiv string
	// SentRange is the column whose range finds the rows sent in a time
	// range (through an index); sent_at where it is not given.
	SentRange string
	// AddOnConflict ends an INSERT into the rollup that adds each column
	// of cols to the row already there.
	AddOnConflict func(table string, key, cols []string) string
	// InsertIgnore is the INSERT of a row that does nothing when its key
	// is already there: before and after the INSERT INTO ... VALUES.
	InsertIgnore [2]string
	// LimitedDelete: DELETE takes ORDER BY and LIMIT (MySQL), where the
	// others take a LIMIT only in a subquery.
	LimitedDelete bool
	// Upsert ends an INSERT that replaces the columns cols of the row
	// already there under its key.
	Upsert func(key string, cols []string) string
}

// OnConflictSet is Upsert for PostgreSQL and SQLite.
func OnConflictSet(key string, cols []string) string {
	set := make([]string, len(cols))
	for i, c := range cols {
		set[i] = c + " = excluded." + c
	}
	return " ON CONFLICT (" + key + ") DO UPDATE SET " + strings.Join(set, ", ")
}

// Derived quotes the name of a table derived from the outbox table's.
func (s *Syntax) Derived(suffix string) string {
	return s.Table[:len(s.Table)-1] + suffix + s.Table[len(s.Table)-1:]
}

func (s *Syntax) rollupTable() string { return s.Derived("_rollup") }
func (s *Syntax) stateTable() string  { return s.Derived("_rollup_state") }

// OnConflictAdd is AddOnConflict for PostgreSQL and SQLite.
func OnConflictAdd(table string, key, cols []string) string {
	set := make([]string, len(cols))
	for i, c := range cols {
		set[i] = c + " = " + table + "." + c + " + excluded." + c
	}
	return " ON CONFLICT (" + strings.Join(key, ", ") + ") DO UPDATE SET " + strings.Join(set, ", ")
}

// rollLock takes the rollup's lock by writing its one state row (a row
// lock on PostgreSQL and MySQL, the database's write lock on SQLite); it
// writes nothing when there is no state yet.
func (s *Syntax) rollLock() Query {
	return Query{SQL: "UPDATE " + s.stateTable() + " SET id = id WHERE id = 1"}
}

// RollState implements store.Overview.
func (s *Syntax) RollState(ctx context.Context, db store.DB) (store.RollState, bool, error) {
	var (
		st             store.RollState
		until, checked DBTime
	)
	q := Query{SQL: "SELECT " + s.TimeCol("rolled_until") + ", low_seq, " + s.TimeCol("low_checked") + " FROM " + s.stateTable() + " WHERE id = 1"}
	err := s.Row(ctx, db, q, &until, &st.Low, &checked)
	if errors.Is(err, sql.ErrNoRows) {
		return st, false, nil
	}
	st.Until, st.Checked = until.T, checked.T
	return st, err == nil, err
}

// RollBegin implements store.Overview: the first pass starts from the
// oldest sent_at, read through the index that finds sent rows. Whether the
// state row is there is read after the lock, not from the UPDATE's row
// count: MySQL's driver counts the rows an UPDATE changed, and SET id = id
// changes none.
func (s *Syntax) RollBegin(ctx context.Context, tx store.DB, from time.Time) (store.RollState, error) {
	if _, err := s.Exec(ctx, tx, s.rollLock()); err != nil {
		return store.RollState{}, err
	}
	if st, found, err := s.RollState(ctx, tx); err != nil || found {
		return st, err
	}
	// The first pass: from the oldest sent row on.
	var first DBTime
	col := cmpOr(s.SentRange, "sent_at")
	if err := s.Row(ctx, tx, Query{SQL: "SELECT " + s.TimeCol("MIN("+col+")") + " FROM " + s.Table + " WHERE status = 'sent'"}, &first); err != nil {
		return store.RollState{}, err
	}
	b := s.Build()
	init := b.W(s.InsertIgnore[0], " ", s.stateTable(), " (id, rolled_until, low_seq, low_checked) VALUES (1, ",
		b.Time(cmp.Or(first.T, from)), ", 0, ", b.Time(time.Unix(0, 0)), ")", s.InsertIgnore[1]).Query()
	if _, err := s.Exec(ctx, tx, init); err != nil {
		return store.RollState{}, err
	}
	// Another pass may have created the row meanwhile: take its lock, and
	// read what it left.
	if _, err := s.Exec(ctx, tx, s.rollLock()); err != nil {
		return store.RollState{}, err
	}
	st, _, err := s.RollState(ctx, tx)
	return st, err
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// delayBin is the SQL of the delay histogram's bin of the delay d, in ms.
func delayBin(d string) string {
	var b strings.Builder
	b.WriteString("CASE")
	for i, bound := range store.DelayBounds {
		b.WriteString(" WHEN " + d + " < " + strconv.FormatFloat(bound, 'f', -1, 64) + " THEN " + strconv.Itoa(i))
	}
	b.WriteString(" ELSE " + strconv.Itoa(len(store.DelayBounds)) + " END")
	return b.String()
}

// SentBins implements store.Overview.
func (s *Syntax) SentBins(ctx context.Context, db store.DB, from, to time.Time) ([]store.SentBin, error) {
	b := s.Build()
	col := cmpOr(s.SentRange, "sent_at")
	// The delay is computed once a row, in the subquery: the bin's CASE
	// reads it once a bound.
	q := b.W("SELECT event_type, ms, mc, ", delayBin("d"), ", COUNT(*) FROM (SELECT event_type, ", s.MinuteOf("sent_at"), " AS ms, ",
		s.MinuteOf(s.CreatedCol()), " AS mc, ", s.MillisBetween(s.CreatedCol(), "sent_at"), " AS d FROM ", s.Table,
		" WHERE status = 'sent' AND ", col, " >= ", b.Time(from), " AND ", col, " < ", b.Time(to), ") s GROUP BY 1, 2, 3, 4").Query()
	var out []store.SentBin
	err := s.Each(ctx, db, q, func(rows *sql.Rows) error {
		var c store.SentBin
		if err := rows.Scan(&c.Type, &c.Sent, &c.Created, &c.Bin, &c.N); err != nil {
			return err
		}
		out = append(out, c)
		return nil
	})
	return out, err
}

// rollupCols are the rollup's counting columns.
func rollupCols() []string {
	cols := []string{"published", "delivered"}
	for i := 0; i <= len(store.DelayBounds); i++ {
		cols = append(cols, "d"+strconv.Itoa(i))
	}
	return cols
}

// RollCommit implements store.Overview. The rows are added in a fixed
// order, so that two passes adding to the same minutes lock them in the
// same order (they cannot overlap: the state row serialises them; MySQL's
// gap locks make the order matter all the same), as many a statement as
// the parameter limit takes.
func (s *Syntax) RollCommit(ctx context.Context, tx store.DB, rows []store.RollRow, now time.Time, st store.RollState) error {
	rows = slices.Clone(rows)
	slices.SortFunc(rows, func(a, b store.RollRow) int {
		return cmp.Or(cmp.Compare(a.Span, b.Span), cmp.Compare(a.Minute, b.Minute), cmp.Compare(a.Type, b.Type))
	})
	cols := rollupCols()
	per := s.PerStatement(500, 3+len(cols), 0)
	for chunk := range slices.Chunk(rows, per) {
		b := s.Build()
		b.W("INSERT INTO ", s.rollupTable(), " (span, minute, event_type, ", strings.Join(cols, ", "), ") VALUES ")
		for i, r := range chunk {
			if i > 0 {
				b.W(", ")
			}
			b.W("(", b.Arg(r.Span), ", ", b.Arg(r.Minute), ", ", b.Arg(r.Type), ", ", b.Arg(r.Published), ", ", b.Arg(r.Delivered))
			for j := range len(store.DelayBounds) + 1 {
				var n int64
				if j < len(r.Delay) {
					n = r.Delay[j]
				}
				b.W(", ", b.Arg(n))
			}
			b.W(")")
		}
		if _, err := s.Exec(ctx, tx, b.W(s.AddOnConflict(s.rollupTable(), []string{"span", "minute", "event_type"}, cols)).Query()); err != nil {
			return err
		}
	}
	for _, sp := range store.RollSpans {
		b := s.Build()
		trim := b.W("DELETE FROM ", s.rollupTable(), " WHERE span = ", b.Arg(sp.Minutes), " AND minute < ", b.Arg(now.Add(-sp.Keep).Unix()/60)).Query()
		if _, err := s.Exec(ctx, tx, trim); err != nil {
			return err
		}
	}
	b := s.Build()
	set := b.W("UPDATE ", s.stateTable(), " SET rolled_until = ", b.Time(st.Until), ", low_seq = ", b.Arg(st.Low),
		", low_checked = ", b.Time(st.Checked), " WHERE id = 1").Query()
	_, err := s.Exec(ctx, tx, set)
	return err
}

// ReadOverview implements store.Overview: with Snapshot, in one
// REPEATABLE READ, read-only transaction, so that a row the relay moves
// between two reads is counted once. Without (SQLite), each read is its
// own snapshot: a transaction there would be BEGIN IMMEDIATE with the DSN
// the outbox advises (_txlock=immediate), the database's write lock held
// for the whole overview; a row moving between two reads can then be
// counted in both or neither, once.
func (s *Syntax) ReadOverview(ctx context.Context, db *sql.DB, q store.OverviewQuery) (store.OverviewRows, error) {
	var out store.OverviewRows
	var on store.DB = db
	if s.Snapshot {
		tx, err := db.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead, ReadOnly: true})
		if err != nil {
			return out, err
		}
		defer func() { _ = tx.Rollback() }()
		on = tx
	}
	var err error
	if !q.Now {
		if out.Rollup, err = s.rollupRead(ctx, on, q); err != nil {
			return out, fmt.Errorf("read the rollup: %w", err)
		}
		// The rows sent since the rollup's end, from the table.
		if out.Sent, err = s.SentBins(ctx, on, q.SentFrom, q.SentTo); err != nil {
			return out, fmt.Errorf("read the sent events: %w", err)
		}
	}
	if out.Pending, err = s.pendingGroups(ctx, on, q.Low); err != nil {
		return out, fmt.Errorf("count the pending events: %w", err)
	}
	if out.Failed, err = s.failedGroups(ctx, on); err != nil {
		return out, fmt.Errorf("count the failed events: %w", err)
	}
	return out, nil
}

// rollupRead is the rollup's rows of span q.Span from q.SinceMinute on,
// summed per interval of q.Step minutes (its index from SinceMinute) and
// type.
func (s *Syntax) rollupRead(ctx context.Context, db store.DB, q store.OverviewQuery) ([]store.RollupSum, error) {
	b := s.Build()
	cols := rollupCols()
	sums := make([]string, len(cols))
	for i, c := range cols {
		sums[i] = "SUM(" + c + ")"
	}
	qq := b.W("SELECT (minute - ", b.Arg(q.SinceMinute), ") ", s.IntDiv, " ", b.Arg(q.Step), ", event_type, ", strings.Join(sums, ", "),
		" FROM ", s.rollupTable(), " WHERE span = ", b.Arg(q.Span), " AND minute >= ", b.Arg(q.SinceMinute), " GROUP BY 1, 2").Query()
	var out []store.RollupSum
	err := s.Each(ctx, db, qq, func(rows *sql.Rows) error {
		r := store.RollupSum{Delay: make([]int64, len(store.DelayBounds)+1)}
		dest := []any{&r.Interval, &r.Type, &r.Published, &r.Delivered}
		for j := range r.Delay {
			dest = append(dest, &r.Delay[j])
		}
		if err := rows.Scan(dest...); err != nil {
			return err
		}
		out = append(out, r)
		return nil
	})
	return out, err
}

// pendingGroups is the pending rows by type and minute created, with the
// oldest creation time of each group. Where new rows are found by seq
// (Fresh), a pending row is either new (available_at NULL), at or above
// low, or waits in the retry index, and the two are read apart; elsewhere
// the pending index holds them all.
func (s *Syntax) pendingGroups(ctx context.Context, db store.DB, low int64) ([]store.PendingGroup, error) {
	b := s.Build()
	cols := "event_type, " + s.MinuteOf(s.CreatedCol()) + " AS m, " + s.CreatedCol() + " AS c"
	if !s.Fresh {
		b.W("SELECT event_type, ", s.MinuteOf(s.CreatedCol()), ", COUNT(*), ", s.TimeCol("MIN("+s.CreatedCol()+")"),
			" FROM ", s.Table, " WHERE status = 'pending' GROUP BY 1, 2")
	} else {
		// The two ranges are told apart by available_at, not by low: a
		// bound on seq in the second would let SQLite read it as a range
		// of the primary key (everything below low) instead of the retry
		// index.
		b.W("SELECT event_type, m, COUNT(*), ", s.TimeCol("MIN(c)"), " FROM (SELECT ", cols, " FROM ", s.Table,
			" WHERE seq >= ", b.Arg(low), " AND status = 'pending' AND available_at IS NULL")
		b.W(" UNION ALL SELECT ", cols, " FROM ", s.Table, " WHERE status = 'pending' AND available_at IS NOT NULL",
			") p GROUP BY 1, 2")
	}
	var out []store.PendingGroup
	err := s.Each(ctx, db, b.Query(), func(rows *sql.Rows) error {
		var (
			g     store.PendingGroup
			first DBTime
		)
		if err := rows.Scan(&g.Type, &g.Created, &g.N, &first); err != nil {
			return err
		}
		g.Oldest = first.T
		out = append(out, g)
		return nil
	})
	return out, err
}

// failedGroups is the failed rows by type, minute failed (updated_at, as
// FailedSince reads it) and minute created.
func (s *Syntax) failedGroups(ctx context.Context, db store.DB) ([]store.FailedGroup, error) {
	failedAt := "COALESCE(updated_at, " + s.CreatedCol() + ")"
	q := Query{SQL: "SELECT event_type, " + s.MinuteOf(failedAt) + ", " + s.MinuteOf(s.CreatedCol()) + ", COUNT(*) FROM " + s.Table +
		" WHERE status = 'failed' GROUP BY 1, 2, 3"}
	var out []store.FailedGroup
	err := s.Each(ctx, db, q, func(rows *sql.Rows) error {
		var g store.FailedGroup
		if err := rows.Scan(&g.Type, &g.Failed, &g.Created, &g.N); err != nil {
			return err
		}
		out = append(out, g)
		return nil
	})
	return out, err
}

func (s *Syntax) attemptsTable() string { return s.Derived("_attempts") }

// RecordAttempts implements store.History: the rows at seqs a failure
// mark at now just updated (updated_at = now: a row whose lease another
// relay holds was not updated, and is not recorded).
func (s *Syntax) RecordAttempts(ctx context.Context, db store.DB, seqs []int64, now time.Time) (int64, error) {
	return s.ExecChunks(ctx, db, len(seqs), s.seqChunk(), func(i, j int) Query {
		b := s.Build()
		return b.W("INSERT INTO ", s.attemptsTable(), " (seq, at, attempt, outcome, error) SELECT seq, updated_at, attempts,",
			" CASE WHEN status = 'failed' THEN 'failed' ELSE 'retry' END, last_error FROM ", s.Table,
			" WHERE ", b.Seqs("seq", seqs[i:j]), " AND updated_at = ", b.Time(now)).Query()
	})
}

// recordReplays is the history entries of the rows at seqs a replay at
// now just set pending, with the error they had and who replayed them.
func (s *Syntax) recordReplays(seqs []int64, now time.Time, actor string) Query {
	b := s.Build()
	return b.W("INSERT INTO ", s.attemptsTable(), " (seq, at, attempt, outcome, error, actor) SELECT seq, updated_at, 0, 'replayed', last_error, NULLIF(",
		b.Arg(actor), ", '') FROM ", s.Table, " WHERE ", b.Seqs("seq", seqs), " AND updated_at = ", b.Time(now), " AND status = 'pending'").Query()
}

// recordRetried is the history entries of the rows at seqs a RetryNow at
// now just made due, with the error they had and who retried them.
func (s *Syntax) recordRetried(seqs []int64, now time.Time, actor string) Query {
	b := s.Build()
	return b.W("INSERT INTO ", s.attemptsTable(), " (seq, at, attempt, outcome, error, actor) SELECT seq, updated_at, attempts, 'retried', last_error, NULLIF(",
		b.Arg(actor), ", '') FROM ", s.Table, " WHERE ", b.Seqs("seq", seqs), " AND updated_at = ", b.Time(now), " AND status = 'pending'").Query()
}

// Attempts implements store.History.
func (s *Syntax) Attempts(ctx context.Context, db store.DB, id string) ([]store.Attempt, error) {
	b := s.Build()
	b.W("SELECT ", s.TimeCol("at"), ", attempt, outcome, error, actor FROM ", s.attemptsTable(), " WHERE seq IN (SELECT seq FROM ", s.Table, " WHERE ")
	q := b.W(s.MatchIDs(b, []string{id}), ") ORDER BY at").Query()
	var out []store.Attempt
	err := s.Each(ctx, db, q, func(rows *sql.Rows) error {
		var (
			a          store.Attempt
			at         DBTime
			errText, x sql.NullString
		)
		if err := rows.Scan(&at, &a.Attempt, &a.Outcome, &errText, &x); err != nil {
			return err
		}
		a.At, a.Error, a.Actor = at.T, errText.String, x.String
		out = append(out, a)
		return nil
	})
	return out, err
}

// ForgetAttempts implements store.History: up to limit entries older than
// before, through the at index.
func (s *Syntax) ForgetAttempts(ctx context.Context, db store.DB, before time.Time, limit int) (int64, error) {
	b := s.Build()
	if s.LimitedDelete {
		return s.Exec(ctx, db, b.W("DELETE FROM ", s.attemptsTable(), " WHERE at < ", b.Time(before), " ORDER BY at LIMIT ", b.Limit(limit)).Query())
	}
	return s.Exec(ctx, db, b.W("DELETE FROM ", s.attemptsTable(), " WHERE (seq, at) IN (SELECT seq, at FROM ", s.attemptsTable(),
		" WHERE at < ", b.Time(before), " ORDER BY at LIMIT ", b.Limit(limit), ")").Query())
}

// purgeAttempts deletes the entries of the rows at seqs that are gone (a
// purge deleted them; one replayed meanwhile stays, and so does its
// history).
func (s *Syntax) purgeAttempts(seqs []int64) Query {
	b := s.Build()
	a := s.attemptsTable()
	return b.W("DELETE FROM ", a, " WHERE ", b.Seqs("seq", seqs), " AND NOT EXISTS (SELECT 1 FROM ", s.Table, " o WHERE o.seq = ", a, ".seq)").Query()
}
