package outbox

import (
	"context"
	"database/sql"
	"errors"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/gorm-outbox/outbox/internal/engine"
	"github.com/gorm-outbox/outbox/internal/store"
)

// PostgreSQL carries wake-ups between processes: the writing process sends
// NOTIFY after a commit that wrote events, debounced, and relays LISTEN on
// a dedicated connection. The NOTIFY is deliberately not part of the
// business transaction: PostgreSQL serialises the commits of transactions
// that notify.

// The gap after a NOTIFY bounds the NOTIFY rate of one pool: wake-ups
// arriving while a NOTIFY is in flight, or within the gap after it, share
// the next one. It starts at minNotifyGap and doubles, up to maxNotifyGap,
// while every NOTIFY finds the next wake-up already waiting: writers that
// keep committing keep the relays busy, and a busy relay needs no wake-up
// (each NOTIFY is a transaction that takes PostgreSQL's notification lock;
// at one per millisecond it cost 8 writers about 10% of their commits,
// BENCHMARKS.md). A NOTIFY that finds nothing waiting resets the gap, so
// a lone commit wakes the relays at once.
//
// A NOTIFY at the smallest gap may skip the gap after it while the pool's
// notifier has credit (notifyCredit): one NOTIFY's worth per minNotifyGap
// since the last, at most notifyBurst. The rate stays at one per
// minNotifyGap over time, but a commit that comes soon after another's
// NOTIFY is not held for the gap: at 500 commits a second that cut the
// wake-up's p99 by half a millisecond, and the writers' cost did not move
// (BENCHMARKS.md).
//
// A pool that commits faster than busyCommitRate (judged over at least
// rateWindow) waits at least busyGap after each NOTIFY, credit or not: at
// that rate a NOTIFY a millisecond cost one writer 7 points of its commits
// (BENCHMARKS.md, "A busy pool's NOTIFY"), and a relay elsewhere finds
// several events per wake-up anyway, waiting up to busyGap for it. Below
// it, where the push latency is judged (500 commits a second), every
// commit may have its own NOTIFY as before.
//
// A process that runs a relay on the pool that committed sends no NOTIFY: the
// in-process wake-up reaches that relay at once, and a relay kept busy
// delivers what the others would (see published).
const (
	minNotifyGap   = time.Millisecond
	maxNotifyGap   = 8 * time.Millisecond
	notifyBurst    = 2
	busyCommitRate = 1500 // wake-ups a second
	busyGap        = 4 * time.Millisecond
	rateWindow     = 10 * time.Millisecond
)

// notifierIdle is how long the notifier's goroutine, and the connection
// it holds, outlive the last wake-up: long enough to serve a burst of
// commits on one connection, short enough that no goroutine lingers once
// writing stops.
const notifierIdle = 250 * time.Millisecond

// notifier sends the debounced NOTIFY of one process. The Outbox owns it;
// its goroutine runs while there is something to send and stops
// notifierIdle after the last.
type notifier struct {
	o       *Outbox
	n       store.Notifier
	db      *sql.DB
	poke    chan struct{}
	signals atomic.Uint64 // wake-ups not yet counted by the loop's commitRate
	running atomic.Bool
	failing atomic.Bool
	notify  func(context.Context, store.DB) error // the NOTIFY; only the running loop touches it
}

func newNotifier(o *Outbox, n store.Notifier, db *sql.DB) *notifier {
	return &notifier{o: o, n: n, db: db, poke: make(chan struct{}, 1)}
}

func (n *notifier) signal() {
	n.signals.Add(1)
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
	idle := time.NewTimer(notifierIdle)
	defer idle.Stop()
	gap := minNotifyGap
	var (
		credit notifyCredit
		rate   commitRate
	)
	for {
		select {
		case <-n.poke:
			conn = n.send(conn)
			now := time.Now()
			free := credit.spend(now)
			gap = nextNotifyGap(gap, len(n.poke) > 0)
			if rate.observe(now, n.signals.Swap(0)) {
				gap, free = max(gap, busyGap), false
			}
			if gap > minNotifyGap || !free {
				time.Sleep(gap) // rate limit, not synchronisation
			}
			if !idle.Stop() {
				<-idle.C
			}
			idle.Reset(notifierIdle)
		case <-idle.C:
			n.running.Store(false)
			// A signal may have come in after the timer fired but before
			// running was cleared; it found running set and started nothing.
			if len(n.poke) == 0 || !n.running.CompareAndSwap(false, true) {
				return
			}
			idle.Reset(notifierIdle)
		}
	}
}

