// Package storetest is the conformance suite every store runs: one
// function, Exercise, that checks at the SQL level the contracts the
// interfaces of package store state, role by role, on a fresh database per
// subtest. A store's own test opens its database and calls it:
//
//	func TestStore(t *testing.T) {
//		storetest.Exercise(t, func(t *testing.T) (store.Store, *sql.DB) { ... })
//	}
//
// The statements the builders return are run on the *sql.DB as the root
// package runs them, read back through store.QueryClaimed, store.ScanRows
// and store.DBTime. Every time the suite writes goes through the builders,
// from a fixed UTC clock: no check depends on the database's clock.
package storetest

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Open returns a store on a fresh, empty database of its own (schema,
// database or file), without the outbox table, closed when t ends.
type Open func(t *testing.T) (store.Store, *sql.DB)

// now is the suite's clock: a fixed UTC time, in microseconds, the
// precision every database keeps.
var now = time.Date(2031, 3, 14, 15, 9, 26, 535897000, time.UTC)

// Exercise runs the conformance suite on the store open returns.
func Exercise(t *testing.T, open Open) {
	t.Helper()
	s, _ := open(t)
	t.Logf("store %s (%T)", s.Name(), s)

	t.Run("Schema", func(t *testing.T) { t.Parallel(); testSchema(t, open, s.Name()) })
	t.Run("Writer", func(t *testing.T) { t.Parallel(); testWriter(t, open) })
	t.Run("Claimer", func(t *testing.T) { t.Parallel(); testClaimer(t, open) })
	t.Run("Admin", func(t *testing.T) { t.Parallel(); testAdmin(t, open) })
	t.Run("Limits", func(t *testing.T) { t.Parallel(); testLimits(t, open) })
	t.Run("Concurrency", func(t *testing.T) { t.Parallel(); testConcurrency(t, open) })
	if _, ok := s.(store.Walker); ok {
		t.Run("Walker", func(t *testing.T) { t.Parallel(); testWalker(t, open) })
	} else {
		t.Logf("%s implements no store.Walker", s.Name())
		t.Run("NoWalker", func(t *testing.T) { t.Parallel(); testNoWalker(t, open) })
	}
	// The optional roles, where the store has them.
	if _, ok := s.(store.Notifier); ok {
		t.Run("Notifier", func(t *testing.T) { t.Parallel(); testNotifier(t, open) })
	} else {
		t.Logf("%s implements no store.Notifier", s.Name())
	}
	if _, ok := s.(store.Logical); ok {
		t.Run("Logical", func(t *testing.T) { t.Parallel(); testLogical(t, open) })
	} else {
		t.Logf("%s implements no store.Logical", s.Name())
	}
}

// env is one subtest's store and database.
type env struct {
	t     *testing.T
	ctx   context.Context
	s     store.Store
	db    *sql.DB
	table string // the table's name
	qt    string // quoted, as the schema writes it
	// leases numbers the leases settle takes, so that no two are equal.
	leases int
}

var tableRE = regexp.MustCompile("(?i)\\bCREATE\\s+TABLE\\s+(?:IF\\s+NOT\\s+EXISTS\\s+)?([\"`]?)(\\w+)([\"`]?)")

// fresh opens an empty database.
func fresh(t *testing.T, open Open) *env {
	t.Helper()
	s, db := open(t)
	m := tableRE.FindStringSubmatch(s.Schema())
	require.NotNil(t, m, "the schema creates no table:\n%s", s.Schema())
	return &env{t: t, ctx: t.Context(), s: s, db: db, table: m[2], qt: m[1] + m[2] + m[3]}
}

// setup opens a database and creates the table, as db.Use does.
func setup(t *testing.T, open Open) *env {
	t.Helper()
	e := fresh(t, open)
	require.NoError(t, store.Create(e.ctx, e.db, e.s))
	return e
}

// exec runs a statement and returns the rows it changed.
func (e *env) exec(q store.Query) int64 {
	e.t.Helper()
	res, err := e.db.ExecContext(e.ctx, q.SQL, q.Args...)
	require.NoError(e.t, err, "%s", q.SQL)
	n, err := res.RowsAffected()
	require.NoError(e.t, err)
	return n
}

// raw runs literal SQL (no arguments: the suite writes no time this way).
func (e *env) raw(sql string) int64 {
	e.t.Helper()
	return e.exec(store.Query{SQL: sql})
}

// insert writes events through Insert at the time at and returns how many
// rows it inserted.
func (e *env) insert(at time.Time, evs ...store.Event) int64 {
	e.t.Helper()
	n, err := e.tryInsert(at, evs...)
	require.NoError(e.t, err, "Insert")
	return n
}

// tryInsert runs Insert as Publish does (runInsert), each seq it returns
// checked to hold one of evs' IDs.
func (e *env) tryInsert(at time.Time, evs ...store.Event) (int64, error) {
	e.t.Helper()
	n, seqs, err := runInsert(e.ctx, e.db, e.s, e.s.Insert(evs, at, true), true)
	if err != nil || seqs == nil {
		return n, err
	}
	want := map[string]bool{}
	for i := range evs {
		want[evs[i].ID] = true
	}
	for i, id := range e.idsAt(seqs) {
		assert.True(e.t, want[id], "Insert returned seq %d, which holds %s, not one of the events written", seqs[i], id)
	}
	return n, nil
}

// runInsert runs an Insert statement as Publish does: asked for its seqs
// (want) with Returning, a query whose rows are the seqs it inserted;
// otherwise a statement whose row count it is (seqs nil).
func runInsert(ctx context.Context, db *sql.DB, s store.Store, q store.Query, want bool) (n int64, seqs []int64, err error) {
	if !want || !s.Returning() {
		res, err := db.ExecContext(ctx, q.SQL, q.Args...)
		if err != nil {
			return 0, nil, err
		}
		n, err := res.RowsAffected()
		return n, nil, err
	}
	rs, err := db.QueryContext(ctx, q.SQL, q.Args...)
	if err != nil {
		return 0, nil, err
	}
	seqs = []int64{}
	for rs.Next() {
		var seq int64
		if err := rs.Scan(&seq); err != nil {
			_ = rs.Close()
			return 0, nil, err
		}
		seqs = append(seqs, seq)
	}
	if err := errors.Join(rs.Err(), rs.Close()); err != nil {
		return 0, nil, err
	}
	return int64(len(seqs)), seqs, nil
}

// find reads a row through Get.
func (e *env) find(id string) (store.Row, bool) {
	e.t.Helper()
	rows := e.query(e.s.Get(id))
	require.LessOrEqual(e.t, len(rows), 1, "Get(%q)", id)
	if len(rows) == 0 {
		return store.Row{}, false
	}
	return rows[0], true
}

// get reads a row that exists through Get.
func (e *env) get(id string) store.Row {
	e.t.Helper()
	r, ok := e.find(id)
	require.True(e.t, ok, "Get(%q) found no row", id)
	return r
}

// query runs a statement selecting RowColumns.
func (e *env) query(q store.Query) []store.Row {
	e.t.Helper()
	rs, err := e.db.QueryContext(e.ctx, q.SQL, q.Args...)
	require.NoError(e.t, err, "%s", q.SQL)
	rows, err := store.ScanRows(rs)
	require.NoError(e.t, err, "%s", q.SQL)
	return rows
}

// list returns the IDs List returns, in its order.
func (e *env) list(p store.Page) []string {
	e.t.Helper()
	return idsOf(e.query(e.s.List(p)))
}

// count runs a statement returning one count.
func (e *env) count(q store.Query) int64 {
	e.t.Helper()
	var n int64
	require.NoError(e.t, e.db.QueryRowContext(e.ctx, q.SQL, q.Args...).Scan(&n), "%s", q.SQL)
	return n
}

// seqList runs a statement returning one column, seq.
func (e *env) seqList(q store.Query) []int64 {
	e.t.Helper()
	rs, err := e.db.QueryContext(e.ctx, q.SQL, q.Args...)
	require.NoError(e.t, err, "%s", q.SQL)
	defer rs.Close()
	var seqs []int64
	for rs.Next() {
		var seq int64
		require.NoError(e.t, rs.Scan(&seq))
		seqs = append(seqs, seq)
	}
	require.NoError(e.t, rs.Err())
	return seqs
}

// all reads every row through List, by seq.
func (e *env) all() []store.Row {
	e.t.Helper()
	return e.query(e.s.List(store.Page{Limit: 100000}))
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
	return e.count(store.Query{SQL: "SELECT COUNT(*) FROM " + e.qt})
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
	require.EqualValues(e.t, len(ids), e.exec(e.s.MarkSent(e.seqs(ids...), at, lease)), "MarkSent")
}

// failed marks the rows failed for good at the time at, with the error.
func (e *env) failed(at time.Time, msg string, ids ...string) {
	e.t.Helper()
	lease := e.settle(ids...)
	outs := make([]store.Outcome, len(ids))
	for i, id := range ids {
		outs[i] = e.outcome(id, "failed", msg, at)
	}
	require.EqualValues(e.t, len(ids), e.exec(e.s.MarkFailed(outs, at, lease)), "MarkFailed")
}

// outcome is the outcome of the row with the ID, by its seq.
func (e *env) outcome(id, status, msg string, due time.Time) store.Outcome {
	e.t.Helper()
	return store.Outcome{Seq: e.get(id).Seq, ID: id, Status: status, Err: msg, Due: due}
}

// walker is the store as a store.Walker, or nil.
func (e *env) walker() store.Walker {
	w, _ := e.s.(store.Walker)
	return w
}

// where is a condition on the row with the ID the publisher chose, for
// literal SQL.
func where(id string) string { return " WHERE named_id = '" + id + "'" }

// ensureOrdering builds the ordering index, as a relay with
// OrderByAggregate does before its first claim.
func (e *env) ensureOrdering() {
	e.t.Helper()
	name, ddl := e.s.OrderingIndex()
	require.NoError(e.t, store.Ensure(e.ctx, e.db, e.s, name, ddl...))
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
