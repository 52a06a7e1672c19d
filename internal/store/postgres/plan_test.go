package postgres_test

import (
	"database/sql"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRelayStatementsKeepAGenericPlan: on a table with history and
// statistics, the relay's statements are planned once per connection
// (PostgreSQL's generic plan), not on every call. A claim planned per call
// cost 0.18 ms of planning, more than it runs (BENCHMARKS.md, the lean row):
// the planner must not see the watermark's value, the LIMIT must be a
// literal, and a mark of one row must not be a one-element = ANY.
func TestRelayStatementsKeepAGenericPlan(t *testing.T) {
	// One connection, so that every call below runs on the prepared
	// statements that pg_prepared_statements then shows.
	s, db := oneConnection(t)
	ctx := t.Context()
	now := time.Now().UTC().Truncate(time.Microsecond)
	insert := func(n int) { insertGenerated(t, s, db, now, n) }
	for range 5 {
		insert(1000)
	}
	_, err := db.ExecContext(ctx, `UPDATE "`+table+`" SET status = 'sent', sent_at = now()`)
	require.NoError(t, err)
	_, err = db.ExecContext(ctx, `ANALYZE "`+table+`"`)
	require.NoError(t, err)
	var from int64
	require.NoError(t, db.QueryRowContext(ctx, `SELECT max(seq) + 1 FROM "`+table+`"`).Scan(&from))

	const calls = 12
	for i := range calls {
		insert(1)
		lease := now.Add(time.Minute)
		got, err := s.Claim(ctx, db, store.ClaimSpec{Now: now, Lease: lease, Limit: 100, From: from})
		require.NoError(t, err)
		require.Len(t, got, 1, "call %d", i)
		n, err := s.MarkSent(ctx, db, []int64{got[0].Seq}, now, lease)
		require.NoError(t, err)
		require.EqualValues(t, 1, n)
		from = got[0].Seq + 1
	}
	plans := func(like string) (generic, custom int64) {
		t.Helper()
		err := db.QueryRowContext(ctx, "SELECT COALESCE(sum(generic_plans), 0), COALESCE(sum(custom_plans), 0) FROM pg_prepared_statements WHERE statement LIKE $1", like).
			Scan(&generic, &custom)
		require.NoError(t, err)
		return generic, custom
	}
	for name, like := range map[string]string{
		"claim":     "WITH r AS%",
		"mark sent": `UPDATE "` + table + `" SET status = 'sent'%`,
	} {
		generic, custom := plans(like)
		assert.EqualValues(t, calls, generic+custom, "%s: every call on the one connection counted (%s)", name, like)
		// PostgreSQL plans the first five calls for their values before it
		// weighs the generic plan.
		assert.LessOrEqual(t, custom, int64(5), "%s: planned afresh on %d of %d calls", name, custom, calls)
	}
	var n sql.NullInt64
	require.NoError(t, db.QueryRowContext(ctx, "SELECT count(*) FROM pg_prepared_statements").Scan(&n))
	require.Positive(t, n.Int64, "the driver prepares statements (pgx's statement cache)")
}

// TestClaimsAreHOT: a claim changes no indexed column and the table keeps
// room on every page (fillfactor 50), so PostgreSQL makes the claim's
// update HOT: no new entry in any index. A claim that set updated_at (the
// failed index's key), or a table filled to 100, made none HOT, and every
// claimed row cost the primary key an entry that relays' claims then read
// past (BENCHMARKS.md, "HOT claims").
func TestClaimsAreHOT(t *testing.T) {
	// One connection: its statistics are the ones flushed below.
	s, db := oneConnection(t)
	ctx := t.Context()
	now := time.Now().UTC().Truncate(time.Microsecond)
	const n = 400
	insertGenerated(t, s, db, now, n)

	// PostgreSQL publishes a session's counts when it next goes idle, at
	// most once a second unless forced.
	counts := func() (upd, hot int64) {
		_, err := db.ExecContext(ctx, `SELECT pg_stat_force_next_flush()`)
		require.NoError(t, err)
		require.NoError(t, db.QueryRowContext(ctx, `SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables WHERE relid = to_regclass($1)`,
			`"`+table+`"`).Scan(&upd, &hot))
		return upd, hot
	}
	upd0, hot0 := counts()
	claimed := 0
	for claimed < n {
		b, err := s.Claim(ctx, db, store.ClaimSpec{Now: now, Lease: now.Add(time.Minute), Limit: 100})
		require.NoError(t, err)
		require.NotEmpty(t, b, "claimed %d of %d", claimed, n)
		claimed += len(b)
	}
	var upd, hot int64
	require.Eventually(t, func() bool {
		upd, hot = counts()
		return upd-upd0 >= n
	}, 30*time.Second, 50*time.Millisecond, "the claims' updates counted")
	assert.EqualValues(t, n, upd-upd0, "one update per claimed row")
	// A claim makes the row longer (locked_until was NULL), so the last
	// rows of a page may not fit its room: nearly all, not all (388 of
	// 400 here; 0 with updated_at set by the claim, 24 at fillfactor 100).
	assert.GreaterOrEqual(t, hot-hot0, int64(n*9/10), "HOT claims: %d of %d", hot-hot0, n)
}

// oneConnection is the store on a fresh schema, migrated, and its pool
// held to one connection; the test skips without a server.
func oneConnection(t *testing.T) (store.Store, *sql.DB) {
	dsn := os.Getenv(dsnEnv)
	if dsn == "" {
		t.Skipf("%s is not set", dsnEnv)
	}
	o := opener(t, dsn)(t)
	db, err := o.Gorm.DB()
	require.NoError(t, err)
	require.NoError(t, o.Store.Migrate(t.Context(), db))
	db.SetMaxOpenConns(1)
	return o.Store, db
}

// insertGenerated writes n events with generated IDs, as Publish does.
func insertGenerated(t *testing.T, s store.Store, db *sql.DB, now time.Time, n int) {
	rows := make([]store.Event, n)
	for i := range rows {
		id := uuid.Must(uuid.NewV7()).String()
		rows[i] = store.Event{ID: id, Type: "order.created", AggregateType: "order", AggregateID: strconv.Itoa(i), Key: id,
			Payload: []byte(`{"order_id": 1, "total": 42}`), OccurredAt: now, Generated: true}
	}
	got, err := s.Insert(t.Context(), db, rows, now, false)
	require.NoError(t, err)
	require.Equal(t, n, got.Written)
}
