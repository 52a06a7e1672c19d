package storetest

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// inboxTable is the suite's inbox table: a keyword with capitals, which
// every statement must quote.
const inboxTable = "Group"

// quote quotes a table name as the outbox table is quoted.
func (e *env) quote(name string) string {
	return strings.Replace(e.qt, e.table, name, 1)
}

// inbox is the store as a store.Inbox, its table named table created.
func (e *env) inbox(table string) store.Inbox {
	e.t.Helper()
	require.True(e.t, is[store.Inbox](e.real), "%T implements no store.Inbox", e.real)
	require.NoError(e.t, e.s.MigrateInbox(e.ctx, e.db, table), "MigrateInbox(%q)", table)
	return e.s
}

// consumed counts the pairs the inbox table holds for consumer and
// messageID, read with SQL of the suite's own on db.
func (e *env) consumed(table, consumer, messageID string) int64 {
	e.t.Helper()
	return e.count("SELECT COUNT(*) FROM "+e.quote(table)+" WHERE consumer = "+e.ph(1)+" AND message_id = "+e.ph(2), consumer, messageID)
}

// record runs Record on db.
func (e *env) record(db store.DB, table, consumer, messageID string, at time.Time) bool {
	e.t.Helper()
	ok, err := e.s.Record(e.ctx, db, table, consumer, messageID, at)
	require.NoError(e.t, err, "Record(%q, %q, %q)", table, consumer, messageID)
	return ok
}

