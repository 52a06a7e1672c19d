package outbox

import (
	"database/sql"
	"fmt"
	"log/slog"

	"github.com/gorm-outbox/outbox/internal/txhook"
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
	t, inTx := txhook.Tracked(tx.Statement.ConnPool)
	switch {
	case t != nil:
		if !t.Add(nil, fn) {
			_ = tx.AddError(txhook.ErrFinished)
		}
	case inTx && fromDB(tx) == nil:
		txhook.Abort(tx, ErrNotInstalled)
	case inTx:
		txhook.Abort(tx, ErrUntrackedTransaction)
	default:
		fn()
	}
}

// SQLTx returns the *sql.Tx a GORM transaction runs on, for code that hands
// it to another library. The plugin wraps the connection pool to see
// commits, so tx.Statement.ConnPool is no longer a *sql.Tx itself (nor is
// db.ConnPool a *sql.DB: use db.DB() for that). ok is false outside a
// transaction, or when the transaction is not a database/sql one, as in
// the function [Consume] runs on PostgreSQL (see there).
func SQLTx(tx *gorm.DB) (stx *sql.Tx, ok bool) {
	if tx == nil || tx.Statement == nil {
		return nil, false
	}
	return txhook.SQLTx(tx.Statement.ConnPool)
}

// txOwner is the Outbox as the hooked transactions call back into it. It is
// a type of its own so that *Outbox gains no exported methods, and one
// defined on Outbox itself so that (*txOwner)(o) is free: Publish hands it
// over on every call.
type txOwner Outbox

func (w *txOwner) HookPanicked(r any) {
	w.logger.Error("outbox: after-commit hook panicked", slog.String("panic", fmt.Sprint(r)))
}

func (w *txOwner) CommitFailed(err error, hooks, events int) {
	w.logger.Warn("outbox: COMMIT failed; its after-commit work is dropped. If it did take effect, persistent events are in the table and relays deliver them; memory-mode events and AfterCommit hooks are lost",
		slog.Any("error", err), slog.Int("hooks", hooks), slog.Int("persistent_events", events))
}
