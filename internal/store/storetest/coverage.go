package storetest

import (
	"context"
	"database/sql"
	"flag"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gorm-outbox/outbox/internal/store"
	"gorm.io/gorm"
)

// roles are the interfaces of package store a store implements, the core
// and each feature role. The coverage check demands, of every one the
// store under test implements, that each of its methods (enumerated by
// reflection, so that a method added later is demanded too) was called
// by the suite; TestRolesListed fails when package store declares a role
// this list lacks.
var roles = []reflect.Type{
	reflect.TypeFor[store.Store](),
	reflect.TypeFor[store.Inbox](),
	reflect.TypeFor[store.InboxLead](),
	reflect.TypeFor[store.Overview](),
	reflect.TypeFor[store.History](),
	reflect.TypeFor[store.Walker](),
	reflect.TypeFor[store.Notifier](),
	reflect.TypeFor[store.Logical](),
	reflect.TypeFor[store.Replicas](),
	reflect.TypeFor[store.Relays](),
}

// calls counts the calls of a store's methods by name, across the
// subtests of one Exercise (each on a store of its own).
type calls struct {
	mu sync.Mutex
	n  map[string]int
}

func (c *calls) add(method string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.n == nil {
		c.n = map[string]int{}
	}
	c.n[method]++
}

func (c *calls) snapshot() map[string]int {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make(map[string]int, len(c.n))
	for k, v := range c.n {
		out[k] = v
	}
	return out
}

// uncalled names, as "Role.Method", each method of each role s
// implements that called holds no call of.
func uncalled(s any, called map[string]int) []string {
	t := reflect.TypeOf(s)
	var out []string
	for _, role := range roles {
		if t == nil || !t.Implements(role) {
			continue
		}
		for i := range role.NumMethod() {
			m := role.Method(i).Name
			if called[m] == 0 {
				out = append(out, role.Name()+"."+m)
			}
		}
	}
	return out
}

// reporter is what checkCoverage reports to: a *testing.T.
type reporter interface {
	Helper()
	Name() string
	Errorf(format string, args ...any)
	Logf(format string, args ...any)
}

var _ reporter = (*testing.T)(nil)

// wholeSuite reports whether the test binary runs every subtest of t: a
// -run whose pattern reaches below t's level, or any -skip, may leave
// some out (and their methods uncalled), and the coverage check is then
// not made.
func wholeSuite(t reporter) bool {
	if f := flag.Lookup("test.skip"); f != nil && f.Value.String() != "" {
		return false
	}
	f := flag.Lookup("test.run")
	if f == nil || f.Value.String() == "" {
		return true
	}
	return len(strings.Split(f.Value.String(), "/")) <= strings.Count(t.Name(), "/")+1
}

// checkCoverage fails t for every method of a role s implements that no
// subtest called.
func checkCoverage(t reporter, s store.Store, c *calls) {
	t.Helper()
	if !wholeSuite(t) {
		t.Logf("storetest: -run or -skip selects subtests: the check that every method of %s's roles is exercised is not made", s.Name())
		return
	}
	missing := uncalled(s, c.snapshot())
	slices.Sort(missing)
	for _, m := range missing {
		t.Errorf("storetest: store %s (%T) implements %s, which no subtest of the suite called: add a check of it", s.Name(), s, m)
	}
}

// recorder is a store that counts each call by method name and hands it
// to the real store. It implements every role, so the sections never ask
// it which roles it has: they ask the real store (env.walker and the
// like), then call through the recorder. A role method called on a
// recorder whose store lacks the role panics: the section did not check.
type recorder struct {
	real  store.Store
	calls *calls
}

var (
	_ store.Store     = (*recorder)(nil)
	_ store.Inbox     = (*recorder)(nil)
	_ store.InboxLead = (*recorder)(nil)
	_ store.Overview  = (*recorder)(nil)
	_ store.History   = (*recorder)(nil)
	_ store.Walker    = (*recorder)(nil)
	_ store.Notifier  = (*recorder)(nil)
	_ store.Logical   = (*recorder)(nil)
	_ store.Replicas  = (*recorder)(nil)
	_ store.Relays    = (*recorder)(nil)
)

