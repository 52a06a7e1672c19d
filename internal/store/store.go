// Package store is the outbox's storage seam, in the manner of river's
// driver executor: every statement the outbox runs lives in one package per
// database beneath it (postgres, mysql, sqlite), behind the interfaces of
// this package. Each method takes a context, the connection or transaction
// to run on and typed parameters, runs its own statements, scans its own
// columns and returns typed results; the callers (the root package, the
// engine, the WAL source, the background services) never see SQL.
//
// A store is a core that every database implements ([Store]: the schema,
// Publish's INSERT, the claim and its outcomes, retention, the operating
// reads and writes) and feature roles that a store implements or not,
// found by an interface check: [Inbox], [Overview], [History], [Notifier],
// [Logical], [Replicas], [Walker]. A feature whose role the store lacks is
// refused by the root with errs.ErrUnsupportedFeature.
//
// Stores register with a priority and a probe ([Register]); storetest is
// the conformance suite every store runs, and it fails when a method of a
// role the store implements was never exercised.
//
// It is internal: the root package is the public face, and converts its
// types (Event, Filter, Row) to and from the plain ones here.
package store

import (
	"context"
	"crypto/md5"
	"database/sql"
	"errors"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"
)

// DB runs statements: a *sql.DB, a *sql.Tx, a *sql.Conn, or the
// connection pool of a GORM session or transaction (gorm.ConnPool).
type DB interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// ErrTooManyParams is the error of a statement a store built with more
// parameters than its database takes (Limits.MaxParams): a store that
// chunks wrongly fails loudly, in the suite, instead of at the database.
var ErrTooManyParams = errors.New("outbox: statement exceeds the database's parameter limit")

// RowID is the id column's UUID of an event ID: the ID itself when it is the
// canonical text of a UUID (every generated ID), else one derived from it,
// the MD5 of "outbox:" and the ID, as the PostgreSQL and MySQL version 3
// upgrade scripts compute it (SQLite's keeps the old text in id). The ID a
// publisher chose is kept as it is in named_id, which is what reads it.
func RowID(id string) uuid.UUID {
	if u, err := uuid.Parse(id); err == nil && u.String() == id {
		return u
	}
	return uuid.UUID(md5.Sum([]byte("outbox:" + id)))
}

// Event is an event as it is written to the table: validated, every
// default filled in, payload and headers in their stored JSON form.
type Event struct {
	ID, Type, AggregateType, AggregateID, Key string
	Payload                                   []byte
	Headers                                   []byte // nil when there are none
	OccurredAt                                time.Time
	// Generated: the publisher chose neither the ID nor the key, so the
	// event cannot be a duplicate of another.
	Generated bool
	// NamedID: the publisher chose the ID (it goes to named_id, where it
	// is unique); otherwise it is a fresh UUIDv7.
	NamedID bool
}

// Inserted is what an Insert wrote.
type Inserted struct {
	// Seqs are the seqs of the rows written, in no particular order, when
	// they were asked for and the store can tell; nil otherwise.
	Seqs []int64
	// Written is how many rows were written; -1 when the driver cannot
	// say.
	Written int
}

// Held is what the table holds under an event ID: the idempotency key
// and when the row was written.
type Held struct {
	Key     string
	Created time.Time
}

// Claimed is one row a claim leased, as the relay delivers it.
type Claimed struct {
	Seq                                       int64 // the database's write order
	ID, Type, AggregateType, AggregateID, Key string
	Payload                                   []byte
	Headers                                   []byte // JSON, nil when there are none
	Attempts                                  int
	OccurredAt, CreatedAt                     time.Time
	// Fresh: a new row (available_at NULL), which the claim read by seq.
	Fresh bool
}

// ClaimSpec is what one claim asks for.
type ClaimSpec struct {
	Now, Lease time.Time
	Limit      int
	Seqs       []int64 // only these rows, when set (DeliverAfterCommit)
	Ordered    bool    // RelayConfig.OrderByAggregate
	// From is the relay's watermark: new rows (Walker stores) are read
	// from this seq on, and at the seqs in Gaps, which the watermark
	// passed while they were not committed yet.
	From int64
	Gaps []int64
}

// Outcome is the recorded result of a failed attempt: the row's next
// status, its error text and when it is next due.
type Outcome struct {
	Seq             int64
	ID, Status, Err string
	Due             time.Time
}

