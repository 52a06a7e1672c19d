package postgres_test

import (
	"database/sql"
	"os"
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
	dsn := os.Getenv(dsnEnv)
	if dsn == "" {
		t.Skipf("%s is not set", dsnEnv)
	}
	o := opener(t, dsn)(t)
	s := o.Store
	db, err := o.Gorm.DB()
	require.NoError(t, err)
	ctx := t.Context()
	require.NoError(t, s.Migrate(ctx, db))
	// One connection, so that every call below runs on the prepared
	// statements that pg_prepared_statements then shows.
	db.SetMaxOpenConns(1)
	now := time.Now().UTC().Truncate(time.Microsecond)
	insert := func(n int) {
		rows := make([]store.Event, n)
		for i := range rows {
			id := uuid.Must(uuid.NewV7()).String()
			rows[i] = store.Event{ID: id, Type: "t", Key: id, Payload: []byte(`{}`), OccurredAt: now, Generated: true}
		}
		got, err := s.Insert(ctx, db, rows, now, false)
		require.NoError(t, err)
		require.Equal(t, n, got.Written)
	}
	for range 5 {
		insert(1000)
	}
	_, err = db.ExecContext(ctx, `UPDATE "`+table+`" SET status = 'sent', sent_at = now()`)
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
