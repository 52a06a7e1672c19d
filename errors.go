package outbox

import (
	"errors"
	"time"

	"github.com/gorm-outbox/outbox/internal/errs"
)

// Sentinel errors. Callers test for them with [errors.Is]; the errors this
// package returns wrap them with the event, table or setting involved.
var (
	// ErrInvalidEvent: an [Event] failed validation or encoding. It is
	// refused before the database is touched, so the transaction can still
	// roll back cleanly.
	ErrInvalidEvent = errs.ErrInvalidEvent

	// ErrIDConflict (with [ErrInvalidEvent]): the table holds the event's ID
	// for another event (other idempotency key); the first write keeps it.
	ErrIDConflict = errs.ErrIDConflict

	// ErrInvalidInboxID: [Consume] was given a consumer name or message
	// ID it cannot record (empty, longer than [MaxInboxIDLen] characters,
	// not valid UTF-8 or holding a NUL byte); fn is not called. A broker
	// consumer terminates such a message: no redelivery can record it.
	ErrInvalidInboxID = errors.New("outbox: invalid inbox consumer or message ID")

	// ErrInvalidConfig: a [Config] or [RelayConfig] value is unusable, such
	// as an unsafe table name or a negative batch size.
	ErrInvalidConfig = errs.ErrInvalidConfig

	// ErrInvalidFilter: a [Filter] or [ListParams] value is unusable (an
	// unknown status, a negative limit, a purge that asks for pending rows).
	ErrInvalidFilter = errors.New("outbox: invalid filter")

	// ErrNotFound: [Outbox.Get] was given an ID the table does not hold.
	ErrNotFound = errors.New("outbox: event not found")

	// ErrNotInstalled: the *gorm.DB has no outbox plugin; install it with
	// db.Use(outbox.Plugin(cfg)).
	ErrNotInstalled = errors.New("outbox: plugin not installed on this *gorm.DB (call db.Use(outbox.Plugin(cfg)) first)")

	// ErrNoTransaction: [Publish] was given a *gorm.DB outside a
	// transaction, and wrote nothing: its events would have committed
	// alone, apart from the business writes they belong with.
	ErrNoTransaction = errors.New("outbox: Publish outside a transaction would commit the events alone, apart from the business writes they belong with (the dual write the outbox prevents): call it on the transaction, inside db.Transaction(func(tx *gorm.DB) error { ...; return outbox.Publish(tx, events...) }), or, to publish events by themselves on purpose, call outbox.PublishAlone(db, events...)")

	// ErrUntrackedTransaction: an after-commit hook or a memory-mode event was
	// attached to a transaction whose commit the plugin cannot see (one begun
	// inside db.Connection); failing closed keeps the hook from being dropped.
	ErrUntrackedTransaction = errors.New("outbox: transaction not tracked by the outbox plugin (was it begun inside db.Connection, or before db.Use?); after-commit hooks cannot run on it")

	// ErrUnsupportedDialect: the database itself is not supported: other
	// than PostgreSQL, SQLite or MySQL/MariaDB, or other than PostgreSQL in
	// [Logical] mode. [Memory] mode works on any database.
	ErrUnsupportedDialect = errs.ErrUnsupportedDialect

	// ErrUnsupportedVersion: the database server is too old, refused at
	// db.Use: PostgreSQL before 13 (14 in [Logical] mode), MariaDB before
	// 10.6, MySQL before 8.0.1, a SQLite library before 3.35.
	ErrUnsupportedVersion = errs.ErrUnsupportedVersion

	// ErrServerSetting: a server setting rules the outbox out until it is
	// changed (binlog_format=STATEMENT on MySQL/MariaDB, a wal_level other
	// than logical in [Logical] mode); the error names the fix.
	ErrServerSetting = errs.ErrServerSetting

	// ErrPrivilege: the database role lacks a privilege the mode needs (in
	// [Logical] mode, REPLICATION).
	ErrPrivilege = errs.ErrPrivilege

	// ErrNoSlot: in [Logical] mode, Publish found the outbox's replication
	// slot missing or invalidated, so the event would never be decoded.
	// Return it from the transaction function so the business writes roll
	// back; db.Use (a restart) creates the slot again.
	ErrNoSlot = errs.ErrNoSlot

	// ErrUnsupportedFeature: the database's store does not implement the
	// feature an operation needs (the inbox, the overview, the event
	// history, wake-ups across processes, standbys): every store the
	// module ships implements all of them but where the docs say
	// otherwise (Logical mode and WaitReplicas need PostgreSQL).
	ErrUnsupportedFeature = errs.ErrUnsupportedFeature

	// ErrMemoryMode: the operation needs a table, and a [Memory] outbox keeps
	// none.
	ErrMemoryMode = errors.New("outbox: operation needs Persistent mode (Memory mode keeps no table)")

	// ErrNoHandler: the failure recorded for an event no handler is
	// registered for. Such events are retried, not marked sent, so a handler
	// registered later still gets them.
	ErrNoHandler = errors.New("outbox: no handler registered for event type")

	// ErrReplicasBehind: with RelayConfig.WaitReplicas, fewer standbys
	// than it asks for flushed a batch's WAL in time; the batch was handed
	// back undelivered, to be claimed again.
	ErrReplicasBehind = errs.ErrReplicasBehind
)

// Permanent wraps err to tell the relay that retrying cannot help: the event
// goes straight to the failed status instead of being retried. A nil err
// yields nil.
func Permanent(err error) error { return errs.Permanent(err) }

// IsPermanent reports whether err (or an error it wraps) was marked with
// [Permanent].
func IsPermanent(err error) bool { return errs.IsPermanent(err) }

// RetryAfter wraps err to ask the relay to retry the event no sooner than d
// from now instead of after RelayConfig.Backoff's delay: an HTTP 429 or 503
// with a Retry-After header, a broker asking to slow down. The attempt still
// counts towards MaxAttempts. A nil err yields nil.
func RetryAfter(err error, d time.Duration) error { return errs.RetryAfter(err, d) }

// Unavailable wraps err to tell the relay that the event's destination is
// down (a broker or endpoint that cannot be reached), not that the event is
// bad. The relay hands the event back without counting the attempt, stops
// delivering, and probes with one event at a time, with backoff (from half
// a second up to 5 seconds, or after the delay of a [RetryAfter] that err
// wraps), until a delivery goes through; it logs once
// when delivery pauses and once when it resumes, instead of a warning per
// event. So an outage of any length burns no attempts and fails no event.
// The broker adapters return it for connection errors. [Permanent] takes
// precedence when both wrap an error. A nil err yields nil.
func Unavailable(err error) error { return errs.Unavailable(err) }

// IsUnavailable reports whether err (or an error it wraps) was marked with
// [Unavailable]. ProcessOnce's error satisfies it when a handler reported
// its destination down.
func IsUnavailable(err error) bool { return errs.IsUnavailable(err) }