func (r *recorder) note(method string) { r.calls.add(method) }

// role is the real store as the role R.
func role[R any](r *recorder) R {
	x, ok := r.real.(R)
	if !ok {
		panic(fmt.Sprintf("storetest: %T implements no %s, and a section called it without asking", r.real, reflect.TypeFor[R]()))
	}
	return x
}

// The core, store.Store.

func (r *recorder) Name() string { r.note("Name"); return r.real.Name() }

func (r *recorder) Limits() store.Limits { r.note("Limits"); return r.real.Limits() }

func (r *recorder) Check(ctx context.Context, db *gorm.DB, logger *slog.Logger) error {
	r.note("Check")
	return r.real.Check(ctx, db, logger)
}

func (r *recorder) Schema() string { r.note("Schema"); return r.real.Schema() }

func (r *recorder) Upgrade(from int) string { r.note("Upgrade"); return r.real.Upgrade(from) }

func (r *recorder) Version(ctx context.Context, db store.DB) (int, error) {
	r.note("Version")
	return r.real.Version(ctx, db)
}

func (r *recorder) Exists(ctx context.Context, db store.DB, name string) (bool, error) {
	r.note("Exists")
	return r.real.Exists(ctx, db, name)
}

func (r *recorder) Migrate(ctx context.Context, db *sql.DB) error {
	r.note("Migrate")
	return r.real.Migrate(ctx, db)
}

func (r *recorder) EnsureOrdering(ctx context.Context, db *sql.DB) error {
	r.note("EnsureOrdering")
	return r.real.EnsureOrdering(ctx, db)
}

func (r *recorder) Insert(ctx context.Context, db store.DB, rows []store.Event, now time.Time, seqs bool) (store.Inserted, error) {
	r.note("Insert")
	return r.real.Insert(ctx, db, rows, now, seqs)
}

func (r *recorder) Held(ctx context.Context, db store.DB, ids, keys []string) (map[string]store.Held, error) {
	r.note("Held")
	return r.real.Held(ctx, db, ids, keys)
}

func (r *recorder) Claim(ctx context.Context, db *sql.DB, c store.ClaimSpec) ([]store.Claimed, error) {
	r.note("Claim")
	return r.real.Claim(ctx, db, c)
}

func (r *recorder) MarkSent(ctx context.Context, db store.DB, seqs []int64, now, lease time.Time) (int64, error) {
	r.note("MarkSent")
	return r.real.MarkSent(ctx, db, seqs, now, lease)
}

func (r *recorder) MarkFailed(ctx context.Context, db store.DB, outs []store.Outcome, now, lease time.Time) (int64, error) {
	r.note("MarkFailed")
	return r.real.MarkFailed(ctx, db, outs, now, lease)
}

func (r *recorder) Release(ctx context.Context, db store.DB, seqs []int64, now, lease time.Time) (int64, error) {
	r.note("Release")
	return r.real.Release(ctx, db, seqs, now, lease)
}

func (r *recorder) DeleteSent(ctx context.Context, db store.DB, before time.Time, limit int) (int64, error) {
	r.note("DeleteSent")
	return r.real.DeleteSent(ctx, db, before, limit)
}

func (r *recorder) List(ctx context.Context, db store.DB, p store.Page) ([]store.Row, error) {
	r.note("List")
	return r.real.List(ctx, db, p)
}

func (r *recorder) Get(ctx context.Context, db store.DB, id string) (store.Row, bool, error) {
	r.note("Get")
	return r.real.Get(ctx, db, id)
}

func (r *recorder) Count(ctx context.Context, db store.DB, f store.Filter) (int64, error) {
	r.note("Count")
	return r.real.Count(ctx, db, f)
}

func (r *recorder) Replay(ctx context.Context, db store.DB, rp store.Replay) (int, error) {
	r.note("Replay")
	return r.real.Replay(ctx, db, rp)
}

func (r *recorder) RetryNow(ctx context.Context, db store.DB, rp store.Replay) (int, error) {
	r.note("RetryNow")
	return r.real.RetryNow(ctx, db, rp)
}

