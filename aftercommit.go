package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"

	"gorm.io/gorm"
)

// AfterCommit registers fn to run once the transaction tx belongs to has
// committed: the outermost real commit, never a savepoint release. fn is
// dropped if that transaction rolls back, or if the savepoint it was
// registered in is rolled back to. Outside a transaction fn runs at once.
//
// fn runs synchronously in the goroutine that commits, after the commit has
// succeeded; a panic in it is recovered and logged, and never turns the
// commit into an error. fn must not use tx, which is finished by then: use
// the root *gorm.DB.
//
// On a transaction whose commit the plugin cannot see (one begun inside
// db.Connection, or on a *gorm.DB without the plugin), fn could never run:
// AfterCommit then rolls the transaction back and adds
// [ErrUntrackedTransaction] (or [ErrNotInstalled]) to tx, and the commit
// that follows fails with it. So an error from db.Transaction still means
// that nothing was committed, and a caller that retries on it does not
// write the business data twice.
func AfterCommit(tx *gorm.DB, fn func()) {
	if tx == nil || fn == nil {
		return
	}
	t, inTx := trackedTx(tx.Statement.ConnPool)
	switch {
	case t != nil:
		if !t.st.add(nil, fn) {
			_ = tx.AddError(errFinished)
		}
	case inTx && fromDB(tx) == nil:
		abortTx(tx, ErrNotInstalled)
	case inTx:
		abortTx(tx, ErrUntrackedTransaction)
	default:
		fn()
	}
}

// abortTx rolls back the transaction tx runs in, which after-commit work
// was attached to that could never run, and makes its commit fail with
// cause. Adding the error to tx alone would not do: GORM's Transaction
// commits whatever tx.Error holds (and then returns the error), and a
// nested Transaction's error never reaches the outer one.
func abortTx(tx *gorm.DB, cause error) {
	err := fmt.Errorf("%w; the transaction is rolled back: its after-commit work could never run", cause)
	_ = tx.AddError(err)
	pool := tx.Statement.ConnPool
	if _, done := pool.(*abortedTx); done {
		return
	}
	if c, ok := pool.(gorm.TxCommitter); ok {
		_ = c.Rollback()
	}
	tx.Statement.ConnPool = &abortedTx{ConnPool: pool, err: err}
}

// abortedTx is a transaction abortTx rolled back: its statements fail as
// on any finished transaction, and its commit with the reason.
type abortedTx struct {
	gorm.ConnPool
	err error
}

func (a *abortedTx) Commit() error   { return a.err }
func (a *abortedTx) Rollback() error { return nil }

// errFinished is the error of attaching work to a transaction that has
// already committed or rolled back.
var errFinished = fmt.Errorf("outbox: the transaction has already committed or rolled back: %w", sql.ErrTxDone)

// SQLTx returns the *sql.Tx a GORM transaction runs on, for code that hands
// it to another library. The plugin wraps the connection pool to see
// commits, so tx.Statement.ConnPool is no longer a *sql.Tx itself (nor is
// db.ConnPool a *sql.DB: use db.DB() for that). ok is false outside a
// transaction, or when the transaction is not a database/sql one.
func SQLTx(tx *gorm.DB) (stx *sql.Tx, ok bool) {
	if tx == nil || tx.Statement == nil {
		return nil, false
	}
	var pool any = tx.Statement.ConnPool
	for {
		switch p := pool.(type) {
		case *sql.Tx:
			return p, true
		case *txPool:
			pool = p.Tx
		case *gorm.PreparedStmtTX:
			pool = p.Tx
		default:
			return nil, false
		}
	}
}

// connPool wraps the database's connection pool so that every transaction
// GORM begins on it carries its own after-commit state. The pool object is
// the one thing shared by every clone of a *gorm.DB inside one transaction
// (Session, WithContext, nested Transaction), so the state lives there.
type connPool struct {
	gorm.ConnPool
	o *Outbox
}

