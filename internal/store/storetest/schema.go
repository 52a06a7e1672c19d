package storetest

import (
	"embed"
	"strings"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// versionOneFiles are the tables the first release created (schema
// version 1), by store name, for the stores whose Upgrade is not "": no seq
// column, ordered by (created_at, id), the idempotency key unique over every
// row. The root's and the command's upgrade tests read the same files.
//
//go:embed schema-v1/*.sql
var versionOneFiles embed.FS

// versionOneOrdering is version 1's ordering index, which relays with
// OrderByAggregate built under the name OrderingIndex still returns; the
// files leave it out, as the first release's DDL did.
const versionOneOrdering = `
CREATE INDEX IF NOT EXISTS "outbox_events_aggregate_idx"
    ON "outbox_events" (aggregate_type, aggregate_id, created_at, id) WHERE status <> 'sent';
`

// versionOne is store name's version 1 table with its ordering index.
func versionOne(name string) (string, bool) {
	ddl, err := versionOneFiles.ReadFile("schema-v1/" + name + ".sql")
	if err != nil {
		return "", false
	}
	return string(ddl) + versionOneOrdering, true
}

func testSchema(t *testing.T, open Open, name string) {
	t.Run("CreateOnEmpty", func(t *testing.T) {
		t.Parallel()
		e := fresh(t, open)
		v, err := e.s.Version(e.ctx, e.db)
		require.NoError(t, err)
		assert.Equal(t, 0, v, "Version of an empty database")

		// SplitDDL names every statement of Schema(), the table first.
		ddl := store.SplitDDL(e.s.Schema())
		require.Len(t, ddl, len(statements(e.s.Schema())), "SplitDDL must name every statement of Schema():\n%s", e.s.Schema())
		require.Equal(t, e.table, ddl[0].Name, "the table comes first")
		seen := map[string]bool{}
		for _, d := range ddl {
			assert.False(t, seen[d.Name], "%s is created twice", d.Name)
			seen[d.Name] = true
			assert.True(t, strings.HasPrefix(strings.ToUpper(d.SQL), "CREATE "), "%s", d.SQL)
			ok, err := e.s.Exists(e.ctx, e.db, d.Name)
			require.NoError(t, err)
			assert.False(t, ok, "Exists(%q) on an empty database", d.Name)
		}

		require.NoError(t, store.Create(e.ctx, e.db, e.s))
		v, err = e.s.Version(e.ctx, e.db)
		require.NoError(t, err)
		assert.Equal(t, store.SchemaVersion, v)
		for _, d := range ddl {
			ok, err := e.s.Exists(e.ctx, e.db, d.Name)
			require.NoError(t, err)
			assert.True(t, ok, "Exists(%q) after Create", d.Name)
		}
		ok, err := e.s.Exists(e.ctx, e.db, e.table+"_no_such_index")
		require.NoError(t, err)
		assert.False(t, ok, "Exists of an object never created")

		// Version takes a transaction too (Upgrade reads it under its lock).
		tx, err := e.db.BeginTx(e.ctx, nil)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback() }()
		v, err = e.s.Version(e.ctx, tx)
		require.NoError(t, err)
		assert.Equal(t, store.SchemaVersion, v, "Version in a transaction")
	})

	t.Run("CreateAgain", func(t *testing.T) {
		t.Parallel()
		e := setup(t, open)
		require.EqualValues(t, 1, e.insert(now, ev("kept")))
		require.NoError(t, store.Create(e.ctx, e.db, e.s), "Create on a created table")
		v, err := e.s.Version(e.ctx, e.db)
		require.NoError(t, err)
		assert.Equal(t, store.SchemaVersion, v)
		assert.EqualValues(t, 1, e.rows(), "Create again keeps the rows")
		e.get("kept")
	})

	t.Run("Upgrade", func(t *testing.T) {
		t.Parallel()
		e := fresh(t, open)
		if e.s.Upgrade() == "" {
			// This database never had version 1: store.Upgrade refuses
			// rather than guess, and changes nothing.
			require.Error(t, store.Upgrade(e.ctx, e.db, e.s))
			v, err := e.s.Version(e.ctx, e.db)
			require.NoError(t, err)
			assert.Equal(t, 0, v)
			t.Logf("%s has no version 1: checked that store.Upgrade refuses", e.s.Name())
			return
		}
		v1, ok := versionOne(e.s.Name())
		require.True(t, ok, "store %s has an Upgrade script but the suite has no version 1 table for it: add the first release's DDL to schema-v1/%s.sql", e.s.Name(), e.s.Name())
		for _, st := range statements(store.Rename(v1, e.table)) {
			e.raw(st)
		}
		v, err := e.s.Version(e.ctx, e.db)
		require.NoError(t, err)
		require.Equal(t, 1, v, "Version of a version 1 table")
		name, _ := e.s.OrderingIndex()
		ok, err = e.s.Exists(e.ctx, e.db, name)
		require.NoError(t, err)
		require.True(t, ok, "version 1's ordering index is named %s", name)

		// Rows as version 1 wrote them: IDs that sort against the order
		// they were written in.
		base := now.Add(-time.Hour)
		for i, e1 := range []store.Event{
			ev("sent-1"), ev("failed-1"),
			agg("b-3", "acct", "B"), agg("b-2", "acct", "B"), agg("b-1", "acct", "B"),
			agg("a-2", "acct", "A"), agg("a-1", "acct", "A"),
		} {
			e1.Key = "key-" + e1.ID
			require.EqualValues(t, 1, e.insert(base.Add(time.Duration(i)*time.Second), e1))
		}
		e.raw("UPDATE " + e.qt + " SET status = 'sent', attempts = 1, sent_at = created_at WHERE id = 'sent-1'")
		e.raw("UPDATE " + e.qt + " SET status = 'failed', attempts = 10, last_error = 'boom' WHERE id = 'failed-1'")
		e.raw("UPDATE " + e.qt + " SET attempts = 2 WHERE id = 'a-2'")

		require.NoError(t, store.Upgrade(e.ctx, e.db, e.s))
		v, err = e.s.Version(e.ctx, e.db)
		require.NoError(t, err)
		assert.Equal(t, store.SchemaVersion, v, "Version after Upgrade")
		for _, d := range store.SplitDDL(e.s.Schema()) {
			ok, err := e.s.Exists(e.ctx, e.db, d.Name)
			require.NoError(t, err)
			assert.True(t, ok, "Exists(%q) after Upgrade", d.Name)
		}
		ok, err = e.s.Exists(e.ctx, e.db, name)
		require.NoError(t, err)
		assert.False(t, ok, "Upgrade drops version 1's ordering index, so that Ensure builds version 2's")

		// Another instance finds the work done, then creates what is missing.
		require.NoError(t, store.Upgrade(e.ctx, e.db, e.s), "Upgrade of an upgraded table")
		require.NoError(t, store.Create(e.ctx, e.db, e.s))
		assert.EqualValues(t, 7, e.rows())

		// seq numbers the rows in the order version 1 delivered them.
		assert.Equal(t, []string{"sent-1", "failed-1", "b-3", "b-2", "b-1", "a-2", "a-1"}, e.list(store.Page{Limit: 100}))
		s := e.get("sent-1")
		assert.Equal(t, "sent", s.Status)
		sameTimePtr(t, base, s.SentAt, "sent_at of sent-1")
		f := e.get("failed-1")
		assert.Equal(t, "failed", f.Status)
		assert.Equal(t, 10, f.Attempts)
		if assert.NotNil(t, f.LastError) {
			assert.Equal(t, "boom", *f.LastError)
		}
		assert.Equal(t, 2, e.get("a-2").Attempts)
		sameTime(t, base.Add(6*time.Second), e.get("a-1").CreatedAt, "created_at of a-1")

		// The old keys still hold; new rows are numbered after the old.
		dup := ev("dup")
		dup.Key = "key-a-1"
		assert.EqualValues(t, 0, e.insert(now, dup), "a new event with an old row's key")
		require.EqualValues(t, 1, e.insert(now, ev("new")))
		assert.Greater(t, e.get("new").Seq, e.get("a-1").Seq, "seq continues after the old rows")

		// Per-aggregate order follows the old rows' order.
		e.ensureOrdering()
		assert.Equal(t, []string{"b-3", "a-2", "new"},
			e.claimIDs(store.ClaimSpec{Now: now, Lease: now.Add(time.Minute), Limit: 10, Ordered: true}))
	})

	t.Run("OrderingIndex", func(t *testing.T) {
		t.Parallel()
		e := setup(t, open)
		name, ddl := e.s.OrderingIndex()
		require.NotEmpty(t, name)
		require.NotEmpty(t, ddl)
		ok, err := e.s.Exists(e.ctx, e.db, name)
		require.NoError(t, err)
		require.False(t, ok, "the ordering index before Ensure")
		require.NoError(t, store.Ensure(e.ctx, e.db, e.s, name, ddl...))
		ok, err = e.s.Exists(e.ctx, e.db, name)
		require.NoError(t, err)
		assert.True(t, ok, "Exists(%q) after Ensure", name)
		require.NoError(t, store.Ensure(e.ctx, e.db, e.s, name, ddl...), "Ensure again")
		ok, err = e.s.Exists(e.ctx, e.db, name)
		require.NoError(t, err)
		assert.True(t, ok, "Exists(%q) after Ensure again", name)
	})

	if name == "postgres" {
		// Exists: "a PostgreSQL index a failed concurrent build left
		// invalid does not" exist, so that Ensure builds it again.
		t.Run("InvalidIndexRebuilt", func(t *testing.T) {
			t.Parallel()
			e := setup(t, open)
			require.EqualValues(t, 2, e.insert(now, agg("x-1", "acct", "1"), agg("x-2", "acct", "2")))
			name, ddl := e.s.OrderingIndex()
			_, err := e.db.ExecContext(e.ctx, `CREATE UNIQUE INDEX CONCURRENTLY "`+name+`" ON `+e.qt+" (aggregate_type)")
			require.Error(t, err, "a concurrent build that fails")
			var left bool
			require.NoError(t, e.db.QueryRowContext(e.ctx, `SELECT to_regclass('"`+name+`"') IS NOT NULL`).Scan(&left))
			require.True(t, left, "the failed build left its index behind")
			ok, err := e.s.Exists(e.ctx, e.db, name)
			require.NoError(t, err)
			assert.False(t, ok, "Exists of an invalid index")
			require.NoError(t, store.Ensure(e.ctx, e.db, e.s, name, ddl...))
			ok, err = e.s.Exists(e.ctx, e.db, name)
			require.NoError(t, err)
			assert.True(t, ok, "Exists after Ensure rebuilt it")
		})
	}
}