// Filter selects rows for the operating functions (outbox.Filter).
type Filter struct {
	IDs, Keys, Statuses, Types []string
	AggregateType, AggregateID string
	CreatedSince, CreatedUntil time.Time
	ErrorContains              string
}

// Page is one page of a listing (outbox.ListParams).
type Page struct {
	Filter
	Limit               int
	AfterSeq, BeforeSeq int64
	Newest              bool
}

// Row is one row of the table as the operating functions read it.
type Row struct {
	Seq                                            int64
	ID, EventType, AggregateType, AggregateID, Key string
	Payload                                        string
	Headers, LastError                             *string
	Status                                         string
	Attempts                                       int
	AvailableAt, OccurredAt, CreatedAt, UpdatedAt  time.Time
	LockedUntil, SentAt                            *time.Time
}

// StatusCount is one line of the table's statistics.
type StatusCount struct {
	Status string
	N      int64
	Oldest time.Time // of the rows in that status
}

// Replay is what Replay puts back to pending.
type Replay struct {
	Filter
	// Now reads the clock, once per batch: the time each batch's rows are
	// due and recorded at.
	Now func() time.Time
	// Actor is who replays, written into each replayed event's history
	// (History stores); "" when not given.
	Actor string
}

// Limits are a store's bounds: its database's parameter limit, which every
// statement it builds stays within, and the batch sizes its callers use.
type Limits struct {
	// MaxParams is the most parameters one statement may have.
	MaxParams int
	// InsertRows is how many rows one INSERT writes: Publish gives a call
	// of more events outside a transaction one of its own, so that the
	// statements commit together.
	InsertRows int
	// OutcomeRows is how many outcomes a relay gathers before it writes
	// them (the store chunks every call by its own limit whatever the
	// size).
	OutcomeRows int
	// RetentionBatch is how many rows one retention DELETE removes.
	RetentionBatch int
}

