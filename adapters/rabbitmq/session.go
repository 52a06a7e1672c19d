package rabbitmq

import (
	"context"
	"fmt"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"
)

// session is one connection with one confirm-mode channel. It dies with
// either of them and is then replaced, never repaired.
type session struct {
	conn *amqp.Connection
	ch   *amqp.Channel

	// pubMu makes reading the next delivery tag and publishing one step, so
	// the tag registered for a message is the one the broker confirms.
	pubMu sync.Mutex

	mu        sync.Mutex
	pending   map[uint64]*inflight // by delivery tag
	blocked   string               // the broker's reason while it blocks the connection
	err       error                // why the session ended; nil while it is alive
	closeOnce sync.Once
}

// inflight is a published message waiting for its confirm.
type inflight struct {
	msgID string
	// dc is the library's record of the message's confirm, set once the
	// message is sent: the broker's ack or nack ([inflight.outcome]).
	dc *amqp.DeferredConfirmation
	// returned is the broker's basic.return of the message, recorded by
	// the loop before it sends on result.
	returned *amqp.Return
	// result is the loop's word: nil once the confirm came, else why the
	// session ended first. Buffered: the loop never waits for a publisher
	// that gave up.
	result chan error
}

// outcome is the message's fate once its confirm came. The ack or nack is
// the DeferredConfirmation's, which the library settles before it tells
// the loop's listener: the listener's own Confirmation cannot be trusted
// with several messages in flight, because amqp091-go (1.16) hands a
// multiple=true ack or nack to every tag up to it, overriding a confirm
// the broker sent for one of them alone, out of order, just before (a
// nacked message reported as acked: lost). A return came before the
// confirm, so the loop has recorded it.
func (f *inflight) outcome() error {
	switch {
	case !f.dc.Acked():
		return ErrNacked
	case f.returned != nil:
		return fmt.Errorf("%w: %d %s", ErrUnroutable, f.returned.ReplyCode, f.returned.ReplyText)
	}
	return nil
}

func openSession(url string, cfg amqp.Config, exchange string, declare bool) (*session, error) {
	conn, err := amqp.DialConfig(url, cfg)
	if err != nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	ch, err := conn.Channel()
	if err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("open channel: %w", err)
	}
	if declare {
		if err := ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			_ = conn.Close()
			return nil, fmt.Errorf("declare exchange %q: %w", exchange, err)
		}
	}
	if err := ch.Confirm(false); err != nil {
		_ = conn.Close()
		return nil, fmt.Errorf("enable publisher confirms: %w", err)
	}
	s := &session{conn: conn, ch: ch, pending: make(map[uint64]*inflight)}

	// Returns and confirms must be unbuffered and read by one goroutine:
	// the broker sends a message's basic.return before its basic.ack, the
	// library hands them over in that order from its reader goroutine, and
	// an unbuffered send completes only once the loop has taken it. So the
	// loop has recorded a return before it sees the matching confirm, and
	// an unroutable message is never reported as delivered.
	returns := ch.NotifyReturn(make(chan amqp.Return))
	confirms := ch.NotifyPublish(make(chan amqp.Confirmation))
	blocks := conn.NotifyBlocked(make(chan amqp.Blocking))
	// Close notifications are sent without waiting, so they need room.
	chClose := ch.NotifyClose(make(chan *amqp.Error, 1))
	connClose := conn.NotifyClose(make(chan *amqp.Error, 1))
	go s.loop(returns, confirms, blocks, chClose, connClose)
	return s, nil
}

func (s *session) alive() bool {
	s.mu.Lock()
	dead := s.err != nil
	s.mu.Unlock()
	return !dead && !s.ch.IsClosed() && !s.conn.IsClosed()
}

// publish sends msg and registers it for its confirm. An error wrapping
// amqp.ErrClosed means nothing was sent.
func (s *session) publish(ctx context.Context, exchange, key string, mandatory bool, msg amqp.Publishing) (*inflight, error) {
	s.pubMu.Lock()
	defer s.pubMu.Unlock()
	// Not under s.mu: the library may hold the lock this takes while it
	// waits for the loop, which needs s.mu.
	tag := s.ch.GetNextPublishSeqNo()
	f := &inflight{msgID: msg.MessageId, result: make(chan error, 1)}
	s.mu.Lock()
	switch {
	case s.err != nil:
		err := s.err
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: %w", amqp.ErrClosed, err)
	case s.blocked != "":
		reason := s.blocked
		s.mu.Unlock()
		return nil, fmt.Errorf("%w: %s", ErrBlocked, reason)
	}
	s.pending[tag] = f
	s.mu.Unlock()

	// The library numbers the message under its own lock, after ours: the
	// tag read above is dc's, as every publish on the channel holds pubMu.
	dc, err := s.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, mandatory, false, msg)
	if err != nil {
		s.mu.Lock()
		delete(s.pending, tag)
		s.mu.Unlock()
		return nil, err
	}
	f.dc = dc
	return f, nil
}

