// Package txhook wraps a *gorm.DB's connection pool so that every
// transaction begun on it carries its own after-commit work, runs that work
// once on the outermost real commit (never a savepoint release), and drops
// what a rollback, or a rollback to a savepoint, undoes.
//
// It is internal because it is a mechanism behind the root package's
// AfterCommit, Publish and Recorder, not an API: its types show up only as
// a *gorm.DB's ConnPool, where GORM's own type checks (gorm.TxCommitter,
// gorm.ConnPoolBeginner, gorm.GetDBConnector, the prepared-statement
// wrappers) must keep seeing what they saw before the pool was wrapped. It
// knows nothing of the Outbox: what it needs from it (reporting a panic or
// a failed COMMIT, announcing committed events) it reaches through Owner
// and Announcer, so the root can depend on it and not the reverse.
package txhook

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"

	"gorm.io/gorm"
)

// Owner is told what the transactions of a wrapped pool cannot handle
// themselves, for the outbox to log.
type Owner interface {
	// HookPanicked reports that a piece of after-commit work panicked
	// with r. The panic is recovered first: the data is committed, so it
	// must not surface from Commit as if the commit had failed.
	HookPanicked(r any)
	// CommitFailed reports a COMMIT that failed while after-commit work
	// was attached, which is dropped: hooks pieces of it, the transaction
	// having written events persistent events.
	CommitFailed(err error, hooks, events int)
}

// Announcer is told, once, the seqs of the persistent events a transaction
// wrote, after it commits (of those the store could name: possibly none).
type Announcer interface {
	Published(seqs []int64)
}

// ErrFinished is the error of attaching work to a transaction that has
// already committed or rolled back.
var ErrFinished = fmt.Errorf("outbox: the transaction has already committed or rolled back: %w", sql.ErrTxDone)

// connPool wraps the database's connection pool so that every transaction
// GORM begins on it carries its own after-commit state. The pool object is
// the one thing shared by every clone of a *gorm.DB inside one transaction
// (Session, WithContext, nested Transaction), so the state lives there.
type connPool struct {
	gorm.ConnPool
	owner Owner
}

// Install wraps db's connection pool, inside GORM's prepared-statement
// wrapper when PrepareStmt is on so that GORM's own type checks still work.
// It is idempotent, as plugins such as dbresolver re-run Initialize: a pool
// already wrapped keeps its first owner.
func Install(db *gorm.DB, owner Owner) {
	wrap := func(p gorm.ConnPool) gorm.ConnPool {
		if _, ok := p.(*connPool); ok {
			return p
		}
		return &connPool{ConnPool: p, owner: owner}
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
	if l := claimLead(ctx); l != nil && (opts == nil || *opts == sql.TxOptions{}) {
		if db, ok := p.ConnPool.(*sql.DB); ok {
			tx, err := beginLead(ctx, db, l)
			if err != nil {
				return nil, err
			}
			return &Tx{Tx: tx, pool: p, ctx: ctx, state: state{idHook: -1}}, nil
		}
	}
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
	return &Tx{Tx: tx, pool: p, ctx: ctx, state: state{idHook: -1}}, nil
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

// run runs one piece of after-commit work.
func (p *connPool) run(fn func()) {
	defer func() {
		if r := recover(); r != nil {
			p.owner.HookPanicked(r)
		}
	}()
	fn()
}

// Tx is one transaction begun through a wrapped pool. It deliberately has
// no BeginTx method: GORM recognises "already in a transaction" by its
// absence. Its after-commit work is added with the methods of its state.
type Tx struct {
	gorm.Tx
	pool *connPool
	ctx  context.Context
	state
}

// GetDBConn implements gorm.GetDBConnector, so tx.DB() works inside a
// transaction.
func (t *Tx) GetDBConn() (*sql.DB, error) { return t.pool.GetDBConn() }

// ExecContext watches the savepoint statements GORM issues for nested
// transactions, so that work attached after a savepoint that is rolled back
// to is dropped with it.
func (t *Tx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	res, err := t.Tx.ExecContext(ctx, query, args...)
	if err == nil && len(args) == 0 {
		t.savepointSQL(query)
	}
	return res, err
}

// Commit commits and then, only if the commit succeeded and only once, runs
// the after-commit work. Its error is the commit's alone: the data is
// committed whatever the hooks do.
func (t *Tx) Commit() error {
	err := t.Tx.Commit()
	work, events, undone, finally := t.finish()
	defer runAll(finally)
	if err != nil {
		runAll(undone)
		if len(work) > 0 && !errors.Is(err, sql.ErrTxDone) {
			// A failed COMMIT may still have taken effect (the connection
			// broke after the server committed): say what is dropped.
			t.pool.owner.CommitFailed(err, len(work), events)
		}
		return err
	}
	for _, h := range work {
		t.pool.run(h.fn)
	}
	return nil
}

// Rollback drops the after-commit work, rolls back, and tells the work
// that asked to know.
func (t *Tx) Rollback() error {
	_, _, undone, finally := t.finish()
	err := t.Tx.Rollback()
	runAll(undone)
	runAll(finally)
	return err
}

func runAll(fns []func()) {
	for _, f := range fns {
		f()
	}
}

// Context is the context after-commit work runs with: the transaction's
// values without its cancellation, which has no meaning once the data is
// committed.
func (t *Tx) Context() context.Context {
	if t.ctx == nil {
		return context.Background()
	}
	return context.WithoutCancel(t.ctx)
}

// Tracked finds the transaction behind a statement's connection pool. t is
// nil when pool is not a transaction begun through a wrapped pool; inTx
// reports whether pool is a transaction at all.
func Tracked(pool gorm.ConnPool) (t *Tx, inTx bool) {
	switch p := pool.(type) {
	case *Tx:
		return p, true
	case *gorm.PreparedStmtTX:
		if tp, ok := p.Tx.(*Tx); ok {
			return tp, true
		}
		return nil, true
	case gorm.TxCommitter:
		return nil, true
	}
	return nil, false
}

// SQLTx returns the *sql.Tx under pool, looking through the wrapper and
// GORM's prepared-statement one.
func SQLTx(pool gorm.ConnPool) (*sql.Tx, bool) {
	var p any = pool
	for {
		switch q := p.(type) {
		case *sql.Tx:
			return q, true
		case *Tx:
			p = q.Tx
		case *gorm.PreparedStmtTX:
			p = q.Tx
		default:
			return nil, false
		}
	}
}

// Abort rolls back the transaction tx runs in, which after-commit work
// was attached to that could never run, and makes its commit fail with
// cause. Adding the error to tx alone would not do: GORM's Transaction
// commits whatever tx.Error holds (and then returns the error), and a
// nested Transaction's error never reaches the outer one.
func Abort(tx *gorm.DB, cause error) {
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

// abortedTx is a transaction Abort rolled back: its statements fail as
// on any finished transaction, and its commit with the reason.
type abortedTx struct {
	gorm.ConnPool
	err error
}

func (a *abortedTx) Commit() error   { return a.err }
func (a *abortedTx) Rollback() error { return nil }
