package outbox

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/gorm-outbox/outbox/internal/encode"
	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/gorm-outbox/outbox/internal/txhook"
	"gorm.io/gorm"
)

// Publish attaches events to the transaction tx runs in.
//
// In [Persistent] mode the events are INSERTed on tx: they become visible to
// relays only when tx commits and disappear if it rolls back. An event whose
// idempotency key is already in the table is skipped without error (the first
// write wins); one whose ID is already taken by an event with another key is
// an error.
//
// In [Memory] mode the events are handed to the handlers synchronously right
// after the outermost commit of tx, and dropped if tx (or the savepoint they
// were published in) rolls back.
//
// tx must be in a transaction: on a *gorm.DB outside one, Publish writes
// nothing and returns [ErrNoTransaction], since the events would commit
// alone, apart from the business writes they belong with (Publish(db, e)
// then db.Create(&order) is the dual write the outbox exists to prevent).
// [PublishAlone] publishes events by themselves on purpose.
//
// Every event is validated and encoded before anything is written, so an
// error wrapping [ErrInvalidEvent] leaves tx untouched: return it from the
// transaction function and the business writes roll back with it. tx must
// come from a *gorm.DB on which the plugin is installed, otherwise the error
// is [ErrNotInstalled].
func Publish(tx *gorm.DB, events ...Event) error { return publish(tx, false, events) }

// PublishAlone publishes events by themselves: on a *gorm.DB outside a
// transaction, in Persistent mode they are written at once (in one
// transaction of their own when they need several statements), in Memory
// mode dispatched at once; inside a transaction it is [Publish]. Use it for
// events that belong to no business write (a scheduled report, a replay
// from a script); within a unit of work, call Publish on its transaction.
func PublishAlone(db *gorm.DB, events ...Event) error { return publish(db, true, events) }

func publish(tx *gorm.DB, alone bool, events []Event) error {
	if tx == nil {
		return ErrNotInstalled
	}
	o := fromDB(tx)
	if o == nil {
		return ErrNotInstalled
	}
	if tx.Error != nil {
		return fmt.Errorf("outbox: publish on a failed statement: %w", tx.Error)
	}
	if len(events) == 0 {
		return nil
	}
	if _, inTx := txhook.Tracked(tx.Statement.ConnPool); !inTx && !alone && !tx.DryRun {
		return ErrNoTransaction
	}
	ctx := tx.Statement.Context
	if ctx == nil {
		ctx = context.Background()
	}
	hs := o.hooks.Load()
	var (
		seen     []Event // the copies the Publish hooks were given
		skipped  []bool
		err      error
		returned bool // false while a panic may end Publish
	)
	// Every event a Publish hook saw reaches the Stored hooks, whatever
	// ends Publish: a hook keeping state per event must be able to drop it.
	defer func() {
		if !returned {
			err = errAborted
		}
		o.storedHooks(ctx, hs, seen, skipped, err)
	}()
	var generated []bool
	events, generated, err = o.publishHooks(ctx, hs, events, &seen)
	if err == nil {
		var enc []encoded
		// One clock reading for the default OccurredAt and the row's
		// creation: equal, the row leaves created_at NULL.
		now := o.now()
		if enc, err = o.encodeAll(events, generated, now); err == nil {
			skipped, err = o.publishEncoded(tx, enc, hs != nil && len(hs.stored) > 0, now)
		}
	}
	returned = true
	return err
}

// errAborted stands for the outcome of a Publish that a panic ended.
var errAborted = errors.New("outbox: publish aborted")

// encoded is an event after validation, as the INSERT and WAL writers
// take it.
type encoded = encode.Encoded

// rowOf is the event as the store writes it.
func rowOf(e *encoded) store.Event {
	return store.Event{
		ID: e.Event.ID, Type: e.Event.Type, AggregateType: e.Event.AggregateType, AggregateID: e.Event.AggregateID,
		Key: e.Event.IdempotencyKey, Payload: e.PayloadJSON, Headers: e.HeadersJSON, OccurredAt: e.Event.OccurredAt,
		Generated: e.Generated, NamedID: !e.GeneratedID,
	}
}

// encodeAll encodes events; generated, when not nil, says per event
// whether its ID and key were generated (see publishHooks), which
// otherwise is read from the event.
func (o *Outbox) encodeAll(events []Event, generated []bool, now time.Time) ([]encoded, error) {
	c := encode.Encoder{Invalid: ErrInvalidEvent, MaxPayload: o.maxPayload}
	return encode.All(&c, events, generated, now)
}

