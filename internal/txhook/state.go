package txhook

import (
	"strings"
	"sync"
)

// state is the after-commit work of one transaction and the savepoints
// that can still roll part of it back. Its exported methods are Tx's.
type state struct {
	mu    sync.Mutex
	work  []hook
	marks []savepoint
	done  bool
	// undone runs when the transaction rolls back (or its COMMIT fails).
	undone []func()
	// finally runs once the transaction has ended, however, after the
	// after-commit work.
	finally []func()

	// The seqs of the persistent events written in this transaction (of
	// those the store could name), how many events it wrote, and where in
	// work the one hook that announces them sits (-1: none).
	seqs   []int64
	events int
	idHook int
}

// hook is one piece of after-commit work; key, when set, lets Has find it.
type hook struct {
	fn  func()
	key any
}

type savepoint struct {
	name string
	n    int // len(work) when the savepoint was set
}

// Add appends fn to the after-commit work and reports whether it could:
// false once the transaction has finished.
func (s *state) Add(key any, fn func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return false
	}
	s.work = append(s.work, hook{fn: fn, key: key})
	return true
}

// Has reports whether the hook added with key is still to run: the
// transaction is live and no savepoint rolled back past it.
func (s *state) Has(key any) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return false
	}
	for _, h := range s.work {
		if h.key == key {
			return true
		}
	}
	return false
}

// AddPublished records n events written in the transaction, seqs those of
// them the store named, and makes sure one after-commit hook announces them
// all, to a.
func (s *state) AddPublished(a Announcer, seqs []int64, n int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return
	}
	s.seqs = append(s.seqs, seqs...)
	s.events += n
	if s.idHook >= 0 {
		return
	}
	s.idHook = len(s.work)
	s.work = append(s.work, hook{fn: func() {
		s.mu.Lock()
		seqs := s.seqs
		s.mu.Unlock()
		a.Published(seqs)
	}})
}

// OnUndone adds fn to what runs if the transaction does not commit.
func (s *state) OnUndone(fn func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.done {
		s.undone = append(s.undone, fn)
	}
}

// Finally adds fn to what runs once the transaction has ended, committed
// or not, after the after-commit work: where work that waits on the
// transaction's outcome is told, whether or not a savepoint dropped the
// after-commit hook that would have told it. It reports false once the
// transaction has finished.
func (s *state) Finally(fn func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return false
	}
	s.finally = append(s.finally, fn)
	return true
}

// finish ends the transaction's state and returns its work, how many
// persistent events it wrote, what runs if it did not commit, and what
// runs at the end either way.
func (s *state) finish() ([]hook, int, []func(), []func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w, n, u, f := s.work, s.events, s.undone, s.finally
	s.work, s.marks, s.undone, s.finally, s.done = nil, nil, nil, nil, true
	return w, n, u, f
}

func (s *state) savepointSQL(query string) {
	q := strings.TrimSpace(query)
	var verb, name string
	switch {
	case hasPrefixFold(q, "SAVEPOINT "):
		verb, name = "set", q[len("SAVEPOINT "):]
	case hasPrefixFold(q, "ROLLBACK TO SAVEPOINT "):
		verb, name = "rollback", q[len("ROLLBACK TO SAVEPOINT "):]
	case hasPrefixFold(q, "RELEASE SAVEPOINT "):
		verb, name = "release", q[len("RELEASE SAVEPOINT "):]
	default:
		return
	}
	name = strings.Trim(strings.TrimSpace(name), `"`)
	s.mu.Lock()
	defer s.mu.Unlock()
	if verb == "set" {
		s.marks = append(s.marks, savepoint{name: name, n: len(s.work)})
		return
	}
	// The newest savepoint of that name is the one affected; savepoints set
	// after it are destroyed either way.
	for i := len(s.marks) - 1; i >= 0; i-- {
		if s.marks[i].name != name {
			continue
		}
		if verb == "rollback" {
			clear(s.work[s.marks[i].n:])
			s.work = s.work[:s.marks[i].n]
			if s.idHook >= s.marks[i].n {
				s.idHook = -1 // seqs that stay are harmless hints
			}
			s.marks = s.marks[:i+1] // the savepoint itself survives ROLLBACK TO
		} else {
			s.marks = s.marks[:i]
		}
		return
	}
}

func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}
