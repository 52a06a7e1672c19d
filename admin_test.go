package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/maint"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// adminTests cover the operating functions (admin.go) the outbox command
// and the dashboard are built on.
var adminTests = map[string]func(*testing.T, backend){
	"AdminListFilters":         testAdminListFilters,
	"AdminListPaging":          testAdminListPaging,
	"AdminGet":                 testAdminGet,
	"AdminReplay":              testAdminReplay,
	"AdminReplayBatches":       testAdminReplayBatches,
	"AdminPurge":               testAdminPurge,
	"AdminPurgeBatches":        testAdminPurgeBatches,
	"AdminInvalidFilter":       testAdminInvalidFilter,
	"AdminStatsFailedLastHour": testAdminStatsFailedLastHour,
	"AdminReplayOnlyFailed":    testAdminReplayOnlyFailed,
	"RetentionDeletesOnlySent": testRetentionDeletesOnlySent,
}

// adminFixture publishes, at distinct times one minute apart:
//
//	pay-0  payment.failed  order/1  -> failed "Card DECLINED: 100% over limit"
//	pay-1  payment.failed  order/2  -> failed "timeout"
//	ship-0 order.shipped   order/1  -> sent
//	ship-1 order.shipped   order/2  -> pending
//
// and returns the time before the first publish. Once heal is set, every
// event is delivered.
func adminFixture(t *testing.T, e *testEnv, heal *atomic.Bool) time.Time {
	t.Helper()
	start := e.clock.Now()
	pub := func(id, typ, agg string) {
		e.clock.Advance(time.Minute)
		require.NoError(t, PublishAlone(e.db, Event{ID: id, Type: typ, AggregateType: "order", AggregateID: agg,
			Payload: map[string]string{"id": id}}))
	}
	pub("pay-0", "payment.failed", "1")
	pub("pay-1", "payment.failed", "2")
	pub("ship-0", "order.shipped", "1")
	pub("ship-1", "order.shipped", "2")
	e.ob.Handle("payment.failed", func(_ context.Context, ev Event) error {
		if heal != nil && heal.Load() {
			return nil
		}
		if ev.ID == "pay-0" {
			return Permanent(errors.New("Card DECLINED: 100% over limit"))
		}
		return Permanent(errors.New("timeout"))
	})
	e.ob.Handle("order.shipped", func(_ context.Context, ev Event) error {
		if ev.ID == "ship-1" {
			return RetryAfter(errors.New("later"), time.Hour)
		}
		return nil
	})
	_, err := e.relay(RelayConfig{}).ProcessOnce(t.Context())
	require.NoError(t, err)
	return start
}

func rowIDs(rows []Row) []string {
	out := make([]string, len(rows))
	for i, r := range rows {
		out[i] = r.ID
	}
	return out
}

func testAdminListFilters(t *testing.T, b backend) {
	e := b.setup(t)
	ctx := t.Context()
	start := adminFixture(t, e, nil)
	list := func(f Filter) []string {
		t.Helper()
		rows, err := e.ob.List(e.db.WithContext(ctx), ListParams{Filter: f})
		require.NoError(t, err)
		n, err := e.ob.Count(e.db.WithContext(ctx), f)
		require.NoError(t, err)
		assert.EqualValues(t, len(rows), n, "Count agrees with List for %+v", f)
		return rowIDs(rows)
	}
	all := []string{"pay-0", "pay-1", "ship-0", "ship-1"}
	assert.Equal(t, all, list(Filter{}))
	assert.Equal(t, []string{"pay-0", "pay-1"}, list(Filter{Statuses: []Status{StatusFailed}}))
	assert.Equal(t, []string{"ship-0", "ship-1"}, list(Filter{Statuses: []Status{StatusSent, StatusPending}}))
	assert.Equal(t, []string{"ship-0", "ship-1"}, list(Filter{Types: []string{"order.shipped"}}))
	assert.Equal(t, []string{"pay-1", "ship-0"}, list(Filter{IDs: []string{"ship-0", "pay-1", "nope"}}))
	assert.Equal(t, []string{"pay-0", "ship-0"}, list(Filter{AggregateType: "order", AggregateID: "1"}))
	assert.Empty(t, list(Filter{AggregateType: "customer"}))
	// Created 1, 2, 3 and 4 minutes after start: since is inclusive,
	// until exclusive.
	created := func(m int) time.Time {
		return e.record([]string{"pay-0", "pay-1", "ship-0", "ship-1"}[m-1]).CreatedAt
	}
	assert.Equal(t, []string{"pay-1", "ship-0"}, list(Filter{CreatedSince: created(2), CreatedUntil: created(4)}))
	assert.Equal(t, all, list(Filter{CreatedSince: start}))
	assert.Empty(t, list(Filter{CreatedUntil: start}))
	// In another zone, the same instants select the same rows.
	far := time.FixedZone("far", -11*3600)
	assert.Equal(t, []string{"pay-1", "ship-0"}, list(Filter{CreatedSince: created(2).In(far), CreatedUntil: created(4).In(far)}))

	// Case-insensitive, and LIKE's wildcards are plain text.
	assert.Equal(t, []string{"pay-0"}, list(Filter{ErrorContains: "card declined"}))
	assert.Equal(t, []string{"pay-0"}, list(Filter{ErrorContains: "100% OVER"}))
	assert.Empty(t, list(Filter{ErrorContains: "100%_over"}))
	assert.Empty(t, list(Filter{ErrorContains: "_"}))
	assert.Equal(t, []string{"pay-1"}, list(Filter{ErrorContains: "TIME", Types: []string{"payment.failed"}}))
}

