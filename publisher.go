package outbox

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"
	"github.com/gorm-outbox/outbox/internal/store"
	"gorm.io/gorm"
)

// Field limits. They match the column sizes of the shipped schema, so an
// event that passes validation never fails its INSERT for length.
const (
	maxFieldLen       = 255      // id, type, aggregate type/id, idempotency key, header keys
	maxHeadersBytes   = 64 << 10 // all headers, JSON encoded
	defaultMaxPayload = 1 << 20
)

// Publish attaches events to the transaction tx runs in.
//
// In [Persistent] mode the events are INSERTed on tx: they become visible to
// relays only when tx commits and disappear if it rolls back. An event whose
// idempotency key is already in the table is skipped without error (the first
// write wins); one whose ID is already taken by an event with another key is
// an error. Outside a transaction each call inserts at once.
//
// In [Memory] mode the events are handed to the handlers synchronously right
// after the outermost commit of tx, and dropped if tx (or the savepoint they
// were published in) rolls back. Outside a transaction they are dispatched at
// once.
//
// Every event is validated and encoded before anything is written, so an
// error wrapping [ErrInvalidEvent] leaves tx untouched: return it from the
// transaction function and the business writes roll back with it. tx must
// come from a *gorm.DB on which the plugin is installed, otherwise the error
// is [ErrNotInstalled].
func Publish(tx *gorm.DB, events ...Event) error {
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
		if enc, err = o.encodeAll(events, generated); err == nil {
			skipped, err = o.publishEncoded(tx, enc, hs != nil && len(hs.stored) > 0)
		}
	}
	returned = true
	return err
}

// errAborted stands for the outcome of a Publish that a panic ended.
var errAborted = errors.New("outbox: publish aborted")

// encoded is an event after validation: every default filled in, payload
// and headers in their stored JSON form.
type encoded struct {
	Event
	payload []byte
	headers []byte // nil when there are no headers
	// generated: the publisher set neither the ID nor the key, so the key
	// is a fresh UUID no other event can have.
	generated bool
}

// row is the event as the store writes it.
func (e *encoded) row() store.Event {
	return store.Event{
		ID: e.ID, Type: e.Type, AggregateType: e.AggregateType, AggregateID: e.AggregateID, Key: e.IdempotencyKey,
		Payload: e.payload, Headers: e.headers, OccurredAt: e.OccurredAt, Generated: e.generated,
	}
}

// event returns what a handler receives: the payload as json.RawMessage and
// a private copy of the headers, identical in both modes.
func (e *encoded) event() Event {
	ev := e.Event
	ev.Payload = json.RawMessage(e.payload)
	if len(e.Headers) > 0 {
		h := make(map[string]string, len(e.Headers))
		for k, v := range e.Headers {
			h[k] = v
		}
		ev.Headers = h
	}
	return ev
}

// encodeAll encodes events; generated, when not nil, says per event
// whether its ID and key were generated (see publishHooks), which
// otherwise is read from the event.
func (o *Outbox) encodeAll(events []Event, generated []bool) ([]encoded, error) {
	now := o.now()
	out := make([]encoded, len(events))
	for i := range events {
		gen := events[i].ID == "" && events[i].IdempotencyKey == ""
		if generated != nil {
			gen = generated[i]
		}
		if err := o.encode(&events[i], gen, now, &out[i]); err != nil {
			if len(events) > 1 {
				return nil, fmt.Errorf("event %d of %d: %w", i+1, len(events), err)
			}
			return nil, err
		}
	}
	return out, nil
}

// newEventID is an event's default ID: a UUIDv7, time ordered (good index
// locality).
func newEventID() (string, error) {
	id, err := uuid.NewV7()
	if err != nil {
		return "", fmt.Errorf("outbox: generate event id: %w", err)
	}
	return id.String(), nil
}

