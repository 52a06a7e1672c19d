// Package rabbitmq publishes outbox events to RabbitMQ, and consumes them
// through the inbox ([Consumer]).
//
// Delivery is at least once: an event counts as delivered only after the
// broker has confirmed it (publisher confirms), and the relay publishes it
// again whenever that confirm is missing (a nack, a return, a lost
// connection, a timeout), so consumers must deduplicate by the AMQP message
// ID, which is the event ID.
//
// Plug a [Publisher] into an outbox with
// ob.HandleAsync(eventType, p.AsyncHandler()): the relay then publishes a
// whole batch on the Publisher's channel, in batch order, before it waits
// for any confirm, so the batch costs about one round trip to the broker
// instead of one per event. ob.Handle(eventType, p.Handler()) still works:
// one publish and its confirm at a time per relay worker.
//
// Messages go to a topic exchange (by default "outbox.events", declared on
// request) with the event type as routing key, so consumers bind queues with
// patterns such as "order.*". Each message is persistent and carries the
// event ID as MessageId, the event type as Type and the event's headers
// (trace context included) as AMQP headers; in the default format the
// event's fields are Outbox-* headers, built by [wire.Headers] as in every
// outbox adapter, and the body, typed application/json, is the payload
// (see Formats).
//
// A queue keeps the order in which a channel published, and the
// AsyncHandler publishes in the order the relay calls it, but a failed
// event is retried after the ones behind it: run the relay with
// RelayConfig.OrderByAggregate for per-aggregate order (an aggregate's next
// event is published once the previous one is confirmed, none after one
// that failed).
//
// The Publisher keeps one connection with one confirm-mode channel and
// reopens both lazily, on the next publish, after the broker closed them (a
// restart, a forced close, a channel error). It is safe for concurrent use.
//
// Outages: a publish that fails because the broker cannot be reached or
// cannot take messages (no connection can be opened, the connection closed,
// the broker blocks publishers on a resource alarm, the exchange is missing
// or forbidden, no confirm in time, the Publisher closed) is reported as
// [outbox.Unavailable]: the relay hands the event back without counting an
// attempt and pauses delivery until the broker takes messages again. A nack
// or a return is about the message and is retried with backoff.
//
// On the consuming side a [Consumer] reads a queue and runs each message's
// effect through [outbox.Consume], so that it commits once per consumer
// and message ID, and acknowledges the message only after the commit: see
// [NewConsumer] and [Consumer.Run].
//
// # Formats
//
// [Config.Format] chooses the layout; the AMQP properties above and the
// event's headers are the same in all three:
//
//   - [wire.Native] (the default): the Outbox-* headers, content-type
//     application/json, the payload as the body.
//   - [wire.CloudEvents]: CloudEvents binary mode, the attributes as
//     cloudEvents_* headers (cloudEvents_id, cloudEvents_type, ...; see
//     package wire for the mapping), content-type application/json (the
//     datacontenttype), the payload as the body.
//   - [wire.CloudEventsJSON]: structured mode, content-type
//     application/cloudevents+json, one CloudEvents JSON document as the
//     body.
//
// The CloudEvents AMQP binding is written for AMQP 1.0 (attributes as
// application properties); RabbitMQ speaks AMQP 0-9-1, so the adapter
// applies its names to the message's headers table and its content-type
// rule to the content-type property ([wire.AMQPBinding]). [Config.Source]
// is the source attribute ([wire.DefaultSource] by default). The Consumer
// decodes every format.
//
// Spans come from outboxotel, whose [wire.Telemetry] is in every delivery's
// context: a PRODUCER span "send {exchange}" per publish, whose trace
// context the message carries (traceparent and tracestate headers, and the
// same extensions in the CloudEvents formats). [Config.Telemetry]
// overrides it; a Consumer gets its own, [ConsumerConfig.Telemetry].
package rabbitmq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"sync"

	amqp "github.com/rabbitmq/amqp091-go"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/wire"
)

// Defaults of [Config].
const (
	// DefaultURL is [Config.URL]'s default: a local broker's guest account.
	DefaultURL = "amqp://guest:guest@localhost:5672/"
	// DefaultExchange is [Config.Exchange]'s default.
	DefaultExchange = "outbox.events"
	// DefaultConnectionName is [Config.ConnectionName]'s default.
	DefaultConnectionName = "gorm-outbox"
)

