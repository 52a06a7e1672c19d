package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"strings"
	"sync"
	"time"

	"github.com/gorm-outbox/outbox/internal/encode"
	"github.com/gorm-outbox/outbox/internal/txhook"
	"gorm.io/gorm"
)

// Recorder lets a GORM model record events on the entity itself. Embed it in
// the model:
//
//	type Order struct {
//		ID    uint
//		Total int
//		outbox.Recorder
//	}
//
//	order.Record(outbox.Event{Type: "order.created", Payload: ...})
//	db.Create(&order) // the event is published in the INSERT's transaction
//
// When the model is created, updated, saved or deleted, the plugin publishes
// the recorded events in that statement's transaction (exactly as [Publish]
// would), and clears them once that transaction commits: saving the entity
// again does not publish them twice, and when the transaction rolls back
// they stay on the entity, so a retry publishes them once (with the same
// IDs, which Record's publishing fixes on the first attempt). It works for
// slices of models too. Recorder adds no column to the model's table. Like
// the rest of an entity, it is not safe for concurrent use.
//
// An event recorded with an empty AggregateID gets the model's primary key
// (set by then, auto-increment included; several keys are joined with
// ":"), and an empty AggregateType the model's table name.
//
// Record outside any function a retry helper re-runs, or on an entity the
// function loads itself. Recording inside it on an entity that outlives
// the attempt publishes one business change twice: the rolled-back
// attempt's event is kept on the entity (that is what makes a retry of the
// save alone safe), and the next attempt records another. The plugin logs
// a warning when a save publishes both kinds at once (after a rolled-back
// transaction; a retry inside one transaction, around a nested Transaction
// whose savepoint rolls back, is not detected).
//
//	order.Record(outbox.Event{Type: "order.paid"}) // once
//	err := retry(func() error {
//		return db.Transaction(func(tx *gorm.DB) error { return tx.Save(&order).Error })
//	})
//
// Recorder's BeforeSave and BeforeDelete hooks fail a statement that would
// save recorded events where the plugin is not installed, instead of
// dropping them. A model that defines its own BeforeSave or BeforeDelete
// hides them: call the Recorder's from it.
type Recorder struct {
	recorded []Event
	// base counts the events already cleared from the front of recorded;
	// marks are the harvests whose transactions have not yet committed,
	// each covering the events up to an absolute count.
	base  int
	marks []*harvestMark
	// undone is the absolute count up to which events were published in
	// a transaction that then rolled back, and are still to publish.
	undone int
}

type harvestMark struct {
	r  *Recorder
	to int // absolute: events [0, to) are published by the harvest
}

// Record adds events to be published with the entity's next write.
func (r *Recorder) Record(events ...Event) { r.recorded = append(r.recorded, events...) }

// Recorded returns a copy of the events recorded and not yet published by
// a committed transaction.
func (r *Recorder) Recorded() []Event { return append([]Event(nil), r.recorded...) }

// BeforeSave implements GORM's hook: saving recorded events on a *gorm.DB
// without the plugin is an error, not a silent loss.
func (r *Recorder) BeforeSave(tx *gorm.DB) error { return r.checkInstalled(tx) }

// BeforeDelete implements GORM's hook, as BeforeSave.
func (r *Recorder) BeforeDelete(tx *gorm.DB) error { return r.checkInstalled(tx) }

func (r *Recorder) checkInstalled(tx *gorm.DB) error {
	if len(r.recorded) > 0 && fromDB(tx) == nil {
		return fmt.Errorf("%w: the model carries %d recorded events that nobody would publish", ErrNotInstalled, len(r.recorded))
	}
	return nil
}

func (r *Recorder) outboxRecorder() *Recorder { return r }

type recorderHolder interface{ outboxRecorder() *Recorder }

var holderType = reflect.TypeFor[recorderHolder]()

