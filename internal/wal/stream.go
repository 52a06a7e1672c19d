package wal

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorm-outbox/outbox/internal/engine"
	"github.com/gorm-outbox/outbox/internal/errs"
	"github.com/gorm-outbox/outbox/internal/store"
	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

// Logical mode, the relay's side: one relay at a time streams the slot
// (PostgreSQL lets one connection stream a slot; the others stand by and
// retry), decodes the outbox's messages in commit order, delivers them in
// batches and confirms the slot's position only once every outcome of a
// batch is durable: delivered, or written to the table for a retry or as
// failed. A crash replays from the last confirmed position, so delivery is
// at least once. The duplicates are what was received but not confirmed:
// the batch in flight and, when the last position report is lost with the
// connection, the one before (RELIABILITY.md measures it); after a
// PostgreSQL crash, what was confirmed since its last checkpoint too.

// walTxn is one committed transaction's outbox events.
type walTxn struct {
	items []walItem
	end   pglogrepl.LSN // confirming it means never seeing the transaction again
}

// walItem is one event read from the stream.
type walItem struct {
	c       engine.Item // attempts 1, createdAt the commit time
	row     store.Event // for writing it to the table
	checked bool        // its ID or key was chosen by the publisher
}

// Prepare makes cfg a replication connection's configuration: a
// database replication connection, with the relay's wal_sender_timeout
// unless the DSN chose one.
func Prepare(cfg *pgconn.Config) {
	cfg.RuntimeParams["replication"] = "database"
	if !setsWalSenderTimeout(cfg.RuntimeParams) {
		cfg.RuntimeParams["wal_sender_timeout"] = strconv.FormatInt(replicationTimeout.Milliseconds(), 10)
	}
}

// replicationTimeout is the wal_sender_timeout the relay sets on its
// replication connection (the server's default is 60 s). The server ends a
// replication session it has heard nothing from for this long, which frees
// the slot for a standby: a relay that froze, was partitioned away or lost
// its host is replaced within seconds rather than a minute. The reader
// reports ten times in that window (streamLimits).
const replicationTimeout = 5 * time.Second

// setsWalSenderTimeout reports whether the replication DSN chose its own
// wal_sender_timeout, as a parameter of its own or in options (-c ...);
// the relay keeps it, and derives its limits from it.
func setsWalSenderTimeout(params map[string]string) bool {
	_, ok := params["wal_sender_timeout"]
	return ok || strings.Contains(params["options"], "wal_sender_timeout")
}

// sqlState reports whether err is a PostgreSQL error with that SQLSTATE:
// what the replication protocol answers (the stores classify the errors
// of their own statements).
func sqlState(err error, code string) bool {
	var pe *pgconn.PgError
	return errors.As(err, &pe) && pe.Code == code
}

// errSlotBusy: another connection streams the slot.
var errSlotBusy = errors.New("outbox: another relay streams the replication slot")

// startStream opens a replication connection and starts streaming the
// slot from its confirmed position. timeout is the wal_sender_timeout the
// server applies to the session (0: none).
func (r *Relay) startStream(ctx context.Context) (conn *pgconn.PgConn, timeout time.Duration, err error) {
	conn, err = pgconn.ConnectConfig(ctx, r.Repl)
	if err != nil {
		return nil, 0, fmt.Errorf("outbox: open the replication connection: %w", err)
	}
	if timeout, err = SessionTimeout(ctx, conn); err != nil {
		_ = conn.Close(context.Background())
		return nil, 0, err
	}
	err = pglogrepl.StartReplication(ctx, conn, r.Slot, 0, pglogrepl.StartReplicationOptions{PluginArgs: []string{
		"proto_version '1'", "publication_names '" + r.Slot + "'", "messages 'true'",
	}})
	if err != nil {
		_ = conn.Close(context.Background())
		if sqlState(err, "55006") { // object_in_use: the slot is active for another PID
			return nil, 0, errSlotBusy
		}
		if sqlState(err, "42704") { // undefined_object
			return nil, 0, fmt.Errorf("%w: slot %s: %w", errs.ErrNoSlot, r.Slot, err)
		}
		return nil, 0, fmt.Errorf("outbox: start streaming slot %s: %w", r.Slot, err)
	}
	return conn, timeout, nil
}