func testAdminListPaging(t *testing.T, b backend) {
	e := b.setup(t)
	ctx := t.Context()
	want := publishN(t, e.db, "page", 120)
	if b.logical { // Logical mode's Publish writes no row: another relay parks the events in the table
		e.parkInTable(t)
	}

	rows, err := e.ob.List(e.db.WithContext(ctx), ListParams{})
	require.NoError(t, err)
	assert.Len(t, rows, defaultListLimit, "the default page")

	var got []string
	var after int64
	for {
		rows, err := e.ob.List(e.db.WithContext(ctx), ListParams{Limit: 25, AfterSeq: after})
		require.NoError(t, err)
		if len(rows) == 0 {
			break
		}
		require.LessOrEqual(t, len(rows), 25)
		got = append(got, rowIDs(rows)...)
		after = rows[len(rows)-1].Seq
		// A row added while paging shows up at the end, once.
		if len(got) == 50 {
			publishN(t, e.db, "late", 1)
			if b.logical {
				e.parkInTable(t)
			}
		}
	}
	assert.Equal(t, append(want, "late-00000"), got, "oldest first, every row once")

	var newest []string
	var before int64
	for {
		rows, err := e.ob.List(e.db.WithContext(ctx), ListParams{Limit: 40, Newest: true, BeforeSeq: before, Filter: Filter{Types: []string{"page"}}})
		require.NoError(t, err)
		if len(rows) == 0 {
			break
		}
		newest = append(newest, rowIDs(rows)...)
		before = rows[len(rows)-1].Seq
	}
	require.Len(t, newest, len(want))
	for i := range want {
		assert.Equal(t, want[len(want)-1-i], newest[i])
	}

	// A window between two seqs, and a limit above the maximum is lowered.
	all, err := e.ob.List(e.db.WithContext(ctx), ListParams{Limit: 5000})
	require.NoError(t, err)
	require.Len(t, all, 121)
	mid, err := e.ob.List(e.db.WithContext(ctx), ListParams{AfterSeq: all[9].Seq, BeforeSeq: all[20].Seq})
	require.NoError(t, err)
	assert.Equal(t, rowIDs(all[10:20]), rowIDs(mid))
}