// insert writes enc and returns the seqs of the rows it wrote, when the
// store can say (DeliverAfterCommit claims them). With skipped (one per
// event of enc), it marks the events it skipped as duplicates.
func (o *Outbox) insert(ctx context.Context, pool gorm.ConnPool, enc []encoded, now time.Time, skipped []bool) ([]int64, error) {
	rows := make([]store.Event, len(enc))
	for i := range enc {
		rows[i] = rowOf(&enc[i])
	}
	// Only DeliverAfterCommit needs the seqs: reading them back costs the
	// writer a result set (on PostgreSQL and SQLite, a RETURNING clause).
	ins, err := o.store.Insert(ctx, pool, rows, now, o.deliverAfterCommit)
	if err != nil {
		if len(enc) == 1 {
			return nil, fmt.Errorf("outbox: insert event %s (%s): %w", enc[0].ID, enc[0].Type, err)
		}
		return nil, fmt.Errorf("outbox: insert %d events: %w", len(enc), err)
	}
	if ins.Written == len(enc) {
		return ins.Seqs, nil
	}
	return ins.Seqs, o.checkSkipped(ctx, pool, enc, now, skipped)
}

// checkSkipped runs when an INSERT skipped rows (or could not say): a row
// skipped because its idempotency key, or its ID with the same key, is
// already there is a duplicate, the first write winning; one whose ID is
// taken by an event with another key is a different event, and an error
// rather than a silent loss. When skipped is not nil it marks the
// duplicates: the events whose ID the table does not hold (their key is
// taken), or holds in a row not written by this INSERT, which wrote now as
// every row's created_at.
func (o *Outbox) checkSkipped(ctx context.Context, pool gorm.ConnPool, enc []encoded, now time.Time, skipped []bool) error {
	var ids, keys []string
	for i := range enc {
		if !enc[i].GeneratedID {
			ids = append(ids, enc[i].ID)
		}
		if enc[i].IdempotencyKey != enc[i].ID {
			keys = append(keys, enc[i].IdempotencyKey)
		}
	}
	held, err := o.store.Held(ctx, pool, ids, keys)
	if err != nil {
		return fmt.Errorf("outbox: check skipped events: %w", err)
	}
	for i := range enc {
		if enc[i].Generated {
			continue // in no unique index: the INSERT wrote it
		}
		row, ok := held[enc[i].ID]
		if ok && row.Key != enc[i].IdempotencyKey {
			return fmt.Errorf("%w: %w: event %s (%s): its ID is already used by an event with another idempotency key",
				ErrInvalidEvent, ErrIDConflict, enc[i].ID, enc[i].Type)
		}
		if skipped != nil && (!ok || !row.Created.Equal(now)) {
			skipped[i] = true
		}
	}
	return nil
}

// publishEncoded writes enc, or in Memory mode queues it. With tell, it
// returns which events of enc it did not write: every one on a dry run,
// the duplicates otherwise.
func (o *Outbox) publishEncoded(tx *gorm.DB, enc []encoded, tell bool, now time.Time) (skipped []bool, err error) {
	ctx := tx.Statement.Context
	if ctx == nil {
		ctx = context.Background()
	}
	pool := tx.Statement.ConnPool
	t, inTx := txhook.Tracked(pool)
	if tell {
		skipped = make([]bool, len(enc))
	}
	if tx.DryRun {
		// As GORM: build, do not execute (nor dispatch).
		for i := range skipped {
			skipped[i] = true
		}
		return skipped, nil
	}

	if o.noTable != nil { // memory mode: dispatched after the commit
		switch {
		case t != nil:
			if !t.Add(nil, func() { o.dispatchMemory(t.Context(), enc) }) {
				return nil, txhook.ErrFinished
			}
		case inTx:
			return nil, ErrUntrackedTransaction
		default:
			o.dispatchMemory(ctx, enc)
		}
		return nil, nil
	}
	if len(enc) > o.limits.InsertRows && !inTx {
		// Several statements must commit together: give them a transaction.
		err := tx.Transaction(func(tx *gorm.DB) error {
			var err error
			skipped, err = o.publishEncoded(tx, enc, tell, now)
			return err
		})
		return skipped, err
	}
	if o.wal != nil {
		// One message however many events: nothing to wake, the relay
		// streams it after the commit.
		return skipped, o.emit(ctx, pool, enc)
	}
	seqs, err := o.insert(ctx, pool, enc, now, skipped)
	if err != nil {
		return nil, err
	}
	if tell {
		// The same event twice in one call is written once, by the first.
		first := make(map[string]bool, len(enc))
		for i := range enc {
			if first[enc[i].ID] {
				skipped[i] = true
			}
			first[enc[i].ID] = true
		}
	}
	switch {
	case t != nil:
		t.AddPublished(o.siteFor(tx), seqs, len(enc))
	case !inTx:
		o.published(o.siteFor(tx), seqs)
	}
	return skipped, nil
}