// Store is the core every database implements: the schema, Publish's
// INSERT, the claim and the lease-guarded outcome statements, retention,
// and the operating functions' reads and writes. Every outcome statement
// touches only pending rows whose lease is still the given one: a relay
// that lost its lease must not overwrite a row claimed since.
type Store interface {
	// Name is the store's name, as SchemaSQL takes it.
	Name() string
	Limits() Limits

	// Check inspects the database when the outbox is installed and
	// refuses settings that would fail later, with an error that names
	// the setting to change; it may log advice.
	Check(ctx context.Context, db *gorm.DB, logger *slog.Logger) error
	// Schema is the DDL that creates the table, its indexes and the
	// tables of the store's features beside it.
	Schema() string
	// Upgrade is the script that turns a table of version from into
	// version from+1, "" when the database never had version from.
	Upgrade(from int) string
	// Version reports the table's schema version: 0 when there is none.
	Version(ctx context.Context, db DB) (int, error)
	// Exists reports whether the table or index named name exists (a
	// PostgreSQL index a failed concurrent build left invalid does not).
	Exists(ctx context.Context, db DB, name string) (bool, error)
	// Migrate brings the table to the current schema version: it upgrades
	// a table of an earlier version in place, under a lock, so that of
	// several processes starting at once one upgrades; then it creates
	// whatever is missing. It reads the catalog first: even CREATE ... IF
	// NOT EXISTS takes a lock that would queue behind open publishing
	// transactions on PostgreSQL.
	Migrate(ctx context.Context, db *sql.DB) error
	// EnsureOrdering builds the index OrderByAggregate's probe reads,
	// without blocking writers where the database can, unless it exists.
	// Relays that start together race to build it: the ones that lose
	// find it built, and return nil.
	EnsureOrdering(ctx context.Context, db *sql.DB) error

	// Insert writes rows as pending events, on db (Publish's
	// transaction), in as many statements as the store's limits take: a
	// row whose chosen ID or chosen key is already in the table is skipped
	// (the first write wins). IDs and keys are unique each among their own
	// kind: an event whose key equals an earlier event's ID, or whose ID
	// equals an earlier event's key, is written, on every database; so is
	// a row whose ID was generated, which enters neither index. With
	// seqs, it tells the seqs of the rows it wrote where it can (Inserted).
	Insert(ctx context.Context, db DB, rows []Event, now time.Time, seqs bool) (Inserted, error)
	// Held reads the key and creation time of the rows whose publisher
	// chose one of ids as ID or one of keys as key, by ID: the one lookup
	// behind every duplicate check (Publish's in Persistent mode, the
	// stream's in Logical mode). An ID held with another key than the
	// event's is a different event reusing it.
	Held(ctx context.Context, db DB, ids, keys []string) (map[string]Held, error)

	// Claim takes up to c.Limit due pending rows (each source oldest
	// first; the relay sorts a batch by seq), moves their lease to
	// c.Lease, counts an attempt, and returns them. Concurrent claims
	// never return the same row while its lease lives; with c.Ordered,
	// never a row behind an unsent older row of its aggregate.
	Claim(ctx context.Context, db *sql.DB, c ClaimSpec) ([]Claimed, error)
	// MarkSent records the rows at seqs delivered; it returns how many it
	// changed.
	MarkSent(ctx context.Context, db DB, seqs []int64, now, lease time.Time) (int64, error)
	// MarkFailed records failed attempts: each row gets its own status
	// (pending for a retry, failed when out of attempts), error and next
	// due time.
	MarkFailed(ctx context.Context, db DB, outs []Outcome, now, lease time.Time) (int64, error)
	// Release hands claimed rows back undelivered: due now, the claim's
	// attempt taken back.
	Release(ctx context.Context, db DB, seqs []int64, now, lease time.Time) (int64, error)
	// DeleteSent deletes up to limit rows sent before before.
	DeleteSent(ctx context.Context, db DB, before time.Time, limit int) (int64, error)

	// List reads one page of the rows matching p, by seq, so that paging
	// with AfterSeq or BeforeSeq is stable while rows are added.
	List(ctx context.Context, db DB, p Page) ([]Row, error)
	// Get reads the row of the event with the ID id; found is false when
	// the table holds none.
	Get(ctx context.Context, db DB, id string) (row Row, found bool, err error)
	// Count counts the rows matching f.
	Count(ctx context.Context, db DB, f Filter) (int64, error)
	// Replay puts the failed rows matching r back to pending, due now,
	// their attempts reset, in batches of rows read beforehand that still
	// match and are still failed (never another status, whatever the
	// filter says), recording each replay in the event's history (History
	// stores). It returns how many it replayed, those of the batches
	// before an error included.
	Replay(ctx context.Context, db DB, r Replay) (int, error)
	// RetryNow makes the pending rows matching r that wait for a retry
	// (due later, no lease holding them) due now, in batches as Replay,
	// and records it in each one's history (History stores). Their
	// attempts are kept. It returns how many it changed.
	RetryNow(ctx context.Context, db DB, r Replay) (int, error)
	// Purge deletes the rows matching f in batches of rows read
	// beforehand that still match, with their history, and returns how
	// many it deleted, those of the batches before an error included. The
	// caller says which statuses it may touch.
	Purge(ctx context.Context, db DB, f Filter) (int, error)
	// Stats counts the rows by status, with the oldest creation of each.
	Stats(ctx context.Context, db DB) ([]StatusCount, error)
	// FailedSince counts the rows marked failed at or after since (a
	// failed row's updated_at is when it failed, or was last touched by
	// an operator).
	FailedSince(ctx context.Context, db DB, since time.Time) (int64, error)
	// IDColumn is the SQL expression, over the table's own columns, that
	// reads an event's ID, for SQL of the user's own (outbox.IDColumn).
	IDColumn() string
}

// Inbox is the consumer side's table: the (consumer, message ID) pairs
// consumed, each recorded in the transaction of its effect. Its table is
// named apart from the outbox table's, so every method takes it (unquoted).
type Inbox interface {
	// InboxSchema is the DDL that creates the inbox table named table.
	InboxSchema(table string) string
	// MigrateInbox creates the inbox table named table and its index
	// unless they exist.
	MigrateInbox(ctx context.Context, db *sql.DB, table string) error
	// Record records the pair on db unless it is already recorded, and
	// reports whether it recorded it. A concurrent transaction that
	// recorded the same pair and has not yet ended makes it wait for that
	// transaction's outcome (the unique key's lock), so of two deliveries
	// of one message only one goes on.
	Record(ctx context.Context, db DB, table, consumer, messageID string, now time.Time) (recorded bool, err error)
	// RetryRecord reports whether err, Record's, ended a transaction that
	// may simply run again (a race that running it again wins).
	RetryRecord(err error) bool
	// ForgetConsumed deletes up to limit pairs consumed before before.
	ForgetConsumed(ctx context.Context, db DB, table string, before time.Time, limit int) (int64, error)
}

