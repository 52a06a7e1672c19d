package sqlbuild

import (
	"context"
	"database/sql"
	"errors"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gorm-outbox/outbox/internal/store"
)

// TestInsertRowsShape checks the text InsertRows keeps per shape: one
// placeholder per column and row, numbered in order across rows, the
// conflict clause only when a row may conflict, and the same text and
// arguments whether the text was built or found.
func TestInsertRowsShape(t *testing.T) {
	s := &Syntax{Table: `"t"`, Placeholder: Dollar, TimeArg: SameTime, Fresh: true,
		IDArg: func(u uuid.UUID) any { return u.String() }}
	now := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	row := func(generated bool) store.Event {
		id := uuid.NewString()
		return store.Event{ID: id, Key: id, Type: "x", Payload: []byte(`{}`), OccurredAt: now, Generated: generated}
	}
	for _, n := range []int{1, 2, maxCachedInsertRows, maxCachedInsertRows + 1} {
		for _, generated := range []bool{true, false} {
			rows := make([]store.Event, n)
			for i := range rows {
				rows[i] = row(generated)
			}
			first := s.InsertRows(rows, now, " ON CONFLICT DO NOTHING", " RETURNING seq")
			again := s.InsertRows(rows, now, " ON CONFLICT DO NOTHING", " RETURNING seq")
			if !reflect.DeepEqual(first, again) {
				t.Fatalf("%d rows: the statement changed between calls:\n%v\n%v", n, first, again)
			}
			if got, want := len(first.Args), n*insertColumnCount; got != want {
				t.Fatalf("%d rows: %d arguments, want %d", n, got, want)
			}
			if got, want := strings.Count(first.SQL, "$"), n*insertColumnCount; got != want {
				t.Fatalf("%d rows: %d placeholders, want %d: %s", n, got, want, first.SQL)
			}
			last := Dollar(n*insertColumnCount) + ")"
			if !strings.Contains(first.SQL, last) {
				t.Fatalf("%d rows: no %s in %s", n, last, first.SQL)
			}
			if got := strings.Contains(first.SQL, "ON CONFLICT"); got == generated {
				t.Fatalf("%d rows, generated %v: conflict clause present %v: %s", n, generated, got, first.SQL)
			}
			if !strings.HasSuffix(first.SQL, " RETURNING seq") {
				t.Fatalf("%d rows: no RETURNING: %s", n, first.SQL)
			}
			if first.Args[(n-1)*insertColumnCount] != rows[n-1].ID {
				t.Fatalf("%d rows: the last row's ID is not its first argument", n)
			}
		}
	}
}

// fakeDB is a store.DB that records the statements executed and answers
// each with the result next returns (Exec only: these tests query nothing).
type fakeDB struct {
	stmts []Query
	next  func(q Query) (sql.Result, error)
}

func (f *fakeDB) ExecContext(_ context.Context, query string, args ...any) (sql.Result, error) {
	q := Query{SQL: query, Args: args}
	f.stmts = append(f.stmts, q)
	return f.next(q)
}

func (f *fakeDB) QueryContext(context.Context, string, ...any) (*sql.Rows, error) {
	return nil, errors.New("fakeDB: no queries")
}

func (f *fakeDB) QueryRowContext(context.Context, string, ...any) *sql.Row {
	panic("fakeDB: no queries")
}

// result is an sql.Result.
type result struct{ first, n int64 }

func (r result) LastInsertId() (int64, error) { return r.first, nil }
func (r result) RowsAffected() (int64, error) { return r.n, nil }