// registerCallbacks wires the model-event callbacks for create, update
// (and so Save) and delete. The harvest runs after the model's own After*
// hooks, which may record events, and before GORM commits its default
// transaction. It is idempotent: dbresolver re-runs Initialize.
func registerCallbacks(db *gorm.DB) error {
	c := db.Callback()
	if c.Create().Get("outbox:harvest_create") != nil {
		return nil
	}
	// With SkipDefaultTransaction set at Open, GORM compiles its own
	// transaction callbacks out of the chain, so ours are placed relative to
	// callbacks that always exist.
	const commit = "gorm:commit_or_rollback_transaction"
	return errors.Join(
		c.Create().Before("gorm:before_create").Register("outbox:begin_create", beginForEvents),
		c.Create().After("gorm:after_create").Before(commit).Register("outbox:harvest_create", harvest),
		c.Create().After("*").Register("outbox:commit_create", commitIfStarted),
		c.Update().Before("gorm:setup_reflect_value").Register("outbox:begin_update", beginForEvents),
		c.Update().After("gorm:after_update").Before(commit).Register("outbox:harvest_update", harvest),
		c.Update().After("*").Register("outbox:commit_update", commitIfStarted),
		c.Delete().Before("gorm:before_delete").Register("outbox:begin_delete", beginForEvents),
		c.Delete().After("gorm:after_delete").Before(commit).Register("outbox:harvest_delete", harvest),
		c.Delete().After("*").Register("outbox:commit_delete", commitIfStarted),
	)
}

// holds reports whether values of the statement's model can carry a
// Recorder, cached per type so models without one pay a map lookup.
func holds(t reflect.Type) bool {
	if v, ok := holdsCache.Load(t); ok {
		return v.(bool)
	}
	ok := t.Kind() == reflect.Struct && reflect.PointerTo(t).Implements(holderType)
	holdsCache.Store(t, ok)
	return ok
}

var holdsCache sync.Map // reflect.Type -> bool

// recorders calls fn for every Recorder in v, with the model that embeds
// it: a model, a pointer to one, or a slice or array of either.
func recorders(v reflect.Value, fn func(r *Recorder, model reflect.Value)) {
	for v.Kind() == reflect.Pointer || v.Kind() == reflect.Interface {
		if v.IsNil() {
			return
		}
		v = v.Elem()
	}
	switch v.Kind() {
	case reflect.Slice, reflect.Array:
		for i := range v.Len() {
			recorders(v.Index(i), fn)
		}
	case reflect.Struct:
		if v.CanAddr() && holds(v.Type()) {
			fn(v.Addr().Interface().(recorderHolder).outboxRecorder(), v)
		}
	}
}

func hasRecorded(db *gorm.DB) bool {
	if db.Statement.Schema == nil || !holds(db.Statement.Schema.ModelType) || !db.Statement.ReflectValue.IsValid() {
		return false
	}
	found := false
	recorders(db.Statement.ReflectValue, func(r *Recorder, _ reflect.Value) { found = found || len(r.recorded) > 0 })
	return found
}

const startedKey = "outbox:started_transaction"

// beginForEvents opens a transaction for a statement that carries recorded
// events when GORM will not (SkipDefaultTransaction), so that in persistent
// mode the events are written atomically with the model.
func beginForEvents(db *gorm.DB) {
	if db.Error != nil || !db.SkipDefaultTransaction || !hasRecorded(db) {
		return
	}
	if o := fromDB(db); o == nil || o.noTable != nil { // memory mode writes nothing in the transaction
		return
	}
	if _, inTx := txhook.Tracked(db.Statement.ConnPool); inTx {
		return
	}
	tx := db.Session(&gorm.Session{NewDB: true}).Begin()
	if tx.Error != nil {
		_ = db.AddError(fmt.Errorf("outbox: begin transaction for recorded events: %w", tx.Error))
		return
	}
	db.Statement.ConnPool = tx.Statement.ConnPool
	db.InstanceSet(startedKey, true)
}

func commitIfStarted(db *gorm.DB) {
	if _, ok := db.InstanceGet(startedKey); !ok {
		return
	}
	if db.Error != nil {
		db.Rollback()
	} else {
		db.Commit()
	}
	db.Statement.ConnPool = db.ConnPool
}

