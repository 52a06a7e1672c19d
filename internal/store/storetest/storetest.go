// Package storetest is the conformance suite every store runs: one
// function, Exercise, that checks the contracts the interfaces of package
// store state, role by role, on a fresh database per subtest. A store's
// own test opens its database and calls it:
//
//	func TestStore(t *testing.T) {
//		storetest.Exercise(t, func(t *testing.T) storetest.DB { ... })
//	}
//
// Every call goes through the store's typed methods, as the root package
// makes them, through a recorder that counts them: once every subtest has
// ended, Exercise fails for each method of a role the store implements
// that none called. Every time the suite writes goes through the store,
// from a fixed UTC clock: no check depends on the database's clock. The
// little SQL of the suite's own (rows as older versions wrote them,
// columns read directly, counts) goes through the env's helpers, spelt as
// the store's test says its database spells it (Dialect).
//
// The suite knows no database and asks no store's name: whatever differs
// between databases (a placeholder, a time argument, the parameter limit,
// the tables of earlier schema versions, the lock an upgrade holds) is in
// the DB the store's test opens. Checks of one database alone live in
// that store's own test.
package storetest

import (
	"cmp"
	"context"
	"database/sql"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
)

// Open returns a store on a fresh, empty database of its own (schema,
// database or file), without the outbox table, closed when t ends, the
// GORM session on it (Check takes one), and what the suite must know of
// the database. The suite runs Check itself, as db.Use does.
type Open func(t *testing.T) DB

// DB is what Open returns: a store on a fresh database and what the suite
// must know of that database, which the store's own test says.
type DB struct {
	Store store.Store
	Gorm  *gorm.DB
	// Dialect is how the suite's own SQL is spelt on the database, and
	// its parameter limit.
	Dialect Dialect
	// Past is the store's earlier schema versions, for a store with
	// Upgrade scripts; the zero Past for one without.
	Past Past
}

// Dialect is how SQL of the suite's own (rows as older versions wrote
// them, columns read directly, counts) is spelt on a database, and the
// database's own limit the store's limits must keep within. Every field
// is required.
type Dialect struct {
	// Placeholder spells the n-th (1-based) parameter of a statement:
	// "$1", "?".
	Placeholder func(n int) string
	// Time is a time as an argument, in the form the store writes its
	// times: rows as older versions wrote them must read back the same.
	Time func(time.Time) any
	// IDHex is the SQL expression, over the table's columns, that reads
	// the id column (a native UUID, text, or 16 bytes) as 32 lower-case
	// hex digits.
	IDHex string
	// MaxParams is the database's own limit on a statement's parameters:
	// the store's Limits().MaxParams must not exceed it.
	MaxParams int
}

// Past is what a store's earlier schema versions were, for the upgrade
// checks: a store whose Upgrade(v) is not "" must give the table version
// v created, and one without Upgrade scripts gives nothing (the suite
// then checks that Migrate refuses such a table).
type Past struct {
	// V1 and V2 are the DDL of the tables schema versions 1 and 2
	// created, under the name store.DefaultTable (the suite renames it);
	// V1 with version 1's ordering index, <table>_aggregate_idx, which
	// relays with OrderByAggregate built. The shipped stores' are
	// Shipped's.
	V1, V2 string
	// UpgradedID is what the id column reads (as Dialect.IDHex reads it)
	// once the upgrade to version 3 has run, for a row version 2 wrote
	// with the ID id; nil: store.RowID of the ID, as the upgrade scripts
	// compute it where the database has MD5.
	UpgradedID func(id string) string
	// UpgradeLockHeld reports whether a session holds the lock the
	// upgrade scripts of the table named table take for the session
	// (store.SessionLock); nil where the lock is the transaction's
	// (store.TxLock), which cannot outlive it.
	UpgradeLockHeld func(ctx context.Context, db *sql.DB, table string) (bool, error)
}

// now is the suite's clock: a fixed UTC time, in microseconds, the
// precision every database keeps.
var now = time.Date(2031, 3, 14, 15, 9, 26, 535897000, time.UTC)

// suite is what each subtest of one Exercise shares: the opener and the
// count of the store's calls.
type suite struct {
	open  Open
	calls *calls
}