// SessionTimeout asks the server which wal_sender_timeout it applies to
// the session: the DSN's when it sets one, the relay's otherwise (a
// connection's own setting takes precedence over the role's, the
// database's and the server's).
func SessionTimeout(ctx context.Context, conn *pgconn.PgConn) (time.Duration, error) {
	rs, err := conn.Exec(ctx, "SELECT setting FROM pg_settings WHERE name = 'wal_sender_timeout'").ReadAll()
	if err != nil {
		return 0, fmt.Errorf("outbox: read wal_sender_timeout on the replication connection: %w", err)
	}
	if len(rs) != 1 || len(rs[0].Rows) != 1 || len(rs[0].Rows[0]) != 1 {
		return 0, errors.New("outbox: read wal_sender_timeout on the replication connection: no such setting")
	}
	ms, err := strconv.ParseInt(string(rs[0].Rows[0][0]), 10, 64)
	if err != nil || ms < 0 {
		return 0, fmt.Errorf("outbox: read wal_sender_timeout on the replication connection: %q is not a number of milliseconds", rs[0].Rows[0][0])
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// streamer is one streaming session on one replication connection.
type streamer struct {
	r    *Relay
	conn *pgconn.PgConn
	txns chan walTxn
	lim  streamLimits

	handed pglogrepl.LSN // reader only: end of the last transaction handed over
	done   atomic.Uint64 // end of the last transaction whose outcomes are durable
	kick   chan struct{} // the dispatcher confirmed something: report it soon
	until  pglogrepl.LSN // ProcessOnce: stop once the stream has passed it
	failed atomic.Bool   // the reader stopped on an error: the connection is gone
	closed sync.Once     // of txns: the reader hands over nothing more

	// The session's clocks, in nanoseconds since base, read with now
	// (time.Now; tests move it): when the last successful position report
	// began, when the last message known to be fresh arrived from the
	// server, and when the server last said, asked through the pool, that
	// the session held the slot.
	now       func() time.Time
	base      time.Time
	lastSent  atomic.Int64
	lastHeard atomic.Int64
	vouched   atomic.Int64

	// holdsSlot asks the server, through the pool, whether this session's
	// walsender still streams the slot.
	holdsSlot func(context.Context) (bool, error)
}

func (r *Relay) newStreamer(conn *pgconn.PgConn, timeout time.Duration, until pglogrepl.LSN) *streamer {
	s := &streamer{r: r, conn: conn, txns: make(chan walTxn, 64), kick: make(chan struct{}, 1), until: until,
		lim: limitsFor(timeout), now: time.Now}
	s.base = s.now() // both clocks at 0: the server has just answered START_REPLICATION
	s.holdsSlot = func(ctx context.Context) (bool, error) { return r.slotHeldBy(ctx, conn.PID()) }
	return s
}

func (s *streamer) stamp(clock *atomic.Int64, t time.Time) { clock.Store(int64(t.Sub(s.base))) }

func (s *streamer) since(clock *atomic.Int64, now time.Time) time.Duration {
	return now.Sub(s.base) - time.Duration(clock.Load())
}

// status reports the position up to which the slot may be freed: the
// last transaction with durable outcomes, or, when every transaction
// handed over is done and the reader is between transactions, all it has
// received (transactions without outbox messages need no outcome).
func (s *streamer) confirmable(received pglogrepl.LSN, inTxn bool) pglogrepl.LSN {
	done := pglogrepl.LSN(s.done.Load())
	if done >= s.handed && !inTxn {
		return max(done, received)
	}
	return done
}

func (s *streamer) sendStatus(ctx context.Context, pos pglogrepl.LSN, reply bool) error {
	return pglogrepl.SendStandbyStatusUpdate(ctx, s.conn, pglogrepl.StandbyStatusUpdate{
		WALWritePosition: pos, WALFlushPosition: pos, WALApplyPosition: pos, ReplyRequested: reply,
	})
}

// streamLimits are a session's timing, derived from the wal_sender_timeout
// T the server applies to it. The server ends the session once nothing
// has arrived from the relay for T (any standby status update restarts
// its clock), which frees the slot for a standby; it asks for a reply
// once T/2 has passed, and while it replays a large transaction it reads
// the relay's messages only then, so it may be silent for about T/2.
//
// A stream that has gone silent (a network partition, a NAT or load
// balancer that dropped the flow, a host that vanished without resetting
// its connections) looks like an idle one: writes still succeed into the
// socket's buffer. And a relay that was frozen (SIGSTOP, a suspended VM,
// a starved process) for longer than T finds, when it resumes, an open
// socket holding what the server streamed to it before giving it up:
// transactions that a standby has since received again and delivered.
// Hence the two clocks of the session: the relay delivers a batch only
// while its last successful report is recent enough that the server
// cannot have timed the session out, and while it has heard from the
// server recently or the server says, through the pool, that the session
// still holds the slot. Reads alone cannot tell: after a freeze they
// return old data at once.
type streamLimits struct {
	timeout time.Duration // T; 0: the server has none
	// status is how often the reader reports its position, each time
	// asking the server for a reply: ten times per T, at most once a
	// second.
	status time.Duration
	// unreported is how long the relay may go without a successful
	// report before it presumes the session over on the server's side
	// (T/2; 0 when T is): the reader reports no more, the dispatcher
	// delivers nothing more, and the stream is given up.
	unreported time.Duration
	// silence is how long the server may say nothing (3T/4, above the
	// T/2 of a large transaction; 15 s without T): past it, the reader
	// gives the stream up to reconnect, and the dispatcher asks whether
	// the session still holds the slot before delivering.
	silence time.Duration
}

func limitsFor(timeout time.Duration) streamLimits {
	if timeout <= 0 {
		return streamLimits{status: time.Second, silence: 15 * time.Second}
	}
	return streamLimits{
		timeout:    timeout,
		status:     min(time.Second, timeout/10),
		unreported: timeout / 2,
		silence:    timeout * 3 / 4,
	}
}

// errSessionStale: the session may already be over on the server's side.
var errSessionStale = errors.New("outbox: the replication session may be over on the server's side")

// expired reports whether the relay has gone without a successful report
// for longer than the session allows (the server may have ended it).
func (s *streamer) expired(now time.Time) error {
	if s.lim.unreported <= 0 {
		return nil
	}
	if d := s.since(&s.lastSent, now); d > s.lim.unreported {
		return fmt.Errorf("%w: the relay sent no position report for %v (frozen or starved?) and the server ends a session after %v without one (wal_sender_timeout): another relay may have taken the slot over and delivered what this session holds; giving the stream up without delivering it",
			errSessionStale, d.Round(100*time.Millisecond), s.lim.timeout)
	}
	return nil
}

// deliverable reports whether the dispatcher may deliver a batch now: nil,
// or why not. Checked right before each batch; a batch refused is neither
// delivered nor confirmed, so the next session, or the relay that took the
// slot over, receives it again.
func (s *streamer) deliverable(ctx context.Context) error {
	now := s.now()
	if err := s.expired(now); err != nil {
		return err
	}
	silent := s.since(&s.lastHeard, now)
	if silent <= s.lim.silence || s.since(&s.vouched, now) <= s.lim.silence {
		return nil
	}
	// Nothing fresh from the server for a while: a partition, or only a
	// dispatcher too busy to take what the reader held (the reader reads
	// nothing while it waits, and then what it finds may be old). The
	// server knows; its answer counts as word from it.
	held, err := s.holdsSlot(ctx)
	if err == nil && held {
		s.stamp(&s.vouched, now)
	}
	switch {
	case err != nil:
		return fmt.Errorf("%w: nothing heard from the server for %v, and whether the session still holds the slot cannot be read: %w; giving the stream up without delivering what it holds",
			errSessionStale, silent.Round(100*time.Millisecond), err)
	case !held:
		return fmt.Errorf("%w: nothing heard from the server for %v, and the session no longer holds the slot; giving the stream up without delivering what it holds",
			errSessionStale, silent.Round(100*time.Millisecond))
	}
	return nil
}

// read owns the connection: it receives the stream, hands each committed
// transaction that carries outbox events to the dispatcher (in commit
// order) and reports the confirmable position. It closes txns when it
// returns: on ctx's end, an error, or, in ProcessOnce, once the stream
// has passed s.until.
func (s *streamer) read(ctx context.Context) error {
	err := s.receive(ctx)
	if err != nil {
		s.failed.Store(true) // before the close: the dispatcher checks it after every receive
	}
	s.handedAll()
	return err
}

// handedAll tells the dispatcher that the reader hands over nothing more.
func (s *streamer) handedAll() { s.closed.Do(func() { close(s.txns) }) }

func (s *streamer) receive(ctx context.Context) error {
	rd := s.newReader()
	for {
		if err := rd.turn(ctx); err != nil {
			return err
		}
		raw, err := rd.receiveMessage(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if pgconn.Timeout(err) {
				if err := rd.idle(); err != nil {
					return err
				}
				continue
			}
			return fmt.Errorf("outbox: receive from the replication stream: %w", err)
		}
		rd.heard()
		if ok, err := rd.handle(ctx, raw); !ok {
			return err // nil: ctx ended
		}
	}
}

// reader is the reader's side of a session, touched by the reader alone:
// what it has received, the transaction it is receiving, and when it
// reports next. Its handlers return ok false when the reader stops: err
// says why, nil when ctx ended.
type reader struct {
	*streamer
	prefix string

	received   pglogrepl.LSN // everything before it has been received
	cur        *walTxn       // the transaction being received
	commitTime time.Time
	nextStatus time.Time
	// catchingUp: the reader stopped reading for a while (it waited on
	// the dispatcher, or the process did not run), so what the socket
	// holds may be old and says nothing of the server now. Set until a
	// receive finds the socket empty.
	catchingUp  bool
	lastLoop    time.Time
	heldUp      time.Duration // a turn of the loop takes 100 ms at most, unless held up
	listenSince time.Time     // the silence limit counts from here too
	// caughtUp: in ProcessOnce, everything committed before the call is
	// handed over. The reader goes on reporting (the server counts the
	// relay's silence while the dispatcher delivers the batch), but reads
	// nothing more into the position it reports: what arrives now is left
	// unconfirmed, for the next session.
	caughtUp bool
}

func (s *streamer) newReader() *reader {
	now := time.Now()
	return &reader{streamer: s, prefix: Prefix(s.r.Slot), nextStatus: now, lastLoop: now,
		heldUp: max(s.lim.status, 200*time.Millisecond)}
}

// turn begins a turn of the loop, reporting the position when it is due.
func (rd *reader) turn(ctx context.Context) error {
	if rd.until != 0 && !rd.caughtUp && rd.cur == nil && rd.received >= rd.until {
		rd.caughtUp = true
		rd.handedAll()
	}
	now := time.Now()
	if now.Sub(rd.lastLoop) > rd.heldUp {
		rd.catchingUp = true
	}
	rd.lastLoop = now
	select {
	case <-rd.kick:
		rd.nextStatus = time.Now()
	default:
	}
	if !time.Now().Before(rd.nextStatus) {
		return rd.report(ctx)
	}
	return nil
}

func (rd *reader) report(ctx context.Context) error {
	began := rd.now()
	if err := rd.expired(began); err != nil {
		// The server may have ended the session: a report now would
		// restart the clock the dispatcher reads.
		return err
	}
	if err := rd.sendStatus(ctx, rd.confirmable(rd.received, rd.cur != nil), true); err != nil {
		return fmt.Errorf("outbox: report the stream's position: %w", err)
	}
	rd.stamp(&rd.lastSent, began) // when it began: a freeze inside the write counts
	interval := rd.lim.status
	if rd.until != 0 && !rd.caughtUp {
		// ProcessOnce asks for the server's position until it has
		// caught up: an idle server would not say otherwise.
		interval = 10 * time.Millisecond
	}
	rd.nextStatus = time.Now().Add(interval)
	return nil
}

// receiveMessage waits for a message no longer than until the next report
// is due, so that reports leave on time however quiet the stream.
func (rd *reader) receiveMessage(ctx context.Context) (pgproto3.BackendMessage, error) {
	wait := min(time.Until(rd.nextStatus), 100*time.Millisecond)
	if rd.until != 0 {
		wait = min(wait, 20*time.Millisecond)
	}
	rctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	return rd.conn.ReceiveMessage(rctx)
}

// idle follows a receive that found nothing: it gives the stream up once
// the server has been silent for too long.
func (rd *reader) idle() error {
	now := rd.now()
	if err := rd.expired(now); err != nil {
		return err // the process did not run (a receive waits 100 ms at most): not the server's silence
	}
	if rd.catchingUp {
		// The socket is drained: whatever arrives now is fresh, and the
		// server has been asked to reply.
		rd.catchingUp, rd.listenSince = false, now
		return nil
	}
	if silent := min(rd.since(&rd.lastHeard, now), now.Sub(rd.listenSince)); silent > rd.lim.silence {
		return fmt.Errorf("outbox: the replication stream has been silent for %v, though asked to reply; reconnecting", silent.Round(100*time.Millisecond))
	}
	return nil
}

// heard follows a receive that found a message: word from the server,
// unless it may be old.
func (rd *reader) heard() {
	if time.Since(rd.lastLoop) > rd.heldUp {
		rd.catchingUp = true // the process did not run while it received
	}
	if !rd.catchingUp {
		rd.stamp(&rd.lastHeard, rd.now())
	}
}

// handle is the reader's dispatcher: to the handler of the message's kind.
func (rd *reader) handle(ctx context.Context, raw pgproto3.BackendMessage) (ok bool, err error) {
	switch m := raw.(type) {
	case *pgproto3.ErrorResponse:
		return false, fmt.Errorf("outbox: replication stream: %w", pgconn.ErrorResponseToPgError(m))
	case *pgproto3.CopyData:
		if len(m.Data) == 0 {
			return true, nil
		}
		switch m.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			err := rd.keepalive(m.Data[1:])
			return err == nil, err
		case pglogrepl.XLogDataByteID:
			return rd.xlogData(ctx, m.Data[1:])
		}
	}
	return true, nil
}

func (rd *reader) keepalive(data []byte) error {
	ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(data)
	if err != nil {
		return fmt.Errorf("outbox: replication stream: %w", err)
	}
	if rd.cur == nil && !rd.caughtUp {
		rd.received = max(rd.received, ka.ServerWALEnd)
	}
	if ka.ReplyRequested {
		rd.nextStatus = time.Now()
	}
	return nil
}

// xlogData handles a message of pgoutput's.
func (rd *reader) xlogData(ctx context.Context, data []byte) (ok bool, err error) {
	if rd.caughtUp {
		return true, nil
	}
	x, err := pglogrepl.ParseXLogData(data)
	if err != nil {
		return false, fmt.Errorf("outbox: replication stream: %w", err)
	}
	msg, err := pglogrepl.Parse(x.WALData)
	if err != nil {
		return false, fmt.Errorf("outbox: decode the replication stream at %s: %w", x.WALStart, err)
	}
	switch msg := msg.(type) {
	case *pglogrepl.BeginMessage:
		rd.begin(msg)
	case *pglogrepl.LogicalDecodingMessage:
		rd.message(ctx, msg)
	case *pglogrepl.CommitMessage:
		return rd.commit(ctx, msg, x.ServerWALEnd)
	default:
		rd.other(x.ServerWALEnd)
	}
	return true, nil
}

func (rd *reader) begin(msg *pglogrepl.BeginMessage) {
	rd.cur, rd.commitTime = &walTxn{}, msg.CommitTime
}

// message takes the outbox's events from a logical decoding message.
// Whatever it skips leaves the position as it was, even between
// transactions: a keepalive moves it on.
func (rd *reader) message(ctx context.Context, msg *pglogrepl.LogicalDecodingMessage) {
	if msg.Prefix != rd.prefix || !msg.Transactional {
		return
	}
	items, err := decodeWAL(msg.Content, rd.commitTime)
	if err != nil {
		// Only this package writes this prefix; a message it cannot read
		// is corruption, and skipping it loses its events: say so loudly,
		// with where it is.
		rd.r.Logger.ErrorContext(ctx, "outbox: an outbox message in the WAL cannot be decoded; its events are skipped",
			slog.String("lsn", msg.LSN.String()), slog.Any("error", err))
		return
	}
	if rd.cur == nil { // a message outside Begin/Commit: never from pgoutput
		rd.cur = &walTxn{}
	}
	rd.cur.items = append(rd.cur.items, items...)
}

// commit hands the transaction over when it carries outbox events: a
// transaction split across several messages goes over whole, as it is
// confirmed whole.
func (rd *reader) commit(ctx context.Context, msg *pglogrepl.CommitMessage, walEnd pglogrepl.LSN) (ok bool, err error) {
	if rd.cur != nil && len(rd.cur.items) > 0 {
		rd.cur.end = msg.TransactionEndLSN
		if ok, err := rd.handOver(ctx, *rd.cur); !ok {
			return false, err
		}
		rd.handed = msg.TransactionEndLSN
	}
	rd.cur = nil
	rd.received = max(rd.received, msg.TransactionEndLSN, walEnd)
	return true, nil
}

// other handles pgoutput's other messages (Relation, Origin, ...):
// nothing to hand over, but between transactions, all up to here is
// received.
func (rd *reader) other(walEnd pglogrepl.LSN) {
	if rd.cur == nil {
		rd.received = max(rd.received, walEnd)
	}
}

// handOver gives the dispatcher a transaction, reporting meanwhile while
// it is busy: the server counts the relay's silence, however long the
// dispatcher takes.
func (rd *reader) handOver(ctx context.Context, t walTxn) (ok bool, err error) {
	select {
	case rd.txns <- t:
		return true, nil
	default:
	}
	timer := time.NewTimer(time.Until(rd.nextStatus))
	defer timer.Stop()
	for {
		select {
		case rd.txns <- t:
			return true, nil
		case <-ctx.Done():
			return false, nil
		case <-rd.kick:
			rd.nextStatus = time.Now()
		case <-timer.C:
		}
		if !time.Now().Before(rd.nextStatus) {
			if err := rd.report(ctx); err != nil {
				return false, err
			}
		}
		timer.Reset(time.Until(rd.nextStatus))
	}
}

// Run streams the slot until ctx ends: it holds the slot while it can,
// stands by while another relay does, and reconnects after errors.
func (r *Relay) Run(ctx context.Context) {
	var (
		standing, failing engine.Episode
		retry             = engine.Backoff{Min: r.PollInterval, Max: max(5*time.Second, r.PollInterval)}
		// lost: the slot was found missing, and no session has started on
		// the one that replaces it yet.
		lost bool
	)
	for ctx.Err() == nil {
		conn, timeout, err := r.startStream(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, errs.ErrNoSlot):
			failing.Begin()
			if !lost {
				lost = true
				r.slotLost(ctx)
			}
			engine.Sleep(ctx, retry.Next())
			continue
		case errors.Is(err, errSlotBusy):
			if standing.Begin() {
				r.Logger.InfoContext(ctx, "outbox: another relay streams the slot; standing by to take over", slog.String("slot", r.Slot))
			}
			// Jittered, so that standbys do not knock together.
			engine.Sleep(ctx, time.Duration(500+rand.IntN(500))*time.Millisecond)
			continue
		case err != nil:
			if failing.Begin() {
				r.Logger.ErrorContext(ctx, "outbox: cannot stream the replication slot; retrying with backoff", slog.Any("error", err))
			}
			engine.Sleep(ctx, retry.Next())
			continue
		}
		wasStanding, _ := standing.End()
		wasFailing, _ := failing.End()
		switch {
		case lost:
			lost = false
			r.Logger.ErrorContext(ctx, "outbox: streaming a new replication slot in place of the lost one; the events committed after delivered_lsn that the old slot had not streamed are not in it",
				slog.String("slot", r.Slot), slog.String("delivered_lsn", pglogrepl.LSN(r.delivered.Load()).String()))
		case wasStanding || wasFailing:
			r.Logger.InfoContext(ctx, "outbox: streaming the replication slot", slog.String("slot", r.Slot))
		}
		retry.Reset()
		if _, err := r.stream(ctx, conn, timeout, 0); err != nil && ctx.Err() == nil {
			r.Logger.ErrorContext(ctx, "outbox: the replication stream broke; reconnecting", slog.Any("error", err))
			failing.Begin()
			engine.Sleep(ctx, retry.Next())
		}
	}
}

