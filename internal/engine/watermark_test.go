package engine

import (
	"context"
	"crypto/rand"
	"database/sql"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/gorm-outbox/outbox/internal/store/postgres"
	"github.com/gorm-outbox/outbox/internal/store/sqlite"
	_ "github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// The relay's watermark (watermark.go) over the stores that walk new rows
// by seq: on SQLite, and on PostgreSQL when OUTBOX_TEST_POSTGRES_DSN is set,
// where a transaction can commit its row after later seqs have committed.

// wmClock is a test's clock, read by the Table's writer goroutine too.
type wmClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *wmClock) now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.t }
func (c *wmClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// wmBackend is a database whose store is a store.Walker.
type wmBackend struct {
	name string
	open func(t *testing.T) (store.Store, *sql.DB)
	// outOfOrder writes early, committed, at a seq above the one late's
	// INSERT takes; late appears only when commit runs.
	outOfOrder func(t *testing.T, db *sql.DB, s store.Store, late, early store.Event) (commit func())
}

func wmBackends(t *testing.T) []wmBackend {
	bs := []wmBackend{{
		name: "sqlite",
		open: func(t *testing.T) (store.Store, *sql.DB) {
			db, err := sql.Open("sqlite3", "file:"+filepath.Join(t.TempDir(), "t.db")+sqlite.DSNOptions)
			require.NoError(t, err)
			t.Cleanup(func() { _ = db.Close() })
			return sqlite.New(store.DefaultTable), db
		},
		// SQLite has one writer: no transaction can hold a seq while
		// another commits a later one. The late row's seq is reserved by
		// a placeholder row, removed once early has the next seq; the late
		// commit inserts its row and moves it to that seq, in one
		// transaction: what a reader sees is the same.
		outOfOrder: func(t *testing.T, db *sql.DB, s store.Store, late, early store.Event) func() {
			hold := wmInsert(t, db, s, wmEvent("placeholder", "", ""))[0]
			wmInsert(t, db, s, early)
			_, err := db.Exec("DELETE FROM "+store.DefaultTable+" WHERE seq = ?", hold)
			require.NoError(t, err)
			return func() {
				tx, err := db.Begin()
				require.NoError(t, err)
				seq := wmInsert(t, tx, s, late)[0]
				_, err = tx.Exec("UPDATE "+store.DefaultTable+" SET seq = ? WHERE seq = ?", hold, seq)
				require.NoError(t, err)
				require.NoError(t, tx.Commit())
			}
		},
	}}
	dsn := os.Getenv("OUTBOX_TEST_POSTGRES_DSN")
	if dsn == "" {
		t.Logf("OUTBOX_TEST_POSTGRES_DSN is not set: the watermark is checked on SQLite only")
		return bs
	}
	return append(bs, wmBackend{
		name: "postgres",
		open: func(t *testing.T) (store.Store, *sql.DB) {
			admin, err := sql.Open("pgx", dsn)
			require.NoError(t, err)
			t.Cleanup(func() { _ = admin.Close() })
			b := make([]byte, 6)
			_, _ = rand.Read(b)
			schema := "engine_" + hex.EncodeToString(b)
			_, err = admin.Exec("CREATE SCHEMA " + schema)
			require.NoError(t, err, "OUTBOX_TEST_POSTGRES_DSN is set but PostgreSQL is unreachable")
			t.Cleanup(func() { _, _ = admin.Exec("DROP SCHEMA " + schema + " CASCADE") })
			sep := "?"
			if strings.Contains(dsn, "?") {
				sep = "&"
			}
			db, err := sql.Open("pgx", dsn+sep+"search_path="+schema)
			require.NoError(t, err)
			t.Cleanup(func() { _ = db.Close() })
			return postgres.New(store.DefaultTable), db
		},
		// A transaction takes late's seq at its INSERT and commits after
		// early, written after it, has committed.
		outOfOrder: func(t *testing.T, db *sql.DB, s store.Store, late, early store.Event) func() {
			tx, err := db.Begin()
			require.NoError(t, err)
			wmInsert(t, tx, s, late)
			wmInsert(t, db, s, early)
			return func() { require.NoError(t, tx.Commit()) }
		},
	})
}

func wmEvent(id, typ, aggID string) store.Event {
	return store.Event{ID: id, Type: "x", AggregateType: typ, AggregateID: aggID, Key: id, NamedID: true, Payload: []byte("{}"), OccurredAt: t0}
}

// wmInsert writes events as Publish does and returns their seqs.
func wmInsert(t *testing.T, q store.DB, s store.Store, evs ...store.Event) []int64 {
	t.Helper()
	ins, err := s.Insert(context.Background(), q, evs, t0, true)
	require.NoError(t, err)
	seqs := ins.Seqs
	require.Len(t, seqs, len(evs), "every event written, the seq of each told")
	slices.Sort(seqs)
	return seqs
}

// wmEnv is one watermark test's table.
type wmEnv struct {
	t     *testing.T
	s     store.Store
	db    *sql.DB
	clock *wmClock
}

func (e *wmEnv) table(ordered bool) *Table {
	return &Table{Store: e.s, DB: e.db, Now: e.clock.now, Lease: time.Minute, StatementTimeout: 10 * time.Second, Ordered: ordered}
}

// claim claims with tb and returns the batch (nil when nothing is due) and
// the IDs it holds, in seq order.
func (e *wmEnv) claim(tb *Table) (*TableBatch, []string) {
	e.t.Helper()
	b, err := tb.Claim(e.t.Context(), nil, 100)
	require.NoError(e.t, err)
	if b == nil {
		return nil, nil
	}
	var ids []string
	for _, it := range b.Items() {
		ids = append(ids, it.Event.ID)
	}
	return b, ids
}

// settle records every item of b sent, but those in fail, which fail with
// a retry due after, and closes it.
func (e *wmEnv) settle(b *TableBatch, after time.Duration, fail ...string) {
	e.t.Helper()
	for i, it := range b.Items() {
		if slices.Contains(fail, it.Event.ID) {
			b.Record(i, Result{Kind: Failed, Out: store.Outcome{Seq: it.Seq, ID: it.Event.ID, Status: "pending", Err: "boom", Due: e.clock.now().Add(after)}})
			continue
		}
		b.Record(i, Result{Kind: Sent})
	}
	require.NoError(e.t, b.Close(context.Background(), nil))
}

// row reads a row's status, attempts and whether it waits in the retry
// index (available_at set), by the ID its publisher chose.
func (e *wmEnv) row(id string) (status string, attempts int, retry bool) {
	e.t.Helper()
	require.NoError(e.t, e.db.QueryRow("SELECT status, attempts, CASE WHEN available_at IS NULL THEN 0 ELSE 1 END FROM "+store.DefaultTable+
		" WHERE named_id = '"+id+"'").Scan(&status, &attempts, &retry))
	return status, attempts, retry
}

func TestWatermark(t *testing.T) {
	for _, be := range wmBackends(t) {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			setup := func(t *testing.T) *wmEnv {
				s, db := be.open(t)
				require.NoError(t, s.Migrate(t.Context(), db))
				_, walks := s.(store.Walker)
				require.True(t, walks, "%s is a store.Walker", be.name)
				require.NoError(t, s.EnsureOrdering(t.Context(), db))
				return &wmEnv{t: t, s: s, db: db, clock: &wmClock{t: t0}}
			}

			// Rows committed out of seq order are all claimed: the late one
			// through Gaps, at a seq the watermark passed while it was not
			// committed.
			t.Run("LateCommitThroughGaps", func(t *testing.T) {
				t.Parallel()
				e := setup(t)
				tb := e.table(false)
				wmInsert(t, e.db, e.s, wmEvent("first", "", ""))
				commit := be.outOfOrder(t, e.db, e.s, wmEvent("late", "", ""), wmEvent("early", "", ""))

				b, ids := e.claim(tb)
				require.Equal(t, []string{"first", "early"}, ids, "the committed rows; late is not visible yet")
				e.settle(b, 0)
				b, ids = e.claim(tb)
				require.Nil(t, b, "nothing due: %v", ids)
				var lateSeq int64
				for seq := range tb.wm.gaps {
					if seq > 0 {
						lateSeq = seq
					}
				}
				require.NotZero(t, lateSeq, "the watermark passed late's seq as a gap: %v", tb.wm.gaps)
				assert.Greater(t, tb.wm.from, lateSeq, "the watermark is past the gap")

				commit()
				b, ids = e.claim(tb)
				require.Equal(t, []string{"late"}, ids, "the late row, claimed")
				assert.Equal(t, lateSeq, b.Items()[0].Seq, "at the gap's seq")
				_, _, retry := e.row("late")
				assert.False(t, retry, "a new row, claimed through Gaps: not deferred to the retry index")
				assert.NotContains(t, tb.wm.gaps, lateSeq, "a claimed gap leaves the list")
				assert.Greater(t, tb.wm.from, lateSeq, "the watermark stayed past it")
				e.settle(b, 0)
				b, ids = e.claim(tb)
				assert.Nil(t, b, "nothing left: %v", ids)
				st, _, _ := e.row("late")
				assert.Equal(t, "sent", st)
			})

			// A database whose seqs start again below the watermark (a
			// failover to a standby that had not received the last rows,
			// whose seqs it hands out again): a claim does not see the new
			// rows until a sweep, which Resweep brings forward.
			t.Run("ResweepAfterServerChange", func(t *testing.T) {
				t.Parallel()
				e := setup(t)
				tb := e.table(false)
				wmInsert(t, e.db, e.s, wmEvent("o1", "", ""), wmEvent("o2", "", ""), wmEvent("o3", "", ""))
				b, ids := e.claim(tb)
				require.Equal(t, []string{"o1", "o2", "o3"}, ids)
				e.settle(b, 0)
				b, _ = e.claim(tb)
				require.Nil(t, b)

				// The rows and their seqs are gone, as on a standby that
				// never got them.
				_, err := e.db.Exec("DELETE FROM " + store.DefaultTable)
				require.NoError(t, err)
				if be.name == "sqlite" {
					_, err = e.db.Exec("UPDATE sqlite_sequence SET seq = 0 WHERE name = '" + store.DefaultTable + "'")
				} else {
					_, err = e.db.Exec("SELECT setval(pg_get_serial_sequence('" + store.DefaultTable + "', 'seq'), 1, false)")
				}
				require.NoError(t, err)
				seqs := wmInsert(t, e.db, e.s, wmEvent("n1", "", ""))
				require.Less(t, seqs[0], tb.wm.from, "the new row's seq is below the watermark")
				e.clock.add(time.Second)
				b, ids = e.claim(tb)
				require.Nil(t, b, "the walk reads from the watermark: %v", ids)

				tb.Resweep()
				b, ids = e.claim(tb)
				require.Equal(t, []string{"n1"}, ids, "found by the sweep Resweep brought forward")
				e.settle(b, 0)
			})

			// An open row a claim passed over (behind its aggregate, with
			// Ordered) is deferred to the retry index: the watermark moves
			// past it, and it is claimed from there once its turn comes.
			t.Run("PassedOverIsDeferred", func(t *testing.T) {
				t.Parallel()
				e := setup(t)
				tb := e.table(true)
				seqs := wmInsert(t, e.db, e.s, wmEvent("a1", "acct", "A"), wmEvent("a2", "acct", "A"), wmEvent("b1", "acct", "B"))

				b, ids := e.claim(tb)
				require.Equal(t, []string{"a1", "b1"}, ids, "a2 waits behind a1")
				e.settle(b, time.Minute, "a1") // a1 to retry in a minute, b1 sent
				st, attempts, retry := e.row("a2")
				require.Equal(t, "pending", st)
				require.Equal(t, 0, attempts, "a2 was not claimed")
				require.False(t, retry, "a2 is still a new row")

				e.clock.add(time.Second)
				b, ids = e.claim(tb)
				require.Nil(t, b, "a2 still behind a1, a1 not due: %v", ids)
				st, attempts, retry = e.row("a2")
				assert.Equal(t, "pending", st)
				assert.Equal(t, 0, attempts, "deferring counts no attempt")
				assert.True(t, retry, "a2, passed over, waits in the retry index")
				assert.Greater(t, tb.wm.from, seqs[1], "the watermark moved past a2")
				assert.Greater(t, tb.wm.from, seqs[2], "and past b1")

				e.clock.add(time.Minute)
				b, ids = e.claim(tb)
				require.Equal(t, []string{"a1"}, ids, "a1's retry; a2 behind it")
				e.settle(b, 0)
				b, ids = e.claim(tb)
				require.Equal(t, []string{"a2"}, ids, "a2 from the retry index once a1 is sent")
				e.settle(b, 0)
				b, ids = e.claim(tb)
				assert.Nil(t, b, "nothing left: %v", ids)
			})

			// A row in flight does not hold the watermark (every relay would
			// scan every other's batches): the walk passes it, its relay
			// marks it.
			t.Run("LeasedPassed", func(t *testing.T) {
				t.Parallel()
				e := setup(t)
				tb := e.table(false)
				seqs := wmInsert(t, e.db, e.s, wmEvent("r1", "", ""), wmEvent("r2", "", ""))
				b, ids := e.claim(tb)
				require.Equal(t, []string{"r1", "r2"}, ids)
				wmInsert(t, e.db, e.s, wmEvent("r3", "", ""))
				b2, ids := e.claim(tb)
				require.Equal(t, []string{"r3"}, ids, "the next row while r1 and r2 are in flight")
				assert.Greater(t, tb.wm.from, seqs[1], "the watermark passes the rows in flight")
				_, _, retry := e.row("r1")
				assert.False(t, retry, "a leased row is not deferred")
				e.settle(b, 0)
				e.settle(b2, 0)
				b, ids = e.claim(tb)
				assert.Nil(t, b, "nothing left: %v", ids)
				for _, id := range []string{"r1", "r2", "r3"} {
					st, attempts, retry := e.row(id)
					assert.Equal(t, "sent", st, id)
					assert.Equal(t, 1, attempts, "%s: delivered once", id)
					assert.False(t, retry, "%s: never deferred", id)
				}
			})

			// A claim that takes the rows from the watermark on, one seq
			// after the other (one relay draining a backlog), moves the
			// watermark past them itself: the next claims read no walk,
			// full or not. The rows stay looked at as a walk's rows in
			// flight are: a batch whose relay died is claimed again once
			// its lease passes, before any sweep.
			t.Run("ContiguousClaimSkipsTheWalk", func(t *testing.T) {
				t.Parallel()
				e := setup(t)
				walker := &countingWalker{Store: e.s, Walker: e.s.(store.Walker)}
				tb := e.table(false)
				tb.Store, tb.Lease, tb.WalkEvery = walker, 5*time.Second, WalkEvery
				var evs []store.Event
				for i := range 250 {
					evs = append(evs, wmEvent(fmt.Sprintf("c%03d", i), "", ""))
				}
				wmInsert(t, e.db, e.s, evs...)
				var got []string
				var batches []*TableBatch
				for {
					b, ids := e.claim(tb)
					if b == nil {
						break
					}
					got = append(got, ids...)
					batches = append(batches, b)
				}
				require.Len(t, batches, 3, "100, 100 and 50")
				require.Len(t, got, 250)
				for i, id := range got {
					require.Equal(t, fmt.Sprintf("c%03d", i), id, "each row once, in seq order")
				}
				assert.Equal(t, int32(1), walker.walks.Load(), "one walk, before the first claim; the claims after it moved the watermark themselves")
				for _, b := range batches {
					assert.True(t, b.Contiguous(), "each batch the rows from the watermark on")
				}

				// A second relay on the same rows: its claim passes the
				// first's batch, so the first's next one is not contiguous.
				var more []store.Event
				for i := range 300 {
					more = append(more, wmEvent(fmt.Sprintf("d%03d", i), "", ""))
				}
				wmInsert(t, e.db, e.s, more...)
				other := e.table(false)
				other.Lease = 5 * time.Second
				mine, _ := e.claim(tb)
				require.NotNil(t, mine)
				assert.True(t, mine.Contiguous())
				theirs, _ := e.claim(other)
				require.NotNil(t, theirs)
				next, _ := e.claim(tb)
				require.NotNil(t, next)
				assert.False(t, next.Contiguous(), "rows another relay claimed among them")
				for _, b := range []*TableBatch{mine, theirs, next} {
					e.settle(b, 0)
				}

				// The last batch's relay dies: its rows are due again once
				// the lease passes, well before the next sweep.
				for _, b := range batches[:2] {
					e.settle(b, 0)
				}
				e.clock.add(6 * time.Second)
				b, ids := e.claim(tb)
				require.NotNil(t, b, "the dead relay's rows, once its lease passed")
				assert.Equal(t, got[200:], ids)
				assert.False(t, b.Contiguous(), "rows below the watermark")
				e.settle(b, 0)
				b, ids = e.claim(tb)
				assert.Nil(t, b, "nothing left: %v", ids)
				require.NoError(t, batches[2].Close(context.Background(), nil), "the dead relay's writer, which recorded nothing")
			})

			// A relay that starts on an empty table whose sequence has
			// moved on (retention deleted every row, or a TRUNCATE) takes
			// the seqs below the first new row for what they are: no gaps.
			// With them as gaps every claim carried 10000 seqs to look at
			// (the latency scenario's p50 went from 0.6 ms to 39 ms).
			t.Run("EmptiedTableLeavesNoGaps", func(t *testing.T) {
				t.Parallel()
				e := setup(t)
				many := make([]store.Event, 3000)
				for i := range many {
					many[i] = wmEvent(fmt.Sprintf("gone-%04d", i), "", "")
				}
				wmInsert(t, e.db, e.s, many...)
				_, err := e.db.Exec("DELETE FROM " + store.DefaultTable)
				require.NoError(t, err)
				tb := e.table(false)
				b, ids := e.claim(tb)
				require.Nil(t, b, "an empty table: %v", ids)
				wmInsert(t, e.db, e.s, wmEvent("first", "", ""))
				b, ids = e.claim(tb)
				require.Equal(t, []string{"first"}, ids)
				e.settle(b, 0)
				assert.Empty(t, tb.wm.gaps, "the seqs of the deleted rows are not gaps")
			})

			// After a restart (a new Table) the first sweep starts the
			// watermark at the lowest open row, however far below the
			// highest seq.
			t.Run("RestartSweepFindsOldRows", func(t *testing.T) {
				t.Parallel()
				e := setup(t)
				old := wmInsert(t, e.db, e.s, wmEvent("old", "", ""))[0]
				many := make([]store.Event, 2*SweepLookback)
				for i := range many {
					many[i] = wmEvent(fmt.Sprintf("done-%04d", i), "", "")
				}
				wmInsert(t, e.db, e.s, many...)
				_, err := e.db.Exec("UPDATE " + store.DefaultTable + " SET status = 'sent' WHERE named_id LIKE 'done-%'")
				require.NoError(t, err)

				tb := e.table(false)
				b, ids := e.claim(tb)
				require.Equal(t, []string{"old"}, ids, "the pending row %d seqs below the highest", 2*SweepLookback)
				assert.Equal(t, old, b.Items()[0].Seq)
				e.settle(b, 0)
				// The walk reads WalkBatches claims' worth of rows a claim
				// (of 100 here), to the end.
				for range len(many)/(WalkBatches*100) + 1 {
					b, ids = e.claim(tb)
					require.Nil(t, b, "nothing left: %v", ids)
				}
				assert.Greater(t, tb.wm.from, old+int64(len(many)), "the walk went on to the end")

				// And the periodic sweep finds a row committed long after
				// it took its seq, once its gap has expired: the late row
				// appears at a seq the watermark passed long ago.
				commit := be.outOfOrder(t, e.db, e.s, wmEvent("very-late", "", ""), wmEvent("next", "", ""))
				b, ids = e.claim(tb)
				require.Equal(t, []string{"next"}, ids)
				e.settle(b, 0)
				b, _ = e.claim(tb)
				require.Nil(t, b)
				require.NotEmpty(t, tb.wm.gaps, "the late row's seq is a gap")
				for seq := range tb.wm.gaps {
					tb.wm.gaps[seq] = e.clock.now().Add(-SweepEvery) // as if SweepEvery had passed
				}
				commit()
				b, ids = e.claim(tb)
				require.Nil(t, b, "the expired gap is no longer looked at: %v", ids)
				assert.Empty(t, tb.wm.gaps)
				tb.wm.swept = e.clock.now().Add(-SweepEvery) // the sweep is due
				b, ids = e.claim(tb)
				require.Equal(t, []string{"very-late"}, ids, "the sweep lowered the watermark to it")
				e.settle(b, 0)
			})
		})
	}
}

// countingWalker counts a store's watermark walks.
type countingWalker struct {
	store.Store
	store.Walker
	walks atomic.Int32
}

func (c *countingWalker) Walk(ctx context.Context, db store.DB, from int64, limit int, gaps []int64, now time.Time) ([]store.WalkRow, error) {
	c.walks.Add(1)
	return c.Walker.Walk(ctx, db, from, limit, gaps, now)
}