// Sentinel errors, wrapped by the errors [Publisher.Publish] returns. Those
// lead with their cause (one of these, or the broker's or the network's
// error), then name the exchange, the routing key and the adapter:
//
//	broker nacked the message: exchange "outbox.events", routing key "order.created" (outbox/rabbitmq)
//
// All of them are retryable: the relay tries the event again later. [ErrNacked]
// and [ErrUnroutable] are about the message and count an attempt; the
// others say the broker is unavailable ([outbox.Unavailable]), except a
// channel closed for the message itself (see [Publisher.Publish]).
var (
	// ErrNacked means the broker refused the message (a negative publisher
	// confirm), for example because a queue with x-overflow=reject-publish
	// is full.
	ErrNacked = errors.New("broker nacked the message")

	// ErrUnroutable means the message was mandatory and no queue was bound
	// to receive it, so the broker returned it instead of storing it.
	ErrUnroutable = errors.New("message unroutable (returned by the broker)")

	// ErrConnectionLost means the connection or channel closed before the
	// broker confirmed the message. The broker may or may not have stored
	// it; the relay's retry may therefore produce a duplicate.
	ErrConnectionLost = errors.New("connection lost before the broker confirmed the message")

	// ErrBlocked means the broker has blocked the connection (a memory or
	// disk alarm). Publishing then would hang, so it fails at once.
	ErrBlocked = errors.New("connection blocked by the broker")

	// ErrClosed is returned after [Publisher.Close].
	ErrClosed = errors.New("publisher closed")
)

// Config configures a [Publisher]. Its zero value publishes to a local
// broker, to the exchange "outbox.events", which must already exist.
type Config struct {
	// URL is the AMQP URI of the broker, credentials and vhost included
	// (percent-encode special characters). Defaults to
	// "amqp://guest:guest@localhost:5672/".
	URL string

	// AMQP is passed to amqp.DialConfig for TLS, heartbeats, SASL or a
	// custom Dial function. Its Recovery must be nil: the Publisher
	// reconnects by itself. Defaults to the zero amqp.Config (10s
	// heartbeat, 30s connection timeout).
	AMQP amqp.Config

	// ConnectionName is the connection's name in the management UI and in
	// rabbitmqctl list_connections; AMQP.Properties["connection_name"], if
	// set, takes precedence. Defaults to "gorm-outbox".
	ConnectionName string

	// Exchange receives every message. Defaults to "outbox.events".
	Exchange string

	// DeclareExchange declares Exchange as a durable topic exchange each
	// time the Publisher connects, so the first publish works on an empty
	// broker. Leave it false when the exchange is provisioned elsewhere (a
	// declaration with different settings would fail). Defaults to false.
	DeclareExchange bool

	// RoutingKey returns the routing key of an event. Defaults to the
	// event's Type, so topic bindings like "order.*" select by type.
	RoutingKey func(outbox.Event) string

	// AllowUnroutable publishes without the mandatory flag, so a message
	// no queue is bound to receive is silently dropped by the broker and
	// the event still counts as delivered. By default every message is
	// mandatory and an unroutable one fails with [ErrUnroutable], leaving
	// the event to be retried once a queue is bound. Defaults to false.
	AllowUnroutable bool

	// Format is how an event is laid out in the message: [wire.Native]
	// (the default: Outbox-* headers, the payload as the body),
	// [wire.CloudEvents] (binary content mode: cloudEvents_* headers, the
	// payload as the body) or [wire.CloudEventsJSON] (structured mode: one
	// application/cloudevents+json document). The AMQP properties
	// (MessageId, Type, Timestamp, persistence) are the same in every
	// format. [New] refuses any other value. See the package doc, Formats.
	Format wire.Format

	// Source is the CloudEvents source attribute in the CloudEvents
	// formats; "" is [wire.DefaultSource]. Name the producing service (for
	// example "/orders") when consumers receive events from several, and
	// keep it stable: consumers deduplicate by source and id.
	Source string

	// Telemetry reports each publish (a PRODUCER span "send {exchange}",
	// whose trace context the message carries). Nil uses the one in the
	// handler's context, which outboxotel puts there for every delivery;
	// set it only to override that, or to publish outside a relay.
	Telemetry wire.Telemetry
}

