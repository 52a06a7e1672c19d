package sqlbuild

import (
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