// InboxLead is an Inbox whose Record can travel with the BEGIN of its
// transaction, in one round trip.
type InboxLead interface {
	// CanLead reports whether db's driver begins a transaction with a Lead
	// in one round trip. An error leaves the question open, to be asked
	// again.
	CanLead(ctx context.Context, db *sql.DB) (bool, error)
	// RecordLead is Record as the first statement of a transaction that a
	// Lead begins.
	RecordLead(table, consumer, messageID string, now time.Time) Lead
}

// Lead begins a transaction on a connection held out of the pool, with its
// first statement in the BEGIN's round trip, and ends it: the store runs
// both (the driver decides how: pgx pipelines them, MySQL's runs one text
// of two statements with multiStatements).
type Lead interface {
	// Begin begins the transaction on conn and runs the first statement;
	// affected is how many rows it affected.
	Begin(ctx context.Context, conn *sql.Conn) (affected int64, err error)
	// End commits (commit) or rolls back the transaction on conn. reuse
	// reports whether conn is outside any transaction afterwards, and may
	// go back to the pool.
	End(ctx context.Context, conn *sql.Conn, commit bool) (reuse bool, err error)
}

// DefaultInbox is the inbox table name the shipped schema files use.
const DefaultInbox = "outbox_inbox"

// Overview is the overview's store: a rollup of the sent rows per minute and
// type, kept by the relays and by Overview itself, and the pending and
// failed rows read through their indexes. None is on the write path.
type Overview interface {
	// RollState reads the rollup's state; found is false when there is
	// none yet.
	RollState(ctx context.Context, db DB) (st RollState, found bool, err error)
	// RollBegin starts one pass of the rollup on tx, a transaction of its
	// own: it takes the rollup's lock (of two passes, one waits and then
	// finds the rows the other rolled up), creating the state from the
	// oldest sent row (or from, when none is sent) on the first pass, and
	// returns the state under the lock.
	RollBegin(ctx context.Context, tx DB, from time.Time) (RollState, error)
	// SentBins counts the rows sent in [from, to) by type, minute sent,
	// minute created and delay bin.
	SentBins(ctx context.Context, db DB, from, to time.Time) ([]SentBin, error)
	// RollCommit ends a pass on tx: it adds rows to the rollup (each
	// column to the row already there), deletes each span's minutes
	// before its Keep from now, and writes the state.
	RollCommit(ctx context.Context, tx DB, rows []RollRow, now time.Time, st RollState) error
	// ReadOverview reads what an overview folds, in one snapshot where the
	// database gives one without blocking writers.
	ReadOverview(ctx context.Context, db *sql.DB, q OverviewQuery) (OverviewRows, error)
}

// DelayBounds are the upper bounds, in milliseconds, of the bins of the
// delivery delay (created to sent) the rollup counts; the last bin, past
// the last bound, has none.
var DelayBounds = []float64{1, 2.5, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000, 300000, 1800000}

// RollSpans are the rollup's spans, in minutes, each with how long its
// rows are kept: charts over an hour read minutes, over a day ten minutes,
// over a week hours, so that none reads more than a few thousand rows.
var RollSpans = []struct {
	Minutes int64
	Keep    time.Duration
}{{1, 25 * time.Hour}, {10, 8 * 24 * time.Hour}, {60, 8 * 24 * time.Hour}}

// RollState is the rollup's state: the rows sent before Until are in the
// rollup; from Low on (Walker stores) the new pending rows are read by seq,
// below it only the retry index holds pending rows; Checked is when Low
// was last checked against the whole table.
type RollState struct {
	Until, Checked time.Time
	Low            int64
}

// RollRow is what one rollup pass adds to one span of one event type:
// the sent events created in the minute, the events sent in it, and the
// latter's delays by bin (len(DelayBounds)+1).
type RollRow struct {
	Span                 int64 // minutes: one of RollSpans
	Minute               int64 // whole minutes since the Unix epoch, a multiple of Span
	Type                 string
	Published, Delivered int64
	Delay                []int64
}

// SentBin counts the rows of one type sent in one minute, created in one
// minute, with a delay in one bin of DelayBounds.
type SentBin struct {
	Type          string
	Sent, Created int64 // minutes since the Unix epoch
	Bin           int
	N             int64
}