func testInbox(t *testing.T, su *suite) {
	t.Run("Schema", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		in := store.Inbox(e.s)
		ddl, err := store.SplitDDL(in.InboxSchema(inboxTable))
		require.NoError(t, err, "SplitDDL of InboxSchema")
		require.NotEmpty(t, ddl)
		assert.Equal(t, inboxTable, ddl[0].Name, "InboxSchema creates the table named first")
		for _, d := range ddl {
			assert.True(t, strings.HasPrefix(d.Name, inboxTable), "every object is named after the table: %s", d.Name)
			assert.NotContains(t, d.SQL, store.DefaultInbox, "the default name is replaced")
		}
		def, err := store.SplitDDL(in.InboxSchema(store.DefaultInbox))
		require.NoError(t, err)
		assert.Equal(t, store.DefaultInbox, def[0].Name, "InboxSchema of the default name")
		assert.Len(t, def, len(ddl), "the same objects whatever the name")

		// MigrateInbox creates them, and again finds them there.
		for _, d := range ddl {
			ok, err := e.s.Exists(e.ctx, e.db, d.Name)
			require.NoError(t, err)
			assert.False(t, ok, "Exists(%q) before MigrateInbox", d.Name)
		}
		require.NoError(t, in.MigrateInbox(e.ctx, e.db, inboxTable))
		for _, d := range ddl {
			ok, err := e.s.Exists(e.ctx, e.db, d.Name)
			require.NoError(t, err)
			assert.True(t, ok, "Exists(%q) after MigrateInbox", d.Name)
		}
		assert.True(t, e.record(e.db, inboxTable, "c", "m", now))
		require.NoError(t, in.MigrateInbox(e.ctx, e.db, inboxTable), "MigrateInbox again")
		assert.EqualValues(t, 1, e.consumed(inboxTable, "c", "m"), "MigrateInbox again keeps the pairs")
		assert.False(t, e.record(e.db, inboxTable, "c", "m", now), "the pair recorded before MigrateInbox ran again")
	})

	t.Run("Record", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		e.inbox(inboxTable)
		assert.True(t, e.record(e.db, inboxTable, "c1", "m1", now), "a first delivery")
		assert.False(t, e.record(e.db, inboxTable, "c1", "m1", now.Add(time.Minute)), "the same pair again")
		assert.True(t, e.record(e.db, inboxTable, "c2", "m1", now), "another consumer of the message")
		assert.True(t, e.record(e.db, inboxTable, "c1", "m2", now), "another message to the consumer")
		assert.True(t, e.record(e.db, inboxTable, "c1", "M1", now), "IDs compare byte for byte")
		assert.True(t, e.record(e.db, inboxTable, "c1", `ünï'"\`, now), "any text")
		assert.False(t, e.record(e.db, inboxTable, "c1", `ünï'"\`, now))
		assert.EqualValues(t, 1, e.consumed(inboxTable, "c1", "m1"))

		// In the transaction of the effect: gone with its rollback, kept
		// with its commit.
		tx, err := e.db.BeginTx(e.ctx, nil)
		require.NoError(t, err)
		assert.True(t, e.record(tx, inboxTable, "c3", "m3", now))
		assert.False(t, e.record(tx, inboxTable, "c3", "m3", now), "again in the same transaction")
		require.NoError(t, tx.Rollback())
		assert.EqualValues(t, 0, e.consumed(inboxTable, "c3", "m3"), "rolled back")
		tx, err = e.db.BeginTx(e.ctx, nil)
		require.NoError(t, err)
		assert.True(t, e.record(tx, inboxTable, "c3", "m3", now), "recorded again once the first was rolled back")
		require.NoError(t, tx.Commit())
		assert.False(t, e.record(e.db, inboxTable, "c3", "m3", now), "committed")
	})

	// Two deliveries of one message, each in its transaction: the second
	// goes on only when the first rolled back, whichever of them reaches
	// the table first.
	t.Run("TwoDeliveries", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		e.inbox(inboxTable)
		for _, commit := range []bool{true, false} {
			msg := "m-rollback"
			if commit {
				msg = "m-commit"
			}
			first, err := e.db.BeginTx(e.ctx, nil)
			require.NoError(t, err)
			require.True(t, e.record(first, inboxTable, "c", msg, now), "the first delivery")
			type result struct {
				recorded bool
				err      error
			}
			second := make(chan result, 1)
			go func() {
				ok, err := func() (bool, error) {
					tx, err := e.db.BeginTx(e.ctx, nil)
					if err != nil {
						return false, err
					}
					ok, err := e.s.Record(e.ctx, tx, inboxTable, "c", msg, now.Add(time.Second))
					if err != nil {
						return false, errors.Join(err, tx.Rollback())
					}
					return ok, tx.Commit()
				}()
				second <- result{ok, err}
			}()
			if commit {
				require.NoError(t, first.Commit())
			} else {
				require.NoError(t, first.Rollback())
			}
			var got result
			select {
			case got = <-second:
			case <-time.After(wait):
				require.FailNow(t, "the second delivery never ended")
			}
			require.NoError(t, got.err, "the second delivery")
			assert.Equal(t, !commit, got.recorded, "the second delivery goes on exactly when the first rolled back (commit %v)", commit)
			assert.EqualValues(t, 1, e.consumed(inboxTable, "c", msg), "one pair, whichever recorded it")
		}
	})

	t.Run("ForgetConsumed", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		in := e.inbox(inboxTable)
		const other = "Group_other"
		e.inbox(other)
		cut := now.Add(-time.Hour)
		old := []string{"old-1", "old-2", "old-3"}
		for i, m := range old {
			require.True(t, e.record(e.db, inboxTable, "c", m, cut.Add(-time.Duration(3-i)*time.Hour)))
		}
		require.True(t, e.record(e.db, inboxTable, "c", "at-cut", cut))
		require.True(t, e.record(e.db, inboxTable, "c", "recent", now))
		require.True(t, e.record(e.db, other, "c", "old-other", cut.Add(-5*time.Hour)))

		var deleted []int64
		for range 3 {
			n, err := in.ForgetConsumed(e.ctx, e.db, inboxTable, cut, 2)
			require.NoError(t, err)
			deleted = append(deleted, n)
		}
		assert.Equal(t, []int64{2, 1, 0}, deleted, "at most limit pairs a call, only those before the cutoff")
		for _, m := range old {
			assert.EqualValues(t, 0, e.consumed(inboxTable, "c", m), "%s forgotten", m)
		}
		assert.EqualValues(t, 1, e.consumed(inboxTable, "c", "at-cut"), "a pair consumed at the cutoff stays")
		assert.EqualValues(t, 1, e.consumed(inboxTable, "c", "recent"))
		assert.EqualValues(t, 1, e.consumed(other, "c", "old-other"), "another inbox table is not touched")
		assert.True(t, e.record(e.db, inboxTable, "c", "old-1", now), "a forgotten pair records again")
	})

	t.Run("RetryRecord", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		in := store.Inbox(e.s)
		for _, err := range []error{nil, errors.New("boom"), context.Canceled, sql.ErrNoRows, sql.ErrTxDone} {
			assert.False(t, in.RetryRecord(err), "RetryRecord(%v)", err)
		}
		// The error of a Record that failed for good: a table that is not
		// there.
		_, err := in.Record(e.ctx, e.db, "no_such_inbox", "c", "m", now)
		require.Error(t, err, "Record into a missing table")
		assert.False(t, in.RetryRecord(err), "RetryRecord of a missing table's error: running again cannot win")
	})
}

func testInboxLead(t *testing.T, su *suite) {
	t.Run("Lead", func(t *testing.T) {
		t.Parallel()
		exerciseLead(t, setup(t, su), false)
	})
}

// ExerciseLead checks store.InboxLead where it leads: CanLead on open's
// database is true, and a Lead begins, records and ends. Exercise checks
// the store's leads on whatever database it is given, and where CanLead
// is false there (MySQL without multiStatements) only that a Lead's Begin
// fails cleanly; a store's test calls ExerciseLead with a database that
// can lead.
func ExerciseLead(t *testing.T, open Open) {
	t.Helper()
	exerciseLead(t, setup(t, &suite{open: open, calls: &calls{}}), true)
}

