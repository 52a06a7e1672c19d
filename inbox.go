package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/gorm-outbox/outbox/internal/maint"
	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/gorm-outbox/outbox/internal/txhook"
	"gorm.io/gorm"
)

// DefaultInboxTable is the inbox table's name when [Config.InboxTable] is
// empty.
const DefaultInboxTable = "outbox_inbox"

// MaxInboxIDLen is the longest consumer name or message ID [Consume]
// takes, in characters: the inbox columns' width.
const MaxInboxIDLen = 255

const (
	defaultInboxRetention = 7 * 24 * time.Hour
	// inboxForgetEvery is how often, at most, a process's Consume calls
	// delete one batch of expired pairs.
	inboxForgetEvery = time.Minute
	// inboxForgetTimeout bounds one such batch.
	inboxForgetTimeout = 10 * time.Second
)

// errConsumed ends the transaction of a message already consumed; Consume
// turns it into nil.
var errConsumed = errors.New("outbox: message already consumed")

// Consume runs fn at most once per (consumer, messageID): the consumer side
// of at-least-once delivery, where every message may arrive more than once
// (a relay killed before it marked the event sent, a broker's redelivery, a
// webhook retried after a lost response).
//
// It records the pair in the inbox table and runs fn in the same
// transaction on db, or, when db already is a transaction, in a savepoint of
// it (committed with it). So the pair commits together with fn's effect, or
// neither does:
//
//   - a pair already recorded by a committed transaction: fn is not called
//     and Consume returns nil, so the caller acknowledges the duplicate;
//   - a second delivery while the first is still running waits for the
//     first's outcome (the inbox key's lock), then returns nil if it
//     committed, or runs fn if it rolled back;
//   - fn returns an error or panics: nothing is recorded, the transaction
//     rolls back, and the error (or the panic) reaches the caller, which
//     should not acknowledge the message, so that it is delivered again.
//
// Acknowledge the message to the broker only after Consume returned nil:
// the commit is then done. [Publish], [AfterCommit] and recorded model
// events work inside fn as in any transaction, so what fn publishes onward
// commits with the effect and never without it.
//
// An empty consumer or message ID, one longer than [MaxInboxIDLen]
// characters, or one that is not valid UTF-8 or holds a NUL byte is an error
// wrapping [ErrInvalidInboxID], and fn is not called; a db without the
// plugin is [ErrNotInstalled].
//
// The record costs one INSERT and no round trip of its own where the
// driver can send it with the transaction's BEGIN: on PostgreSQL through
// pgx (GORM's driver), and on MySQL or MariaDB with multiStatements=true in
// the DSN. fn's transaction then runs on a connection Consume holds out of
// the pool and ends itself, which database/sql cannot make a *sql.Tx of:
// [SQLTx] reports none inside fn there. Elsewhere, and in a savepoint of
// the caller's transaction, the INSERT is the transaction's first
// statement.
//
// Pairs are kept for [Config.InboxRetention] (7 days by default): a
// redelivery later than that runs fn again, so the window must exceed the
// longest a broker may redeliver. Consume itself deletes expired pairs,
// one batch at most once a minute per process, after its transaction has
// committed, whether or not the process runs a relay. In [Memory] mode the
// pairs are kept in memory (the last 10,000 per Outbox), and lost with the
// process.
func Consume(db *gorm.DB, consumer, messageID string, fn func(tx *gorm.DB) error) error {
	if db == nil {
		return ErrNotInstalled
	}
	o := fromDB(db)
	if o == nil {
		return ErrNotInstalled
	}
	if db.Error != nil {
		return fmt.Errorf("outbox: consume on a failed statement: %w", db.Error)
	}
	if err := validInboxID("consumer", consumer); err != nil {
		return err
	}
	if err := validInboxID("message ID", messageID); err != nil {
		return err
	}
	if fn == nil {
		return fmt.Errorf("%w: Consume needs a function to run", ErrInvalidEvent)
	}
	if o.noTable != nil {
		dup, err := o.memInbox.consume(db, inboxKey{consumer, messageID}, o.inboxRetention, o.clock, fn)
		if dup {
			o.duplicate(dbContext(db), consumer, messageID)
		}
		return err
	}
	in, ok := o.store.(store.Inbox)
	if !ok {
		return o.unsupported("Consume")
	}
	_, inTx := txhook.Tracked(db.Statement.ConnPool)
	for attempt := 1; ; attempt++ {
		err := o.consumeOnce(db, in, consumer, messageID, fn)
		var re *recordError
		if !inTx && attempt < maxRecordAttempts && errors.As(err, &re) && in.RetryRecord(re.err) {
			// The record lost a race (MySQL: a deadlock between deliveries
			// of the message that waited on one that rolled back); it is the
			// transaction's first statement, so fn has not run.
			continue
		}
		if err != nil {
			return err
		}
		break
	}
	if !inTx {
		o.forgetConsumedSometimes(dbContext(db), db, in)
	}
	return nil
}

