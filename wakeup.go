package outbox

import (
	"database/sql"
	"sync"
	"sync/atomic"

	"github.com/gorm-outbox/outbox/internal/store"
	"gorm.io/gorm"
)

// A committed event should reach a relay in milliseconds, not a poll
// interval. Three paths carry the news, all of them hints (the poll stays):
//
//   - in-process: the commit wakes every relay of its database's pool
//     running in the same process, or, when there is none, every relay of
//     the Outbox (one may serve that database through another pool);
//   - PostgreSQL: a writing process that runs no relay on the database
//     sends NOTIFY after the commit, debounced, and relays LISTEN on a
//     dedicated connection. The NOTIFY is deliberately not part of the
//     business transaction: PostgreSQL serialises the commits of
//     transactions that notify;
//   - Config.DeliverAfterCommit: the in-process relay is handed the IDs just
//     committed and claims exactly those at once.

// site is one database the Outbox is installed on (an Outbox may serve
// many: a database per tenant): the news of a commit goes to that
// database's relays and NOTIFY channel only.
type site struct {
	o        *Outbox
	wakers   wakers       // its relays running in this process
	fresh    chan []int64 // seqs just committed on it, for DeliverAfterCommit
	notifier *notifier    // its NOTIFY, PostgreSQL only
	lead     atomic.Int32 // whether it takes Consume's txhook.Lead: leadUnknown, leadYes, leadNo
}

// Published implements txhook.Announcer: it runs after the commit of a
// transaction on s's database that wrote events.
func (s *site) Published(seqs []int64) { s.o.published(s, seqs) }

// siteOf returns the site of sqlDB, creating it on first use.
func (o *Outbox) siteOf(sqlDB *sql.DB) *site {
	if s, ok := o.sites.Load(sqlDB); ok {
		return s.(*site)
	}
	s := &site{o: o, fresh: make(chan []int64, 1024)}
	if n, ok := o.store.(store.Notifier); ok && o.notify && sqlDB != nil {
		s.notifier = newNotifier(o, n, sqlDB)
	}
	got, _ := o.sites.LoadOrStore(sqlDB, s)
	return got.(*site)
}

// siteFor returns the site of the database db (or the transaction it is
// in) belongs to.
func (o *Outbox) siteFor(db *gorm.DB) *site {
	if sqlDB, err := db.DB(); err == nil {
		return o.siteOf(sqlDB)
	}
	// A pool that is no *sql.DB (a wrapper of the caller's): its relays,
	// which cannot be created on it either, are none.
	return o.siteOf(nil)
}

// wakers is the set of relays of one database running in this process.
type wakers struct {
	mu  sync.Mutex
	set map[*waker]struct{}
}

type waker struct{ wake chan struct{} }

func (ws *wakers) add() *waker {
	w := &waker{wake: make(chan struct{}, 1)}
	ws.mu.Lock()
	if ws.set == nil {
		ws.set = map[*waker]struct{}{}
	}
	ws.set[w] = struct{}{}
	ws.mu.Unlock()
	return w
}

func (ws *wakers) remove(w *waker) {
	ws.mu.Lock()
	delete(ws.set, w)
	ws.mu.Unlock()
}

// wakeAll pokes every relay in the set and returns how many there are.
func (ws *wakers) wakeAll() int {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	for w := range ws.set {
		w.poke()
	}
	return len(ws.set)
}

func (w *waker) poke() {
	select {
	case w.wake <- struct{}{}:
	default: // already pending: wake-ups coalesce
	}
}

// published runs after a commit on s's database that wrote events (or
// right after an insert outside a transaction).
func (o *Outbox) published(s *site, ids []int64) {
	if o.deliverAfterCommit && len(ids) > 0 {
		select {
		case s.fresh <- ids:
		default: // the relay is busy; its regular claim will find them
		}
	}
	if s.wakers.wakeAll() > 0 {
		// A relay of this process runs on that pool and is woken now: a
		// NOTIFY would only wake the other processes' relays to claim what
		// it claims, for a commit's worth of the writer's time. Relays
		// elsewhere find the events when they poll, and one kept busy
		// claims again at once, as the woken one does.
		return
	}
	// No relay of this process runs on that pool, but one may serve the
	// same database through a pool of its own (an app that opens one for
	// writes and one for its relay): a spurious claim is cheaper than a
	// poll interval's wait.
	o.sites.Range(func(_, other any) bool {
		other.(*site).wakers.wakeAll()
		return true
	})
	if s.notifier != nil {
		s.notifier.signal()
	}
}