// harvest publishes the events recorded on the statement's models in the
// statement's transaction. It runs only when the statement wrote
// something: Save on a missing primary key first runs an UPDATE that
// touches no row, then a Create, and the events belong to the Create.
//
// Events stay on the entity until the transaction commits (a hook clears
// them then). A harvest skips the events an earlier harvest published in
// the same live transaction, unless a savepoint rolled back past it; and a
// rolled-back transaction leaves them all to publish again.
func harvest(db *gorm.DB) {
	if db.Error != nil || db.RowsAffected == 0 || db.Statement.Schema == nil ||
		!holds(db.Statement.Schema.ModelType) || !db.Statement.ReflectValue.IsValid() {
		return
	}
	t, _ := txhook.Tracked(db.Statement.ConnPool)
	type harvested struct {
		r  *Recorder
		to int
	}
	var (
		recs   []harvested
		events []Event
		err    error
	)
	recorders(db.Statement.ReflectValue, func(r *Recorder, model reflect.Value) {
		// Only the marks of this live transaction still count.
		live := r.marks[:0]
		from := r.base
		for _, m := range r.marks {
			if t != nil && t.Has(m) {
				live = append(live, m)
				from = max(from, m.to)
			}
		}
		clear(r.marks[len(live):])
		r.marks = live
		fresh := r.recorded[from-r.base:]
		if len(fresh) == 0 {
			return
		}
		if r.undone > from && r.base+len(r.recorded) > r.undone {
			warnRetried(db, model, r.undone-from, r.base+len(r.recorded)-r.undone)
		}
		r.undone = 0
		if e := fillRecorded(db, fresh, model); e != nil && err == nil {
			err = e
		}
		recs = append(recs, harvested{r: r, to: r.base + len(r.recorded)})
		events = append(events, fresh...)
	})
	if err == nil && len(events) > 0 {
		// In a transaction, but for memory mode with
		// SkipDefaultTransaction, whose events are dispatched at once.
		err = publish(db, true, events)
	}
	if err != nil {
		_ = db.AddError(err)
		return
	}
	for _, h := range recs {
		if t == nil {
			// Published at once (no transaction), or in one the plugin
			// cannot see commit: nothing to wait for.
			h.r.clearTo(h.to)
			continue
		}
		m := &harvestMark{r: h.r, to: h.to}
		if t.Add(m, func() { m.r.clearTo(m.to) }) {
			h.r.marks = append(h.r.marks, m)
			t.OnUndone(func() { m.r.undone = max(m.r.undone, m.to) })
		}
	}
}

// warnRetried says that a model publishes events kept from a transaction
// that rolled back together with events recorded since: what a retry of
// code that records and saves does, publishing one business change twice.
func warnRetried(db *gorm.DB, model reflect.Value, kept, since int) {
	if o := fromDB(db); o != nil {
		ctx := db.Statement.Context
		if ctx == nil {
			ctx = context.Background()
		}
		o.logger.WarnContext(ctx, "outbox: a model publishes events kept from a transaction that rolled back together with events recorded since; if the code that records them was retried, the change is published twice: record outside the retried function, or on an entity loaded inside it (docs/modes.md, \"Recorder\")",
			slog.String("model", model.Type().String()), slog.Int("kept", kept), slog.Int("recorded_since", since))
	}
}

// clearTo drops the events before the absolute count to, which a
// committed transaction published.
func (r *Recorder) clearTo(to int) {
	if n := to - r.base; n > 0 {
		r.recorded = append([]Event(nil), r.recorded[min(n, len(r.recorded)):]...)
		r.base = to
	}
}

// fillRecorded fixes the defaults of recorded events on the entity itself,
// so that a retry publishes the same event: the ID and OccurredAt, and the
// aggregate from the model (its primary key and table) when empty.
func fillRecorded(db *gorm.DB, events []Event, model reflect.Value) error {
	sch := db.Statement.Schema
	now := time.Now()
	if o := fromDB(db); o != nil {
		now = o.now()
	}
	var aggID string
	for i := range events {
		e := &events[i]
		if e.ID == "" {
			id, err := encode.NewID()
			if err != nil {
				return err
			}
			e.ID = id
		}
		if e.OccurredAt.IsZero() {
			e.OccurredAt = now
		}
		if e.AggregateID == "" {
			if aggID == "" {
				aggID = primaryKey(db, model)
			}
			e.AggregateID = aggID
		}
		if e.AggregateType == "" && e.AggregateID != "" {
			e.AggregateType = sch.Table
		}
	}
	return nil
}

// primaryKey renders the model's primary key, "" when it has none set.
func primaryKey(db *gorm.DB, model reflect.Value) string {
	var parts []string
	for _, f := range db.Statement.Schema.PrimaryFields {
		v, zero := f.ValueOf(db.Statement.Context, model)
		if zero {
			return ""
		}
		parts = append(parts, fmt.Sprint(v))
	}
	return strings.Join(parts, ":")
}