func exerciseLead(t *testing.T, e *env, must bool) {
	t.Helper()
	require.True(t, is[store.InboxLead](e.real), "%T implements no store.InboxLead", e.real)
	e.inbox(inboxTable)
	il := store.InboxLead(e.s)
	can, err := il.CanLead(e.ctx, e.db)
	require.NoError(t, err, "CanLead")
	if must {
		require.True(t, can, "CanLead on a database that can lead")
	}
	conn, err := e.db.Conn(e.ctx)
	require.NoError(t, err)
	defer func() { _ = conn.Close() }()
	// outside asserts conn is in no transaction: a Record on it commits
	// by itself, and the pool sees it.
	outside := func(msg, what string) {
		t.Helper()
		assert.True(t, e.record(conn, inboxTable, "c", msg, now), "%s: Record on the connection", what)
		assert.EqualValues(t, 1, e.consumed(inboxTable, "c", msg), "%s: the connection is in no transaction", what)
	}

	if !can {
		// The driver cannot send a Lead in one round trip: the Lead's
		// Begin fails, having recorded nothing and left the connection
		// as it was. The rest of the Lead's checks need a database that
		// leads (ExerciseLead).
		t.Logf("CanLead is false on this database: only a Lead's Begin failing cleanly is checked")
		l := il.RecordLead(inboxTable, "c", "m1", now)
		_, err := l.Begin(e.ctx, conn)
		assert.Error(t, err, "Begin of a Lead where CanLead is false")
		reuse, err := l.End(e.ctx, conn, false)
		assert.NoError(t, err, "End (rollback) after the Begin failed")
		assert.True(t, reuse, "the connection goes back to the pool")
		assert.EqualValues(t, 0, e.consumed(inboxTable, "c", "m1"), "nothing recorded")
		outside("after-failed-begin", "after a Begin that failed")
		return
	}

	// Begin records the pair in a transaction the pool does not see
	// until End commits it.
	l := il.RecordLead(inboxTable, "c", "m1", now)
	n, err := l.Begin(e.ctx, conn)
	require.NoError(t, err, "Begin")
	assert.EqualValues(t, 1, n, "Begin records the pair")
	assert.EqualValues(t, 0, e.consumed(inboxTable, "c", "m1"), "the pair is not visible before End")
	reuse, err := l.End(e.ctx, conn, true)
	require.NoError(t, err, "End (commit)")
	assert.True(t, reuse, "the connection is reusable after a commit")
	assert.EqualValues(t, 1, e.consumed(inboxTable, "c", "m1"), "End (commit) makes the pair visible")

	// The same pair again: nothing affected.
	l = il.RecordLead(inboxTable, "c", "m1", now.Add(time.Minute))
	n, err = l.Begin(e.ctx, conn)
	require.NoError(t, err, "Begin of a recorded pair")
	assert.EqualValues(t, 0, n, "Begin of a pair already recorded affects nothing")
	reuse, err = l.End(e.ctx, conn, true)
	require.NoError(t, err)
	assert.True(t, reuse)

	// Rolled back: nothing left.
	l = il.RecordLead(inboxTable, "c", "m2", now)
	n, err = l.Begin(e.ctx, conn)
	require.NoError(t, err)
	assert.EqualValues(t, 1, n)
	reuse, err = l.End(e.ctx, conn, false)
	require.NoError(t, err, "End (rollback)")
	assert.True(t, reuse, "the connection is reusable after a rollback")
	assert.EqualValues(t, 0, e.consumed(inboxTable, "c", "m2"), "End (rollback) leaves nothing")
	outside("after-leads", "after Leads that committed and rolled back")

	// A Begin whose INSERT fails (its table is missing): an error, and
	// End (rollback) gives the connection back outside any transaction.
	l = il.RecordLead("no_such_inbox", "c", "m3", now)
	_, err = l.Begin(e.ctx, conn)
	require.Error(t, err, "Begin of a Lead into a missing table")
	reuse, err = l.End(e.ctx, conn, false)
	require.NoError(t, err, "End (rollback) after the INSERT failed")
	if assert.True(t, reuse, "the connection is reusable after the failed Lead's rollback") {
		outside("after-failed-insert", "after a Lead whose INSERT failed")
	}

	// Leads on connections of the pool, as a consumer takes them.
	for i, msg := range []string{"p1", "p2", "p1"} {
		c, err := e.db.Conn(e.ctx)
		require.NoError(t, err)
		l := il.RecordLead(inboxTable, "pool", msg, now)
		n, err := l.Begin(e.ctx, c)
		require.NoError(t, err)
		assert.EqualValues(t, map[bool]int64{true: 1, false: 0}[i < 2], n, "Lead %d of %s", i, msg)
		reuse, err := l.End(e.ctx, c, true)
		require.NoError(t, err)
		assert.True(t, reuse)
		require.NoError(t, c.Close())
	}
	assert.EqualValues(t, 1, e.consumed(inboxTable, "pool", "p1"), "each pair recorded once")
	assert.EqualValues(t, 1, e.consumed(inboxTable, "pool", "p2"), "each pair recorded once")
}