// loop hands confirms and returns to the waiting publishers and ends the
// session when its channel or connection closes. It runs until the library
// has closed every listener, so the library's reader never waits on it in
// vain.
func (s *session) loop(returns <-chan amqp.Return, confirms <-chan amqp.Confirmation, blocks <-chan amqp.Blocking, chClose, connClose <-chan *amqp.Error) {
	// The library reports a close on these before it closes the other
	// listeners, so they usually hold the broker's reason by then.
	reason := func() error {
		select {
		case e, ok := <-connClose:
			connClose = nil
			return closeReason("connection", e, ok)
		default:
		}
		select {
		case e, ok := <-chClose:
			chClose = nil
			return closeReason("channel", e, ok)
		default:
		}
		return &closedError{what: "channel"}
	}
	for returns != nil || confirms != nil || blocks != nil {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				s.shutdown(reason())
				continue
			}
			s.markReturned(r)
		case c, ok := <-confirms:
			if !ok {
				confirms = nil
				s.shutdown(reason())
				continue
			}
			s.confirm(c)
		case b, ok := <-blocks:
			if !ok {
				blocks = nil
				continue
			}
			s.mu.Lock()
			s.blocked = ""
			if b.Active {
				s.blocked = "blocked"
				if b.Reason != "" {
					s.blocked = b.Reason
				}
			}
			s.mu.Unlock()
		case e, ok := <-chClose:
			chClose = nil
			s.shutdown(closeReason("channel", e, ok))
		case e, ok := <-connClose:
			connClose = nil
			s.shutdown(closeReason("connection", e, ok))
		}
	}
}

func closeReason(what string, e *amqp.Error, ok bool) error {
	if !ok {
		e = nil
	}
	return &closedError{what: what, reason: e}
}

// closedError says why a session ended: its connection or its channel
// closed, with the broker's (or the library's) reason when there was one.
// It wraps [ErrConnectionLost] and the *amqp.Error.
type closedError struct {
	what   string      // "connection" or "channel"
	reason *amqp.Error // nil when the close came without one
	// others is how many other messages were waiting for their confirm
	// when the channel was closed for a message ([closedError.brokerSide]
	// false): the broker does not say which one it refused.
	others int
}

func (e *closedError) Error() string {
	s := e.what + " closed before the broker confirmed the message"
	if e.others > 0 {
		s += fmt.Sprintf(" (closed for this message or one of the %d others awaiting a confirm on it)", e.others)
	}
	if e.reason != nil {
		s += ": " + e.reason.Error()
	}
	return s
}

func (e *closedError) Unwrap() []error {
	if e.reason != nil {
		return []error{ErrConnectionLost, e.reason}
	}
	return []error{ErrConnectionLost}
}

// brokerSide reports whether the close says the broker, not the message, is
// the problem: the connection closed (a restart, a network failure), the
// channel closed with no reason or a connection-level (hard) error, or the
// broker refused the exchange itself (404 missing, 403 forbidden), which
// no message can get past. A channel closed for a message (406 precondition
// failed, such as a message over max_message_size; 311 content too large)
// is not.
func (e *closedError) brokerSide() bool {
	if e.what == "connection" || e.reason == nil || !e.reason.Recover {
		return true
	}
	return e.reason.Code == amqp.NotFound || e.reason.Code == amqp.AccessRefused
}

// aboutMessage reports whether the close is about the one message that
// gets the error: a channel closed for a message while it was the only one
// awaiting a confirm. With others in flight the message at fault is
// unknown, and counting an attempt against each of them would let one bad
// message fail a whole pipelined batch for good, retry after retry.
func (e *closedError) aboutMessage() bool { return !e.brokerSide() && e.others == 0 }

// sharedBy is err as told to each of n messages awaiting their confirm
// when the session ended: a close for a message names how many others
// were in flight with it.
func sharedBy(err error, n int) error {
	closed, ok := err.(*closedError)
	if !ok || n < 2 || closed.brokerSide() {
		return err
	}
	c := *closed
	c.others = n - 1
	return &c
}

// markReturned records a basic.return on the oldest unconfirmed message
// with its ID. A return carries no delivery tag, but it precedes its
// message's confirm, so the oldest such message is the right one even if the
// same event is being published twice at once.
func (s *session) markReturned(r amqp.Return) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var (
		best    *inflight
		bestTag uint64
	)
	for tag, f := range s.pending {
		if f.msgID == r.MessageId && f.returned == nil && (best == nil || tag < bestTag) {
			best, bestTag = f, tag
		}
	}
	if best != nil {
		best.returned = &r
	}
}

func (s *session) confirm(c amqp.Confirmation) {
	s.mu.Lock()
	f, ok := s.pending[c.DeliveryTag]
	delete(s.pending, c.DeliveryTag)
	s.mu.Unlock()
	if ok {
		f.result <- nil // c.Ack is not to be trusted: see outcome
	}
}

// shutdown ends the session: every unconfirmed message fails with err (the
// first reason given wins) and the connection is closed, which releases
// the loop.
func (s *session) shutdown(err error) {
	if err == nil {
		err = ErrConnectionLost
	}
	s.mu.Lock()
	if s.err == nil {
		s.err = err
	}
	err = s.err
	pending := s.pending
	s.pending = make(map[uint64]*inflight)
	s.mu.Unlock()
	err = sharedBy(err, len(pending))
	for _, f := range pending {
		f.result <- err
	}
	s.closeOnce.Do(func() {
		// Closing waits for the library's reader, which may be waiting
		// for the loop that called us.
		go func() { _ = s.conn.Close() }()
	})
}
