package outbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"gorm.io/driver/postgres"
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
	c       claimed // attempts 1, createdAt the commit time
	enc     encoded // for writing it to the table
	checked bool    // its ID or key was chosen by the publisher
}

// replicationConfig is the replication connection's configuration: the
// DSN the *gorm.DB was opened with unless RelayConfig.ReplicationDSN is set.
func (r *Relay) replicationConfig() (*pgconn.Config, error) {
	dsn := r.cfg.ReplicationDSN
	if dsn == "" {
		if d, ok := r.db.Dialector.(*postgres.Dialector); ok && d.Config != nil {
			dsn = d.Config.DSN
		}
	}
	if dsn == "" {
		return nil, fmt.Errorf("%w: Logical mode needs a replication connection and the *gorm.DB was not opened from a DSN: set RelayConfig.ReplicationDSN", ErrInvalidConfig)
	}
	cfg, err := pgconn.ParseConfig(dsn)
	if err != nil {
		// The DSN may hold a password: name the field, not its value.
		return nil, fmt.Errorf("%w: the replication DSN does not parse (%T)", ErrInvalidConfig, err)
	}
	cfg.RuntimeParams["replication"] = "database"
	return cfg, nil
}

// errSlotBusy: another connection streams the slot.
var errSlotBusy = errors.New("outbox: another relay streams the replication slot")

// startStream opens a replication connection and starts streaming the
// slot from its confirmed position.
func (r *Relay) startStream(ctx context.Context) (*pgconn.PgConn, error) {
	conn, err := pgconn.ConnectConfig(ctx, r.repl)
	if err != nil {
		return nil, fmt.Errorf("outbox: open the replication connection: %w", err)
	}
	err = pglogrepl.StartReplication(ctx, conn, r.o.slot, 0, pglogrepl.StartReplicationOptions{PluginArgs: []string{
		"proto_version '1'", "publication_names '" + r.o.slot + "'", "messages 'true'",
	}})
	if err != nil {
		_ = conn.Close(context.Background())
		if isSQLState(err, "55006") { // object_in_use: the slot is active for another PID
			return nil, errSlotBusy
		}
		if isSQLState(err, "42704") { // undefined_object
			return nil, fmt.Errorf("%w: slot %s: %w", ErrNoSlot, r.o.slot, err)
		}
		return nil, fmt.Errorf("outbox: start streaming slot %s: %w", r.o.slot, err)
	}
	return conn, nil
}

// streamer is one streaming session on one replication connection.
type streamer struct {
	r    *Relay
	conn *pgconn.PgConn
	txns chan walTxn

	handed pglogrepl.LSN // reader only: end of the last transaction handed over
	done   atomic.Uint64 // end of the last transaction whose outcomes are durable
	kick   chan struct{} // the dispatcher confirmed something: report it soon
	until  pglogrepl.LSN // ProcessOnce: stop once the stream has passed it
	failed atomic.Bool   // the reader stopped on an error: the connection is gone
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

// standbyStatusInterval is how often the reader reports its position, well
// inside PostgreSQL's wal_sender_timeout (60 s by default).
const standbyStatusInterval = time.Second

// A stream that has gone silent (a network partition, a NAT or load
// balancer that dropped the flow, a host that vanished without resetting
// its connections) looks like an idle one: writes still succeed into the
// socket's buffer. The reader asks the server for a reply every
// streamPingInterval, and gives the stream up, to reconnect, once nothing
// at all has arrived for streamSilenceLimit.
const (
	streamPingInterval = 3 * time.Second
	streamSilenceLimit = 15 * time.Second
)

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
	close(s.txns)
	return err
}