// TestCheckRefusesOverLimit: a statement of more parameters than
// Lim.MaxParams is refused before it reaches the database, with
// store.ErrTooManyParams; one at the limit runs; no limit, no check.
func TestCheckRefusesOverLimit(t *testing.T) {
	ctx := t.Context()
	db := &fakeDB{next: func(Query) (sql.Result, error) { return result{n: 1}, nil }}
	s := &Syntax{Lim: store.Limits{MaxParams: 3}}
	over := Query{SQL: "UPDATE t SET a = ?, b = ?, c = ?, d = ?", Args: []any{1, 2, 3, 4}}
	if _, err := s.Exec(ctx, db, over); !errors.Is(err, store.ErrTooManyParams) {
		t.Fatalf("Exec over the limit: %v, want store.ErrTooManyParams", err)
	}
	if err := s.Each(ctx, db, over, nil); !errors.Is(err, store.ErrTooManyParams) {
		t.Fatalf("Each over the limit: %v, want store.ErrTooManyParams", err)
	}
	if err := s.Row(ctx, db, over); !errors.Is(err, store.ErrTooManyParams) {
		t.Fatalf("Row over the limit: %v, want store.ErrTooManyParams", err)
	}
	if len(db.stmts) != 0 {
		t.Fatalf("a statement over the limit reached the database: %v", db.stmts)
	}
	at := Query{SQL: "UPDATE t SET a = ?, b = ?, c = ?", Args: []any{1, 2, 3}}
	if n, err := s.Exec(ctx, db, at); err != nil || n != 1 {
		t.Fatalf("Exec at the limit: %d, %v", n, err)
	}
	s.Lim.MaxParams = 0
	if _, err := s.Exec(ctx, db, over); err != nil {
		t.Fatalf("Exec without a limit: %v", err)
	}
	if len(db.stmts) != 2 {
		t.Fatalf("%d statements ran, want 2", len(db.stmts))
	}
}

// TestPerStatement: the rows of per parameters each that fit beside fixed
// others, at most cap, at least 1.
func TestPerStatement(t *testing.T) {
	for _, c := range []struct{ max, cap, per, fixed, want int }{
		{65535, 1000, 11, 0, 1000},
		{32766, 5000, 11, 0, 2978},
		{32766, 1000, 4, 2, 1000},
		{2000, 1000, 4, 2, 499},
		{100, 1000, 1, 8, 92},
		{10, 1000, 23, 0, 1},   // not even one: one, which the check then refuses
		{10, 1000, 1, 20, 1},   // the fixed ones alone are over
		{0, 1000, 11, 0, 1000}, // no limit: the cap
	} {
		s := &Syntax{Lim: store.Limits{MaxParams: c.max}}
		if got := s.PerStatement(c.cap, c.per, c.fixed); got != c.want {
			t.Errorf("PerStatement(%d, %d, %d) with MaxParams %d = %d, want %d", c.cap, c.per, c.fixed, c.max, got, c.want)
		}
	}
}

// TestExecChunks: n items in statements of at most chunk, each built for
// its own range, the rows they affected summed; an error stops them, with
// the rows of the statements before it.
func TestExecChunks(t *testing.T) {
	ctx := t.Context()
	db := &fakeDB{next: func(q Query) (sql.Result, error) { return result{n: int64(len(q.Args))}, nil }}
	s := &Syntax{}
	var ranges [][2]int
	build := func(i, j int) Query {
		ranges = append(ranges, [2]int{i, j})
		return Query{SQL: "x", Args: make([]any, j-i)}
	}
	n, err := s.ExecChunks(ctx, db, 10, 3, build)
	if err != nil || n != 10 {
		t.Fatalf("ExecChunks of 10 by 3: %d, %v", n, err)
	}
	if want := [][2]int{{0, 3}, {3, 6}, {6, 9}, {9, 10}}; !reflect.DeepEqual(ranges, want) {
		t.Fatalf("ranges %v, want %v", ranges, want)
	}
	ranges, db.stmts = nil, nil
	if n, err := s.ExecChunks(ctx, db, 0, 3, build); err != nil || n != 0 || len(db.stmts) != 0 {
		t.Fatalf("ExecChunks of nothing: %d, %v, %d statements", n, err, len(db.stmts))
	}
	boom := errors.New("boom")
	db.next = func(Query) (sql.Result, error) {
		if len(db.stmts) == 3 {
			return nil, boom
		}
		return result{n: 3}, nil
	}
	n, err = s.ExecChunks(ctx, db, 10, 3, build)
	if !errors.Is(err, boom) || n != 6 {
		t.Fatalf("ExecChunks failing at its third statement: %d, %v; want 6 and the error", n, err)
	}
	if len(db.stmts) != 3 {
		t.Fatalf("%d statements after the error, want 3", len(db.stmts))
	}
}

