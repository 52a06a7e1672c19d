package txhook

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"reflect"
	"sync"
	"sync/atomic"

	"gorm.io/gorm"
)

// A Lead is a transaction's first statement sent together with its BEGIN,
// in one round trip. database/sql spends a round trip on BEGIN alone, so a
// statement that must open the transaction (the inbox's INSERT, which
// decides whether the rest runs) costs a second one; sent with the BEGIN
// it costs none of its own. The store builds and runs both (Starter): pgx
// pipelines them, MySQL's driver runs one text of two statements with
// multiStatements.
//
// A Lead rides in the context of the Transaction it is meant for, and only
// the first BeginTx that sees it uses it: a transaction begun later with the
// same context (a nested Transaction on another *gorm.DB) begins as usual.
type Lead struct {
	Starter Starter

	claimed  atomic.Bool
	ran      bool
	affected int64
	err      error
}

type leadKey struct{}

// WithLead returns ctx carrying l, for the BeginTx of a transaction begun
// with it.
func WithLead(ctx context.Context, l *Lead) context.Context {
	return context.WithValue(ctx, leadKey{}, l)
}

// Ran reports whether the transaction began with l, and how many rows l's
// statement affected. false: l was not used (the pool could not take it,
// or the transaction was a savepoint), and its statement is still to run.
func (l *Lead) Ran() (affected int64, ran bool) {
	if l == nil {
		return 0, false
	}
	return l.affected, l.ran
}

// Err is the error of the text that was to begin the transaction (the
// transaction then did not begin).
func (l *Lead) Err() error {
	if l == nil {
		return nil
	}
	return l.err
}

// Starter begins a transaction on a connection held out of the pool with
// its first statement, and ends it (store.Lead).
type Starter interface {
	// Begin begins the transaction and runs the first statement,
	// returning the rows it affected.
	Begin(ctx context.Context, conn *sql.Conn) (affected int64, err error)
	// End commits or rolls back; reuse reports whether conn may go back
	// to the pool.
	End(ctx context.Context, conn *sql.Conn, commit bool) (reuse bool, err error)
}

// claimLead returns the lead in ctx that no BeginTx has seen yet.
func claimLead(ctx context.Context) *Lead {
	l, _ := ctx.Value(leadKey{}).(*Lead)
	if l == nil || !l.claimed.CompareAndSwap(false, true) {
		return nil
	}
	return l
}

// CanLead reports whether a transaction begun on pool may start with a
// Lead, and returns the *sql.DB it would run on: pool is a wrapped pool
// straight over a *sql.DB, not GORM's prepared-statement wrapper (whose
// transactions must be *sql.Tx) nor another plugin's pool, and not a
// transaction already.
func CanLead(pool gorm.ConnPool) (*sql.DB, bool) {
	p, ok := pool.(*connPool)
	if !ok {
		return nil, false
	}
	db, ok := p.ConnPool.(*sql.DB)
	return db, ok
}

// beginLead begins a transaction on a connection of db with l.
func beginLead(ctx context.Context, db *sql.DB, l *Lead) (*connTx, error) {
	conn, err := db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	c := &connTx{conn: conn, ctx: ctx, lead: l.Starter}
	l.affected, err = l.Starter.Begin(ctx, conn)
	if err != nil {
		// The BEGIN may have run and the statement failed after it.
		_ = c.end(false)
		l.err = err
		return nil, err
	}
	l.ran = true
	return c, nil
}

// connTx is a transaction begun by a Lead: database/sql knows it only as a
// connection held out of the pool, so it ends it with COMMIT or ROLLBACK
// itself and gives the connection back. It is not a *sql.Tx (SQLTx finds
// none under it).
type connTx struct {
	conn  *sql.Conn
	ctx   context.Context
	lead  Starter
	mu    sync.Mutex
	done  bool
	stmts []*sql.Stmt // prepared by StmtContext, closed at the end
}

var _ gorm.Tx = (*connTx)(nil)

func (c *connTx) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return c.conn.ExecContext(ctx, query, args...)
}

func (c *connTx) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return c.conn.QueryContext(ctx, query, args...)
}

func (c *connTx) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	return c.conn.QueryRowContext(ctx, query, args...)
}

func (c *connTx) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	return c.conn.PrepareContext(ctx, query)
}

// StmtContext returns stmt prepared on the transaction's connection, as
// *sql.Tx's does; GORM's PrepareStmt sessions call it with the statements
// they cache. database/sql has no call that rebinds a statement to a
// *sql.Conn, so it prepares stmt's text anew. That failing means the
// connection is gone, and since the signature has no error to return and
// running stmt outside the transaction would be silently wrong, it panics
// (the transaction then rolls back).
func (c *connTx) StmtContext(ctx context.Context, stmt *sql.Stmt) *sql.Stmt {
	query := stmtQuery(stmt)
	ps, err := c.conn.PrepareContext(ctx, query)
	if err != nil {
		panic(fmt.Errorf("outbox: prepare %q on the connection of a transaction Consume began: %w", query, err))
	}
	c.mu.Lock()
	c.stmts = append(c.stmts, ps)
	c.mu.Unlock()
	return ps
}

// stmtQuery is the text stmt was prepared from: database/sql keeps it in
// an unexported field, which reflection can read.
func stmtQuery(stmt *sql.Stmt) string {
	if stmt == nil {
		return ""
	}
	return reflect.ValueOf(stmt).Elem().FieldByName("query").String()
}

// Commit commits, unless the transaction's context is done, in which case
// it rolls back and returns the context's error, as a *sql.Tx does.
func (c *connTx) Commit() error {
	if !c.finish() {
		return sql.ErrTxDone
	}
	if err := c.ctx.Err(); err != nil {
		_ = c.end(false)
		return err
	}
	return c.end(true)
}

// Rollback rolls back.
func (c *connTx) Rollback() error {
	if !c.finish() {
		return sql.ErrTxDone
	}
	return c.end(false)
}

func (c *connTx) finish() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.done {
		return false
	}
	c.done = true
	for _, s := range c.stmts {
		_ = s.Close()
	}
	c.stmts = nil
	return true
}

// end commits or rolls back and gives the connection back to its pool, or,
// when that failed or left the connection inside a transaction, closes it:
// a pooled connection must never carry a transaction to its next user. It
// runs past the transaction's context, as database/sql's own Commit and
// Rollback do.
func (c *connTx) end(commit bool) error {
	reuse, err := c.lead.End(context.Background(), c.conn, commit)
	if !reuse {
		_ = c.conn.Raw(func(any) error { return driver.ErrBadConn })
	}
	_ = c.conn.Close()
	return err
}