func testAdminGet(t *testing.T, b backend) {
	e := b.setup(t)
	ctx := t.Context()
	occurred := time.Date(2026, 3, 29, 1, 30, 0, 123456000, time.FixedZone("x", 5*3600+1800))
	before := time.Now()
	require.NoError(t, PublishAlone(e.db, Event{ID: "g1", Type: "t", AggregateType: "order", AggregateID: "9",
		IdempotencyKey: "key-g1", Headers: map[string]string{"traceparent": "00-1-2-01"},
		Payload: map[string]any{"name": "<script>alert(1)</script>", "n": 1}, OccurredAt: occurred}))
	published, after := e.clock.Now(), time.Now()
	e.ob.Handle("t", func(context.Context, Event) error { return Permanent(errors.New("bad <b>")) })
	_, err := e.relay(RelayConfig{}).ProcessOnce(ctx)
	require.NoError(t, err)

	r, err := e.ob.Get(e.db.WithContext(ctx), "g1")
	require.NoError(t, err)
	assert.Positive(t, r.Seq)
	assert.Equal(t, "t", r.EventType)
	assert.Equal(t, "order", r.AggregateType)
	assert.Equal(t, "9", r.AggregateID)
	assert.Equal(t, "key-g1", r.IdempotencyKey)
	var payload map[string]any
	require.NoError(t, json.Unmarshal([]byte(r.Payload), &payload))
	assert.Equal(t, "<script>alert(1)</script>", payload["name"])
	require.NotNil(t, r.Headers)
	assert.JSONEq(t, `{"traceparent":"00-1-2-01"}`, *r.Headers)
	assert.Equal(t, StatusFailed, r.Status)
	assert.Equal(t, 1, r.Attempts)
	require.NotNil(t, r.LastError)
	assert.Contains(t, *r.LastError, "bad <b>")
	assert.Nil(t, r.LockedUntil)
	assert.Nil(t, r.SentAt)
	// Every time is UTC and right, MySQL (stored as zone-less text) included.
	for name, tm := range map[string]time.Time{"OccurredAt": r.OccurredAt, "CreatedAt": r.CreatedAt,
		"UpdatedAt": r.UpdatedAt, "AvailableAt": r.AvailableAt} {
		assert.Equal(t, time.UTC, tm.Location(), name)
	}
	assert.True(t, occurred.Equal(r.OccurredAt), "OccurredAt %v came back as %v", occurred, r.OccurredAt)
	if b.logical {
		// The relay wrote the row (the ID is explicit) with the commit
		// time, by PostgreSQL's clock on this machine: the outbox's clock
		// does not make it.
		assert.False(t, r.CreatedAt.Before(before.Add(-time.Millisecond)) || r.CreatedAt.After(after.Add(time.Millisecond)),
			"CreatedAt %v is the commit's time, between %v and %v", r.CreatedAt, before, after)
	} else {
		assert.WithinDuration(t, published, r.CreatedAt, time.Millisecond)
	}
	assert.True(t, e.record("g1").CreatedAt.Equal(r.CreatedAt), "Get and a GORM read agree")

	_, err = e.ob.Get(e.db.WithContext(ctx), "missing")
	require.ErrorIs(t, err, ErrNotFound)

	// Sent rows carry SentAt; in a transaction too.
	require.NoError(t, PublishAlone(e.db, Event{ID: "g2", Type: "ok"}))
	e.ob.Handle("ok", func(context.Context, Event) error { return nil })
	_, err = e.relay(RelayConfig{}).ProcessOnce(ctx)
	require.NoError(t, err)
	require.NoError(t, e.db.Transaction(func(tx *gorm.DB) error {
		r, err := e.ob.Get(tx.WithContext(ctx), "g2")
		require.NoError(t, err)
		require.NotNil(t, r.SentAt)
		assert.Equal(t, time.UTC, r.SentAt.Location())
		assert.WithinDuration(t, e.clock.Now(), *r.SentAt, time.Millisecond)
		return nil
	}))
}

func testAdminReplay(t *testing.T, b backend) {
	e := b.setup(t)
	ctx := t.Context()
	var heal atomic.Bool
	adminFixture(t, e, &heal)

	n, err := e.ob.Replay(e.db.WithContext(ctx), Filter{ErrorContains: "declined"})
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	r := e.record("pay-0")
	assert.Equal(t, StatusPending, r.Status)
	assert.Equal(t, 0, r.Attempts)
	assert.Nil(t, r.LockedUntil)
	assert.Equal(t, StatusFailed, e.record("pay-1").Status)

	// Sent and pending rows matching the filter are left alone.
	n, err = e.ob.Replay(e.db.WithContext(ctx), Filter{AggregateID: "2"})
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	assert.Equal(t, StatusPending, e.record("pay-1").Status)
	assert.Equal(t, StatusSent, e.record("ship-0").Status)
	n, err = e.ob.Replay(e.db.WithContext(ctx), Filter{})
	require.NoError(t, err)
	assert.Equal(t, 0, n, "nothing is failed any more")

	// The replayed events are due now and get delivered.
	heal.Store(true)
	_, err = e.relay(RelayConfig{}).ProcessOnce(ctx)
	require.NoError(t, err)
	assert.Equal(t, StatusSent, e.record("pay-0").Status)
	assert.Equal(t, StatusSent, e.record("pay-1").Status)

	_, err = e.ob.Replay(e.db.WithContext(ctx), Filter{Statuses: []Status{StatusSent}})
	require.ErrorIs(t, err, ErrInvalidFilter, "a replay that cannot touch failed rows is a mistake")
}

