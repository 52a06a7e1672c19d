package sqlbuild

import (
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

// RollLock implements store.Overviewer: it takes the rollup's lock by
// writing its one state row (a row lock on PostgreSQL and MySQL, the
// database's write lock on SQLite), so that of two rollups one waits and
// then finds the rows the other rolled up.
func (s *Syntax) RollLock() store.Query {
	return store.Query{SQL: "UPDATE " + s.stateTable() + " SET id = id WHERE id = 1"}
}

// RollInit implements store.Overviewer.
func (s *Syntax) RollInit(from time.Time) store.Query {
	b := s.Build()
	return b.W(s.InsertIgnore[0], " ", s.stateTable(), " (id, rolled_until, low_seq, low_checked) VALUES (1, ",
		b.Time(from), ", 0, ", b.Time(time.Unix(0, 0)), ")", s.InsertIgnore[1]).Query()
}

// RollState implements store.Overviewer.
func (s *Syntax) RollState() store.Query {
	return store.Query{SQL: "SELECT " + s.TimeCol("rolled_until") + ", low_seq, " + s.TimeCol("low_checked") + " FROM " + s.stateTable() + " WHERE id = 1"}
}

// RollSet implements store.Overviewer.
func (s *Syntax) RollSet(until time.Time, low int64, checked time.Time) store.Query {
	b := s.Build()
	return b.W("UPDATE ", s.stateTable(), " SET rolled_until = ", b.Time(until), ", low_seq = ", b.Arg(low),
		", low_checked = ", b.Time(checked), " WHERE id = 1").Query()
}

// FirstSent implements store.Overviewer: the oldest sent_at, through the
// index that finds sent rows.
func (s *Syntax) FirstSent() store.Query {
	col := cmpOr(s.SentRange, "sent_at")
	return store.Query{SQL: "SELECT " + s.TimeCol("MIN("+col+")") + " FROM " + s.Table + " WHERE status = 'sent'"}
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

// SentBins implements store.Overviewer: the rows sent in [from, to),
// counted by type, minute sent, minute created and delay bin.
func (s *Syntax) SentBins(from, to time.Time) store.Query {
	b := s.Build()
	col := cmpOr(s.SentRange, "sent_at")
	// The delay is computed once a row, in the subquery: the bin's CASE
	// reads it once a bound.
	return b.W("SELECT event_type, ms, mc, ", delayBin("d"), ", COUNT(*) FROM (SELECT event_type, ", s.MinuteOf("sent_at"), " AS ms, ",
		s.MinuteOf(s.CreatedCol()), " AS mc, ", s.MillisBetween(s.CreatedCol(), "sent_at"), " AS d FROM ", s.Table,
		" WHERE status = 'sent' AND ", col, " >= ", b.Time(from), " AND ", col, " < ", b.Time(to), ") s GROUP BY 1, 2, 3, 4").Query()
}

// rollupCols are the rollup's counting columns.
func rollupCols() []string {
	cols := []string{"published", "delivered"}
	for i := 0; i <= len(store.DelayBounds); i++ {
		cols = append(cols, "d"+strconv.Itoa(i))
	}
	return cols
}

// RollAdd implements store.Overviewer.
func (s *Syntax) RollAdd(rows []store.RollRow) store.Query {
	b := s.Build()
	cols := rollupCols()
	b.W("INSERT INTO ", s.rollupTable(), " (span, minute, event_type, ", strings.Join(cols, ", "), ") VALUES ")
	for i, r := range rows {
		if i > 0 {
			b.W(", ")
		}
		b.W("(", b.Arg(r.Span), ", ", b.Arg(r.Minute), ", ", b.Arg(r.Type), ", ", b.Arg(r.Published), ", ", b.Arg(r.Delivered))
		for _, n := range r.Delay {
			b.W(", ", b.Arg(n))
		}
		b.W(")")
	}
	return b.W(s.AddOnConflict(s.rollupTable(), []string{"span", "minute", "event_type"}, cols)).Query()
}

// RollTrim implements store.Overviewer.
func (s *Syntax) RollTrim(span, beforeMinute int64) store.Query {
	b := s.Build()
	return b.W("DELETE FROM ", s.rollupTable(), " WHERE span = ", b.Arg(span), " AND minute < ", b.Arg(beforeMinute)).Query()
}

// LowScan implements store.Overviewer: the lowest seq at or above from of
// a new pending row (available_at NULL), and the highest seq, each NULL
// when there is none. From 0 it is one scan of the table.
func (s *Syntax) LowScan(from int64) store.Query {
	b := s.Build()
	return b.W("SELECT (SELECT MIN(seq) FROM ", s.Table, " WHERE seq >= ", b.Arg(from),
		" AND status = 'pending' AND available_at IS NULL), (SELECT MAX(seq) FROM ", s.Table, ")").Query()
}

// PendingGroups implements store.Overviewer: the pending rows by type and
// minute created, with the oldest creation time of each group. Where new
// rows are found by seq (Fresh), a pending row is either new (available_at
// NULL), at or above low, or waits in the retry index, and the two are
// read apart; elsewhere the pending index holds them all.
func (s *Syntax) PendingGroups(low int64) store.Query {
	b := s.Build()
	cols := "event_type, " + s.MinuteOf(s.CreatedCol()) + " AS m, " + s.CreatedCol() + " AS c"
	if !s.Fresh {
		return b.W("SELECT event_type, ", s.MinuteOf(s.CreatedCol()), ", COUNT(*), ", s.TimeCol("MIN("+s.CreatedCol()+")"),
			" FROM ", s.Table, " WHERE status = 'pending' GROUP BY 1, 2").Query()
	}
	// The two ranges are told apart by available_at, not by low: a bound
	// on seq in the second would let SQLite read it as a range of the
	// primary key (everything below low) instead of the retry index.
	b.W("SELECT event_type, m, COUNT(*), ", s.TimeCol("MIN(c)"), " FROM (SELECT ", cols, " FROM ", s.Table,
		" WHERE seq >= ", b.Arg(low), " AND status = 'pending' AND available_at IS NULL")
	return b.W(" UNION ALL SELECT ", cols, " FROM ", s.Table, " WHERE status = 'pending' AND available_at IS NOT NULL",
		") p GROUP BY 1, 2").Query()
}

// FailedGroups implements store.Overviewer: the failed rows by type,
// minute failed (updated_at, as FailedSince reads it) and minute created.
func (s *Syntax) FailedGroups() store.Query {
	failedAt := "COALESCE(updated_at, " + s.CreatedCol() + ")"
	return store.Query{SQL: "SELECT event_type, " + s.MinuteOf(failedAt) + ", " + s.MinuteOf(s.CreatedCol()) + ", COUNT(*) FROM " + s.Table +
		" WHERE status = 'failed' GROUP BY 1, 2, 3"}
}

// RollupRead implements store.Overviewer: the rollup's rows of span from
// sinceMinute on, summed per interval of step minutes (its index from
// sinceMinute) and type.
func (s *Syntax) RollupRead(span, sinceMinute, step int64) store.Query {
	b := s.Build()
	cols := rollupCols()
	sums := make([]string, len(cols))
	for i, c := range cols {
		sums[i] = "SUM(" + c + ")"
	}
	return b.W("SELECT (minute - ", b.Arg(sinceMinute), ") ", s.IntDiv, " ", b.Arg(step), ", event_type, ", strings.Join(sums, ", "),
		" FROM ", s.rollupTable(), " WHERE span = ", b.Arg(span), " AND minute >= ", b.Arg(sinceMinute), " GROUP BY 1, 2").Query()
}

func (s *Syntax) attemptsTable() string { return s.Derived("_attempts") }

// RecordAttempts implements store.Historian: the rows at seqs a failure
// mark at now just updated (updated_at = now: a row whose lease another
// relay holds was not updated, and is not recorded).
func (s *Syntax) RecordAttempts(seqs []int64, now time.Time) store.Query {
	b := s.Build()
	return b.W("INSERT INTO ", s.attemptsTable(), " (seq, at, attempt, outcome, error) SELECT seq, updated_at, attempts,",
		" CASE WHEN status = 'failed' THEN 'failed' ELSE 'retry' END, last_error FROM ", s.Table,
		" WHERE ", b.Seqs("seq", seqs), " AND updated_at = ", b.Time(now)).Query()
}

// RecordReplays implements store.Historian: the rows at seqs a replay at
// now just set pending, with the error they had and who replayed them.
func (s *Syntax) RecordReplays(seqs []int64, now time.Time, actor string) store.Query {
	b := s.Build()
	return b.W("INSERT INTO ", s.attemptsTable(), " (seq, at, attempt, outcome, error, actor) SELECT seq, updated_at, 0, 'replayed', last_error, NULLIF(",
		b.Arg(actor), ", '') FROM ", s.Table, " WHERE ", b.Seqs("seq", seqs), " AND updated_at = ", b.Time(now), " AND status = 'pending'").Query()
}

// Attempts implements store.Historian.
func (s *Syntax) Attempts(id string) store.Query {
	b := s.Build()
	b.W("SELECT ", s.TimeCol("at"), ", attempt, outcome, error, actor FROM ", s.attemptsTable(), " WHERE seq IN (SELECT seq FROM ", s.Table, " WHERE ")
	return b.W(s.MatchIDs(b, []string{id}), ") ORDER BY at").Query()
}

// ForgetAttempts implements store.Historian: up to limit entries older
// than before, through the at index.
func (s *Syntax) ForgetAttempts(before time.Time, limit int) store.Query {
	b := s.Build()
	if s.LimitedDelete {
		return b.W("DELETE FROM ", s.attemptsTable(), " WHERE at < ", b.Time(before), " ORDER BY at LIMIT ", b.Limit(limit)).Query()
	}
	return b.W("DELETE FROM ", s.attemptsTable(), " WHERE (seq, at) IN (SELECT seq, at FROM ", s.attemptsTable(),
		" WHERE at < ", b.Time(before), " ORDER BY at LIMIT ", b.Limit(limit), ")").Query()
}

// PurgeAttempts implements store.Historian: the entries of the rows at
// seqs that are gone (a purge deleted them; one replayed meanwhile stays,
// and so does its history).
func (s *Syntax) PurgeAttempts(seqs []int64) store.Query {
	b := s.Build()
	a := s.attemptsTable()
	return b.W("DELETE FROM ", a, " WHERE ", b.Seqs("seq", seqs), " AND NOT EXISTS (SELECT 1 FROM ", s.Table, " o WHERE o.seq = ", a, ".seq)").Query()
}
