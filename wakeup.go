package outbox

import (
	"sync"
)

// A committed event should reach a relay in milliseconds, not a poll
// interval. Three paths carry the news, all of them hints (the poll stays):
//
//   - in-process: the commit wakes every relay running in the same process;
//   - PostgreSQL: the writing process sends NOTIFY after the commit,
//     debounced, and relays LISTEN on a dedicated connection. The NOTIFY is
//     deliberately not part of the business transaction: PostgreSQL
//     serialises the commits of transactions that notify;
//   - Config.DeliverAfterCommit: the in-process relay is handed the IDs just
//     committed and claims exactly those at once.

// wakers is the set of relays running in this process.
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

func (ws *wakers) wakeAll() {
	ws.mu.Lock()
	for w := range ws.set {
		w.poke()
	}
	ws.mu.Unlock()
}

func (w *waker) poke() {
	select {
	case w.wake <- struct{}{}:
	default: // already pending: wake-ups coalesce
	}
}

// published runs after a commit that wrote events (or right after an insert
// outside a transaction).
func (o *Outbox) published(ids []int64) {
	if o.deliverAfterCommit && len(ids) > 0 {
		select {
		case o.fresh <- ids:
		default: // the relay is busy; its regular claim will find them
		}
	}
	o.wakers.wakeAll()
	if o.notifier != nil {
		o.notifier.signal()
	}
}