// failRows marks every row of typ failed with msg, as the relay would.
func failRows(t *testing.T, e *testEnv, typ, msg string) {
	t.Helper()
	require.NoError(t, e.db.Table(e.ob.Table()).Where("event_type = ?", typ).
		Updates(map[string]any{"status": StatusFailed, "last_error": msg, "attempts": 3}).Error)
}

// The rows one Replay or Purge pass reads and one of its statements
// changes (sqlbuild's adminScan and adminBatch): the batch tests write more
// than one of each.
const (
	adminScanRows  = 10000
	adminBatchRows = 1000
)

func testAdminReplayBatches(t *testing.T, b backend) {
	e := b.setup(t)
	skipPureGo(t, e)
	const bulk = adminScanRows + adminBatchRows + 5
	publishN(t, e.db, "bulk", bulk)
	publishN(t, e.db, "other", 3)
	if b.logical { // Logical mode's Publish writes no row: the relay writes them, failed
		fail := func(context.Context, Event) error { return Permanent(errors.New("boom")) }
		e.ob.Handle("bulk", fail)
		e.ob.Handle("other", fail)
		// One streamed batch of over 11,000 events (see testAdminPurgeBatches).
		drain(t, e.relay(RelayConfig{StatementTimeout: 50 * time.Second}))
		require.EqualValues(t, bulk+3, e.count("status = ? AND attempts = 1", StatusFailed))
	} else {
		failRows(t, e, "bulk", "boom")
		failRows(t, e, "other", "boom")
	}
	n, err := e.ob.Replay(e.db.WithContext(t.Context()), Filter{Types: []string{"bulk"}, Statuses: []Status{StatusFailed}})
	require.NoError(t, err)
	assert.Equal(t, bulk, n)
	assert.EqualValues(t, bulk, e.count("status = ? AND attempts = 0", StatusPending))
	assert.EqualValues(t, 3, e.count("status = ?", StatusFailed))
}

func testAdminPurge(t *testing.T, b backend) {
	e := b.setup(t)
	ctx := t.Context()
	adminFixture(t, e, nil)

	_, err := e.ob.Purge(e.db.WithContext(ctx), Filter{Statuses: []Status{StatusPending}})
	require.ErrorIs(t, err, ErrInvalidFilter)
	_, err = e.ob.Purge(e.db.WithContext(ctx), Filter{Statuses: []Status{StatusSent, StatusPending}})
	require.ErrorIs(t, err, ErrInvalidFilter)

	// A poison event: purging it by ID.
	n, err := e.ob.Purge(e.db.WithContext(ctx), Filter{IDs: []string{"pay-0", "ship-1"}})
	require.NoError(t, err)
	assert.Equal(t, 1, n, "the pending ship-1 is never deleted")
	assert.EqualValues(t, 0, e.count("named_id = ?", "pay-0"))
	assert.EqualValues(t, 1, e.count("named_id = ?", "ship-1"))

	// Sent rows created before a time.
	n, err = e.ob.Purge(e.db.WithContext(ctx), Filter{Statuses: []Status{StatusSent}, CreatedUntil: e.clock.Now()})
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	assert.Equal(t, []string{"pay-1", "ship-1"}, func() []string {
		rows, err := e.ob.List(e.db.WithContext(ctx), ListParams{})
		require.NoError(t, err)
		return rowIDs(rows)
	}())

	// No statuses: sent and failed, never pending.
	n, err = e.ob.Purge(e.db.WithContext(ctx), Filter{})
	require.NoError(t, err)
	assert.Equal(t, 1, n)
	assert.EqualValues(t, 1, e.count(""))
	assert.EqualValues(t, 1, e.count("status = ?", StatusPending))
}