func (o *Outbox) encode(in *Event, generated bool, now time.Time, out *encoded) error {
	e := *in
	if e.Type == "" {
		return fmt.Errorf("%w: Type is required", ErrInvalidEvent)
	}
	if e.ID == "" {
		id, err := newEventID()
		if err != nil {
			return err
		}
		e.ID = id
	}
	if e.IdempotencyKey == "" {
		e.IdempotencyKey = e.ID
	}
	if e.OccurredAt.IsZero() {
		e.OccurredAt = now
	}
	e.OccurredAt = e.OccurredAt.UTC().Truncate(time.Microsecond)
	if y := e.OccurredAt.Year(); y < 1 || y > 9999 {
		// Both databases' time types and SQLite's text format hold 4-digit
		// years; outside them the time would not come back as written.
		return fmt.Errorf("%w: event %s: OccurredAt year %d is outside 1-9999", ErrInvalidEvent, e.ID, y)
	}
	for _, f := range [...]struct{ name, v string }{
		{"ID", e.ID}, {"Type", e.Type}, {"AggregateType", e.AggregateType},
		{"AggregateID", e.AggregateID}, {"IdempotencyKey", e.IdempotencyKey},
	} {
		if err := checkText(f.name, f.v); err != nil {
			return err
		}
	}

	payload, err := encodePayload(e.Payload)
	if err != nil {
		return fmt.Errorf("%w: event %s (%s): %w", ErrInvalidEvent, e.ID, e.Type, err)
	}
	if len(payload) > o.maxPayload {
		return fmt.Errorf("%w: event %s (%s): payload is %d bytes, over the %d-byte limit (Config.MaxPayloadBytes)",
			ErrInvalidEvent, e.ID, e.Type, len(payload), o.maxPayload)
	}
	var headers []byte
	if len(e.Headers) > 0 {
		for k, v := range e.Headers {
			if k == "" {
				return fmt.Errorf("%w: event %s: empty header name", ErrInvalidEvent, e.ID)
			}
			if err := checkText("header name", k); err != nil {
				return err
			}
			if !utf8.ValidString(v) || strings.IndexByte(v, 0) >= 0 {
				return fmt.Errorf("%w: event %s: header %q: value must be valid UTF-8 without NUL bytes", ErrInvalidEvent, e.ID, k)
			}
		}
		headers, err = json.Marshal(e.Headers)
		if err != nil {
			return fmt.Errorf("%w: event %s: encode headers: %w", ErrInvalidEvent, e.ID, err)
		}
		if len(headers) > maxHeadersBytes {
			return fmt.Errorf("%w: event %s: headers are %d bytes encoded, over the %d-byte limit", ErrInvalidEvent, e.ID, len(headers), maxHeadersBytes)
		}
	}
	*out = encoded{Event: e, payload: payload, headers: headers, generated: generated}
	return nil
}

// checkText enforces what both databases can store in a text column of the
// shipped schema: valid UTF-8, no NUL byte, at most maxFieldLen bytes.
func checkText(name, v string) error {
	switch {
	case len(v) > maxFieldLen:
		return fmt.Errorf("%w: %s is %d bytes, over the %d-byte limit", ErrInvalidEvent, name, len(v), maxFieldLen)
	case !utf8.ValidString(v):
		return fmt.Errorf("%w: %s is not valid UTF-8", ErrInvalidEvent, name)
	case strings.IndexByte(v, 0) >= 0:
		return fmt.Errorf("%w: %s contains a NUL byte", ErrInvalidEvent, name)
	}
	return nil
}

func encodePayload(p any) ([]byte, error) {
	var b []byte
	switch v := p.(type) {
	case json.RawMessage:
		b = v
	case []byte:
		b = v
	default:
		var err error
		if b, err = json.Marshal(v); err != nil {
			return nil, fmt.Errorf("encode payload: %w", err)
		}
		// encoding/json writes each invalid byte of a string as \ufffd;
		// the same bytes as json.RawMessage are refused below, so these
		// are too rather than silently changed. A MarshalJSON may write
		// the escape on purpose: only a string of the value itself
		// counts.
		if bytes.Contains(b, []byte(`\ufffd`)) && hasInvalidUTF8(reflect.ValueOf(v), 0) {
			return nil, errNotUTF8
		}
		if !utf8.Valid(b) { // from a MarshalJSON
			return nil, errNotUTF8
		}
		return b, checkStorableJSON(b)
	}
	if b == nil {
		return []byte("null"), nil
	}
	if !utf8.Valid(b) {
		return nil, errNotUTF8
	}
	if !json.Valid(b) {
		if nestingDepth(b) > maxValidatorDepth {
			return nil, fmt.Errorf("payload nests arrays and objects deeper than %d levels, which MariaDB's JSON cannot store", maxJSONDepth)
		}
		return nil, errors.New("payload bytes are not valid JSON")
	}
	if err := checkStorableJSON(b); err != nil {
		return nil, err
	}
	// Own the bytes: the caller may reuse its buffer before the commit.
	return bytes.Clone(b), nil
}