func (r *recorder) Purge(ctx context.Context, db store.DB, f store.Filter) (int, error) {
	r.note("Purge")
	return r.real.Purge(ctx, db, f)
}

func (r *recorder) Stats(ctx context.Context, db store.DB) ([]store.StatusCount, error) {
	r.note("Stats")
	return r.real.Stats(ctx, db)
}

func (r *recorder) FailedSince(ctx context.Context, db store.DB, since time.Time) (int64, error) {
	r.note("FailedSince")
	return r.real.FailedSince(ctx, db, since)
}

func (r *recorder) IDColumn() string { r.note("IDColumn"); return r.real.IDColumn() }

// store.Inbox.

func (r *recorder) InboxSchema(table string) string {
	r.note("InboxSchema")
	return role[store.Inbox](r).InboxSchema(table)
}

func (r *recorder) MigrateInbox(ctx context.Context, db *sql.DB, table string) error {
	r.note("MigrateInbox")
	return role[store.Inbox](r).MigrateInbox(ctx, db, table)
}

func (r *recorder) Record(ctx context.Context, db store.DB, table, consumer, messageID string, now time.Time) (bool, error) {
	r.note("Record")
	return role[store.Inbox](r).Record(ctx, db, table, consumer, messageID, now)
}

func (r *recorder) RetryRecord(err error) bool {
	r.note("RetryRecord")
	return role[store.Inbox](r).RetryRecord(err)
}

func (r *recorder) ForgetConsumed(ctx context.Context, db store.DB, table string, before time.Time, limit int) (int64, error) {
	r.note("ForgetConsumed")
	return role[store.Inbox](r).ForgetConsumed(ctx, db, table, before, limit)
}

// store.InboxLead.

func (r *recorder) CanLead(ctx context.Context, db *sql.DB) (bool, error) {
	r.note("CanLead")
	return role[store.InboxLead](r).CanLead(ctx, db)
}

func (r *recorder) RecordLead(table, consumer, messageID string, now time.Time) store.Lead {
	r.note("RecordLead")
	return role[store.InboxLead](r).RecordLead(table, consumer, messageID, now)
}

// store.Overview.

func (r *recorder) RollState(ctx context.Context, db store.DB) (store.RollState, bool, error) {
	r.note("RollState")
	return role[store.Overview](r).RollState(ctx, db)
}

func (r *recorder) RollBegin(ctx context.Context, tx store.DB, from time.Time) (store.RollState, error) {
	r.note("RollBegin")
	return role[store.Overview](r).RollBegin(ctx, tx, from)
}

func (r *recorder) SentBins(ctx context.Context, db store.DB, from, to time.Time) ([]store.SentBin, error) {
	r.note("SentBins")
	return role[store.Overview](r).SentBins(ctx, db, from, to)
}

func (r *recorder) RollCommit(ctx context.Context, tx store.DB, rows []store.RollRow, now time.Time, st store.RollState) error {
	r.note("RollCommit")
	return role[store.Overview](r).RollCommit(ctx, tx, rows, now, st)
}

func (r *recorder) ReadOverview(ctx context.Context, db *sql.DB, q store.OverviewQuery) (store.OverviewRows, error) {
	r.note("ReadOverview")
	return role[store.Overview](r).ReadOverview(ctx, db, q)
}

// store.History.

func (r *recorder) RecordAttempts(ctx context.Context, db store.DB, seqs []int64, now time.Time) (int64, error) {
	r.note("RecordAttempts")
	return role[store.History](r).RecordAttempts(ctx, db, seqs, now)
}

func (r *recorder) Attempts(ctx context.Context, db store.DB, id string) ([]store.Attempt, error) {
	r.note("Attempts")
	return role[store.History](r).Attempts(ctx, db, id)
}

func (r *recorder) ForgetAttempts(ctx context.Context, db store.DB, before time.Time, limit int) (int64, error) {
	r.note("ForgetAttempts")
	return role[store.History](r).ForgetAttempts(ctx, db, before, limit)
}

// store.Walker.