func (s *streamer) receive(ctx context.Context) error {
	var (
		received   pglogrepl.LSN // everything before it has been received
		cur        *walTxn       // the transaction being received
		commitTime time.Time
		nextStatus = time.Now()
		prefix     = logicalPrefix(s.r.o.slot)
		lastHeard  = time.Now()
		lastPing   = time.Now()
	)
	report := func(reply bool) error {
		if time.Since(lastPing) >= streamPingInterval {
			reply, lastPing = true, time.Now()
		}
		pos := s.confirmable(received, cur != nil)
		if err := s.sendStatus(ctx, pos, reply); err != nil {
			return fmt.Errorf("outbox: report the stream's position: %w", err)
		}
		interval := standbyStatusInterval
		if s.until != 0 {
			// ProcessOnce asks for the server's position until it has
			// caught up: an idle server would not say otherwise.
			interval = 10 * time.Millisecond
		}
		nextStatus = time.Now().Add(interval)
		return nil
	}
	for {
		if s.until != 0 && cur == nil && received >= s.until {
			return nil // everything committed before ProcessOnce is handed over
		}
		select {
		case <-s.kick:
			nextStatus = time.Now()
		default:
		}
		if !time.Now().Before(nextStatus) {
			if err := report(s.until != 0); err != nil {
				return err
			}
		}
		wait := min(time.Until(nextStatus), 100*time.Millisecond)
		if s.until != 0 {
			wait = min(wait, 20*time.Millisecond)
		}
		rctx, cancel := context.WithTimeout(ctx, wait)
		raw, err := s.conn.ReceiveMessage(rctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if pgconn.Timeout(err) {
				if silent := time.Since(lastHeard); silent > streamSilenceLimit {
					return fmt.Errorf("outbox: the replication stream has been silent for %v, though asked to reply; reconnecting", silent.Round(time.Second))
				}
				continue
			}
			return fmt.Errorf("outbox: receive from the replication stream: %w", err)
		}
		lastHeard = time.Now()
		switch m := raw.(type) {
		case *pgproto3.ErrorResponse:
			return fmt.Errorf("outbox: replication stream: %w", pgconn.ErrorResponseToPgError(m))
		case *pgproto3.CopyData:
			if len(m.Data) == 0 {
				continue
			}
			switch m.Data[0] {
			case pglogrepl.PrimaryKeepaliveMessageByteID:
				ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(m.Data[1:])
				if err != nil {
					return fmt.Errorf("outbox: replication stream: %w", err)
				}
				if cur == nil {
					received = max(received, ka.ServerWALEnd)
				}
				if ka.ReplyRequested {
					nextStatus = time.Now()
				}
			case pglogrepl.XLogDataByteID:
				x, err := pglogrepl.ParseXLogData(m.Data[1:])
				if err != nil {
					return fmt.Errorf("outbox: replication stream: %w", err)
				}
				msg, err := pglogrepl.Parse(x.WALData)
				if err != nil {
					return fmt.Errorf("outbox: decode the replication stream at %s: %w", x.WALStart, err)
				}
				switch msg := msg.(type) {
				case *pglogrepl.BeginMessage:
					cur, commitTime = &walTxn{}, msg.CommitTime
				case *pglogrepl.LogicalDecodingMessage:
					if msg.Prefix != prefix || !msg.Transactional {
						continue
					}
					items, err := decodeWAL(msg.Content, commitTime)
					if err != nil {
						// Only this package writes this prefix; a message it
						// cannot read is corruption, and skipping it loses
						// its events: say so loudly, with where it is.
						s.r.o.logger.ErrorContext(ctx, "outbox: an outbox message in the WAL cannot be decoded; its events are skipped",
							slog.String("lsn", msg.LSN.String()), slog.Any("error", err))
						continue
					}
					if cur == nil { // a message outside Begin/Commit: never from pgoutput
						cur = &walTxn{}
					}
					cur.items = append(cur.items, items...)
				case *pglogrepl.CommitMessage:
					if cur != nil && len(cur.items) > 0 {
						cur.end = msg.TransactionEndLSN
						select {
						case s.txns <- *cur:
						case <-ctx.Done():
							return nil
						}
						s.handed = msg.TransactionEndLSN
					}
					cur = nil
					received = max(received, msg.TransactionEndLSN)
				}
				if cur == nil {
					received = max(received, x.ServerWALEnd)
				}
			}
		}
	}
}

// decodeWAL decodes one outbox message into its events.
func decodeWAL(content []byte, commitTime time.Time) ([]walItem, error) {
	var msg []walEvent
	if err := json.Unmarshal(content, &msg); err != nil {
		return nil, err
	}
	items := make([]walItem, len(msg))
	for i, w := range msg {
		if w.ID == "" || w.Type == "" {
			return nil, fmt.Errorf("event %d of %d has no ID or type", i+1, len(msg))
		}
		e := Event{
			ID: w.ID, Type: w.Type, AggregateType: w.AggregateType, AggregateID: w.AggregateID,
			IdempotencyKey: w.Key, Payload: json.RawMessage(w.Payload), OccurredAt: w.OccurredAt.UTC(),
		}
		if e.IdempotencyKey == "" {
			e.IdempotencyKey = e.ID
		}
		var bad error
		if len(w.Headers) > 0 {
			if err := json.Unmarshal(w.Headers, &e.Headers); err != nil {
				bad = fmt.Errorf("outbox: decode headers of event %s: %w", e.ID, err)
			}
		}
		items[i] = walItem{
			c:       claimed{ev: e, attempts: 1, createdAt: commitTime.UTC(), bad: bad},
			enc:     encoded{Event: e, payload: w.Payload, headers: w.Headers},
			checked: w.Checked,
		}
	}
	return items, nil
}