// Publisher publishes events to RabbitMQ. Create it with [New]; it is safe
// for concurrent use.
type Publisher struct {
	url        string
	amqpCfg    amqp.Config
	exchange   string
	declare    bool
	routingKey func(outbox.Event) string
	mandatory  bool
	format     wire.Format
	ce         wire.CloudEventOptions
	telemetry  wire.Telemetry
	op         wire.Operation // what Telemetry is told of every send

	mu      sync.Mutex
	sess    *session      // the current session; may have died since
	dialing chan struct{} // non-nil while a connect is in progress; closed when it ends
	dialErr error         // result of the last connect
	closed  bool
}

// New returns a Publisher configured by cfg. It checks cfg (an unknown
// Format is an error wrapping [wire.ErrFormat]) but does not connect: the
// first publish (or [Publisher.Connect]) does, so an application can start
// while the broker is down.
func New(cfg Config) (*Publisher, error) {
	if err := cfg.Format.Check(); err != nil {
		return nil, fmt.Errorf("outbox/rabbitmq: %w", err)
	}
	if err := wire.CheckSource(cfg.Source); err != nil {
		return nil, fmt.Errorf("outbox/rabbitmq: Config.Source: %w", err)
	}
	p := &Publisher{
		url:        cmp.Or(cfg.URL, DefaultURL),
		amqpCfg:    cfg.AMQP,
		exchange:   cmp.Or(cfg.Exchange, DefaultExchange),
		declare:    cfg.DeclareExchange,
		routingKey: cfg.RoutingKey,
		mandatory:  !cfg.AllowUnroutable,
		format:     cfg.Format,
		ce:         wire.CloudEventOptions{Source: cfg.Source},
		telemetry:  cfg.Telemetry,
	}
	if p.routingKey == nil {
		p.routingKey = func(e outbox.Event) string { return e.Type }
	}
	var err error
	if p.amqpCfg, err = dialConfig(cfg, p.url, DefaultConnectionName); err != nil {
		return nil, err
	}
	// The exchange is never "" (the default exchange is not offered), so
	// it is the destination as the messaging conventions name it.
	p.op = operation(p.url, p.exchange)
	return p, nil
}

// operation describes sends or receives through the broker at url to
// [wire.Telemetry]: the system, the destination and the broker's address.
func operation(url, destination string) wire.Operation {
	op := wire.Operation{System: "rabbitmq", Destination: destination}
	if u, err := amqp.ParseURI(url); err == nil {
		op.ServerAddress, op.ServerPort = u.Host, u.Port
	}
	return op
}

// dialConfig checks cfg's connection settings (url is its URL with the
// default applied) and returns the amqp.Config to dial with: cfg.AMQP with
// a copy of its properties that names the connection (cfg.ConnectionName,
// else defaultName). [New] and [NewConsumer] share it.
func dialConfig(cfg Config, url, defaultName string) (amqp.Config, error) {
	if _, err := amqp.ParseURI(url); err != nil {
		// The URI may hold a password; ParseURI's error does not echo it.
		return amqp.Config{}, fmt.Errorf("outbox/rabbitmq: invalid URL: %w", err)
	}
	if cfg.AMQP.Recovery != nil {
		return amqp.Config{}, errors.New("outbox/rabbitmq: AMQP.Recovery must be nil (the Publisher and the Consumer reconnect on their own; the library's recovery would race with them)")
	}
	ac := cfg.AMQP
	// Copy the properties so that the caller's map is never written to.
	props := amqp.Table{}
	for k, v := range cfg.AMQP.Properties {
		props[k] = v
	}
	if _, ok := props["connection_name"]; !ok {
		props["connection_name"] = cmp.Or(cfg.ConnectionName, defaultName)
	}
	ac.Properties = props
	return ac, nil
}

// Handler returns the outbox handler that publishes each event it receives
// and waits for its confirm ([Publisher.Publish]); register it with
// ob.Handle. [Publisher.AsyncHandler] does the same without waiting
// between publishes.
func (p *Publisher) Handler() outbox.Handler { return p.Publish }