func (r *recorder) Walk(ctx context.Context, db store.DB, from int64, limit int, gaps []int64, now time.Time) ([]store.WalkRow, error) {
	r.note("Walk")
	return role[store.Walker](r).Walk(ctx, db, from, limit, gaps, now)
}

func (r *recorder) Defer(ctx context.Context, db store.DB, seqs []int64, now time.Time) (int64, error) {
	r.note("Defer")
	return role[store.Walker](r).Defer(ctx, db, seqs, now)
}

func (r *recorder) LowOpen(ctx context.Context, db store.DB, from int64, now time.Time) (low, high int64, err error) {
	r.note("LowOpen")
	return role[store.Walker](r).LowOpen(ctx, db, from, now)
}

// store.Notifier.

func (r *recorder) Channel() string { r.note("Channel"); return role[store.Notifier](r).Channel() }

func (r *recorder) PrepareNotify(ctx context.Context, db store.DB) (func(context.Context, store.DB) error, error) {
	r.note("PrepareNotify")
	return role[store.Notifier](r).PrepareNotify(ctx, db)
}

func (r *recorder) Listen(ctx context.Context, conn *sql.Conn, ready, wake func()) error {
	r.note("Listen")
	return role[store.Notifier](r).Listen(ctx, conn, ready, wake)
}

// store.Logical.

func (r *recorder) CheckLogical(ctx context.Context, db *sql.DB) error {
	r.note("CheckLogical")
	return role[store.Logical](r).CheckLogical(ctx, db)
}

func (r *recorder) CreateSlot(ctx context.Context, db *sql.DB, slot string, logger *slog.Logger) (bool, error) {
	r.note("CreateSlot")
	return role[store.Logical](r).CreateSlot(ctx, db, slot, logger)
}

func (r *recorder) Emit(ctx context.Context, db store.DB, slot, prefix string, content []byte) (bool, error) {
	r.note("Emit")
	return role[store.Logical](r).Emit(ctx, db, slot, prefix, content)
}

func (r *recorder) Park(ctx context.Context, db store.DB, rows []store.ParkRow, now time.Time) (map[string]int64, error) {
	r.note("Park")
	return role[store.Logical](r).Park(ctx, db, rows, now)
}

func (r *recorder) Blocked(ctx context.Context, db store.DB, aggs []store.Aggregate) (map[store.Aggregate]bool, error) {
	r.note("Blocked")
	return role[store.Logical](r).Blocked(ctx, db, aggs)
}

func (r *recorder) SlotStats(ctx context.Context, db store.DB, slot string) (store.SlotStats, error) {
	r.note("SlotStats")
	return role[store.Logical](r).SlotStats(ctx, db, slot)
}

func (r *recorder) WALPosition(ctx context.Context, db store.DB) (uint64, error) {
	r.note("WALPosition")
	return role[store.Logical](r).WALPosition(ctx, db)
}

func (r *recorder) SlotHeldBy(ctx context.Context, db store.DB, slot string, pid uint32) (bool, error) {
	r.note("SlotHeldBy")
	return role[store.Logical](r).SlotHeldBy(ctx, db, slot, pid)
}

// store.Replicas.

func (r *recorder) WALInsertPosition(ctx context.Context, db store.DB) (string, error) {
	r.note("WALInsertPosition")
	return role[store.Replicas](r).WALInsertPosition(ctx, db)
}

func (r *recorder) ReplicasFlushed(ctx context.Context, db store.DB, lsn string) (int, error) {
	r.note("ReplicasFlushed")
	return role[store.Replicas](r).ReplicasFlushed(ctx, db, lsn)
}

// store.Relays.

func (r *recorder) Beat(ctx context.Context, db store.DB, row store.RelayRow) error {
	r.note("Beat")
	return role[store.Relays](r).Beat(ctx, db, row)
}

func (r *recorder) Relays(ctx context.Context, db store.DB, since time.Time) ([]store.RelayRow, error) {
	r.note("Relays")
	return role[store.Relays](r).Relays(ctx, db, since)
}

func (r *recorder) ForgetRelays(ctx context.Context, db store.DB, before time.Time) (int64, error) {
	r.note("ForgetRelays")
	return role[store.Relays](r).ForgetRelays(ctx, db, before)
}