// slotLost reports the slot missing: loudly, since the events it had not
// streamed yet are out of reach, with the position this relay had
// delivered up to, where that window starts (as far as this process
// knows: another relay may have streamed further).
func (r *Relay) slotLost(ctx context.Context) {
	r.Logger.ErrorContext(ctx, "outbox: the replication slot is gone: a failover to a standby that had no copy of it (PostgreSQL before 17's synchronized failover slots), or a DROP. Events committed after delivered_lsn that it had not streamed will never be delivered; Publish fails with ErrNoSlot until db.Use creates a new slot (docs/logical.md, \"Standbys and failover\")",
		slog.String("slot", r.Slot), slog.String("delivered_lsn", pglogrepl.LSN(r.delivered.Load()).String()))
	if r.SlotLost != nil {
		r.SlotLost()
	}
}

// Once is ProcessOnce's streaming side: it delivers what was
// committed before the call, unless another relay holds the slot.
func (r *Relay) Once(ctx context.Context) (int, error) {
	pos, err := r.Logical.WALPosition(ctx, r.DB)
	if err != nil {
		return 0, fmt.Errorf("outbox: read the WAL position: %w", err)
	}
	until := pglogrepl.LSN(pos)
	conn, timeout, err := r.startStream(ctx)
	if errors.Is(err, errSlotBusy) {
		return 0, nil // the relay streaming it delivers these events
	}
	if err != nil {
		return 0, err
	}
	return r.stream(ctx, conn, timeout, until)
}