// Exercise runs the conformance suite on the store open returns. Once
// every subtest has ended, it fails for each method of a role the store
// implements that no subtest called.
func Exercise(t *testing.T, open Open) {
	t.Helper()
	su := &suite{open: open, calls: &calls{}}
	s := open(t).Store
	t.Logf("store %s (%T)", s.Name(), s)
	// Cleanups run once every subtest, parallel ones included, has ended.
	t.Cleanup(func() { checkCoverage(t, s, su.calls) })

	t.Run("Schema", func(t *testing.T) { t.Parallel(); testSchema(t, su) })
	t.Run("Writer", func(t *testing.T) { t.Parallel(); testWriter(t, su) })
	t.Run("Claimer", func(t *testing.T) { t.Parallel(); testClaimer(t, su) })
	t.Run("Admin", func(t *testing.T) { t.Parallel(); testAdmin(t, su) })
	t.Run("Limits", func(t *testing.T) { t.Parallel(); testLimits(t, su) })
	t.Run("Concurrency", func(t *testing.T) { t.Parallel(); testConcurrency(t, su) })
	if is[store.Walker](s) {
		t.Run("Walker", func(t *testing.T) { t.Parallel(); testWalker(t, su) })
	} else {
		t.Logf("%s implements no store.Walker", s.Name())
		t.Run("NoWalker", func(t *testing.T) { t.Parallel(); testNoWalker(t, su) })
	}
	// The feature roles, where the store has them: the real store says,
	// not the recorder (which has every method).
	for _, r := range []struct {
		name string
		has  bool
		run  func(*testing.T, *suite)
	}{
		{"Inbox", is[store.Inbox](s), testInbox},
		{"InboxLead", is[store.InboxLead](s), testInboxLead},
		{"Overview", is[store.Overview](s), testOverview},
		{"History", is[store.History](s), testHistory},
		{"Notifier", is[store.Notifier](s), testNotifier},
		{"Logical", is[store.Logical](s), testLogical},
		{"Replicas", is[store.Replicas](s), testReplicas},
		{"Relays", is[store.Relays](s), testRelays},
	} {
		if !r.has {
			t.Logf("%s implements no store.%s", s.Name(), r.name)
			continue
		}
		t.Run(r.name, func(t *testing.T) { t.Parallel(); r.run(t, su) })
	}
}

// is reports whether s implements the role R.
func is[R any](s store.Store) bool {
	_, ok := s.(R)
	return ok
}

// env is one subtest's store and database.
type env struct {
	t   *testing.T
	ctx context.Context
	// s is the store through the suite's recorder; real is the store
	// itself, which the role accessors (walker and the like) ask.
	s     *recorder
	real  store.Store
	db    *sql.DB
	gdb   *gorm.DB
	d     Dialect
	past  Past
	table string // the table's name
	qt    string // quoted, as the schema writes it
	// leases numbers the leases settle takes, so that no two are equal.
	leases int
}

var tableRE = regexp.MustCompile("(?i)\\bCREATE\\s+TABLE\\s+(?:IF\\s+NOT\\s+EXISTS\\s+)?([\"`]?)(\\w+)([\"`]?)")

// fresh opens an empty database and runs Check on it, as db.Use does
// first.
func fresh(t *testing.T, su *suite) *env {
	t.Helper()
	o := su.open(t)
	require.NotNil(t, o.Store, "Open returns the store")
	require.NotNil(t, o.Gorm, "Open returns the GORM session")
	d := o.Dialect
	require.True(t, d.Placeholder != nil && d.Time != nil && d.IDHex != "" && d.MaxParams > 0,
		"Open of %s returns its database's Dialect: every field is required", o.Store.Name())
	db, err := o.Gorm.DB()
	require.NoError(t, err)
	e := &env{t: t, ctx: t.Context(), s: &recorder{real: o.Store, calls: su.calls}, real: o.Store, db: db, gdb: o.Gorm, d: d, past: o.Past}
	require.NoError(t, e.s.Check(e.ctx, e.gdb, slog.New(slog.DiscardHandler)), "Check of the test's database")
	m := tableRE.FindStringSubmatch(e.s.Schema())
	require.NotNil(t, m, "the schema creates no table:\n%s", e.s.Schema())
	e.table, e.qt = m[2], m[1]+m[2]+m[3]
	return e
}

