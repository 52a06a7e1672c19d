package storetest

import (
	"embed"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// shippedFiles are the tables earlier releases created on the shipped
// stores, by store name: schema-v1/ the first release's (schema version
// 1: no seq column, ordered by (created_at, id), the idempotency key
// unique over every row), schema-v2/ version 2's (seq, but not yet the
// primary key; the ID in id (text), every column NOT NULL but headers,
// locked_until, last_error and sent_at; a pending index). The root's and
// the command's upgrade tests read the same files. The suite reads none
// of them by itself: a store's test passes its own in Past.
//
//go:embed schema-v1/*.sql schema-v2/*.sql
var shippedFiles embed.FS

// versionOneOrdering is version 1's ordering index, which relays with
// OrderByAggregate built under the name EnsureOrdering still builds
// (<table>_aggregate_idx); the files leave it out, as the first release's
// DDL did.
const versionOneOrdering = `
CREATE INDEX IF NOT EXISTS "outbox_events_aggregate_idx"
    ON "outbox_events" (aggregate_type, aggregate_id, created_at, id) WHERE status <> 'sent';
`

// Shipped is the DDL of the table schema version (1 or 2) created on the
// shipped store named name, for its test's Past (version 1's with its
// ordering index). It panics when that store never had that version.
func Shipped(version int, name string) string {
	ddl, err := shippedFiles.ReadFile(fmt.Sprintf("schema-v%d/%s.sql", version, name))
	if err != nil {
		panic(fmt.Sprintf("storetest: no release created a version %d table on %s: %v", version, name, err))
	}
	if version == 1 {
		return string(ddl) + versionOneOrdering
	}
	return string(ddl)
}

// oldInsert writes events as versions 1 and 2 wrote them, at the time at:
// every column but seq (version 2 assigns it), the key and the times
// spelt out. The builders write version 3 only, so this statement is the
// suite's own, its times spelt as the store wrote them (Dialect.Time).
func (e *env) oldInsert(at time.Time, evs ...store.Event) {
	e.t.Helper()
	for _, ev := range evs {
		var headers any
		if ev.Headers != nil {
			headers = string(ev.Headers)
		}
		args := []any{ev.ID, ev.Type, ev.AggregateType, ev.AggregateID, ev.Key, string(ev.Payload), headers,
			e.timeArg(at), e.timeArg(ev.OccurredAt), e.timeArg(at), e.timeArg(at)}
		marks := make([]string, len(args))
		for i := range marks {
			marks[i] = e.ph(i + 1)
		}
		e.raw("INSERT INTO "+e.qt+" (id, event_type, aggregate_type, aggregate_id, idempotency_key, payload, headers,"+
			" available_at, occurred_at, created_at, updated_at) VALUES ("+strings.Join(marks, ", ")+")", args...)
	}
}

// upgradeLockFree reports whether no session holds the lock the upgrade
// scripts take for the session (Past.UpgradeLockHeld); true where the
// lock is the script's transaction's.
func (e *env) upgradeLockFree() bool {
	e.t.Helper()
	if e.past.UpgradeLockHeld == nil {
		return true
	}
	held, err := e.past.UpgradeLockHeld(e.ctx, e.db, e.table)
	require.NoError(e.t, err, "Past.UpgradeLockHeld")
	return !held
}

// upgradedID is what the id column reads once the upgrade to version 3
// has run, for a row version 2 wrote with the ID id.
func (e *env) upgradedID(id string) string {
	if e.past.UpgradedID != nil {
		return e.past.UpgradedID(id)
	}
	return hexOf(store.RowID(id))
}

func testSchema(t *testing.T, su *suite) {
	t.Run("CreateOnEmpty", func(t *testing.T) {
		t.Parallel()
		e := fresh(t, su)
		v, err := e.s.Version(e.ctx, e.db)
		require.NoError(t, err)
		assert.Equal(t, 0, v, "Version of an empty database")

		// SplitDDL names every statement of Schema(), the table before its
		// indexes (only the types its columns use before it).
		ddl, err := store.SplitDDL(e.s.Schema())
		require.NoError(t, err, "SplitDDL of Schema()")
		require.Len(t, ddl, len(statements(e.s.Schema())), "SplitDDL must name every statement of Schema():\n%s", e.s.Schema())
		tableAt := slices.IndexFunc(ddl, func(d store.DDL) bool { return d.Name == e.table })
		require.GreaterOrEqual(t, tableAt, 0, "the schema creates the table %s", e.table)
		for _, d := range ddl[:tableAt] {
			assert.Regexp(t, `(?i)^CREATE\s+TYPE\b`, d.SQL, "only a type comes before the table")
		}
		seen := map[string]bool{}
		for _, d := range ddl {
			assert.False(t, seen[d.Name], "%s is created twice", d.Name)
			seen[d.Name] = true
			assert.True(t, strings.HasPrefix(strings.ToUpper(d.SQL), "CREATE "), "%s", d.SQL)
			ok, err := e.s.Exists(e.ctx, e.db, d.Name)
			require.NoError(t, err)
			assert.False(t, ok, "Exists(%q) on an empty database", d.Name)
		}

		require.NoError(t, e.s.Migrate(e.ctx, e.db))
		v, err = e.s.Version(e.ctx, e.db)
		require.NoError(t, err)
		assert.Equal(t, store.SchemaVersion, v)
		for _, d := range ddl {
			ok, err := e.s.Exists(e.ctx, e.db, d.Name)
			require.NoError(t, err)
			assert.True(t, ok, "Exists(%q) after Migrate", d.Name)
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
		e := setup(t, su)
		require.EqualValues(t, 1, e.insert(now, ev("kept")))
		require.NoError(t, e.s.Migrate(e.ctx, e.db), "Migrate of a created table")
		v, err := e.s.Version(e.ctx, e.db)
		require.NoError(t, err)
		assert.Equal(t, store.SchemaVersion, v)
		assert.EqualValues(t, 1, e.rows(), "Migrate again keeps the rows")
		e.get("kept")
	})

	t.Run("UpgradeFrom", func(t *testing.T) {
		t.Parallel()
		e := fresh(t, su)
		assert.Empty(t, e.s.Upgrade(0), "no upgrade from no table")
		assert.Empty(t, e.s.Upgrade(store.SchemaVersion), "no upgrade from the current version")
		require.Empty(t, e.s.Upgrade(store.SchemaVersion+1), "no upgrade from a version to come")
	})

	t.Run("UpgradeFromVersion1", func(t *testing.T) {
		t.Parallel()
		e := fresh(t, su)
		if e.s.Upgrade(1) == "" {
			// This database never had version 1: Migrate of a version 1
			// table (one without seq) refuses rather than guess, and
			// changes nothing.
			require.Empty(t, e.past.V1, "the test of %s gives a version 1 table in Past.V1, but the store has no Upgrade(1) script", e.s.Name())
			e.raw("CREATE TABLE " + e.qt + " (id VARCHAR(64) PRIMARY KEY)")
			v, err := e.s.Version(e.ctx, e.db)
			require.NoError(t, err)
			require.Equal(t, 1, v, "Version of a table without seq")
			require.Error(t, e.s.Migrate(e.ctx, e.db), "Migrate of a version 1 table where there is no upgrade from it")
			v, err = e.s.Version(e.ctx, e.db)
			require.NoError(t, err)
			assert.Equal(t, 1, v)
			t.Logf("%s has no version 1: checked that Migrate refuses", e.s.Name())
			return
		}
		v1 := e.past.V1
		require.NotEmpty(t, v1, "store %s has an Upgrade(1) script: its test must give the first release's table in Past.V1", e.s.Name())
		for _, st := range statements(store.Rename(v1, e.table)) {
			e.raw(st)
		}
		v, err := e.s.Version(e.ctx, e.db)
		require.NoError(t, err)
		require.Equal(t, 1, v, "Version of a version 1 table")
		name := e.orderingIndex()
		ok, err := e.s.Exists(e.ctx, e.db, name)
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
			e.oldInsert(base.Add(time.Duration(i)*time.Second), e1)
		}
		e.raw("UPDATE " + e.qt + " SET status = 'sent', attempts = 1, sent_at = created_at WHERE id = 'sent-1'")
		e.raw("UPDATE " + e.qt + " SET status = 'failed', attempts = 10, last_error = 'boom' WHERE id = 'failed-1'")
		e.raw("UPDATE " + e.qt + " SET attempts = 2 WHERE id = 'a-2'")

		require.NoError(t, e.s.Migrate(e.ctx, e.db))
		v, err = e.s.Version(e.ctx, e.db)
		require.NoError(t, err)
		assert.Equal(t, store.SchemaVersion, v, "Version after Migrate")
		e.existsAll("after Migrate of version 1")
		ok, err = e.s.Exists(e.ctx, e.db, name)
		require.NoError(t, err)
		assert.False(t, ok, "Migrate drops version 1's ordering index, so that EnsureOrdering builds the current one")

		// Another instance finds the work done.
		require.NoError(t, e.s.Migrate(e.ctx, e.db), "Migrate of an upgraded table")
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
		assert.Equal(t, "key-a-1", e.get("a-1").Key)
		for _, id := range []string{"sent-1", "a-1"} {
			named, ok := e.namedID(e.get(id).Seq)
			assert.True(t, ok && named == id, "version 1's ID %s is in named_id (%q)", id, named)
		}

		// The old keys and IDs still hold; new rows are numbered after the old.
		dup := ev("dup")
		dup.Key = "key-a-1"
		assert.EqualValues(t, 0, e.insert(now, dup), "a new event with an old row's key")
		assert.EqualValues(t, 0, e.insert(now, ev("a-1")), "a new event with an old row's ID")
		require.EqualValues(t, 1, e.insert(now, ev("new")))
		assert.Greater(t, e.get("new").Seq, e.get("a-1").Seq, "seq continues after the old rows")

		// Per-aggregate order follows the old rows' order.
		e.ensureOrdering()
		ok, err = e.s.Exists(e.ctx, e.db, name)
		require.NoError(t, err)
		assert.True(t, ok, "EnsureOrdering builds the current ordering index")
		assert.Equal(t, []string{"b-3", "a-2", "new"},
			e.claimIDs(store.ClaimSpec{Now: now, Lease: now.Add(time.Minute), Limit: 10, Ordered: true}))
	})

	t.Run("UpgradeFromVersion2", func(t *testing.T) {
		t.Parallel()
		e := fresh(t, su)
		v2 := e.past.V2
		if e.s.Upgrade(2) == "" {
			require.Empty(t, v2, "the test of %s gives a version 2 table in Past.V2, but the store has no Upgrade(2) script", e.s.Name())
			e.raw("CREATE TABLE " + e.qt + " (seq BIGINT PRIMARY KEY, id VARCHAR(64))")
			require.Error(t, e.s.Migrate(e.ctx, e.db), "Migrate of a version 2 table where there is no upgrade from it")
			t.Logf("%s has no version 2: checked that Migrate refuses", e.s.Name())
			return
		}
		require.NotEmpty(t, v2, "store %s has an Upgrade(2) script: its test must give version 2's table in Past.V2", e.s.Name())
		for _, st := range statements(store.Rename(v2, e.table)) {
			e.raw(st)
		}
		v, err := e.s.Version(e.ctx, e.db)
		require.NoError(t, err)
		require.Equal(t, 2, v, "Version of a version 2 table")
		// Version 2's ordering index, as relays with OrderByAggregate built
		// it (the same DDL as now).
		e.ensureOrdering()

		// Rows as version 2 wrote them, their IDs sorting against the
		// order they were written in: named IDs, and a UUID as version 2
		// wrote the generated ones; keys of their own and keys that are
		// the ID.
		const uid = "0190f0c4-8a6e-7b3c-9d2e-5f1a2b3c4d5e"
		base := now.Add(-time.Hour)
		old := []store.Event{
			ev("sent-1"), ev("failed-1"), agg(uid, "acct", "A"),
			agg("b-3", "acct", "B"), agg("b-2", "acct", "B"), agg("a-2", "acct", "A"), agg("a-1", "acct", "A"),
		}
		old[1].Key = "key-failed-1"
		old[5].Key = "key-a-2"
		old[6].Headers = []byte(`{"trace":"t-1"}`)
		for i, e2 := range old {
			e.oldInsert(base.Add(time.Duration(i)*time.Second), e2)
		}
		e.raw("UPDATE " + e.qt + " SET status = 'sent', attempts = 1, sent_at = created_at WHERE id = 'sent-1'")
		e.raw("UPDATE " + e.qt + " SET status = 'failed', attempts = 10, last_error = 'boom' WHERE id = 'failed-1'")
		e.raw("UPDATE " + e.qt + " SET attempts = 2 WHERE id = 'a-2'")

		require.NoError(t, e.s.Migrate(e.ctx, e.db))
		assert.True(t, e.upgradeLockFree(), "the upgrade's named lock is released")
		v, err = e.s.Version(e.ctx, e.db)
		require.NoError(t, err)
		assert.Equal(t, store.SchemaVersion, v, "Version after Migrate")
		e.existsAll("after Migrate of version 2")
		// Another instance finds the work done.
		require.NoError(t, e.s.Migrate(e.ctx, e.db), "Migrate of an upgraded table")
		assert.True(t, e.upgradeLockFree(), "the upgrade's named lock is released when another instance did the work")
		assert.EqualValues(t, 7, e.rows())

		// seq is kept; every row reads back as version 2 wrote it.
		ids := make([]string, len(old))
		for i := range old {
			ids[i] = old[i].ID
		}
		assert.Equal(t, ids, e.list(store.Page{Limit: 100}), "seq kept")
		for i, o := range old {
			r := e.get(o.ID)
			assert.Equal(t, o.ID, r.ID)
			assert.Equal(t, o.Key, r.Key, "key of %s", o.ID)
			assert.Equal(t, o.Type, r.EventType, o.ID)
			assert.Equal(t, o.AggregateID, r.AggregateID, o.ID)
			assert.JSONEq(t, string(o.Payload), r.Payload, o.ID)
			sameTime(t, base.Add(time.Duration(i)*time.Second), r.CreatedAt, "created_at of %s", o.ID)
			sameTime(t, base.Add(time.Duration(i)*time.Second), r.UpdatedAt, "updated_at of %s", o.ID)
			sameTime(t, o.OccurredAt, r.OccurredAt, "occurred_at of %s", o.ID)
			named, ok := e.namedID(r.Seq)
			assert.True(t, ok && named == o.ID, "version 2's ID %s is in named_id (%q)", o.ID, named)
			assert.Equal(t, o.Key == o.ID, e.nulls(r.Seq)["idempotency_key"], "the key of %s is NULL exactly when it is the ID", o.ID)
			assert.Equal(t, e.upgradedID(o.ID), e.idColumn(r.Seq), "the id column of %s after the upgrade (store.RowID of the ID, or Past.UpgradedID)", o.ID)
		}
		if h := e.get("a-1").Headers; assert.NotNil(t, h) {
			assert.JSONEq(t, `{"trace":"t-1"}`, *h)
		}
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
		assert.EqualValues(t, 1, e.countOf(store.Filter{Statuses: []string{"failed"}}), "the status reads as before")
		st := e.stats()
		assert.EqualValues(t, 5, st["pending"].N)
		assert.EqualValues(t, 1, st["sent"].N)
		assert.Equal(t, map[string]key{"sent-1": {"sent-1", base}, "failed-1": {"key-failed-1", base.Add(time.Second)}}, e.keysOf("sent-1", "failed-1"))

		// The old IDs and keys still hold; new rows are numbered after the old.
		dup := ev("dup")
		dup.Key = "key-failed-1"
		assert.EqualValues(t, 0, e.insert(now, dup), "a new event with an old row's key")
		assert.EqualValues(t, 0, e.insert(now, ev("a-1")), "a new event with an old row's ID")
		assert.EqualValues(t, 0, e.insert(now, ev(uid)), "a new event with an old row's UUID")
		g := generated()
		require.EqualValues(t, 1, e.insert(now, g))
		assert.Greater(t, e.get(g.ID).Seq, e.get("a-1").Seq, "seq continues after the old rows")

		if e.walker() != nil {
			// The old pending rows have their due time: they wait in the
			// retry index, where the watermark does not hide them.
			low, high := e.lowOpen()
			assert.Equal(t, e.get(g.ID).Seq, low, "the old rows are not new rows")
			assert.Equal(t, []string{uid, "b-3", "b-2", "a-2", "a-1"},
				e.claimIDs(store.ClaimSpec{Now: now, Lease: now.Add(time.Minute), Limit: 10, From: high + 1}), "the old pending rows, whatever From")
			for _, r := range e.walk(high+1, 1, e.seqs(uid, "b-3", "a-1"), now) {
				assert.False(t, r.Open, "an old pending row is not open: seq %d", r.Seq)
			}
			require.EqualValues(t, 5, e.release(e.seqs(uid, "b-3", "b-2", "a-2", "a-1"), now, now.Add(time.Minute)))
		}

		// Per-aggregate order follows the old rows' order.
		e.ensureOrdering()
		assert.Equal(t, []string{uid, "b-3", g.ID},
			e.claimIDs(store.ClaimSpec{Now: now, Lease: now.Add(time.Hour), Limit: 10, Ordered: true}))
	})

	// Several instances starting at once: one upgrades, the others find
	// the work done.
	t.Run("UpgradeConcurrently", func(t *testing.T) {
		t.Parallel()
		e := fresh(t, su)
		v2 := e.past.V2
		if e.s.Upgrade(2) == "" {
			t.Skipf("%s has no version 2", e.s.Name())
		}
		require.NotEmpty(t, v2, "store %s has an Upgrade(2) script: its test must give version 2's table in Past.V2", e.s.Name())
		for _, st := range statements(store.Rename(v2, e.table)) {
			e.raw(st)
		}
		for i := range 20 {
			e.oldInsert(now, ev(fmt.Sprintf("r-%02d", i)))
		}
		const instances = 3
		errs := make([]error, instances)
		var wg sync.WaitGroup
		for i := range instances {
			wg.Go(func() { errs[i] = e.s.Migrate(e.ctx, e.db) })
		}
		wg.Wait()
		for i, err := range errs {
			assert.NoError(t, err, "instance %d", i)
		}
		assert.True(t, e.upgradeLockFree(), "the upgrade's named lock is released")
		v, err := e.s.Version(e.ctx, e.db)
		require.NoError(t, err)
		assert.Equal(t, store.SchemaVersion, v)
		e.existsAll("after instances migrated at once")
		assert.EqualValues(t, 20, e.rows())
		assert.Equal(t, "r-07", e.get("r-07").ID)
	})

	t.Run("EnsureOrdering", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		name := e.orderingIndex()
		ok, err := e.s.Exists(e.ctx, e.db, name)
		require.NoError(t, err)
		require.False(t, ok, "the ordering index before EnsureOrdering")
		require.NoError(t, e.s.EnsureOrdering(e.ctx, e.db))
		ok, err = e.s.Exists(e.ctx, e.db, name)
		require.NoError(t, err)
		assert.True(t, ok, "Exists(%q) after EnsureOrdering", name)
		require.NoError(t, e.s.EnsureOrdering(e.ctx, e.db), "EnsureOrdering again")
		ok, err = e.s.Exists(e.ctx, e.db, name)
		require.NoError(t, err)
		assert.True(t, ok, "Exists(%q) after EnsureOrdering again", name)

		// Relays that start together race to build it: each finds it
		// built, or builds it, and none fails.
		e2 := setup(t, su)
		const relays = 3
		errs := make([]error, relays)
		var wg sync.WaitGroup
		for i := range relays {
			wg.Go(func() { errs[i] = e2.s.EnsureOrdering(e2.ctx, e2.db) })
		}
		wg.Wait()
		for i, err := range errs {
			assert.NoError(t, err, "relay %d", i)
		}
		ok, err = e2.s.Exists(e2.ctx, e2.db, e2.orderingIndex())
		require.NoError(t, err)
		assert.True(t, ok, "the ordering index after relays built it at once")
	})
}

// existsAll asserts that every object Schema() creates exists.
func (e *env) existsAll(when string) {
	e.t.Helper()
	ddl, err := store.SplitDDL(e.s.Schema())
	require.NoError(e.t, err)
	for _, d := range ddl {
		ok, err := e.s.Exists(e.ctx, e.db, d.Name)
		require.NoError(e.t, err)
		assert.True(e.t, ok, "Exists(%q) %s", d.Name, when)
	}
}