// stream runs one session on conn, whose wal_sender_timeout is timeout:
// the reader and the dispatcher, until ctx ends, the stream breaks or may
// be over on the server's side, or (until != 0) it has passed until. It
// closes conn and returns how many events it handled.
func (r *Relay) stream(ctx context.Context, conn *pgconn.PgConn, timeout time.Duration, until pglogrepl.LSN) (int, error) {
	s := r.newStreamer(conn, timeout, until)
	rctx, stopReader := context.WithCancel(ctx)
	var (
		wg      sync.WaitGroup
		readErr error
	)
	wg.Add(1)
	go func() { defer wg.Done(); readErr = s.read(rctx) }()

	// The session's freshness is checked before each event too: a relay
	// frozen mid-batch must not deliver the rest once a standby may hold
	// the slot.
	stale := func() error { return s.expired(s.now()) }
	n, err := s.dispatch(ctx, func(ctx context.Context, items []walItem) (handled, error) {
		return r.handleStream(ctx, items, stale)
	})
	stopReader()
	for range s.txns { // unblock the reader; these were not handled and are not confirmed
	}
	wg.Wait()
	if d := s.done.Load(); d > 0 {
		r.delivered.Store(d)
	}
	// The final report: what this session confirmed. Not on a connection
	// the reader saw break: pgconn is closing it from a goroutine of its
	// own, and pglogrepl writes to it without pgconn's lock; the server
	// keeps the last position reported before, and replays from there.
	if done := pglogrepl.LSN(s.done.Load()); done > 0 && readErr == nil && !conn.IsClosed() {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.StatementTimeout)
		if serr := s.sendStatus(fctx, done, false); serr != nil && err == nil && readErr == nil {
			err = fmt.Errorf("outbox: report the stream's position: %w", serr)
		}
		_, _ = pglogrepl.SendStandbyCopyDone(fctx, conn)
		cancel()
	}
	pid := conn.PID()
	_ = conn.Close(context.Background())
	r.awaitRelease(ctx, pid)
	if err == nil && ctx.Err() == nil {
		err = readErr
	}
	return n, err
}

