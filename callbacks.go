package outbox

import (
	"errors"
	"fmt"
	"reflect"
	"sync"

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
// would) and clears them, so saving the entity again does not publish them
// twice. It works for slices of models too. Recorder adds no column to the
// model's table. Like the rest of an entity, it is not safe for concurrent
// use.
type Recorder struct {
	recorded []Event
}

// Record adds events to be published with the entity's next write.
func (r *Recorder) Record(events ...Event) { r.recorded = append(r.recorded, events...) }

// Recorded returns a copy of the events recorded and not yet published.
func (r *Recorder) Recorded() []Event { return append([]Event(nil), r.recorded...) }

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

// recorders calls fn for every Recorder in v: a model, a pointer to one, or
// a slice or array of either.
func recorders(v reflect.Value, fn func(*Recorder)) {
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
			fn(v.Addr().Interface().(recorderHolder).outboxRecorder())
		}
	}
}

func hasRecorded(db *gorm.DB) bool {
	if db.Statement.Schema == nil || !holds(db.Statement.Schema.ModelType) || !db.Statement.ReflectValue.IsValid() {
		return false
	}
	found := false
	recorders(db.Statement.ReflectValue, func(r *Recorder) { found = found || len(r.recorded) > 0 })
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
	if o := fromDB(db); o == nil || o.mode != Persistent {
		return
	}
	if _, inTx := trackedTx(db.Statement.ConnPool); inTx {
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
// statement's transaction, then clears them. It runs only when the statement
// wrote something: Save on a missing primary key first runs an UPDATE that
// touches no row, then a Create, and the events belong to the Create.
func harvest(db *gorm.DB) {
	if db.Error != nil || db.RowsAffected == 0 || db.Statement.Schema == nil ||
		!holds(db.Statement.Schema.ModelType) || !db.Statement.ReflectValue.IsValid() {
		return
	}
	var (
		recs   []*Recorder
		events []Event
	)
	recorders(db.Statement.ReflectValue, func(r *Recorder) {
		if len(r.recorded) > 0 {
			recs = append(recs, r)
			events = append(events, r.recorded...)
		}
	})
	if len(events) == 0 {
		return
	}
	if err := Publish(db, events...); err != nil {
		_ = db.AddError(err)
		return
	}
	for _, r := range recs {
		r.recorded = nil
	}
}