func testAdminPurgeBatches(t *testing.T, b backend) {
	e := b.setup(t)
	skipPureGo(t, e)
	publishN(t, e.db, "bulk", adminScanRows+adminBatchRows+7)
	publishN(t, e.db, "keep", 2)
	if b.logical { // Logical mode's Publish writes no row: the relay writes them, bulk sent and keep pending
		e.ob.Handle("bulk", func(context.Context, Event) error { return nil })
		e.ob.Handle("keep", func(context.Context, Event) error { return RetryAfter(errors.New("later"), time.Hour) })
		// One transaction of 11,007 events is one streamed batch, written
		// to the table by the relay: on a loaded machine (CI, load 20-30)
		// that took longer than the default 10 s StatementTimeout.
		drain(t, e.relay(RelayConfig{StatementTimeout: 50 * time.Second}))
		require.EqualValues(t, adminScanRows+adminBatchRows+7, e.count("status = ?", StatusSent))
		require.EqualValues(t, 2, e.count("status = ?", StatusPending))
	} else {
		require.NoError(t, e.db.Table(e.ob.Table()).Where("event_type = ?", "bulk").
			Updates(map[string]any{"status": StatusSent}).Error)
	}
	n, err := e.ob.Purge(e.db.WithContext(t.Context()), Filter{Types: []string{"bulk", "keep"}})
	require.NoError(t, err)
	assert.Equal(t, adminScanRows+adminBatchRows+7, n)
	assert.EqualValues(t, 2, e.count(""))
}

func testAdminInvalidFilter(t *testing.T, b backend) {
	e := b.setup(t)
	ctx := t.Context()
	bad := Filter{Statuses: []Status{"stuck"}}
	_, err := e.ob.List(e.db.WithContext(ctx), ListParams{Filter: bad})
	require.ErrorIs(t, err, ErrInvalidFilter)
	assert.Contains(t, err.Error(), `"stuck"`)
	_, err = e.ob.Count(e.db.WithContext(ctx), bad)
	require.ErrorIs(t, err, ErrInvalidFilter)
	_, err = e.ob.Replay(e.db.WithContext(ctx), bad)
	require.ErrorIs(t, err, ErrInvalidFilter)
	_, err = e.ob.Purge(e.db.WithContext(ctx), bad)
	require.ErrorIs(t, err, ErrInvalidFilter)
	_, err = e.ob.List(e.db.WithContext(ctx), ListParams{Limit: -1})
	require.ErrorIs(t, err, ErrInvalidFilter)

	// The db must be the one the outbox is installed on.
	other := b.open(t, &gorm.Config{Logger: logger.Discard})
	_, err = Plugin(Config{}).List(other.WithContext(ctx), ListParams{})
	require.ErrorIs(t, err, ErrNotInstalled)
	_, err = e.ob.Stats(other)
	require.ErrorIs(t, err, ErrNotInstalled, "Stats too")
	// A nil *gorm.DB is an error, not a panic, in every operating call.
	for name, call := range map[string]func() error{
		"List":    func() error { _, err := e.ob.List(nil, ListParams{}); return err },
		"Get":     func() error { _, err := e.ob.Get(nil, "x"); return err },
		"Count":   func() error { _, err := e.ob.Count(nil, Filter{}); return err },
		"Replay":  func() error { _, err := e.ob.Replay(nil, Filter{}); return err },
		"Purge":   func() error { _, err := e.ob.Purge(nil, Filter{}); return err },
		"Stats":   func() error { _, err := e.ob.Stats(nil); return err },
		"Migrate": func() error { return e.ob.Migrate(nil) },
	} {
		assert.ErrorIs(t, call(), ErrNotInstalled, name)
	}
	mem := Plugin(Config{Mode: Memory})
	_, err = mem.Count(e.db.WithContext(ctx), Filter{})
	require.ErrorIs(t, err, ErrMemoryMode)
}