// dispatch is the session's dispatcher: it hands the reader's transactions
// to handle (Relay.handleStream) in batches, and records what is done for
// the reader to confirm. It returns once the reader has stopped, a batch's
// outcomes are not durable, the session may be over on the server's side
// (deliverable), or, in ProcessOnce, after one batch.
func (s *streamer) dispatch(ctx context.Context, handle func(context.Context, []walItem) (handled, error)) (n int, err error) {
	r, until := s.r, s.until
	var probe engine.Probe
	for {
		batch, ok := s.nextBatch(r.BatchSize, until != 0)
		if !ok || s.failed.Load() {
			// A broken connection cannot confirm anything any more: what
			// the reader had buffered is left to the next session, which
			// receives it again, rather than delivered twice.
			return n, nil
		}
		if err := s.deliverable(ctx); err != nil {
			// Nor can a session the server may have ended: a standby may
			// hold the slot, and have delivered this batch already.
			return n, err
		}
		var end pglogrepl.LSN
		var items []walItem
		for _, t := range batch {
			items = append(items, t.items...)
			end = t.end
		}
		res, werr := handle(ctx, items)
		if werr != nil {
			// Outcomes not durable: stop without confirming; the next
			// session delivers the batch again.
			return n, werr
		}
		n += res.handled
		s.done.Store(uint64(end))
		select {
		case s.kick <- struct{}{}:
		default:
		}
		switch {
		case res.down != nil:
			// The rest of the batch is in the table, due now: the table's
			// loop probes the destination with it, and logs the outage
			// once. The stream holds back meanwhile, leaving new events
			// in the slot, at the same pace.
			if until != 0 {
				err = fmt.Errorf("%w; batch handed to the table undelivered", res.down) // the cause first, as the table source says it
			}
			pause := probe.Pause(res.down)
			if until == 0 {
				engine.Sleep(ctx, pause)
			}
		case res.sent > 0:
			probe.Reset()
		}
		if until != 0 {
			return n, err // ProcessOnce: one batch, as from the table
		}
	}
}

