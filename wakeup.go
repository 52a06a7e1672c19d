package outbox

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/stdlib"
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
func (o *Outbox) published(ids []string) {
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

// notifyGap bounds the NOTIFY rate of one process: wake-ups arriving while a
// NOTIFY is in flight, or within this gap after it, share the next one.
const notifyGap = time.Millisecond

// notifier sends the debounced NOTIFY of one process. Its goroutine runs
// while there is something to send and exits after a second idle.
type notifier struct {
	o       *Outbox
	db      *sql.DB
	channel string
	poke    chan struct{}
	running atomic.Bool
	failing atomic.Bool
}

func newNotifier(o *Outbox, db *sql.DB) *notifier {
	return &notifier{o: o, db: db, channel: channelName(o.table), poke: make(chan struct{}, 1)}
}

// channelName derives the NOTIFY channel from the table, within
// PostgreSQL's 63-byte identifier limit.
func channelName(table string) string {
	const suffix = "_outbox_wakeup"
	if len(table)+len(suffix) > 63 {
		table = table[:63-len(suffix)]
	}
	return table + suffix
}

func (n *notifier) signal() {
	select {
	case n.poke <- struct{}{}:
	default:
	}
	if n.running.CompareAndSwap(false, true) {
		go n.loop()
	}
}

func (n *notifier) loop() {
	// One connection held for as long as the loop runs: borrowing one from
	// the pool per NOTIFY churns connections when the pool keeps few idle
	// ones (database/sql's default is two), and a new PostgreSQL backend per
	// NOTIFY put tens of milliseconds on the wake-up (BENCHMARKS.md).
	var conn *sql.Conn
	defer func() {
		if conn != nil {
			_ = conn.Close()
		}
	}()
	idle := time.NewTimer(time.Second)
	defer idle.Stop()
	for {
		select {
		case <-n.poke:
			conn = n.send(conn)
			time.Sleep(notifyGap) // rate limit, not synchronisation
			if !idle.Stop() {
				<-idle.C
			}
			idle.Reset(time.Second)
		case <-idle.C:
			n.running.Store(false)
			// A signal may have come in after the timer fired but before
			// running was cleared; it found running set and started nothing.
			if len(n.poke) == 0 || !n.running.CompareAndSwap(false, true) {
				return
			}
			idle.Reset(time.Second)
		}
	}
}

// send sends one NOTIFY on conn (taking a connection when conn is nil) and
// returns the connection to use next time: nil after an error, so that a
// broken one is replaced.
func (n *notifier) send(conn *sql.Conn) *sql.Conn {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var err error
	if conn == nil {
		conn, err = n.db.Conn(ctx)
	}
	if err == nil {
		_, err = conn.ExecContext(ctx, "SELECT pg_notify($1, '')", n.channel)
		if err != nil {
			_ = conn.Close()
			conn = nil
		}
	}
	switch {
	case err != nil && n.failing.CompareAndSwap(false, true):
		// A lost hint delays delivery to the next poll; it loses nothing.
		n.o.logger.Warn("outbox: NOTIFY after commit failed; relays in other processes will find the events by polling", slog.Any("error", err))
	case err == nil && n.failing.Load():
		n.failing.Store(false)
	}
	return conn
}

var errListenUnsupported = errors.New("the database driver is not pgx (github.com/jackc/pgx/v5/stdlib)")

// listen keeps a LISTEN connection open and pokes w on every notification.
// It reconnects with backoff; if LISTEN cannot work at all it logs that once
// and returns, leaving the relay to poll.
func (r *Relay) listen(ctx context.Context, w *waker) {
	retry := r.cfg.PollInterval
	failing := false
	for ctx.Err() == nil {
		err := r.listenOnce(ctx, w, func() {
			if failing {
				r.o.logger.InfoContext(ctx, "outbox: relay listening for notifications again")
			}
			failing, retry = false, r.cfg.PollInterval
		})
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, errListenUnsupported) {
			r.o.logger.WarnContext(ctx, "outbox: LISTEN unavailable; the relay polls every PollInterval", slog.Any("error", err))
			return
		}
		if !failing {
			r.o.logger.WarnContext(ctx, "outbox: LISTEN connection lost; polling until it is back", slog.Any("error", err))
			failing = true
		}
		t := time.NewTimer(retry)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		retry = min(retry*2, 30*time.Second)
	}
}

func (r *Relay) listenOnce(ctx context.Context, w *waker, listening func()) error {
	sqlDB, err := r.db.DB()
	if err != nil {
		return err
	}
	conn, err := sqlDB.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	return conn.Raw(func(dc any) error {
		sc, ok := dc.(*stdlib.Conn)
		if !ok {
			return errListenUnsupported
		}
		pc := sc.Conn()
		if _, err := pc.Exec(ctx, `LISTEN "`+channelName(r.o.table)+`"`); err != nil {
			return err
		}
		listening()
		r.listening.Store(true)
		defer r.listening.Store(false)
		w.poke() // events committed before LISTEN took effect
		for {
			if _, err := pc.WaitForNotification(ctx); err != nil {
				// The connection carries a LISTEN and may be mid-read: never
				// hand it back to the pool.
				return errors.Join(err, driver.ErrBadConn)
			}
			w.poke()
		}
	})
}

// retentionBatch is how many sent rows one DELETE removes: small enough to
// hold locks briefly, large enough to keep up with a busy relay.
const retentionBatch = 1000

// retain deletes sent rows older than RetainSent, in small batches, until
// ctx is done. Failed rows are never deleted.
func (r *Relay) retain(ctx context.Context) {
	every := min(r.cfg.RetainSent/10, time.Minute)
	t := time.NewTimer(0)
	defer t.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		_, err := r.DeleteSent(ctx)
		if ctx.Err() != nil {
			return
		}
		if err != nil && !failing {
			r.o.logger.WarnContext(ctx, "outbox: deleting old sent events failed; will retry", slog.Any("error", err))
		}
		failing = err != nil
		t.Reset(every)
	}
}

// DeleteSent deletes sent rows older than RetainSent, in batches of 1000,
// and returns how many it deleted. Run calls it periodically; call it
// yourself when you run retention from a job of your own.
func (r *Relay) DeleteSent(ctx context.Context) (int, error) {
	if r.err != nil {
		return 0, r.err
	}
	sqlDB, err := r.db.DB()
	if err != nil {
		return 0, err
	}
	total := 0
	q := r.o.sql.deleteSentSQL()
	for ctx.Err() == nil {
		sctx, cancel := context.WithTimeout(ctx, r.cfg.StatementTimeout)
		res, err := sqlDB.ExecContext(sctx, q, r.o.now().Add(-r.cfg.RetainSent), retentionBatch)
		cancel()
		if err != nil {
			return total, fmt.Errorf("outbox: delete sent events: %w", err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return total, fmt.Errorf("outbox: delete sent events: %w", err)
		}
		total += int(n)
		if n < retentionBatch {
			break
		}
	}
	return total, nil
}