// maxRecordAttempts bounds how often Consume runs its transaction again
// when the record lost a race: each time, one of the deliveries racing for
// the message wins and the others then find it recorded.
const maxRecordAttempts = 5

// recordError is the error of the inbox INSERT.
type recordError struct {
	consumer, message, table string
	err                      error
}

func (e *recordError) Error() string {
	return fmt.Sprintf("outbox: record message %q of consumer %q in the inbox %s: %v", e.message, e.consumer, e.table, e.err)
}

func (e *recordError) Unwrap() error { return e.err }

// consumeOnce is one transaction of Consume.
func (o *Outbox) consumeOnce(db *gorm.DB, in store.Inbox, consumer, messageID string, fn func(tx *gorm.DB) error) error {
	recordErr := func(err error) error {
		return &recordError{consumer: consumer, message: messageID, table: o.inbox, err: err}
	}
	lead := o.leadFor(db, consumer, messageID)
	tdb := db
	if lead != nil {
		tdb = db.WithContext(txhook.WithLead(dbContext(db), lead))
	}
	err := tdb.Transaction(func(tx *gorm.DB) error {
		n, ran := lead.Ran()
		recorded := n > 0
		if !ran {
			var err error
			if recorded, err = in.Record(dbContext(tx), tx.Statement.ConnPool, o.inbox, consumer, messageID, o.now()); err != nil {
				return recordErr(err)
			}
		}
		if !recorded {
			return errConsumed
		}
		return fn(tx)
	})
	switch {
	case errors.Is(err, errConsumed):
		o.duplicate(dbContext(db), consumer, messageID)
		return nil
	case err != nil && lead.Err() != nil:
		return recordErr(err)
	}
	return err
}

// leadFor returns the Lead that sends the inbox INSERT with the BEGIN of
// Consume's transaction on db, saving the round trip of a statement of its
// own (on PostgreSQL through pgx, and on MySQL or MariaDB with
// multiStatements=true in the DSN), or nil where db cannot take one: then
// the INSERT runs first in the transaction, as it does in a savepoint of the
// caller's transaction. Whether the database can is asked once per *sql.DB.
func (o *Outbox) leadFor(db *gorm.DB, consumer, messageID string) *txhook.Lead {
	il, ok := o.store.(store.InboxLead)
	if !ok {
		return nil
	}
	sqlDB, ok := txhook.CanLead(db.Statement.ConnPool)
	if !ok {
		return nil
	}
	s := o.siteOf(sqlDB)
	switch s.lead.Load() {
	case leadNo:
		return nil
	case leadUnknown:
		can, err := il.CanLead(dbContext(db), sqlDB)
		if err != nil {
			return nil // asked again next time
		}
		if !can {
			s.lead.Store(leadNo)
			return nil
		}
		s.lead.Store(leadYes)
	}
	return &txhook.Lead{Starter: il.RecordLead(o.inbox, consumer, messageID, o.now())}
}

// Whether a site's database takes a txhook.Lead.
const (
	leadUnknown int32 = iota
	leadYes
	leadNo
)

// duplicate tells of a message Consume found consumed: at debug in the
// log, and to the Duplicate hooks (outboxotel counts them).
func (o *Outbox) duplicate(ctx context.Context, consumer, messageID string) {
	o.logger.DebugContext(ctx, "outbox: message already consumed; skipped", slog.String("consumer", consumer), slog.String("message_id", messageID))
	if hs := o.hooks.Load(); hs != nil {
		for _, f := range hs.duplicate {
			f(ctx, consumer, messageID)
		}
	}
}

// CheckInboxID reports whether [Consume] takes s as a consumer name or a
// message ID: nil, or the error wrapping [ErrInvalidInboxID] that Consume
// would return. A broker consumer uses it to tell a message whose ID can
// never be recorded (to terminate) from an error of its own handler.
func CheckInboxID(s string) error { return validInboxID("ID", s) }

func validInboxID(what, s string) error {
	switch {
	case s == "":
		return fmt.Errorf("%w: empty %s", ErrInvalidInboxID, what)
	case !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0:
		return fmt.Errorf("%w: %s is not valid UTF-8 text without NUL bytes", ErrInvalidInboxID, what)
	case utf8.RuneCountInString(s) > MaxInboxIDLen:
		return fmt.Errorf("%w: %s is %d characters long, longer than the inbox's %d", ErrInvalidInboxID, what, utf8.RuneCountInString(s), MaxInboxIDLen)
	}
	return nil
}

