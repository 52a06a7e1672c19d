package storetest

import (
	"database/sql"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// maxGaps is how many seqs a relay's watermark passes to Walk and Claim at
// most (engine.MaxGaps), and walkRows how many rows one walk reads
// (engine.WalkBatches claims of up to InsertRows rows, at most 10000).
const (
	maxGaps  = 10000
	walkRows = 1000
)

// Parameters per item: an INSERT row has 11, an outcome 4, a rollup row
// its key (span, minute, type), its two counts and a count per delay bin.
const (
	insertParams  = 11
	outcomeParams = 4
	rollParams    = 5 + 1 + 17 // len(store.DelayBounds)+1 bins; checked in testLimits
)

// noRow is where the seqs that hold no row start, in the lists the suite
// pads with them.
const noRow = int64(1) << 40

// spread returns n seqs: those of rows at evenly spaced positions, one of
// them the last, and seqs that hold no row between them. With n more than
// one statement takes, a store's work on rows falls in several statements.
func spread(rows []int64, n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = noRow + int64(i)
	}
	for i, s := range rows {
		out[(i+1)*n/len(rows)-1] = s
	}
	return out
}

// refusedOrRan asserts that a statement a store cannot chunk either ran or
// was refused by the store itself, with an error wrapping
// store.ErrTooManyParams, never by the database; it reports whether it ran.
func refusedOrRan(t *testing.T, err error, what string) bool {
	t.Helper()
	if err == nil {
		return true
	}
	assert.ErrorIs(t, err, store.ErrTooManyParams, "%s: over the parameter limit, the store refuses it itself", what)
	t.Logf("%s: refused: %v", what, err)
	return false
}