// slotHeldBy reports whether the walsender with this PID streams the slot.
func (r *Relay) slotHeldBy(ctx context.Context, pid uint32) (bool, error) {
	qctx, cancel := context.WithTimeout(ctx, r.StatementTimeout)
	defer cancel()
	return r.Logical.SlotHeldBy(qctx, r.DB, r.Slot, pid)
}

// awaitRelease waits, briefly, until the walsender that served a closed
// session has released the slot: PostgreSQL frees it as that process
// exits, a moment after the connection closes. Without the wait, the next
// ProcessOnce (of this relay or another in this process) would find the
// slot busy and take this session's own shadow for another relay.
func (r *Relay) awaitRelease(ctx context.Context, pid uint32) {
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	for {
		held, err := r.slotHeldBy(wctx, pid)
		if err != nil || !held {
			return
		}
		engine.Sleep(wctx, 5*time.Millisecond)
		if wctx.Err() != nil {
			return
		}
	}
}

// nextBatch waits for a transaction, then takes those already waiting (or,
// with fill, those still to come until the reader stops), up to limit
// events or just past it: whole transactions only, since a transaction is
// confirmed as a whole. ok is false once the reader has stopped.
func (s *streamer) nextBatch(limit int, fill bool) (batch []walTxn, ok bool) {
	t, ok := <-s.txns
	if !ok {
		return nil, false
	}
	batch, n := []walTxn{t}, len(t.items)
	for n < limit {
		if fill {
			t, ok := <-s.txns
			if !ok {
				break
			}
			batch, n = append(batch, t), n+len(t.items)
			continue
		}
		select {
		case t, ok := <-s.txns:
			if !ok {
				return batch, true
			}
			batch, n = append(batch, t), n+len(t.items)
		default:
			return batch, true
		}
	}
	return batch, true
}