// hookConnPool installs connPool under db, inside GORM's prepared-statement
// wrapper when PrepareStmt is on so that GORM's own type checks still work.
// It is idempotent, as plugins such as dbresolver re-run Initialize.
func hookConnPool(db *gorm.DB, o *Outbox) {
	wrap := func(p gorm.ConnPool) gorm.ConnPool {
		if _, ok := p.(*connPool); ok {
			return p
		}
		return &connPool{ConnPool: p, o: o}
	}
	old := db.Config.ConnPool
	if ps, ok := old.(*gorm.PreparedStmtDB); ok {
		ps.ConnPool = wrap(ps.ConnPool)
	} else {
		db.Config.ConnPool = wrap(old)
	}
	if db.Statement != nil && samePool(db.Statement.ConnPool, old) {
		db.Statement.ConnPool = db.Config.ConnPool
	}
}

// samePool compares two pools without panicking on a custom pool of a type
// that == cannot compare.
func samePool(a, b gorm.ConnPool) bool {
	if a == nil || b == nil {
		return a == nil && b == nil
	}
	ta := reflect.TypeOf(a)
	return ta == reflect.TypeOf(b) && ta.Comparable() && a == b
}

// BeginTx implements gorm.ConnPoolBeginner.
func (p *connPool) BeginTx(ctx context.Context, opts *sql.TxOptions) (gorm.ConnPool, error) {
	var inner gorm.ConnPool
	switch b := p.ConnPool.(type) {
	case gorm.TxBeginner:
		tx, err := b.BeginTx(ctx, opts)
		if err != nil {
			return nil, err
		}
		inner = tx
	case gorm.ConnPoolBeginner:
		tx, err := b.BeginTx(ctx, opts)
		if err != nil {
			return nil, err
		}
		inner = tx
	default:
		return nil, gorm.ErrInvalidTransaction
	}
	tx, ok := inner.(gorm.Tx)
	if !ok {
		return inner, nil // not a transaction we can wrap; hooks fail closed on it
	}
	return &txPool{Tx: tx, pool: p, ctx: ctx, st: txState{idHook: -1}}, nil
}

// GetDBConn implements gorm.GetDBConnector, so db.DB() keeps working.
func (p *connPool) GetDBConn() (*sql.DB, error) {
	switch c := p.ConnPool.(type) {
	case *sql.DB:
		return c, nil
	case gorm.GetDBConnector:
		return c.GetDBConn()
	}
	return nil, gorm.ErrInvalidDB
}

// Ping lets GORM and users ping through the wrapper.
func (p *connPool) Ping() error {
	db, err := p.GetDBConn()
	if err != nil {
		return err
	}
	return db.Ping()
}

// txPool is one transaction begun through connPool. It deliberately has no
// BeginTx method: GORM recognises "already in a transaction" by its absence.
type txPool struct {
	gorm.Tx
	pool *connPool
	ctx  context.Context
	st   txState
}

// GetDBConn implements gorm.GetDBConnector, so tx.DB() works inside a
// transaction.
func (t *txPool) GetDBConn() (*sql.DB, error) { return t.pool.GetDBConn() }

// ExecContext watches the savepoint statements GORM issues for nested
// transactions, so that work attached after a savepoint that is rolled back
// to is dropped with it.
func (t *txPool) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	res, err := t.Tx.ExecContext(ctx, query, args...)
	if err == nil && len(args) == 0 {
		t.st.savepointSQL(query)
	}
	return res, err
}

// Commit commits and then, only if the commit succeeded and only once, runs
// the after-commit work. Its error is the commit's alone: the data is
// committed whatever the hooks do.
func (t *txPool) Commit() error {
	err := t.Tx.Commit()
	work, ids, undone := t.st.finish()
	if err != nil {
		runAll(undone)
		if len(work) > 0 && !errors.Is(err, sql.ErrTxDone) {
			// A failed COMMIT may still have taken effect (the connection
			// broke after the server committed): say what is dropped.
			t.pool.o.logger.Warn("outbox: COMMIT failed; its after-commit work is dropped. If it did take effect, persistent events are in the table and relays deliver them; memory-mode events and AfterCommit hooks are lost",
				slog.Any("error", err), slog.Int("hooks", len(work)), slog.Int("persistent_events", len(ids)))
		}
		return err
	}
	for _, h := range work {
		t.pool.o.runHook(h.fn)
	}
	return nil
}