func testLimits(t *testing.T, su *suite) {
	t.Run("Bounds", func(t *testing.T) {
		t.Parallel()
		e := fresh(t, su)
		lim := e.s.Limits()
		for name, v := range map[string]int{
			"MaxParams": lim.MaxParams, "InsertRows": lim.InsertRows, "OutcomeRows": lim.OutcomeRows, "RetentionBatch": lim.RetentionBatch,
		} {
			assert.Positive(t, v, "Limits().%s", name)
		}
		assert.LessOrEqual(t, lim.InsertRows*insertParams, lim.MaxParams, "InsertRows*%d within MaxParams", insertParams)
		assert.LessOrEqual(t, lim.OutcomeRows*outcomeParams, lim.MaxParams, "OutcomeRows*%d within MaxParams", outcomeParams)
		require.Equal(t, 5+len(store.DelayBounds)+1, rollParams, "rollParams counts a rollup row's columns")
		assert.LessOrEqual(t, lim.MaxParams, e.d.MaxParams, "MaxParams within the database's own limit (Dialect.MaxParams)")
	})

	// Every method that chunks, given more items than one statement takes
	// (lists of MaxParams+1, padded with seqs that hold no row), does all
	// the work, its statements each within the limit (a store refuses a
	// statement over it, with store.ErrTooManyParams).
	t.Run("Chunked", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		lim := e.s.Limits()
		long := lim.MaxParams + 1
		// More rows than one INSERT or one outcome statement takes.
		r := max(min(lim.InsertRows, lim.MaxParams/insertParams), min(lim.OutcomeRows, lim.MaxParams/outcomeParams)) + 1
		at := now.Add(time.Second)

		// Insert: events the publisher named (with keys of their own)
		// and generated ones, alternately, so that the statements have
		// their conflict clause (but the last, of one generated row, when
		// it holds one row); then generated ones alone, which have none
		// (and whose seqs MySQL tells from the first). Either way, the
		// seqs Insert returns are those of every row written, or none.
		mixed := make([]store.Event, r)
		var named, namedKeys []string
		for i := range mixed {
			if i%2 == 0 {
				mixed[i] = generated()
				continue
			}
			mixed[i] = ev(fmt.Sprintf("n%05d", i))
			mixed[i].Key = "k-" + mixed[i].ID
			named = append(named, mixed[i].ID)
			namedKeys = append(namedKeys, mixed[i].Key)
		}
		require.EqualValues(t, r, e.insert(now, mixed...), "Insert of %d rows, named and generated", r)
		gen := make([]store.Event, r)
		for i := range gen {
			gen[i] = generated()
		}
		require.EqualValues(t, r, e.insert(now, gen...), "Insert of %d generated rows", r)
		require.EqualValues(t, 2*r, e.rows())

		// Held: the named rows, half found by ID among more IDs no row
		// holds than one statement takes, half by key.
		half := len(named) / 2
		byID := make([]string, long)
		for i := range byID {
			byID[i] = fmt.Sprintf("none-%d", i)
		}
		for i, id := range named[:half] {
			byID[(i+1)*long/half-1] = id
		}
		byKey := append([]string{"k-none"}, namedKeys[half:]...)
		held, err := e.s.Held(e.ctx, e.db, byID, byKey)
		require.NoError(t, err, "Held of %d IDs and %d keys", len(byID), len(byKey))
		assert.Len(t, held, len(named), "Held finds every named row, by ID or by key")
		for i, id := range named {
			assert.Equal(t, namedKeys[i], held[id].Key, "Held of %s", id)
		}

		bySeq := map[int64]string{}
		for _, row := range e.all() {
			bySeq[row.Seq] = row.ID
		}
		seqsOf := func(evs []store.Event) []int64 {
			byID := map[string]int64{}
			for s, id := range bySeq {
				byID[id] = s
			}
			out := make([]int64, len(evs))
			for i := range evs {
				out[i] = byID[evs[i].ID]
				require.NotZero(t, out[i], "the row of %s", evs[i].ID)
			}
			return out
		}
		b, a := seqsOf(mixed), seqsOf(gen) // b: to fail for good; a: to retry, release and send
		both := append(slices.Clone(a), b...)

		// Defer: every row is new and open.
		if e.walker() != nil {
			assert.EqualValues(t, 2*r, e.deferred(spread(both, long), now), "Defer of %d seqs", long)
			low, _ := e.lowOpen()
			assert.Zero(t, low, "no open row once every row is deferred")
		}

		l1 := now.Add(time.Hour)
		e.claimAllAt(both, at, l1)
		outs := make([]store.Outcome, max(lim.MaxParams/outcomeParams+1, len(both)))
		for i := range outs {
			outs[i] = store.Outcome{Seq: noRow + int64(i), ID: "none", Status: "pending", Err: "none", Due: at}
		}
		for i, s := range both {
			o := store.Outcome{Seq: s, ID: bySeq[s], Status: "pending", Err: fmt.Sprintf("limit %d", i), Due: at}
			if i >= len(a) {
				o.Status = "failed"
			}
			outs[(i+1)*len(outs)/len(both)-1] = o
		}
		assert.EqualValues(t, 2*r, e.markFailed(outs, at, l1), "MarkFailed of %d outcomes", len(outs))
		assert.EqualValues(t, r, e.countOf(store.Filter{Statuses: []string{"failed"}}), "the rows failed for good")
		assert.EqualValues(t, 2*r, e.countOf(store.Filter{ErrorContains: "limit "}), "every outcome's error written")

		// RetryNow of more rows waiting for a retry than one statement
		// takes, in a transaction rolled back: the rows stay as they are.
		e.rolledBack(func(tx *sql.Tx) {
			n, err := e.s.RetryNow(e.ctx, tx, store.Replay{Now: func() time.Time { return now }})
			require.NoError(t, err, "RetryNow of %d rows", r)
			assert.EqualValues(t, r, n, "RetryNow of %d rows", r)
			due := 0
			for _, row := range e.listOn(tx, store.Page{Limit: 100000}) {
				if row.Status == "pending" && row.AvailableAt.Equal(now) {
					due++
				}
			}
			assert.Equal(t, r, due, "every row that waited is due now")
		})

		var history int64
		if h := e.history(); h != nil {
			n, err := h.RecordAttempts(e.ctx, e.db, spread(both, long), at)
			require.NoError(t, err, "RecordAttempts of %d seqs", long)
			assert.EqualValues(t, 2*r, n, "RecordAttempts of %d seqs", long)
			history = int64(2 * r)
			assert.EqualValues(t, history, e.attemptsCount(), "one entry a failed row")
		}

		at2, l2 := at.Add(time.Second), l1.Add(time.Second)
		e.claimAllAt(a, at2, l2)
		assert.EqualValues(t, r, e.release(spread(a, long), at2, l2), "Release of %d seqs", long)
		for _, row := range e.all() {
			if row.Status == "pending" {
				assert.Nil(t, row.LockedUntil, "released: %s", row.ID)
				assert.Equal(t, 1, row.Attempts, "the claim's attempt taken back: %s", row.ID)
			}
		}
		at3, l3 := at2.Add(time.Second), l2.Add(time.Second)
		e.claimAllAt(a, at3, l3)
		assert.EqualValues(t, r, e.markSent(spread(a, long), at3, l3), "MarkSent of %d seqs", long)
		assert.EqualValues(t, r, e.countOf(store.Filter{Statuses: []string{"sent"}}))

		// Replay and Purge of more rows than one statement takes.
		at4 := at3.Add(time.Second)
		assert.EqualValues(t, r, e.replay(store.Filter{Statuses: []string{"failed"}}, at4, "limits"), "Replay of %d rows", r)
		assert.EqualValues(t, 0, e.countOf(store.Filter{Statuses: []string{"failed"}}))
		if e.history() != nil {
			history += int64(r)
			assert.EqualValues(t, history, e.attemptsCount(), "an entry a replayed row")
		}
		assert.EqualValues(t, r, e.purge(store.Filter{Statuses: []string{"pending"}}), "Purge of %d rows", r)
		assert.EqualValues(t, r, e.rows(), "the sent rows are left")
		if e.history() != nil {
			assert.EqualValues(t, r, e.attemptsCount(), "the purged rows' history is gone, the others' kept")
		}
		deleted, err := e.s.DeleteSent(e.ctx, e.db, at4, lim.RetentionBatch)
		require.NoError(t, err)
		assert.EqualValues(t, min(r, lim.RetentionBatch), deleted, "one DeleteSent of RetentionBatch rows")

		if e.walker() != nil {
			// The watermark's statements, with as many seqs as a relay
			// passes them, one new row among them.
			require.EqualValues(t, 1, e.insert(at, ev("late")))
			late := e.get("late").Seq
			left := e.rows()
			gaps := make([]int64, maxGaps)
			for i := range gaps {
				gaps[i] = late - int64(i) // every row's seq among them
			}
			require.Less(t, late-e.all()[0].Seq, int64(maxGaps), "the gaps reach every row")
			assert.Len(t, e.walk(0, maxGaps, nil, at), int(left), "one Walk of every row")
			assert.Len(t, e.walk(late+1, walkRows, gaps, at), int(left), "one Walk with %d gaps", maxGaps)
			claimed := e.claimIDs(store.ClaimSpec{Now: at, Lease: l3.Add(time.Second), Limit: 10, From: late + 1, Gaps: gaps})
			assert.Equal(t, []string{"late"}, claimed, "a claim with %d gaps", maxGaps)
			assert.EqualValues(t, 0, e.deferred(gaps, at), "one Defer of %d seqs: the one open row is leased", maxGaps)
		}

		if lg := e.logical(); lg != nil {
			// Park: in the order given, more rows than one statement takes.
			rows := make([]store.ParkRow, r)
			for i, id := range ids("park-", r) {
				rows[i] = store.ParkRow{Event: ev(id), Status: "pending", Attempts: 1, LastErr: "x", Due: now.Add(time.Hour), Lease: l3, Created: now}
			}
			got, err := lg.Park(e.ctx, e.db, rows, at)
			require.NoError(t, err, "Park of %d rows", r)
			require.Len(t, got, r, "Park of %d rows", r)
			prev := int64(0)
			for _, p := range rows {
				seq, ok := got[p.Event.ID]
				if assert.True(t, ok, "Park returns the seq of %s", p.Event.ID) {
					assert.Greater(t, seq, prev, "seq follows the order given: %s", p.Event.ID)
					prev = seq
				}
			}
		}
	})

	// RollCommit with more rollup rows than one statement takes adds
	// them all.
	t.Run("RollCommit", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		ov := e.overview()
		if ov == nil {
			t.Skipf("%s implements no store.Overview", e.s.Name())
		}
		n := e.s.Limits().MaxParams/rollParams + 1
		m0 := now.Unix() / 60
		rows := make([]store.RollRow, n)
		for i := range rows {
			d := make([]int64, len(store.DelayBounds)+1)
			d[i%len(d)] = 2
			rows[i] = store.RollRow{Span: 1, Minute: m0 - int64(i%1000), Type: fmt.Sprintf("t%02d", i/1000), Published: 1, Delivered: 2, Delay: d}
		}
		e.rollPass(now, func(tx *sql.Tx, st store.RollState) ([]store.RollRow, store.RollState) { return rows, st })
		got := e.readOverview(store.OverviewQuery{Span: 1, SinceMinute: m0 - 1439, Step: 1440, SentFrom: now, SentTo: now})
		var published, delivered, delays int64
		for _, s := range got.Rollup {
			assert.Equal(t, 0, s.Interval, "one interval")
			published += s.Published
			delivered += s.Delivered
			for _, d := range s.Delay {
				delays += d
			}
		}
		assert.EqualValues(t, n, published, "RollCommit of %d rows adds every row", n)
		assert.EqualValues(t, 2*n, delivered)
		assert.EqualValues(t, 2*n, delays)
	})

	// A statement the store cannot chunk (one filter, one claim, one
	// walk), given more parameters than the database takes, runs (an
	// array on PostgreSQL) or is refused by the store with
	// store.ErrTooManyParams: never a database error.
	t.Run("Unchunked", func(t *testing.T) {
		t.Parallel()
		e := setup(t, su)
		long := e.s.Limits().MaxParams + 1
		g := generated()
		require.EqualValues(t, 3, e.insert(now, ev("u-1"), ev("u-2"), g))
		names := make([]string, long)
		uuids := make([]string, long)
		for i := range names {
			names[i] = fmt.Sprintf("none-%d", i)
			uuids[i] = uuid.NewString()
		}
		names[0], names[long/2], names[long-1] = "u-1", "u-2", g.ID
		uuids[long-1] = g.ID
		for _, c := range []struct {
			name string
			f    store.Filter
			want []string
		}{
			{"IDs", store.Filter{IDs: names}, []string{"u-1", "u-2", g.ID}},
			{"UUIDs", store.Filter{IDs: uuids}, []string{g.ID}},
			{"Keys", store.Filter{Keys: names}, []string{"u-1", "u-2", g.ID}},
			{"Types", store.Filter{Types: append(names[:long-1:long-1], "order.created")}, []string{"u-1", "u-2", g.ID}},
		} {
			n, err := e.s.Count(e.ctx, e.db, c.f)
			if refusedOrRan(t, err, "Count by "+c.name) {
				assert.EqualValues(t, len(c.want), n, "Count by %d %s", long, c.name)
			}
			rows, err := e.s.List(e.ctx, e.db, store.Page{Filter: c.f, Limit: 10})
			if refusedOrRan(t, err, "List by "+c.name) {
				assert.Equal(t, c.want, idsOf(rows), "List by %d %s", long, c.name)
			}
			e.rolledBack(func(tx *sql.Tx) {
				n, err := e.s.Purge(e.ctx, tx, c.f)
				if refusedOrRan(t, err, "Purge by "+c.name) {
					assert.Equal(t, len(c.want), n, "Purge by %d %s", long, c.name)
				}
			})
			rf := c.f
			rf.Statuses = []string{"failed"}
			e.rolledBack(func(tx *sql.Tx) {
				n, err := e.s.Replay(e.ctx, tx, store.Replay{Filter: rf, Now: func() time.Time { return now }})
				if refusedOrRan(t, err, "Replay by "+c.name) {
					assert.Zero(t, n, "Replay by %d %s: no row failed", long, c.name)
				}
			})
			pf := c.f
			pf.Statuses = []string{"pending"}
			e.rolledBack(func(tx *sql.Tx) {
				n, err := e.s.RetryNow(e.ctx, tx, store.Replay{Filter: pf, Now: func() time.Time { return now }})
				if refusedOrRan(t, err, "RetryNow by "+c.name) {
					assert.Zero(t, n, "RetryNow by %d %s: no row waits for a retry", long, c.name)
				}
			})
		}

		seqs := spread(e.seqs("u-1", "u-2"), long)
		lease := now.Add(time.Minute)
		got, err := e.s.Claim(e.ctx, e.db, store.ClaimSpec{Now: now, Lease: lease, Limit: 10, Seqs: seqs})
		if refusedOrRan(t, err, "Claim of Seqs") {
			assert.Len(t, got, 2, "Claim of %d seqs", long)
			assert.EqualValues(t, 2, e.release(e.seqs("u-1", "u-2"), now, lease))
		}
		if e.walker() != nil {
			high := e.get(g.ID).Seq + 1
			got, err = e.s.Claim(e.ctx, e.db, store.ClaimSpec{Now: now, Lease: lease, Limit: 10, From: high, Gaps: seqs})
			if refusedOrRan(t, err, "Claim with Gaps") {
				assert.Len(t, got, 2, "Claim with %d gaps", long)
				assert.EqualValues(t, 2, e.release(e.seqs("u-1", "u-2"), now, lease))
			}
			walked, err := e.walker().Walk(e.ctx, e.db, high, 10, seqs, now)
			if refusedOrRan(t, err, "Walk with gaps") {
				assert.Len(t, walked, 2, "Walk with %d gaps", long)
			}
		}
		if lg := e.logical(); lg != nil {
			aggs := make([]store.Aggregate, long)
			for i := range aggs {
				aggs[i] = store.Aggregate{Type: "t", ID: fmt.Sprint(i)}
			}
			require.EqualValues(t, 1, e.insert(now, agg("b-1", "t", "7")))
			blocked, err := lg.Blocked(e.ctx, e.db, aggs)
			if refusedOrRan(t, err, "Blocked") {
				assert.Equal(t, map[store.Aggregate]bool{{Type: "t", ID: "7"}: true}, blocked, "Blocked of %d aggregates", long)
			}
		}
	})
}

// claimAllAt claims the rows at seqs, due at at, under lease.
func (e *env) claimAllAt(seqs []int64, at, lease time.Time) {
	e.t.Helper()
	got := e.claim(store.ClaimSpec{Now: at, Lease: lease, Limit: len(seqs), Seqs: seqs})
	require.Len(e.t, got, len(seqs), "claim the rows")
}

// attemptsTable is the history's table, quoted as the outbox table is:
// <table>_attempts, as the shipped schema names it.
func (e *env) attemptsTable() string {
	e.t.Helper()
	ddl, err := store.SplitDDL(e.s.Schema())
	require.NoError(e.t, err)
	name := e.table + "_attempts"
	require.True(e.t, slices.ContainsFunc(ddl, func(d store.DDL) bool { return d.Name == name }),
		"a History store's schema creates the table %s", name)
	return strings.Replace(e.qt, e.table, name, 1)
}

// attemptsCount counts the history's entries.
func (e *env) attemptsCount() int64 {
	e.t.Helper()
	return e.count("SELECT COUNT(*) FROM " + e.attemptsTable())
}