// AsyncHandler returns the outbox handler that publishes each event it
// receives and returns at once, with a wait for the broker's confirm;
// register it with ob.HandleAsync. A relay publishes a batch's events one
// after the other, in batch order, then waits for their confirms, which
// the broker sends as it stores the messages, so the batch takes about one
// round trip instead of one per event.
//
// The message, the trace context and the errors are those of
// [Publisher.Publish], which is this handler's start and wait in one call:
// the start publishes the message on the Publisher's channel before it
// returns (connecting first when there is no connection), so messages
// reach the broker, and a queue, in the order of the calls; the wait
// returns nil once the broker confirmed the message, and otherwise the
// error Publish would have returned: [ErrNacked], [ErrUnroutable] for a
// mandatory message no queue took, [ErrConnectionLost] wrapped in
// [outbox.Unavailable] when the channel or the connection closes before
// the confirm. The send span starts with the publish and ends in the wait.
// Several relays, or goroutines, may share one Publisher: each one's
// messages keep the order of its calls, and each confirm or return goes to
// its own message.
func (p *Publisher) AsyncHandler() outbox.AsyncHandler { return p.start }

// Publish publishes e, laid out in Config.Format, and waits, at most until
// ctx ends, for the broker to confirm it. A nil error means the broker has taken responsibility for the
// message (routed it to at least one queue, unless AllowUnroutable is set).
// Any error leaves the outcome to a retry: the message may or may not have
// been stored.
//
// An unencodable payload is [outbox.Permanent]. Errors that say the broker
// cannot take messages are [outbox.Unavailable], so the relay pauses
// without counting attempts: no connection (dial, TLS, authentication,
// vhost, exchange declaration), the connection or channel closed by a
// broker restart or a network failure, the exchange missing (404) or
// forbidden (403), [ErrBlocked], [ErrClosed], and a connect or confirm that
// ran out of time. A nack ([ErrNacked]), a return ([ErrUnroutable]) and a
// channel closed for the message (406, such as a message over the broker's
// max_message_size) are retried with backoff and count attempts. The broker
// does not say which message a channel was closed for: when other messages
// were waiting for their confirm on that channel too, each of them fails
// as [outbox.Unavailable], so that the relay probes with one event at a
// time and only the message at fault, alone on the channel, counts its
// attempts.
//
// The publish is reported to Config.Telemetry, or the one in ctx: the
// message carries the trace context of its send span, and the span ends
// with the error returned.
func (p *Publisher) Publish(ctx context.Context, e outbox.Event) error {
	return p.start(ctx, e)()
}

// start publishes e and returns the wait for its confirm: the
// [outbox.AsyncHandler] of [Publisher.AsyncHandler], and [Publisher.Publish]
// when its wait is called at once.
func (p *Publisher) start(ctx context.Context, e outbox.Event) (wait func() error) {
	ctx, e, end := wire.StartSend(ctx, p.telemetry, p.op, e)
	key := p.routingKey(e)
	f, err := p.send(ctx, e, key)
	return func() error {
		if err == nil {
			err = p.confirmed(ctx, f, key)
		}
		end(err)
		return err
	}
}

// send publishes e with the routing key key on a live session and returns
// the message's registration for its confirm, or the publish's error,
// classified.
func (p *Publisher) send(ctx context.Context, e outbox.Event, key string) (*inflight, error) {
	msg, err := p.message(e)
	if err != nil {
		return nil, outbox.Permanent(p.publishError(err, key))
	}

	// A publish that fails with amqp.ErrClosed was never written to the
	// socket: the session died between two publishes (typically a broker
	// restart while the relay was idle). Retrying once on a fresh session is
	// therefore safe and saves the event a whole backoff period.
	for attempt := 0; ; attempt++ {
		s, err := p.session(ctx)
		if err != nil {
			// No session: nothing about this message was tried.
			return nil, unavailableUnlessCancelled(p.publishError(err, key))
		}
		f, err := s.publish(ctx, p.exchange, key, p.mandatory, msg)
		if errors.Is(err, amqp.ErrClosed) && attempt == 0 {
			continue
		}
		if err != nil {
			return nil, classify(p.publishError(err, key))
		}
		return f, nil
	}
}

// confirmed waits, at most until ctx ends, for the broker's confirm of the
// message f registered, and returns its outcome, classified.
func (p *Publisher) confirmed(ctx context.Context, f *inflight, key string) error {
	select {
	case err := <-f.result:
		if err == nil {
			err = f.outcome()
		}
		if err != nil {
			return classify(p.publishError(err, key))
		}
		return nil
	case <-ctx.Done():
		return classify(p.publishError(fmt.Errorf("no confirm from the broker: %w", ctx.Err()), key))
	}
}