// setup opens a database and creates the table, as db.Use does.
func setup(t *testing.T, su *suite) *env {
	t.Helper()
	e := fresh(t, su)
	require.NoError(t, e.s.Migrate(e.ctx, e.db))
	return e
}

// ph is the n-th (1-based) placeholder of SQL of the suite's own.
func (e *env) ph(n int) string { return e.d.Placeholder(n) }

// timeArg is a time as an argument of SQL of the suite's own, in the form
// the store writes its times (rows as older versions wrote them must read
// back the same).
func (e *env) timeArg(t time.Time) any { return e.d.Time(t) }

// raw runs SQL of the suite's own (placeholders spelt by ph) and returns
// the rows it changed.
func (e *env) raw(query string, args ...any) int64 {
	e.t.Helper()
	res, err := e.db.ExecContext(e.ctx, query, args...)
	require.NoError(e.t, err, "%.300s", query)
	n, err := res.RowsAffected()
	require.NoError(e.t, err)
	return n
}

// count runs SQL of the suite's own that returns one count.
func (e *env) count(query string, args ...any) int64 {
	e.t.Helper()
	var n int64
	require.NoError(e.t, e.db.QueryRowContext(e.ctx, query, args...).Scan(&n), "%.300s", query)
	return n
}

// insert writes events through Insert at the time at and returns how many
// rows it inserted.
func (e *env) insert(at time.Time, evs ...store.Event) int64 {
	e.t.Helper()
	n, err := e.tryInsert(at, evs...)
	require.NoError(e.t, err, "Insert")
	return n
}

// tryInsert runs Insert as Publish does with DeliverAfterCommit (asking
// for the seqs), each seq it returns checked to hold one of evs' IDs.
func (e *env) tryInsert(at time.Time, evs ...store.Event) (int64, error) {
	e.t.Helper()
	got, err := e.s.Insert(e.ctx, e.db, evs, at, true)
	if err != nil {
		return int64(got.Written), err
	}
	require.GreaterOrEqual(e.t, got.Written, 0, "Insert tells how many rows it wrote: every driver of the suite can say")
	if got.Seqs == nil {
		return int64(got.Written), nil
	}
	assert.Len(e.t, got.Seqs, got.Written, "Insert returns a seq for each row it wrote")
	want := map[string]bool{}
	for i := range evs {
		want[evs[i].ID] = true
	}
	seen := map[int64]bool{}
	for i, id := range e.idsAt(got.Seqs) {
		assert.True(e.t, want[id], "Insert returned seq %d, which holds %s, not one of the events written", got.Seqs[i], id)
		assert.False(e.t, seen[got.Seqs[i]], "Insert returned seq %d twice", got.Seqs[i])
		seen[got.Seqs[i]] = true
	}
	return int64(got.Written), nil
}

// find reads a row through Get.
func (e *env) find(id string) (store.Row, bool) {
	e.t.Helper()
	r, ok, err := e.s.Get(e.ctx, e.db, id)
	require.NoError(e.t, err, "Get(%q)", id)
	return r, ok
}

// get reads a row that exists through Get.
func (e *env) get(id string) store.Row {
	e.t.Helper()
	r, ok := e.find(id)
	require.True(e.t, ok, "Get(%q) found no row", id)
	return r
}

// listOn runs List on db (the pool, or a transaction).
func (e *env) listOn(db store.DB, p store.Page) []store.Row {
	e.t.Helper()
	rows, err := e.s.List(e.ctx, db, p)
	require.NoError(e.t, err, "List(%+v)", p)
	return rows
}

// list returns the IDs List returns, in its order.
func (e *env) list(p store.Page) []string {
	e.t.Helper()
	return idsOf(e.listOn(e.db, p))
}

// countOf runs Count.
func (e *env) countOf(f store.Filter) int64 {
	e.t.Helper()
	n, err := e.s.Count(e.ctx, e.db, f)
	require.NoError(e.t, err, "Count(%+v)", f)
	return n
}