// forgetConsumedSometimes deletes one batch of pairs older than the
// retention window, at most once per inboxForgetEvery, and again on the
// next call while batches come back full. A failure is logged, not
// returned: the Consume that triggered it has committed.
func (o *Outbox) forgetConsumedSometimes(ctx context.Context, db *gorm.DB, in store.Inbox) {
	if o.inboxRetention == RetainForever {
		return
	}
	now := o.now()
	next := o.inboxForgetAt.Load()
	if now.UnixNano() < next || !o.inboxForgetAt.CompareAndSwap(next, now.Add(inboxForgetEvery).UnixNano()) {
		return
	}
	sqlDB, err := rawDB(db)
	if err != nil {
		return
	}
	batch := o.limits.RetentionBatch
	// Past the caller's cancellation (its Consume has committed), but
	// bounded: a DELETE stuck behind a lock must not hold Consume's return.
	expiry := maint.InboxExpiry(in, sqlDB, o.inbox, batch, o.inboxRetention, inboxForgetTimeout, o.now)
	n, err := expiry.Pass(context.WithoutCancel(ctx))
	switch {
	case err != nil:
		o.logger.WarnContext(ctx, "outbox: deleting expired inbox entries failed; will retry", slog.String("table", o.inbox), slog.Any("error", err))
	case n >= int64(batch):
		o.inboxForgetAt.Store(0)
	}
}

type inboxKey struct{ consumer, message string }

// memInbox is Memory mode's inbox: the pairs consumed, the last memoryKeys
// of them, and the ones whose transaction is still running, which a second
// delivery waits for.
type memInbox struct {
	mu   sync.Mutex
	ents map[inboxKey]*inboxEntry
	ring []inboxKey // consumed pairs, oldest evicted first
	next int
}

type inboxEntry struct {
	owner    *txhook.Tx    // the transaction consuming it; nil until it began
	ended    chan struct{} // closed when that transaction has ended
	once     sync.Once     // end runs once
	consumed bool
	at       time.Time
}

func (m *memInbox) consume(db *gorm.DB, key inboxKey, retention time.Duration, clock func() time.Time, fn func(tx *gorm.DB) error) (dup bool, err error) {
	ctx := dbContext(db)
	outer, _ := txhook.Tracked(db.Statement.ConnPool)
	for {
		m.mu.Lock()
		if m.ents == nil {
			m.ents = map[inboxKey]*inboxEntry{}
			m.ring = make([]inboxKey, memoryKeys)
		}
		e := m.ents[key]
		switch {
		case e == nil, e.consumed && retention != RetainForever && clock().Sub(e.at) > retention:
			e = &inboxEntry{ended: make(chan struct{})}
			m.ents[key] = e
			m.mu.Unlock()
			return false, m.run(db, key, e, clock, fn)
		case e.consumed, outer != nil && e.owner == outer:
			// Consumed, or being consumed by this very transaction, as a
			// second INSERT of the pair in one transaction finds it.
			m.mu.Unlock()
			return true, nil
		}
		ended := e.ended
		m.mu.Unlock()
		select {
		case <-ended:
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
}

func (m *memInbox) run(db *gorm.DB, key inboxKey, e *inboxEntry, clock func() time.Time, fn func(tx *gorm.DB) error) (err error) {
	tracked := false
	defer func() {
		// Not tracked: the transaction never began, nothing else ends the
		// entry. Failed in a savepoint of the caller's transaction: the
		// pair is not consumed, whatever the caller's transaction does
		// next, as the rolled-back INSERT of the table modes is gone. (A
		// panic leaves the entry to the end of its transaction, which
		// Finally reports.)
		if !tracked || err != nil {
			m.end(key, e)
		}
	}()
	return db.Transaction(func(tx *gorm.DB) error {
		t, _ := txhook.Tracked(tx.Statement.ConnPool)
		if t == nil {
			return ErrUntrackedTransaction
		}
		if !t.Finally(func() { m.end(key, e) }) {
			return txhook.ErrFinished
		}
		tracked = true
		m.mu.Lock()
		e.owner = t
		m.mu.Unlock()
		// Dropped with the savepoint if fn's work is rolled back to it.
		t.Add(nil, func() {
			m.mu.Lock()
			e.consumed, e.at = true, clock()
			m.mu.Unlock()
		})
		return fn(tx)
	})
}

// end runs once e's transaction has ended: a pair it did not consume is
// forgotten, one it did is kept among the last memoryKeys, and whoever
// waits on it looks again.
func (m *memInbox) end(key inboxKey, e *inboxEntry) { e.once.Do(func() { m.ended(key, e) }) }

func (m *memInbox) ended(key inboxKey, e *inboxEntry) {
	m.mu.Lock()
	defer m.mu.Unlock()
	defer close(e.ended)
	if m.ents[key] != e {
		return
	}
	if !e.consumed {
		delete(m.ents, key)
		return
	}
	if old := m.ring[m.next]; old != (inboxKey{}) {
		if oe := m.ents[old]; oe != nil && oe.consumed {
			delete(m.ents, old)
		}
	}
	m.ring[m.next] = key
	m.next = (m.next + 1) % len(m.ring)
	e.owner = nil
}