// PostgreSQL's numeric, which jsonb stores numbers as, holds at most this
// many digits before and after the decimal point.
const (
	maxNumericWeight = 131072
	maxNumericScale  = 16383

	// PostgreSQL refuses exponents from 2^30-1 on, even on zero.
	maxNumericExponent = 1<<30 - 1
)

// insert writes enc with one statement. It goes straight to the
// transaction's connection, not through GORM's logger, which would print the
// payload arguments of a slow statement. With tell, it adds the IDs of the
// events it skipped as duplicates in skipped (one per event of enc).
func (o *Outbox) insert(ctx context.Context, pool gorm.ConnPool, enc []encoded, now time.Time, skipped []bool) error {
	rows := make([]store.Event, len(enc))
	for i := range enc {
		rows[i] = enc[i].row()
	}
	q := o.store.Insert(rows, now)
	res, err := pool.ExecContext(ctx, q.SQL, q.Args...)
	if err != nil {
		if len(enc) == 1 {
			return fmt.Errorf("outbox: insert event %s (%s): %w", enc[0].ID, enc[0].Type, err)
		}
		return fmt.Errorf("outbox: insert %d events: %w", len(enc), err)
	}
	if n, err := res.RowsAffected(); err == nil && int(n) == len(enc) {
		return nil
	}
	return o.checkSkipped(ctx, pool, enc, now, skipped)
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
	ids := make([]string, len(enc))
	for i := range enc {
		ids[i] = enc[i].ID
	}
	q := o.store.KeysOf(ids)
	rows, err := pool.QueryContext(ctx, q.SQL, q.Args...)
	if err != nil {
		return fmt.Errorf("outbox: check skipped events: %w", err)
	}
	defer rows.Close()
	type stored struct {
		key   string
		added time.Time
	}
	held := make(map[string]stored, len(enc))
	for rows.Next() {
		var (
			id, key string
			added   store.DBTime
		)
		if err := rows.Scan(&id, &key, &added); err != nil {
			return fmt.Errorf("outbox: check skipped events: %w", err)
		}
		held[id] = stored{key, added.T}
	}
	if err := rows.Err(); err != nil {
		return fmt.Errorf("outbox: check skipped events: %w", err)
	}
	for i := range enc {
		row, ok := held[enc[i].ID]
		if ok && row.key != enc[i].IdempotencyKey {
			return fmt.Errorf("%w: %w: event %s (%s): its ID is already used by an event with another idempotency key",
				ErrInvalidEvent, ErrIDConflict, enc[i].ID, enc[i].Type)
		}
		if skipped != nil && (!ok || !row.added.Equal(now)) {
			skipped[i] = true
		}
	}
	return nil
}

// publishEncoded writes enc, or in Memory mode queues it. With tell, it
// returns which events of enc it did not write: every one on a dry run,
// the duplicates otherwise.
func (o *Outbox) publishEncoded(tx *gorm.DB, enc []encoded, tell bool) (skipped []bool, err error) {
	ctx := tx.Statement.Context
	if ctx == nil {
		ctx = context.Background()
	}
	pool := tx.Statement.ConnPool
	t, inTx := trackedTx(pool)
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

	if o.mode == Memory {
		switch {
		case t != nil:
			if !t.st.add(nil, func() { o.dispatchMemory(t.dispatchContext(), enc) }) {
				return nil, errFinished
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
			skipped, err = o.publishEncoded(tx, enc, tell)
			return err
		})
		return skipped, err
	}
	if o.mode == Logical {
		// One message however many events: nothing to wake, the relay
		// streams it after the commit.
		return skipped, o.emit(ctx, pool, enc)
	}
	now := o.now()
	for off := 0; off < len(enc); off += o.limits.InsertRows {
		end := min(off+o.limits.InsertRows, len(enc))
		var sk []bool
		if tell {
			sk = skipped[off:end]
		}
		if err := o.insert(ctx, pool, enc[off:end], now, sk); err != nil {
			return nil, err
		}
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
	ids := make([]string, len(enc))
	for i := range enc {
		ids[i] = enc[i].ID
	}
	switch {
	case t != nil:
		t.st.addPublished(o, ids)
	case !inTx:
		o.published(ids)
	}
	return skipped, nil
}