// OverviewQuery is what ReadOverview reads: the rollup's span Span from
// SinceMinute on, summed per interval of Step minutes; the rows sent from
// SentFrom (the rollup's end) on; the pending rows (new ones from Low on,
// for Walker stores) and the failed rows. With Now alone, only the pending
// and failed rows (outbox.Stats).
type OverviewQuery struct {
	Span, SinceMinute, Step int64
	SentFrom, SentTo        time.Time
	Low                     int64
	Now                     bool
}

// OverviewRows is what ReadOverview read.
type OverviewRows struct {
	Rollup  []RollupSum
	Sent    []SentBin
	Pending []PendingGroup
	Failed  []FailedGroup
}

// RollupSum is the rollup's sums of one type in one interval (its index
// from SinceMinute).
type RollupSum struct {
	Interval             int
	Type                 string
	Published, Delivered int64
	Delay                []int64
}

// PendingGroup counts the pending rows of one type created in one minute.
type PendingGroup struct {
	Type    string
	Created int64 // minutes since the Unix epoch
	N       int64
	Oldest  time.Time
}

// FailedGroup counts the failed rows of one type by the minute they failed
// and the minute they were created.
type FailedGroup struct {
	Type            string
	Failed, Created int64 // minutes since the Unix epoch
	N               int64
}

// History is the event history: an entry per failed attempt and per
// replay, in a table beside the outbox table, written only on those paths.
type History interface {
	// RecordAttempts records the failed attempts of the rows at seqs that
	// an outcome statement at now just wrote (a row whose lease another
	// relay holds was not written, and is not recorded).
	RecordAttempts(ctx context.Context, db DB, seqs []int64, now time.Time) (int64, error)
	// Attempts reads the history of the event with the ID id, oldest
	// first.
	Attempts(ctx context.Context, db DB, id string) ([]Attempt, error)
	// ForgetAttempts deletes up to limit entries older than before.
	ForgetAttempts(ctx context.Context, db DB, before time.Time, limit int) (int64, error)
}

// Attempt is one entry of an event's history.
type Attempt struct {
	At           time.Time
	Attempt      int
	Outcome      string // "retry", "failed", "replayed" or "retried"
	Error, Actor string
}

// The outcomes of an Attempt.
const (
	AttemptRetry    = "retry"
	AttemptFailed   = "failed"
	AttemptReplayed = "replayed"
	AttemptRetried  = "retried"
)

// Relays is where the relays of a table record that they run: a row per
// relay, which it writes every few seconds while it runs (outbox.Stats'
// Relays, the dashboard's relays panel).
type Relays interface {
	// Beat writes the relay's row: inserted the first time, replaced
	// after.
	Beat(ctx context.Context, db DB, r RelayRow) error
	// Relays reads the rows of the relays seen at or after since (all of
	// them with since zero), by name.
	Relays(ctx context.Context, db DB, since time.Time) ([]RelayRow, error)
	// ForgetRelays deletes the rows of the relays not seen since before.
	ForgetRelays(ctx context.Context, db DB, before time.Time) (int64, error)
}

// RelayRow is one relay's row.
type RelayRow struct {
	ID, Name, Host string
	PID            int
	Mode           string
	Started, Seen  time.Time
	// LastClaim and LastDelivery are when it last claimed events and last
	// delivered one; zero for never.
	LastClaim, LastDelivery time.Time
	// LastError is its last cycle's error, "" when that cycle went
	// through.
	LastError string
}

// Walker is implemented by a store whose new events are written due at once
// (available_at NULL) and found by seq, from a watermark the relay keeps,
// instead of through an index of pending rows every INSERT would enter.
type Walker interface {
	// Walk reads, from seq from on and in seq order, up to limit rows; and
	// first the rows at the seqs gaps, all below from.
	Walk(ctx context.Context, db DB, from int64, limit int, gaps []int64, now time.Time) ([]WalkRow, error)
	// Defer makes the open rows with the seqs that no lease holds at now
	// due now, through the retry index.
	Defer(ctx context.Context, db DB, seqs []int64, now time.Time) (int64, error)
	// LowOpen reads the lowest seq from from on of an open row (new and
	// pending) that no lease holds at now (with now zero, leased or not),
	// and the highest seq of the table; 0 stands for none.
	LowOpen(ctx context.Context, db DB, from int64, now time.Time) (low, high int64, err error)
}

// WalkRow is one row a Walk read.
type WalkRow struct {
	Seq int64
	// Open: new and pending; Leased: a lease holds it at the walk's now,
	// until LeaseEnd.
	Open, Leased bool
	LeaseEnd     time.Time
}

