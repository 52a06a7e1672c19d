package outbox

import (
	"time"

	"github.com/gorm-outbox/outbox/internal/maint"
	"github.com/gorm-outbox/outbox/internal/store"
)

// RetainForever, as Config.RetainSent, keeps sent rows (relays delete
// none); as Config.InboxRetention, every inbox record.
const RetainForever time.Duration = -1

// defaultRetainSent is Config.RetainSent's default.
const defaultRetainSent = 72 * time.Hour

// services is the background work a relay runs beside delivery: retention
// of sent rows and of their history (unless Config.RetainSent is
// RetainForever), its heartbeat,
// and the overview's rollup, where the store has them.
func (r *Relay) services() []maint.Service {
	var svcs []maint.Service
	h, _ := r.o.store.(store.History)
	if r.o.retainSent != RetainForever {
		svcs = append(svcs, maint.Retention(r.o.store, h, r.table.DB, r.o.retainSent, r.cfg.StatementTimeout, r.o.now))
	}
	if _, ok := r.o.store.(store.Overview); ok {
		svcs = append(svcs, r.o.rollup(r.table.DB, r.cfg.StatementTimeout).Service())
	}
	if rs, ok := r.o.store.(store.Relays); ok {
		svcs = append(svcs, r.heartbeat(rs))
	}
	return svcs
}