// Rollback drops the after-commit work, rolls back, and tells the work
// that asked to know.
func (t *txPool) Rollback() error {
	_, _, undone := t.st.finish()
	err := t.Tx.Rollback()
	runAll(undone)
	return err
}

func runAll(fns []func()) {
	for _, f := range fns {
		f()
	}
}

// dispatchContext is the context after-commit work runs with: the
// transaction's values without its cancellation, which has no meaning once
// the data is committed.
func (t *txPool) dispatchContext() context.Context {
	if t.ctx == nil {
		return context.Background()
	}
	return context.WithoutCancel(t.ctx)
}

func (o *Outbox) runHook(fn func()) {
	defer func() {
		if r := recover(); r != nil {
			o.logger.Error("outbox: after-commit hook panicked", slog.String("panic", fmt.Sprint(r)))
		}
	}()
	fn()
}

// txState is the after-commit work of one transaction and the savepoints
// that can still roll part of it back.
type txState struct {
	mu    sync.Mutex
	work  []hook
	marks []savepoint
	done  bool
	// undone runs when the transaction rolls back (or its COMMIT fails).
	undone []func()

	// The IDs of the persistent events written in this transaction, and
	// where in work the one hook that announces them sits (-1: none).
	ids    []string
	idHook int
}

// hook is one piece of after-commit work; key, when set, lets has find it.
type hook struct {
	fn  func()
	key any
}

type savepoint struct {
	name string
	n    int // len(work) when the savepoint was set
}

// add appends fn to the after-commit work and reports whether it could:
// false once the transaction has finished.
func (s *txState) add(key any, fn func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return false
	}
	s.work = append(s.work, hook{fn: fn, key: key})
	return true
}

// has reports whether the hook added with key is still to run: the
// transaction is live and no savepoint rolled back past it.
func (s *txState) has(key any) bool {
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

// addPublished records IDs written in the transaction and makes sure one
// after-commit hook announces them all.
func (s *txState) addPublished(o *Outbox, ids []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done {
		return
	}
	s.ids = append(s.ids, ids...)
	if s.idHook >= 0 {
		return
	}
	s.idHook = len(s.work)
	s.work = append(s.work, hook{fn: func() {
		s.mu.Lock()
		ids := s.ids
		s.mu.Unlock()
		o.published(ids)
	}})
}

// onUndone adds fn to what runs if the transaction does not commit.
func (s *txState) onUndone(fn func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.done {
		s.undone = append(s.undone, fn)
	}
}

// finish ends the transaction's state and returns its work, the IDs of
// the persistent events it wrote, and what runs if it did not commit.
func (s *txState) finish() ([]hook, []string, []func()) {
	s.mu.Lock()
	defer s.mu.Unlock()
	w, ids, u := s.work, s.ids, s.undone
	s.work, s.marks, s.undone, s.done = nil, nil, nil, true
	return w, ids, u
}

func (s *txState) savepointSQL(query string) {
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
				s.idHook = -1 // IDs that stay are harmless hints
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

// trackedTx finds the transaction behind a statement's connection pool. t is
// nil when pool is not a transaction the plugin tracks; inTx reports whether
// pool is a transaction at all.
func trackedTx(pool gorm.ConnPool) (t *txPool, inTx bool) {
	switch p := pool.(type) {
	case *txPool:
		return p, true
	case *gorm.PreparedStmtTX:
		if tp, ok := p.Tx.(*txPool); ok {
			return tp, true
		}
		return nil, true
	case gorm.TxCommitter:
		return nil, true
	}
	return nil, false
}