// Replicas is implemented by a store whose database streams its WAL to
// standbys it can list (PostgreSQL).
type Replicas interface {
	// WALInsertPosition reads the server's current WAL write position.
	WALInsertPosition(ctx context.Context, db DB) (string, error)
	// ReplicasFlushed counts the standbys that have flushed the WAL up to
	// the position lsn to disk.
	ReplicasFlushed(ctx context.Context, db DB, lsn string) (int, error)
}

// Notifier is implemented by a store whose database can wake relays in
// other processes (PostgreSQL's LISTEN/NOTIFY).
type Notifier interface {
	// Channel is the channel of the outbox's wake-ups in schema public.
	Channel() string
	// PrepareNotify resolves, on db, the wake-up of db's schema and
	// returns the function that sends it on a connection of the same
	// database: a statement without arguments, which the driver sends as
	// one simple query with nothing to plan. A writer resolves it once per
	// pool and sends it after every commit that wrote events.
	PrepareNotify(ctx context.Context, db DB) (notify func(ctx context.Context, conn DB) error, err error)
	// Listen listens on conn, a connection taken from db's pool for
	// this alone, calls ready once listening, then wake for every
	// notification, until ctx ends or the connection fails. It returns
	// ErrListenUnsupported when the driver cannot listen.
	Listen(ctx context.Context, conn *sql.Conn, ready, wake func()) error
}

// ErrListenUnsupported: the database/sql driver cannot LISTEN.
var ErrListenUnsupported = errors.New("the database driver is not pgx (github.com/jackc/pgx/v5/stdlib)")

// ParkRow is a row Logical mode's stream writes to the table: a failed
// attempt (to retry, or failed for good), an event held back behind its
// aggregate or handed back, or, leased to the stream, an event checked
// against the table before it is delivered.
type ParkRow struct {
	Event    Event
	Status   string
	Attempts int
	LastErr  string    // "" for none
	Due      time.Time //
	Lease    time.Time // zero for none
	Created  time.Time
}

// Aggregate names an aggregate.
type Aggregate struct{ Type, ID string }

// SlotStats is a replication slot's state.
type SlotStats struct {
	Active   bool  // a relay streams it now
	LagBytes int64 // the WAL it keeps
}

// Logical is implemented by a store whose database can carry events in
// its WAL (PostgreSQL's logical decoding messages, Logical mode).
type Logical interface {
	// CheckLogical refuses a server that cannot decode the WAL or a role
	// that may not stream it, naming the setting to change.
	CheckLogical(ctx context.Context, db *sql.DB) error
	// CreateSlot creates the publication and the slot named slot when
	// missing. replaced reports a slot created where its publication
	// already was: the slot was lost (a failover to a standby without a
	// copy of it, or a DROP), and the events committed before it that the
	// old one had not streamed are out of reach; CreateSlot logs that at
	// Error.
	CreateSlot(ctx context.Context, db *sql.DB, slot string, logger *slog.Logger) (replaced bool, err error)
	// Emit writes content into the transaction's WAL as one message with
	// the prefix, unless the slot does not exist (or is not usable yet, or
	// lost): emitted reports whether it did.
	Emit(ctx context.Context, db DB, slot, prefix string, content []byte) (emitted bool, err error)
	// Park inserts rows in the order given (seq follows it), in as many
	// statements as the store's limits take, and returns the seq of each
	// row it inserted by its ID; a row whose ID or key is in the table
	// already is skipped. A parked row's ID is always in named_id
	// (unique): the stream may offer the same event again.
	Park(ctx context.Context, db DB, rows []ParkRow, now time.Time) (map[string]int64, error)
	// Blocked returns the aggregates among aggs that have an unsent row.
	Blocked(ctx context.Context, db DB, aggs []Aggregate) (map[Aggregate]bool, error)
	// SlotStats reads whether the slot is streamed and the WAL it keeps;
	// an error wrapping errs.ErrNoSlot when there is no such slot.
	SlotStats(ctx context.Context, db DB, slot string) (SlotStats, error)
	// WALPosition reads the server's flushed WAL position.
	WALPosition(ctx context.Context, db DB) (uint64, error)
	// SlotHeldBy reads whether the walsender with that PID streams slot.
	SlotHeldBy(ctx context.Context, db DB, slot string, pid uint32) (bool, error)
}
