// Package store is the outbox's storage seam: every SQL statement the
// outbox runs lives in one package per database beneath it (postgres,
// mysql, sqlite), behind the interfaces of this package, split by role:
// the schema and its migration, the writer Publish uses, the claimer and
// outcome statements the relay uses, and the operating functions' queries.
// What only some databases can do (wake-ups through LISTEN/NOTIFY, Logical
// mode's WAL) are optional interfaces a store implements or not. Each
// store registers itself with a probe; storetest is the conformance suite
// every store runs.
//
// It is internal: the root package is the public face, and converts its
// types (Event, Filter, Row) to and from the plain ones here.
package store

import (
	"context"
	"crypto/md5"
	"database/sql"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"gorm.io/gorm"
)

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

// Query is one statement and its arguments. Statements never contain
// event data, only placeholders.
type Query struct {
	SQL  string
	Args []any
}

// Querier runs queries: a *sql.DB, a *sql.Tx, or a GORM connection pool.
type Querier interface {
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Execer runs statements.
type Execer interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
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
	// From is the relay's watermark: new rows (Fresh stores) are read from
	// this seq on, and at the seqs in Gaps, which the watermark passed
	// while they were not committed yet.
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
	IDs, Statuses, Types       []string
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

// Limits are a store's bounds on one statement, within its database's
// parameter limit, and the batch sizes of its maintenance statements.
type Limits struct {
	InsertRows     int // rows per INSERT
	OutcomeRows    int // rows per outcome statement
	AdminBatch     int // rows one Replay or Purge statement touches
	AdminScan      int // IDs one Replay or Purge SELECT reads
	RetentionBatch int // sent rows one retention DELETE removes
}

// Schema is the table's definition and migration.
type Schema interface {
	// Check inspects the database when the outbox is installed and
	// refuses settings that would fail later, with an error that names
	// the setting to change; it may log advice.
	Check(ctx context.Context, db *gorm.DB, logger *slog.Logger) error
	// Schema is the DDL that creates the table and its indexes.
	Schema() string
	// Upgrade is the script that turns a table of version from into
	// version from+1, "" when the database never had version from.
	Upgrade(from int) string
	// Version reports the table's schema version: 0 when there is none.
	Version(ctx context.Context, q Querier) (int, error)
	// Exists reports whether the table or index named name exists (a
	// PostgreSQL index a failed concurrent build left invalid does not).
	Exists(ctx context.Context, db *sql.DB, name string) (bool, error)
	// OrderingIndex is the index OrderByAggregate's probe reads: its name,
	// and the statements that build it without blocking writers where the
	// database can.
	OrderingIndex() (name string, ddl []string)
}

// Writer is what Publish runs on the caller's transaction.
type Writer interface {
	// Insert writes rows as pending events; a row whose chosen ID or
	// chosen key is already in the table is skipped (the first write
	// wins). IDs and keys are unique each among their own kind: an event
	// whose key equals an earlier event's ID, or whose ID equals an earlier
	// event's key, is written, on every database; so is a row whose ID was
	// generated, which enters neither index.
	// With seqs, the statement tells the seqs of the rows it wrote: with
	// Returning, it returns the seq of each row it inserted; without, the
	// store assigns consecutive seqs to the rows of one INSERT of
	// generated events (the driver's LastInsertId is the first). Without
	// seqs it returns no rows (a RETURNING clause costs the writer a
	// result set to read, and only DeliverAfterCommit needs them).
	Insert(rows []Event, now time.Time, seqs bool) Query
	Returning() bool
	// Held reads the ID, key and creation time of the rows whose
	// publisher chose one of ids as ID or one of keys as key.
	Held(ids, keys []string) Query
}

// Claimer is the relay's side of the table. Every outcome statement
// touches only pending rows whose lease is still the given one: a relay
// that lost its lease must not overwrite a row claimed since.
type Claimer interface {
	// Claim takes up to c.Limit due pending rows (each source oldest
	// first; the relay sorts a batch by seq), moves
	// their lease to c.Lease, counts an attempt, and returns them.
	// Concurrent claims never return the same row while its lease lives;
	// with c.Ordered, never a row behind an unsent older row of its
	// aggregate.
	Claim(ctx context.Context, db *sql.DB, c ClaimSpec) ([]Claimed, error)
	MarkSent(seqs []int64, now, lease time.Time) Query
	MarkFailed(outs []Outcome, now, lease time.Time) Query
	// Release hands claimed rows back undelivered: due now, the claim's
	// attempt taken back.
	Release(seqs []int64, now, lease time.Time) Query
	// DeleteSent deletes up to limit rows sent before before.
	DeleteSent(before time.Time, limit int) Query
}

// Admin is the operating functions' queries (List, Get, Count, Replay,
// Purge, Stats).
type Admin interface {
	List(p Page) Query                                   // rows in RowColumns' order
	Get(id string) Query                                 // likewise
	Count(f Filter) Query                                // one count
	ReplaySelect(f Filter, after int64, limit int) Query // seq of failed rows matching f, by seq
	ReplayUpdate(f Filter, seqs []int64, now time.Time) Query
	PurgeSelect(f Filter, limit int) Query // seq
	PurgeDelete(f Filter, seqs []int64) Query
	Stats() Query                      // status, count, oldest creation
	FailedSince(since time.Time) Query // one count
	// IDExpr is the SQL expression reading a row's event ID.
	IDExpr() string
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

// Overviewer is the overview's statements: a rollup of the sent rows per
// minute and type, kept by the relays and by Overview itself, and the
// pending and failed rows read through their indexes. None is on the
// write path.
type Overviewer interface {
	RollLock() Query               // affects the state row, 0 rows when there is none
	RollInit(from time.Time) Query // the state row, unless there is one
	RollState() Query              // rolled_until, low_seq, low_checked
	RollSet(until time.Time, low int64, checked time.Time) Query
	FirstSent() Query                               // the oldest sent_at, NULL when none
	SentBins(from, to time.Time) Query              // type, minute sent, minute created, delay bin, count
	RollAdd(rows []RollRow) Query                   //
	RollTrim(span, beforeMinute int64) Query        //
	LowScan(from int64) Query                       // lowest new pending seq >= from, highest seq
	PendingGroups(low int64) Query                  // type, minute created, count, oldest creation
	FailedGroups() Query                            // type, minute failed, minute created, count
	RollupRead(span, sinceMinute, step int64) Query // interval, type, published, delivered, delay bins
}

// Historian is the event history's statements: an entry per failed
// attempt and per replay, in a table beside the outbox table, written only
// on those paths.
type Historian interface {
	RecordAttempts(seqs []int64, now time.Time) Query
	RecordReplays(seqs []int64, now time.Time, actor string) Query
	Attempts(id string) Query // at, attempt, outcome, error, actor; oldest first
	ForgetAttempts(before time.Time, limit int) Query
	PurgeAttempts(seqs []int64) Query
}

// Inbox is the consumer side's table: the (consumer, message ID) pairs
// consumed, each recorded in the transaction of its effect. Its table is
// named apart from the outbox table's, so every method takes it (unquoted).
type Inbox interface {
	// InboxSchema is the DDL that creates the inbox table named table.
	InboxSchema(table string) string
	// Consume records the pair unless it is already recorded: one row
	// affected when it recorded it, none when the pair was there. A
	// concurrent transaction that recorded the same pair and has not yet
	// ended makes it wait for that transaction's outcome (the unique key's
	// lock), so of two deliveries of one message only one goes on.
	Consume(table, consumer, messageID string, now time.Time) Query
	// ForgetConsumed deletes up to limit pairs consumed before before.
	ForgetConsumed(table string, before time.Time, limit int) Query
}

// InboxRetrier is an Inbox whose Consume INSERT can lose a race that
// running its transaction again wins.
type InboxRetrier interface {
	// RetryRecord reports whether err, the inbox INSERT's, ended a
	// transaction that may simply run again.
	RetryRecord(err error) bool
}

// InboxLead is an Inbox whose Consume can travel with the BEGIN of its
// transaction, in one round trip (see txhook.Lead).
type InboxLead interface {
	// ConsumeLead is Consume with the statement that begins a transaction.
	ConsumeLead(table, consumer, messageID string, now time.Time) Lead
	// CanLead reports whether db's driver sends a Lead in one round trip.
	// An error leaves the question open, to be asked again.
	CanLead(ctx context.Context, db *sql.DB) (bool, error)
}

// Lead is Consume's INSERT (Query) with Begin, the statement that begins
// its transaction, for a driver that pipelines them (pgx); or Text, both as
// one text with the values written as literals, for a driver that runs a
// text of several statements in one round trip (MySQL's, with
// multiStatements).
type Lead struct {
	Begin string
	Query Query
	Text  string
}

// DefaultInbox is the inbox table name the shipped schema files use.
const DefaultInbox = "outbox_inbox"

// RenameInbox renames the shipped inbox schema's table and index.
func RenameInbox(ddl, table string) string { return strings.ReplaceAll(ddl, DefaultInbox, table) }

// Store is one database's statements.
type Store interface {
	Schema
	Writer
	Claimer
	Admin
	Inbox
	Overviewer
	Historian
	// Name is the database's name as SchemaSQL takes it.
	Name() string
	Limits() Limits
}

// Walker is implemented by a store whose new events are written due at once
// (available_at NULL) and found by seq, from a watermark the relay keeps,
// instead of through an index of pending rows every INSERT would enter.
type Walker interface {
	// Walk reads, from seq from on and in seq order, up to limit rows:
	// seq, open (new and pending), leased (its lease runs at now),
	// locked_until; first, the same of the rows at the seqs gaps, all below
	// from.
	Walk(from int64, limit int, gaps []int64, now time.Time) Query
	// Defer makes the open, unleased rows with the seqs due now through
	// the retry index.
	Defer(seqs []int64, now time.Time) Query
	// LowOpen reads the lowest seq of an open row not leased at now and
	// the highest seq, each NULL when there is none.
	LowOpen(now time.Time) Query
}

// Replicas is implemented by a store whose database streams its WAL to
// standbys it can list (PostgreSQL).
type Replicas interface {
	// WALInsertPosition reads the server's current WAL write position,
	// as text.
	WALInsertPosition() Query
	// ReplicasFlushed counts the standbys that have flushed the WAL up to
	// the position lsn (text) to disk.
	ReplicasFlushed(lsn string) Query
}

// Notifier is implemented by a store whose database can wake relays in
// other processes (PostgreSQL's LISTEN/NOTIFY).
type Notifier interface {
	// Channel is the channel of the outbox's wake-ups.
	Channel() string
	// NotifySQL is the statement that sends one wake-up from db's
	// session: a statement without arguments, which the driver sends as
	// one simple query with nothing to plan, its channel resolved by this
	// call for the session's schema. A writer resolves it once per
	// connection and sends it after every commit that wrote events.
	NotifySQL(ctx context.Context, db Querier) (string, error)
	// Listen listens on conn, a connection taken from db's pool for
	// this alone, calls ready once listening, then wake for every
	// notification, until ctx ends or the connection fails. It returns
	// ErrListenUnsupported when the driver cannot listen.
	Listen(ctx context.Context, conn *sql.Conn, ready, wake func()) error
}

// ErrListenUnsupported: the database/sql driver cannot LISTEN.
var ErrListenUnsupported = fmt.Errorf("the database driver is not pgx (github.com/jackc/pgx/v5/stdlib)")

// A Driver opens the store of one database.
type Driver struct {
	// Name is the database's name (SchemaSQL's dialect argument).
	Name string
	// Probe reports whether the store serves the database GORM names
	// dialector; db, when not nil, may be asked (a PostgreSQL-compatible
	// server, MySQL or MariaDB, can so get a store of its own).
	Probe func(ctx context.Context, dialector string, db *sql.DB) bool
	// Open returns the store of the outbox table named table.
	Open func(table string) Store
}

var registry struct {
	mu      sync.Mutex
	drivers []Driver
}

// Register adds a store. Probes are tried in registration order, so a
// store for a more specific server registers before the general one.
func Register(d Driver) {
	registry.mu.Lock()
	defer registry.mu.Unlock()
	registry.drivers = append(registry.drivers, d)
}

// Open returns the store of the first driver whose probe accepts the
// database, or an error wrapping errs.ErrUnsupportedDialect.
func Open(ctx context.Context, dialector string, db *sql.DB, table string) (Store, error) {
	registry.mu.Lock()
	drivers := append([]Driver(nil), registry.drivers...)
	registry.mu.Unlock()
	var names []string
	for _, d := range drivers {
		if d.Probe(ctx, dialector, db) {
			return d.Open(table), nil
		}
		names = append(names, d.Name)
	}
	return nil, unsupported(dialector, names)
}

// ParkRow is a row Logical mode's stream writes to the table: a failed
// attempt (to retry, or failed for good), an event held back behind its
// aggregate or handed back, or, leased to the stream, an event checked
// against the table before it is delivered.
type ParkRow struct {
	Event    Event
	Status   string
	Attempts int
	LastErr  any // string or nil
	Due      time.Time
	Lease    any // time.Time or nil
	Created  time.Time
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
	Emit(ctx context.Context, db Execer, slot, prefix string, content []byte) (emitted bool, err error)
	// Park inserts rows in the order given (seq follows it) and returns
	// the seq and ID of each row it inserted; a row whose ID or key is in
	// the table already is skipped. A parked row's ID is always in named_id
	// (unique): the stream may offer the same event again.
	Park(rows []ParkRow, now time.Time) Query
	// Blocked returns the aggregates among types/ids (pairwise) that have
	// an unsent row: aggregate_type, aggregate_id.
	Blocked(types, ids []string) Query
	// SlotStats reads whether the slot is streamed and the WAL it keeps.
	SlotStats(slot string) Query
	// WALPosition reads the server's flushed WAL position.
	WALPosition() Query
	// SlotHeldBy reads whether the walsender with that PID streams slot.
	SlotHeldBy(slot string, pid uint32) Query
	// SessionTimeout is the statement that reads, on a replication
	// connection, the wal_sender_timeout the server applies to it, in ms.
	SessionTimeout() string
}