// all reads every row through List, by seq.
func (e *env) all() []store.Row {
	e.t.Helper()
	return e.listOn(e.db, store.Page{Limit: 100000})
}

// idsAt are the IDs of the rows at seqs, in seqs' order ("?" for a seq
// that holds no row).
func (e *env) idsAt(seqs []int64) []string {
	e.t.Helper()
	byseq := map[int64]string{}
	for _, r := range e.all() {
		byseq[r.Seq] = r.ID
	}
	out := make([]string, len(seqs))
	for i, s := range seqs {
		id, ok := byseq[s]
		if !ok {
			id = fmt.Sprintf("?%d", s)
		}
		out[i] = id
	}
	return out
}

// seqs is the seq of each row, in ids' order, read through Get.
func (e *env) seqs(ids ...string) []int64 {
	e.t.Helper()
	out := make([]int64, len(ids))
	for i, id := range ids {
		out[i] = e.get(id).Seq
	}
	return out
}

// state is a row's status and attempts.
type state struct {
	Status   string
	Attempts int
}

// states reads every row's status and attempts, by ID.
func (e *env) states() map[string]state {
	e.t.Helper()
	out := map[string]state{}
	for _, r := range e.all() {
		out[r.ID] = state{r.Status, r.Attempts}
	}
	return out
}

// rows counts the table's rows.
func (e *env) rows() int64 {
	e.t.Helper()
	return e.count("SELECT COUNT(*) FROM " + e.qt)
}

// claim runs Claim.
func (e *env) claim(c store.ClaimSpec) []store.Claimed {
	e.t.Helper()
	got, err := e.s.Claim(e.ctx, e.db, c)
	require.NoError(e.t, err, "Claim(%+v)", c)
	return got
}

// claimIDs runs Claim and returns the IDs in write order (RETURNING has no
// order of its own).
func (e *env) claimIDs(c store.ClaimSpec) []string {
	e.t.Helper()
	got := e.claim(c)
	slices.SortFunc(got, func(a, b store.Claimed) int { return cmp.Compare(a.Seq, b.Seq) })
	ids := make([]string, len(got))
	for i := range got {
		ids[i] = got[i].ID
	}
	return ids
}

// settle claims the rows with the IDs (due by far) and returns the lease
// they are held by.
func (e *env) settle(ids ...string) time.Time {
	e.t.Helper()
	e.leases++
	at := now.Add(1000 * time.Hour)
	lease := at.Add(time.Hour + time.Duration(e.leases)*time.Microsecond)
	got := e.claimIDs(store.ClaimSpec{Now: at, Lease: lease, Limit: len(ids), Seqs: e.seqs(ids...)})
	require.ElementsMatch(e.t, ids, got, "claim the rows to settle")
	return lease
}

// sent marks the rows sent at the time at.
func (e *env) sent(at time.Time, ids ...string) {
	e.t.Helper()
	lease := e.settle(ids...)
	require.EqualValues(e.t, len(ids), e.markSent(e.seqs(ids...), at, lease), "MarkSent")
}

// failed marks the rows failed for good at the time at, with the error.
func (e *env) failed(at time.Time, msg string, ids ...string) {
	e.t.Helper()
	lease := e.settle(ids...)
	outs := make([]store.Outcome, len(ids))
	for i, id := range ids {
		outs[i] = e.outcome(id, "failed", msg, at)
	}
	require.EqualValues(e.t, len(ids), e.markFailed(outs, at, lease), "MarkFailed")
}

// markSent runs MarkSent and returns the rows it changed.
func (e *env) markSent(seqs []int64, at, lease time.Time) int64 {
	e.t.Helper()
	n, err := e.s.MarkSent(e.ctx, e.db, seqs, at, lease)
	require.NoError(e.t, err, "MarkSent of %d seqs", len(seqs))
	return n
}

// markFailed runs MarkFailed and returns the rows it changed.
func (e *env) markFailed(outs []store.Outcome, at, lease time.Time) int64 {
	e.t.Helper()
	n, err := e.s.MarkFailed(e.ctx, e.db, outs, at, lease)
	require.NoError(e.t, err, "MarkFailed of %d outcomes", len(outs))
	return n
}

