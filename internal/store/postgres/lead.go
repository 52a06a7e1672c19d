package postgres

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"

	"github.com/gorm-outbox/outbox/internal/store/sqlbuild"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// pgLead begins a transaction with the inbox INSERT in one pipeline
// (SendBatch: the statement prepared once per connection, as every
// statement pgx runs).
type pgLead struct{ q sqlbuild.Query }

// pgxConn is pgx's database/sql connection (stdlib.Conn).
type pgxConn interface{ Conn() *pgx.Conn }

var errNotPgx = errors.New("outbox: the connection is not pgx's")

// Begin implements store.Lead.
func (l pgLead) Begin(ctx context.Context, conn *sql.Conn) (affected int64, err error) {
	err = conn.Raw(func(dc any) error {
		pc, ok := dc.(pgxConn)
		if !ok {
			return errNotPgx
		}
		b := &pgx.Batch{}
		b.Queue("BEGIN")
		b.Queue(l.q.SQL, l.q.Args...)
		br := pc.Conn().SendBatch(ctx, b)
		_, err := br.Exec()
		if err == nil {
			var tag pgconn.CommandTag
			tag, err = br.Exec()
			affected = tag.RowsAffected()
		}
		if cerr := br.Close(); err == nil {
			err = cerr
		}
		return err
	})
	return affected, err
}

// End implements store.Lead. A COMMIT of a transaction a failed statement
// aborted answers ROLLBACK, which is reported as pgx's own Commit reports
// it (pgx.ErrTxCommitRollback).
func (l pgLead) End(ctx context.Context, conn *sql.Conn, commit bool) (reuse bool, err error) {
	verb := "ROLLBACK"
	if commit {
		verb = "COMMIT"
	}
	rawErr := conn.Raw(func(dc any) error {
		pc, ok := dc.(pgxConn)
		if !ok {
			err = errNotPgx
			return driver.ErrBadConn
		}
		t, e := pc.Conn().Exec(ctx, verb)
		err = e
		if e == nil && commit && t.String() == "ROLLBACK" {
			err = pgx.ErrTxCommitRollback
		}
		reuse = e == nil && pc.Conn().PgConn().TxStatus() == 'I'
		return nil
	})
	if err == nil && rawErr != nil && !errors.Is(rawErr, driver.ErrBadConn) {
		err = rawErr
	}
	return reuse, err
}