func testAdminStatsFailedLastHour(t *testing.T, b backend) {
	e := b.setup(t)
	ctx := t.Context()
	e.ob.Handle("x", func(context.Context, Event) error { return Permanent(errors.New("no")) })
	publishN(t, e.db, "x", 2)
	r := e.relay(RelayConfig{})
	_, err := r.ProcessOnce(ctx)
	require.NoError(t, err)
	e.clock.Advance(2 * time.Hour)
	require.NoError(t, PublishAlone(e.db, Event{ID: "y", Type: "x"}))
	_, err = r.ProcessOnce(ctx)
	require.NoError(t, err)
	require.NoError(t, PublishAlone(e.db, Event{ID: "z", Type: "pending-only"}))
	if b.logical { // Logical mode's Publish writes no row: another relay parks z in the table
		e.parkInTable(t)
	}

	st, err := e.ob.Stats(e.db.WithContext(ctx))
	require.NoError(t, err)
	assert.EqualValues(t, 3, st.Failed)
	assert.EqualValues(t, 1, st.FailedLastHour, "the two failed two hours ago are not new")
	assert.EqualValues(t, 1, st.Pending)
	if b.logical {
		// z's row holds its commit time, by PostgreSQL's clock, which the
		// test's two hours did not move.
		assert.InDelta(t, 2*time.Hour, st.OldestPending, float64(time.Minute))
	} else {
		assert.Less(t, st.OldestPending, time.Second)
	}
}

// TestMigrateChecksConfig: Migrate called without db.Use (as the outbox
// command does) refuses a table name that is not a plain identifier
// instead of running DDL with it.
func TestMigrateChecksConfig(t *testing.T) {
	t.Parallel()
	db := sqliteBackend.open(t, &gorm.Config{Logger: logger.Discard})
	err := Plugin(Config{Table: `x"; DROP TABLE y; --`}).Migrate(db.WithContext(t.Context()))
	require.ErrorIs(t, err, ErrInvalidConfig)
	var n int
	require.NoError(t, db.Raw("SELECT COUNT(*) FROM sqlite_master").Scan(&n).Error)
	assert.Zero(t, n, "no DDL ran")
}

// skipPureGo skips a test of batching on the pure-Go SQLite driver: the
// statements are the cgo driver's, and its 11,000 rows take minutes there
// under -race.
func skipPureGo(t *testing.T, e *testEnv) {
	if _, ok := pure.Load(e.db); ok {
		t.Skip("same statements as TestSQLite; too slow on the pure-Go driver under -race")
	}
}

// testAdminReplayOnlyFailed: Replay changes failed rows
// and nothing else, whatever the caller names: a sent event put back to
// pending is delivered again, and a pending one loses its attempts and its
// backoff.
func testAdminReplayOnlyFailed(t *testing.T, b backend) {
	e := b.setup(t)
	ctx := t.Context()
	adminFixture(t, e, nil)
	sent, pending := e.record("ship-0"), e.record("ship-1")
	require.Equal(t, StatusSent, sent.Status)
	require.Equal(t, StatusPending, pending.Status)
	require.Equal(t, 1, pending.Attempts)
	unchanged := func(want Row) {
		t.Helper()
		got := e.record(want.ID)
		assert.Equal(t, want.Status, got.Status, "%s", want.ID)
		assert.Equal(t, want.Attempts, got.Attempts, "%s", want.ID)
		assert.True(t, want.AvailableAt.Equal(got.AvailableAt), "%s: available_at %v, was %v", want.ID, got.AvailableAt, want.AvailableAt)
		assert.Equal(t, want.SentAt, got.SentAt, "%s", want.ID)
	}

	n, err := e.ob.Replay(e.db.WithContext(ctx), Filter{IDs: []string{"ship-0", "ship-1", "nope"}})
	require.NoError(t, err)
	assert.Equal(t, 0, n, "Replay changes failed events only")
	unchanged(sent)
	unchanged(pending)

	n, err = e.ob.Replay(e.db.WithContext(ctx), Filter{Statuses: []Status{StatusFailed, StatusPending}, AggregateID: "2"})
	require.NoError(t, err)
	assert.Equal(t, 1, n, "pay-1 only")
	assert.Equal(t, StatusPending, e.record("pay-1").Status)
	unchanged(pending)

	n, err = e.ob.Replay(e.db.WithContext(ctx), Filter{Statuses: []Status{StatusSent, StatusFailed}, AggregateID: "1"})
	require.NoError(t, err)
	assert.Equal(t, 1, n, "pay-0 only")
	unchanged(sent)
}