// TestInsertSeqsAllOrNone: Inserted.Seqs tells the seqs of every row an
// Insert wrote, or is nil: a store that cannot tell the seqs of one of
// its statements (here, without RETURNING, a statement with a named row,
// whose conflict clause makes the first seq say nothing) cannot tell them
// for the call, whatever its other statements could.
func TestInsertSeqsAllOrNone(t *testing.T) {
	ctx := t.Context()
	s := &Syntax{Table: "`t`", Placeholder: Question, TimeArg: SameTime, IDArg: func(u uuid.UUID) any { return u[:] },
		InsertConflict: " ON DUPLICATE KEY UPDATE seq = seq", Lim: store.Limits{MaxParams: 65535, InsertRows: 2}}
	now := time.Date(2026, 12, 3, 0, 0, 0, 0, time.UTC)
	gen := func() store.Event {
		id := uuid.NewString()
		return store.Event{ID: id, Key: id, Type: "x", Payload: []byte(`{}`), OccurredAt: now, Generated: true}
	}
	named := store.Event{ID: "named", Key: "named", Type: "x", Payload: []byte(`{}`), OccurredAt: now, NamedID: true}
	next := int64(100)
	db := &fakeDB{next: func(q Query) (sql.Result, error) {
		n := int64(len(q.Args) / insertColumnCount)
		r := result{first: next, n: n}
		next += n
		return r, nil
	}}
	for _, rows := range [][]store.Event{
		{named, gen(), gen()}, // the first statement cannot tell, the second can
		{gen(), gen(), named}, // the other way round
	} {
		db.stmts = nil
		got, err := s.Insert(ctx, db, rows, now, true)
		if err != nil {
			t.Fatal(err)
		}
		if len(db.stmts) != 2 {
			t.Fatalf("%d statements, want 2 (InsertRows 2)", len(db.stmts))
		}
		if got.Written != 3 {
			t.Fatalf("Written %d, want 3", got.Written)
		}
		if got.Seqs != nil && len(got.Seqs) != got.Written {
			t.Errorf("Insert wrote %d rows in 2 statements and returned the seqs of %d: %v (want all %d, or nil when one statement cannot tell)",
				got.Written, len(got.Seqs), got.Seqs, got.Written)
		}
	}
}

// TestDBTime: every form a driver returns a time in reads as the same
// instant, in UTC.
func TestDBTime(t *testing.T) {
	want := time.Date(2031, 3, 14, 15, 9, 26, 535897000, time.UTC)
	for _, v := range []any{
		want.In(time.FixedZone("x", 5*3600)),
		"2031-03-14 15:09:26.535897+00:00",
		"2031-03-14T20:09:26.535897+05:00",
		"2031-03-14 15:09:26.535897",
		[]byte("2031-03-14T15:09:26.535897"),
		"2031-03-14T15:09:26.535897Z",
	} {
		var d DBTime
		if err := d.Scan(v); err != nil {
			t.Errorf("Scan(%v): %v", v, err)
			continue
		}
		if !d.T.Equal(want) || d.T.Location() != time.UTC {
			t.Errorf("Scan(%v) = %v, want %v in UTC", v, d.T, want)
		}
	}
	var d DBTime
	if err := d.Scan(nil); err != nil || !d.T.IsZero() {
		t.Errorf("Scan(nil) = %v, %v; want the zero time", d.T, err)
	}
	for _, v := range []any{"yesterday", 42} {
		if err := d.Scan(v); err == nil {
			t.Errorf("Scan(%v) accepted", v)
		}
	}
}
