package txhook

import (
	"slices"
	"testing"
)

// The savepoint statements GORM and users issue decide which work a
// nested rollback drops; spelling and quoting vary by dialect.
func TestSavepoints(t *testing.T) {
	var ran []string
	s := state{idHook: -1}
	add := func(name string) { s.Add(nil, func() { ran = append(ran, name) }) }
	add("before")
	s.savepointSQL(`SAVEPOINT "sp1"`)
	add("in sp1")
	s.savepointSQL("savepoint sp2")
	add("in sp2")
	s.savepointSQL("  ROLLBACK TO SAVEPOINT sp1 ")
	add("after rollback to sp1")
	s.savepointSQL("RELEASE SAVEPOINT sp1")
	s.savepointSQL("ROLLBACK TO SAVEPOINT sp2") // destroyed with sp1: no effect
	s.savepointSQL("SELECT 1")
	work, _, _, _ := s.finish()
	for _, h := range work {
		h.fn()
	}
	if want := []string{"before", "after rollback to sp1"}; !slices.Equal(ran, want) {
		t.Errorf("ran %q, want %q", ran, want)
	}
	if s.Add(nil, func() {}) || s.Has(nil) {
		t.Error("a finished transaction still takes work")
	}
}

type announcer struct{ got [][]int64 }

func (a *announcer) Published(ids []int64) { a.got = append(a.got, ids) }

// One hook announces every event of the transaction; one a savepoint
// rollback dropped is replaced by the next publish. The rolled-back seqs
// stay in the announcement: they only wake relays, which find nothing.
func TestAddPublished(t *testing.T) {
	a := &announcer{}
	s := state{idHook: -1}
	s.savepointSQL("SAVEPOINT sp")
	s.AddPublished(a, []int64{1}, 1)
	s.savepointSQL("ROLLBACK TO SAVEPOINT sp")
	s.AddPublished(a, []int64{2}, 1)
	s.AddPublished(a, nil, 1) // a store that could not name it
	work, events, _, _ := s.finish()
	for _, h := range work {
		h.fn()
	}
	if len(work) != 1 || len(a.got) != 1 || !slices.Equal(a.got[0], []int64{1, 2}) || events != 3 {
		t.Errorf("%d hooks, announced %v, %d events", len(work), a.got, events)
	}
}