// testRetentionDeletesOnlySent: retention deletes sent rows past the
// window and nothing else, however old the other rows are, and whatever
// their other time columns hold.
func testRetentionDeletesOnlySent(t *testing.T, b backend) {
	e := b.setup(t)
	ctx := t.Context()
	e.ob.Handle("ok", func(context.Context, Event) error { return nil })
	e.ob.Handle("bad", func(context.Context, Event) error { return Permanent(errors.New("no")) })
	e.ob.Handle("later", func(context.Context, Event) error { return RetryAfter(errors.New("later"), 24*time.Hour) })
	publishN(t, e.db, "ok", 3)
	publishN(t, e.db, "bad", 2)
	publishN(t, e.db, "later", 2)
	_, err := e.relay(RelayConfig{}).ProcessOnce(ctx)
	require.NoError(t, err)
	publishN(t, e.db, "unclaimed", 2) // no handler, never claimed
	if b.logical {                    // Logical mode's Publish writes no row: another relay parks the events in the table
		e.parkInTable(t)
	}
	// A pending row that carries a sent time (as one replayed by hand
	// would): only its status keeps it.
	require.NoError(t, e.db.Table(e.ob.Table()).Where("named_id IN ?", []string{"later-00000", "bad-00000"}).Update("sent_at", e.timeArg(e.ob.now())).Error)

	e.clock.Advance(48 * time.Hour)
	sqlDB, err := e.db.DB()
	require.NoError(t, err)
	n, err := maint.Retention(e.ob.store, nil, sqlDB, time.Hour, defaultStatementTimeout, e.ob.now).Pass(ctx)
	require.NoError(t, err)
	assert.EqualValues(t, 3, n)
	assert.EqualValues(t, 0, e.count("status = ?", StatusSent))
	assert.EqualValues(t, 2, e.count("status = ?", StatusFailed), "failed rows are never deleted")
	assert.EqualValues(t, 4, e.count("status = ?", StatusPending), "pending rows are never deleted")
}

func init() {
	adminTests["AdminRetryNow"] = testAdminRetryNow
}

// testAdminRetryNow: RetryNow makes the pending events waiting for a retry
// due at once, keeping their attempts, with a history entry; it touches
// nothing else, and refuses a filter without pending.
func testAdminRetryNow(t *testing.T, b backend) {
	e := b.setup(t)
	ctx := WithActor(t.Context(), "bob@ops")
	db := e.db.WithContext(ctx)
	fixed := false
	e.ob.Handle("slow", func(context.Context, Event) error {
		if fixed {
			return nil
		}
		return RetryAfter(errors.New("receiver: 503"), time.Hour)
	})
	e.ob.Handle("bad", func(context.Context, Event) error { return Permanent(errors.New("422")) })
	publishN(t, e.db, "slow", 2)
	publishN(t, e.db, "bad", 1)
	r := e.relay(RelayConfig{Workers: 1})
	_, err := r.ProcessOnce(t.Context())
	require.NoError(t, err)
	n, err := r.ProcessOnce(t.Context())
	require.NoError(t, err)
	require.Zero(t, n, "the slow events wait an hour")

	_, err = e.ob.RetryNow(db, Filter{Statuses: []Status{StatusFailed}})
	require.ErrorIs(t, err, ErrInvalidFilter)
	n, err = e.ob.RetryNow(db, Filter{Types: []string{"bad"}})
	require.NoError(t, err)
	assert.Zero(t, n, "a failed event is replayed, not retried")

	e.clock.Advance(time.Second)
	n, err = e.ob.RetryNow(db, Filter{Types: []string{"slow"}})
	require.NoError(t, err)
	assert.Equal(t, 2, n)
	for _, id := range []string{"slow-00000", "slow-00001"} {
		row, err := e.ob.Get(db, id)
		require.NoError(t, err)
		assert.Equal(t, StatusPending, row.Status)
		assert.Equal(t, 1, row.Attempts, "its attempt is kept")
		assert.False(t, row.AvailableAt.After(e.ob.now()), "due now")
		h, err := e.ob.History(db, id)
		require.NoError(t, err)
		if assert.Len(t, h, 2) {
			assert.Equal(t, OutcomeRetried, h[1].Outcome)
			assert.Equal(t, "bob@ops", h[1].Actor)
			assert.Contains(t, h[1].Error, "receiver: 503")
		}
	}
	n, err = e.ob.RetryNow(db, Filter{})
	require.NoError(t, err)
	assert.Zero(t, n, "nothing waits any more")

	fixed = true
	n, err = r.ProcessOnce(t.Context())
	require.NoError(t, err)
	assert.Equal(t, 2, n, "delivered at once")
	assert.EqualValues(t, 2, e.count("status = ?", StatusSent))
}
