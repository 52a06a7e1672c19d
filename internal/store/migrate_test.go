package store_test

import (
	"context"
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/gorm-outbox/outbox/internal/errs"
	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestSplitDDL: each statement with the name of what it creates (tables,
// indexes, unique indexes, types; quoted or not; IF NOT EXISTS or not),
// comments and blank statements left out; a statement that creates
// nothing it can name is an error that quotes it.
func TestSplitDDL(t *testing.T) {
	ddl := `
-- A comment; with a semicolon.
CREATE TYPE "t_status" AS ENUM ('a', 'b');
CREATE TABLE IF NOT EXISTS "t" (
    id int -- a column
);
create unique index if not exists t_id_idx ON "t" (id);
CREATE INDEX ` + "`t_x_idx`" + ` ON t (x) ;

CREATE TABLE other (id int)
`
	got, err := store.SplitDDL(ddl)
	require.NoError(t, err)
	var names []string
	for _, d := range got {
		names = append(names, d.Name)
		assert.NotContains(t, d.SQL, "--", "comments are stripped")
		assert.NotContains(t, d.SQL, ";", "one statement each")
		assert.Equal(t, strings.TrimSpace(d.SQL), d.SQL, "trimmed")
	}
	assert.Equal(t, []string{"t_status", "t", "t_id_idx", "t_x_idx", "other"}, names)
	assert.Contains(t, got[1].SQL, "id int", "the statement is kept whole")

	for _, bad := range []string{
		"CREATE TABLE t (id int); ALTER TABLE t ADD COLUMN x int",
		"DROP INDEX IF EXISTS t_idx",
		"INSERT INTO t VALUES (1)",
		"SELECT 1; CREATE TABLE t (id int)",
		"-- CREATE TABLE t\nUPDATE t SET id = 1",
	} {
		_, err := store.SplitDDL(bad)
		assert.Error(t, err, "SplitDDL(%q)", bad)
	}
	_, err = store.SplitDDL("CREATE TABLE t (id int); ALTER TABLE t ADD COLUMN x int")
	assert.ErrorContains(t, err, "ALTER TABLE t ADD COLUMN x int", "the error quotes the statement")

	got, err = store.SplitDDL("  \n-- nothing\n;;  ")
	require.NoError(t, err)
	assert.Empty(t, got, "nothing but comments and blanks")
}

func TestVersionOf(t *testing.T) {
	assert.Equal(t, 0, store.VersionOf(false, false, false), "no table")
	assert.Equal(t, 0, store.VersionOf(false, true, true), "no table, whatever columns")
	assert.Equal(t, 1, store.VersionOf(true, false, false), "no seq")
	assert.Equal(t, 1, store.VersionOf(true, false, true), "no seq, whatever named_id")
	assert.Equal(t, 2, store.VersionOf(true, true, false), "seq, no named_id")
	assert.Equal(t, store.SchemaVersion, store.VersionOf(true, true, true))
}

func TestRename(t *testing.T) {
	ddl := `CREATE TABLE "outbox_events" (id int); CREATE INDEX "outbox_events_x_idx" ON "outbox_events" (id)`
	assert.Equal(t, `CREATE TABLE "Order" (id int); CREATE INDEX "Order_x_idx" ON "Order" (id)`, store.Rename(ddl, "Order"))
	inbox := `CREATE TABLE outbox_inbox (c int); CREATE INDEX outbox_inbox_consumed_idx ON outbox_inbox (c)`
	assert.Equal(t, `CREATE TABLE Group (c int); CREATE INDEX Group_consumed_idx ON Group (c)`, store.RenameInbox(inbox, "Group"))
	assert.Equal(t, ddl, store.RenameInbox(ddl, "Group"), "RenameInbox leaves the outbox table's names")
}

// TestRegistry: Open asks the probes highest priority first (ties by
// name) and returns the first store that accepts; ByName finds a store
// without a database; unknown names and dialects wrap
// errs.ErrUnsupportedDialect and list the registered stores; a name
// registered twice panics. The drivers registered here are the test
// binary's own (the stores register in the root package).
func TestRegistry(t *testing.T) {
	// The registry is the process's: each run (-count) registers and asks
	// under names and dialects of its own.
	runs++
	n := func(s string) string { return fmt.Sprintf("%s-%d", s, runs) }
	type opened struct {
		store.Store
		name, table string
	}
	asked := []string{}
	driver := func(name string, priority int, accepts ...string) store.Driver {
		return store.Driver{
			Name:     name,
			Priority: priority,
			Probe: func(_ context.Context, dialector string, _ *sql.DB) bool {
				asked = append(asked, name)
				return slices.Contains(accepts, dialector)
			},
			Open: func(table string) store.Store { return opened{name: name, table: table} },
		}
	}
	// Names that sort against their priorities.
	general, specific, tieA, tieB := n("test-a-general"), n("test-z-specific"), n("test-m-tie"), n("test-n-tie")
	store.Register(driver(general, -10, n("testdb"), n("otherdb")))
	store.Register(driver(specific, 10, n("testdb")))
	store.Register(driver(tieB, 5, n("tiedb")))
	store.Register(driver(tieA, 5, n("tiedb")))
	mine := func(asked []string) []string {
		var out []string
		for _, a := range asked {
			if strings.HasSuffix(a, fmt.Sprintf("-%d", runs)) {
				out = append(out, a)
			}
		}
		return out
	}

	s, err := store.Open(t.Context(), n("testdb"), nil, "events")
	require.NoError(t, err)
	assert.Equal(t, opened{name: specific, table: "events"}, s, "the highest priority that accepts")
	assert.Equal(t, []string{specific}, mine(asked), "asked highest priority first, and no further")

	asked = nil
	s, err = store.Open(t.Context(), n("otherdb"), nil, "events")
	require.NoError(t, err)
	assert.Equal(t, general, s.(opened).name)
	assert.Equal(t, []string{specific, tieA, tieB, general}, mine(asked), "by priority, ties by name")

	s, err = store.Open(t.Context(), n("tiedb"), nil, "events")
	require.NoError(t, err)
	assert.Equal(t, tieA, s.(opened).name, "a tie goes by name")

	_, err = store.Open(t.Context(), n("nodb"), nil, "events")
	assert.ErrorIs(t, err, errs.ErrUnsupportedDialect)
	for _, name := range []string{general, tieA, tieB, specific} {
		assert.ErrorContains(t, err, name, "the error lists the stores")
	}
	assert.ErrorContains(t, err, strings.Join(store.Names(), ", "), "the error lists the stores, sorted")

	s, err = store.ByName(general, "t2")
	require.NoError(t, err)
	assert.Equal(t, opened{name: general, table: "t2"}, s)
	_, err = store.ByName(n("test-none"), "t")
	assert.ErrorIs(t, err, errs.ErrUnsupportedDialect)

	assert.Subset(t, store.Names(), []string{general, specific, tieA, tieB})
	assert.IsNonDecreasing(t, store.Names(), "Names is sorted")
	assert.PanicsWithValue(t, fmt.Sprintf("outbox: store %q registered twice", general), func() { store.Register(driver(general, 1)) })
}

// runs counts TestRegistry's runs.
var runs int