// streamRun is Run's streaming side: it holds the slot while it can,
// stands by while another relay does, and reconnects after errors.
func (r *Relay) streamRun(ctx context.Context) {
	var (
		standing bool // logged "standing by" for the current episode
		failing  bool
		retry    = r.cfg.PollInterval
	)
	for ctx.Err() == nil {
		conn, err := r.startStream(ctx)
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, errSlotBusy):
			if !standing {
				r.o.logger.InfoContext(ctx, "outbox: another relay streams the slot; standing by to take over", slog.String("slot", r.o.slot))
				standing = true
			}
			sleepCtx(ctx, time.Duration(500+rand.IntN(500))*time.Millisecond)
			continue
		case err != nil:
			if !failing {
				r.o.logger.ErrorContext(ctx, "outbox: cannot stream the replication slot; retrying with backoff", slog.Any("error", err))
				failing = true
			}
			sleepCtx(ctx, retry)
			retry = min(retry*2, 5*time.Second)
			continue
		}
		if standing || failing {
			r.o.logger.InfoContext(ctx, "outbox: streaming the replication slot", slog.String("slot", r.o.slot))
		}
		standing, failing, retry = false, false, r.cfg.PollInterval
		if _, err := r.stream(ctx, conn, 0); err != nil && ctx.Err() == nil {
			r.o.logger.ErrorContext(ctx, "outbox: the replication stream broke; reconnecting", slog.Any("error", err))
			failing = true
			sleepCtx(ctx, retry)
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// streamOnce is ProcessOnce's streaming side: it delivers what was
// committed before the call, unless another relay holds the slot.
func (r *Relay) streamOnce(ctx context.Context) (int, error) {
	var until pglogrepl.LSN
	sqlDB, err := rawDB(r.db)
	if err != nil {
		return 0, err
	}
	if err := sqlDB.QueryRowContext(ctx, "SELECT pg_current_wal_flush_lsn()").Scan(&until); err != nil {
		return 0, fmt.Errorf("outbox: read the WAL position: %w", err)
	}
	conn, err := r.startStream(ctx)
	if errors.Is(err, errSlotBusy) {
		return 0, nil // the relay streaming it delivers these events
	}
	if err != nil {
		return 0, err
	}
	return r.stream(ctx, conn, until)
}

// stream runs one session on conn: the reader and the dispatcher, until
// ctx ends, the stream breaks, or (until != 0) it has passed until. It
// closes conn and returns how many events it handled.
func (r *Relay) stream(ctx context.Context, conn *pgconn.PgConn, until pglogrepl.LSN) (int, error) {
	s := &streamer{r: r, conn: conn, txns: make(chan walTxn, 64), kick: make(chan struct{}, 1), until: until}
	rctx, stopReader := context.WithCancel(ctx)
	var (
		wg      sync.WaitGroup
		readErr error
	)
	wg.Add(1)
	go func() { defer wg.Done(); readErr = s.read(rctx) }()

	var (
		n       int
		err     error
		probeIn = destProbeMin
	)
	for {
		batch, ok := s.nextBatch(r.cfg.BatchSize, until != 0)
		if !ok || s.failed.Load() {
			// A broken connection cannot confirm anything any more: what
			// the reader had buffered is left to the next session, which
			// receives it again, rather than delivered twice.
			break
		}
		var end pglogrepl.LSN
		var items []walItem
		for _, t := range batch {
			items = append(items, t.items...)
			end = t.end
		}
		handled, down, werr := r.handleStream(ctx, items)
		if werr != nil {
			// Outcomes not durable: stop without confirming; the next
			// session delivers the batch again.
			err = werr
			break
		}
		n += handled
		s.done.Store(uint64(end))
		select {
		case s.kick <- struct{}{}:
		default:
		}
		switch {
		case down != nil:
			// The rest of the batch is in the table, due now: the table's
			// loop probes the destination with it, and logs the outage
			// once. The stream holds back meanwhile, leaving new events
			// in the slot, with the same backoff.
			if until != 0 {
				err = fmt.Errorf("outbox: batch handed to the table undelivered: %w", down)
			}
			pause := probeIn
			if d, ok := retryDelay(down); ok {
				pause = min(d, maxProbePause)
			}
			if until == 0 {
				sleepCtx(ctx, pause)
			}
			probeIn = min(probeIn*2, destProbeMax)
		case r.delivered.Load():
			probeIn = destProbeMin
		}
		if until != 0 {
			break // ProcessOnce: one batch, as from the table
		}
	}
	stopReader()
	for range s.txns { // unblock the reader; these were not handled and are not confirmed
	}
	wg.Wait()
	// The final report: what this session confirmed. Not on a connection
	// the reader saw break: pgconn is closing it from a goroutine of its
	// own, and pglogrepl writes to it without pgconn's lock; the server
	// keeps the last position reported before, and replays from there.
	if done := pglogrepl.LSN(s.done.Load()); done > 0 && readErr == nil && !conn.IsClosed() {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.StatementTimeout)
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

// awaitRelease waits, briefly, until the walsender that served a closed
// session has released the slot: PostgreSQL frees it as that process
// exits, a moment after the connection closes. Without the wait, the next
// ProcessOnce (of this relay or another in this process) would find the
// slot busy and take this session's own shadow for another relay.
func (r *Relay) awaitRelease(ctx context.Context, pid uint32) {
	sqlDB, err := rawDB(r.db)
	if err != nil {
		return
	}
	wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	for {
		var held bool
		err := sqlDB.QueryRowContext(wctx, "SELECT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = $1 AND active_pid = $2)",
			r.o.slot, int64(pid)).Scan(&held)
		if err != nil || !held {
			return
		}
		sleepCtx(wctx, 5*time.Millisecond)
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