// nextNotifyGap is the gap after a NOTIFY, given the one before and
// whether the next wake-up was already waiting when it was sent. (Growing
// it whenever a wake-up came in during the gap sent a tenth as many NOTIFYs
// for one writer, but at 500 commits a second put the relays' wake-ups
// 6 ms late instead of 1.4 ms: BENCHMARKS.md.)
func nextNotifyGap(gap time.Duration, waiting bool) time.Duration {
	if !waiting {
		return minNotifyGap
	}
	return min(2*gap, maxNotifyGap)
}

// notifyCredit is the credit of NOTIFYs that may skip the gap after them.
type notifyCredit struct {
	credit float64   // NOTIFYs' worth, at most notifyBurst
	at     time.Time // of the last spend; zero before the first
}

// spend records a NOTIFY sent at now and reports whether the gap after it
// may be skipped: whether credit is left once the NOTIFY is paid for.
func (c *notifyCredit) spend(now time.Time) (free bool) {
	if c.at.IsZero() {
		c.credit = notifyBurst
	} else {
		c.credit = min(notifyBurst, c.credit+float64(now.Sub(c.at))/float64(minNotifyGap))
	}
	c.at = now
	c.credit--
	return c.credit >= 1
}

// commitRate tells whether wake-ups come faster than busyCommitRate.
type commitRate struct {
	start time.Time // of the window; zero before the first observation
	n     uint64    // wake-ups in the window
	busy  bool      // the verdict on the last whole window
}

// observe adds n wake-ups counted at now and reports whether the last
// window of at least rateWindow saw more than busyCommitRate a second.
func (r *commitRate) observe(now time.Time, n uint64) (busy bool) {
	if r.start.IsZero() {
		r.start = now
	}
	r.n += n
	if d := now.Sub(r.start); d >= rateWindow {
		r.busy = float64(r.n) > busyCommitRate*d.Seconds()
		r.start, r.n = now, 0
	}
	return r.busy
}

// send sends one NOTIFY on conn (taking a connection when conn is nil) and
// returns the connection to use next time: nil after an error, so that a
// broken one is replaced. The statement is resolved once (its channel
// depends on the schema, the same on every connection of the pool) and
// again after an error.
func (n *notifier) send(conn *sql.Conn) *sql.Conn {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var err error
	if conn == nil {
		conn, err = n.db.Conn(ctx)
	}
	if err == nil && n.notify == nil {
		n.notify, err = n.n.PrepareNotify(ctx, conn)
	}
	if err == nil {
		err = n.notify(ctx, conn)
	}
	if err != nil {
		n.notify = nil
		if conn != nil {
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

// listen keeps a LISTEN connection open and pokes w on every notification.
// It reconnects with backoff; if LISTEN cannot work at all it logs that once
// and returns, leaving the relay to poll.
func (r *Relay) listen(ctx context.Context, n store.Notifier, w *waker) {
	retry := engine.Backoff{Min: r.cfg.PollInterval, Max: max(30*time.Second, r.cfg.PollInterval)}
	var failing engine.Episode
	for ctx.Err() == nil {
		err := r.listenOnce(ctx, n, w, func() {
			if was, _ := failing.End(); was {
				r.o.logger.InfoContext(ctx, "outbox: relay listening for notifications again")
				// A LISTEN connection breaks when its server goes: the
				// server may be another now (see Relay.Run's recovery).
				r.table.Resweep()
			}
			retry.Reset()
		})
		if ctx.Err() != nil {
			return
		}
		if errors.Is(err, store.ErrListenUnsupported) {
			r.o.logger.WarnContext(ctx, "outbox: LISTEN unavailable; the relay polls every PollInterval", slog.Any("error", err))
			return
		}
		if failing.Begin() {
			r.o.logger.WarnContext(ctx, "outbox: LISTEN connection lost; polling until it is back", slog.Any("error", err))
		}
		engine.Sleep(ctx, retry.Next())
	}
}

func (r *Relay) listenOnce(ctx context.Context, n store.Notifier, w *waker, listening func()) error {
	sqlDB, err := r.db.DB()
	if err != nil {
		return err
	}
	conn, err := sqlDB.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	return n.Listen(ctx, conn, func() {
		listening()
		w.poke() // events committed before LISTEN took effect
	}, w.poke)
}