// release runs Release and returns the rows it changed.
func (e *env) release(seqs []int64, at, lease time.Time) int64 {
	e.t.Helper()
	n, err := e.s.Release(e.ctx, e.db, seqs, at, lease)
	require.NoError(e.t, err, "Release of %d seqs", len(seqs))
	return n
}

// outcome is the outcome of the row with the ID, by its seq.
func (e *env) outcome(id, status, msg string, due time.Time) store.Outcome {
	e.t.Helper()
	return store.Outcome{Seq: e.get(id).Seq, ID: id, Status: status, Err: msg, Due: due}
}

// walker is the store, through the recorder, as a store.Walker, or nil
// when the store is none.
func (e *env) walker() store.Walker {
	if !is[store.Walker](e.real) {
		return nil
	}
	return e.s
}

// history is the store as a store.History, or nil.
func (e *env) history() store.History {
	if !is[store.History](e.real) {
		return nil
	}
	return e.s
}

// logical is the store as a store.Logical, or nil.
func (e *env) logical() store.Logical {
	if !is[store.Logical](e.real) {
		return nil
	}
	return e.s
}

// overview is the store as a store.Overview, or nil.
func (e *env) overview() store.Overview {
	if !is[store.Overview](e.real) {
		return nil
	}
	return e.s
}

// where is a condition on the row with the ID the publisher chose, for
// SQL of the suite's own.
func where(id string) string { return " WHERE named_id = '" + id + "'" }

// ensureOrdering builds the ordering index, as a relay with
// OrderByAggregate does before its first claim.
func (e *env) ensureOrdering() {
	e.t.Helper()
	require.NoError(e.t, e.s.EnsureOrdering(e.ctx, e.db))
}

// orderingIndex is the ordering index's name, as docs/schema.md gives it
// (and version 1 gave it).
func (e *env) orderingIndex() string { return e.table + "_aggregate_idx" }

// rolledBack runs f in a transaction it then rolls back: what Replay or
// Purge would change, read on the transaction, leaving the rows as they
// were.
func (e *env) rolledBack(f func(tx *sql.Tx)) {
	e.t.Helper()
	tx, err := e.db.BeginTx(e.ctx, nil)
	require.NoError(e.t, err)
	defer func() { require.NoError(e.t, tx.Rollback()) }()
	f(tx)
}

// purged are the IDs Purge of f deletes, in a transaction rolled back.
func (e *env) purged(f store.Filter) []string {
	e.t.Helper()
	var gone []string
	e.rolledBack(func(tx *sql.Tx) {
		before := e.listOn(tx, store.Page{Limit: 100000})
		n, err := e.s.Purge(e.ctx, tx, f)
		require.NoError(e.t, err, "Purge(%+v)", f)
		after := map[int64]bool{}
		for _, r := range e.listOn(tx, store.Page{Limit: 100000}) {
			after[r.Seq] = true
		}
		for _, r := range before {
			if !after[r.Seq] {
				gone = append(gone, r.ID)
			}
		}
		assert.Equal(e.t, len(gone), n, "Purge returns how many rows it deleted")
	})
	return gone
}

// replayed are the IDs, by seq, Replay of f at the time at turns from
// failed to pending, in a transaction rolled back.
func (e *env) replayed(f store.Filter, at time.Time) []string {
	e.t.Helper()
	var out []string
	e.rolledBack(func(tx *sql.Tx) {
		before := map[int64]string{}
		for _, r := range e.listOn(tx, store.Page{Limit: 100000}) {
			before[r.Seq] = r.Status
		}
		n, err := e.s.Replay(e.ctx, tx, store.Replay{Filter: f, Now: func() time.Time { return at }})
		require.NoError(e.t, err, "Replay(%+v)", f)
		for _, r := range e.listOn(tx, store.Page{Limit: 100000}) {
			if before[r.Seq] != r.Status {
				assert.Equal(e.t, "failed", before[r.Seq], "Replay changes only failed rows: %s", r.ID)
				assert.Equal(e.t, "pending", r.Status, "Replay turns a row to pending: %s", r.ID)
				out = append(out, r.ID)
			}
		}
		assert.Equal(e.t, len(out), n, "Replay returns how many rows it replayed")
	})
	return out
}