// publishError is the error of a publish with the routing key key that
// failed with err: err first, then the destination and the adapter (see
// [ErrNacked]'s example). The event ID is left out: the relay's logs and
// the outbox row carry it, and a reader of a column cut to a width wants
// the cause. So is the URL, which holds credentials.
func (p *Publisher) publishError(err error, key string) error {
	return fmt.Errorf("%w: exchange %q, routing key %q (outbox/rabbitmq)", err, p.exchange, key)
}

// classify marks err [outbox.Unavailable] when it says the broker, not the
// message, is the problem.
func classify(err error) error {
	var closed *closedError
	switch {
	case errors.Is(err, ErrNacked), errors.Is(err, ErrUnroutable), errors.Is(err, context.Canceled):
		return err
	case errors.As(err, &closed):
		if closed.aboutMessage() {
			return err
		}
		return outbox.Unavailable(err)
	case errors.Is(err, ErrConnectionLost), errors.Is(err, ErrBlocked), errors.Is(err, ErrClosed),
		errors.Is(err, amqp.ErrClosed), errors.Is(err, context.DeadlineExceeded):
		return outbox.Unavailable(err)
	}
	if _, ok := errors.AsType[net.Error](err); ok {
		return outbox.Unavailable(err)
	}
	return err
}

// unavailableUnlessCancelled marks err [outbox.Unavailable] unless the
// caller cancelled: then nothing is known about the broker.
func unavailableUnlessCancelled(err error) error {
	if errors.Is(err, context.Canceled) {
		return err
	}
	return outbox.Unavailable(err)
}

// Connect opens the connection now, if it is not open, and waits for it at
// most until ctx ends. Publishing connects by itself; Connect serves
// readiness checks and surfaces configuration errors early.
func (p *Publisher) Connect(ctx context.Context) error {
	if _, err := p.session(ctx); err != nil {
		return fmt.Errorf("outbox/rabbitmq: %w", err)
	}
	return nil
}

// Close closes the connection. Publishes waiting for a confirm fail with
// [ErrConnectionLost] and later ones with [ErrClosed], so the relay keeps
// their events for a retry.
func (p *Publisher) Close() error {
	p.mu.Lock()
	p.closed = true
	s := p.sess
	p.sess = nil
	p.mu.Unlock()
	if s == nil {
		return nil
	}
	if err := s.conn.Close(); err != nil && !errors.Is(err, amqp.ErrClosed) {
		return fmt.Errorf("outbox/rabbitmq: close: %w", err)
	}
	return nil
}

// session returns a live session, connecting if there is none. Connecting
// runs in its own goroutine so that every caller can give up when its ctx
// ends, while the connection still comes up for the next caller.
func (p *Publisher) session(ctx context.Context) (*session, error) {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return nil, ErrClosed
	}
	if s := p.sess; s != nil && s.alive() {
		p.mu.Unlock()
		return s, nil
	}
	if p.dialing == nil {
		p.dialing = make(chan struct{})
		go p.connect(p.dialing)
	}
	wait := p.dialing
	p.mu.Unlock()

	select {
	case <-wait:
	case <-ctx.Done():
		return nil, fmt.Errorf("connect: %w", ctx.Err())
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.closed:
		return nil, ErrClosed
	case p.dialErr != nil:
		return nil, p.dialErr // it names the step: dial, open channel, ...
	case p.sess == nil || !p.sess.alive():
		return nil, fmt.Errorf("connect: %w", ErrConnectionLost)
	}
	return p.sess, nil
}

func (p *Publisher) connect(done chan struct{}) {
	s, err := openSession(p.url, p.amqpCfg, p.exchange, p.declare)
	p.mu.Lock()
	old := p.sess
	if p.closed && s != nil {
		// Close ran while we were connecting; nobody will use s.
		go s.conn.Close()
		s = nil
	}
	if s != nil {
		p.sess = s
	}
	p.dialErr = err
	p.dialing = nil
	close(done)
	p.mu.Unlock()
	if old != nil && old != s {
		old.shutdown(ErrConnectionLost)
	}
}
