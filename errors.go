package outbox

import (
	"errors"
	"time"

	"github.com/gorm-outbox/outbox/internal/errs"
)

// Sentinel errors. Callers test for them with [errors.Is]; the errors this
// package returns wrap them with the event or table involved.
var (
	// ErrInvalidEvent is wrapped by every validation or encoding failure of an
	// [Event]. Such an event is rejected before the database is touched, so the
	// caller's transaction is still usable and can roll back cleanly.
	ErrInvalidEvent = errs.ErrInvalidEvent

	// ErrIDConflict is wrapped, with [ErrInvalidEvent], by the error of
	// [Publish] for an event whose ID the table already holds for another
	// event (one with a different idempotency key): the first write keeps
	// the ID, and the later event is refused rather than lost.
	ErrIDConflict = errs.ErrIDConflict

	// ErrInvalidConfig is wrapped by errors about a [Config] or [RelayConfig]
	// value, such as an unsafe table name or a negative batch size.
	ErrInvalidConfig = errs.ErrInvalidConfig

	// ErrNotInstalled is returned by [Publish] when the *gorm.DB it is given
	// has no outbox plugin: install it with db.Use(outbox.Plugin(...)).
	ErrNotInstalled = errors.New("outbox: plugin not installed on this *gorm.DB (call db.Use(outbox.Plugin(cfg)) first)")

	// ErrUntrackedTransaction is added to a transaction the plugin cannot see
	// commit, such as one begun inside db.Connection, when an after-commit hook
	// or a memory-mode event is attached to it. Failing closed keeps the
	// commit from silently dropping the hook.
	ErrUntrackedTransaction = errors.New("outbox: transaction not tracked by the outbox plugin (was it begun inside db.Connection, or before db.Use?); after-commit hooks cannot run on it")

	// ErrUnsupportedDialect is returned by db.Use for a database other than
	// PostgreSQL, SQLite and MySQL/MariaDB (other than PostgreSQL in Logical
	// mode), or for a server version or setting the outbox cannot work with
	// (in Logical mode: before PostgreSQL 14, wal_level other than logical,
	// a role that may not replicate). Memory mode works on any database.
	ErrUnsupportedDialect = errs.ErrUnsupportedDialect

	// ErrMemoryMode is returned by relay operations on an outbox in [Memory]
	// mode, which keeps no table.
	ErrMemoryMode = errors.New("outbox: operation needs Persistent mode (Memory mode keeps no table)")

	// ErrNoHandler is the failure recorded for an event no handler was
	// registered for. The relay retries such events rather than mark them
	// sent, so registering the handler later still delivers them.
	ErrNoHandler = errors.New("outbox: no handler registered for event type")
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