// replay runs Replay of f at the time at and returns how many it replayed.
func (e *env) replay(f store.Filter, at time.Time, actor string) int {
	e.t.Helper()
	n, err := e.s.Replay(e.ctx, e.db, store.Replay{Filter: f, Now: func() time.Time { return at }, Actor: actor})
	require.NoError(e.t, err, "Replay(%+v)", f)
	return n
}

// retryNow runs RetryNow of f at the time at and returns how many it
// made due.
func (e *env) retryNow(f store.Filter, at time.Time, actor string) int {
	e.t.Helper()
	n, err := e.s.RetryNow(e.ctx, e.db, store.Replay{Filter: f, Now: func() time.Time { return at }, Actor: actor})
	require.NoError(e.t, err, "RetryNow(%+v)", f)
	return n
}

// purge runs Purge of f and returns how many it deleted.
func (e *env) purge(f store.Filter) int {
	e.t.Helper()
	n, err := e.s.Purge(e.ctx, e.db, f)
	require.NoError(e.t, err, "Purge(%+v)", f)
	return n
}

// ev is an event the caller named (not generated), its key its ID.
func ev(id string) store.Event {
	return store.Event{
		ID: id, Type: "order.created", Key: id, NamedID: true,
		Payload:    []byte(`{"id":"` + id + `"}`),
		OccurredAt: now.Add(-time.Minute),
	}
}

// agg is ev in an aggregate.
func agg(id, typ, aggID string) store.Event {
	e := ev(id)
	e.AggregateType, e.AggregateID = typ, aggID
	return e
}

// generated is an event whose ID (a fresh UUIDv7) and key the publisher
// generated, as Publish writes one.
func generated() store.Event {
	id := uuid.Must(uuid.NewV7()).String()
	e := ev(id)
	e.Generated, e.NamedID = true, false
	return e
}

func idsOf(rows []store.Row) []string {
	ids := make([]string, len(rows))
	for i := range rows {
		ids[i] = rows[i].ID
	}
	return ids
}

// seqOf is the seq of each row, by ID.
func (e *env) seqOf(ids ...string) map[string]int64 {
	e.t.Helper()
	out := map[string]int64{}
	for _, id := range ids {
		out[id] = e.get(id).Seq
	}
	return out
}

// sameTime asserts two instants are equal.
func sameTime(t *testing.T, want, got time.Time, what string, args ...any) bool {
	t.Helper()
	return assert.True(t, want.Equal(got), "%s: want %s, got %s", fmt.Sprintf(what, args...),
		want.UTC().Format(time.RFC3339Nano), got.UTC().Format(time.RFC3339Nano))
}

// sameTimePtr asserts an optional time is the instant given, or nil when
// want is zero.
func sameTimePtr(t *testing.T, want time.Time, got *time.Time, what string, args ...any) bool {
	t.Helper()
	if want.IsZero() {
		return assert.Nil(t, got, "%s: want NULL", fmt.Sprintf(what, args...))
	}
	if !assert.NotNil(t, got, "%s: want %s, got NULL", fmt.Sprintf(what, args...), want.Format(time.RFC3339Nano)) {
		return false
	}
	return sameTime(t, want, *got, what, args...)
}

// ids is a list of IDs with the given prefix, numbered from 1.
func ids(prefix string, n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("%s%04d", prefix, i+1)
	}
	return out
}

// statements splits DDL on ";" after removing "--" comments, as
// store.SplitDDL does, keeping every non-blank statement.
func statements(ddl string) []string {
	var b strings.Builder
	for _, line := range strings.Split(ddl, "\n") {
		if i := strings.Index(line, "--"); i >= 0 {
			line = line[:i]
		}
		b.WriteString(line)
		b.WriteByte('\n')
	}
	var out []string
	for _, st := range strings.Split(b.String(), ";") {
		if st = strings.TrimSpace(st); st != "" {
			out = append(out, st)
		}
	}
	return out
}
