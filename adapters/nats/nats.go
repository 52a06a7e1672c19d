// Package nats publishes outbox events to NATS JetStream, and, with a
// [Consumer], applies the messages of a durable pull consumer to a database
// once each through the outbox inbox ([outbox.Consume]).
//
// Delivery guarantee: effectively once within the stream's duplicate window
// (each message carries Nats-Msg-Id = event ID, so JetStream drops re-sends),
// at least once beyond it.
//
// Each event becomes one message on the subject [Config.Subject] returns
// (by default "outbox." + event type), laid out in [Config.Format] (see
// Formats below). An event counts as delivered only once JetStream's
// publish ack says the stream has stored it.
//
// # Registering
//
// [Publisher.AsyncHandler], registered with [outbox.Outbox.HandleAsync], is
// the default: the relay starts the publishes of a whole batch (or, with
// [outbox.RelayConfig.OrderByAggregate], of a wave: one event per
// aggregate), in batch order, before it waits for any ack, so a batch
// costs about one round trip to the server instead of one per event.
// [Publisher.Handler], registered with [outbox.Outbox.Handle], publishes an
// event and waits for its ack before it returns: a relay has at most
// Workers events in flight. Both build the same message and report errors
// alike.
//
// Ordering: the stream stores events in the order they reach it. Without
// OrderByAggregate a relay's events reach it in no particular order (a
// batch's publishes overlap), a failed event that is retried lands after
// the events delivered meanwhile, and several relays interleave. With
// OrderByAggregate an aggregate's next event is published only once the
// previous one's ack has come back, so its events are stored in order and
// none after one that was not; consumers that need per-aggregate order
// across relays should still compare Outbox-Occurred-At (ce-time in the
// CloudEvents formats) or keep per-aggregate state.
//
// Outages: a publish that fails because the server cannot be reached (the
// connection is reconnecting or closed, no servers, a timed-out request or
// ack, JetStream not answering) is reported as [outbox.Unavailable]: the
// relay hands the event back without counting an attempt and pauses
// delivery until the server answers again. Connect with
// nats.MaxReconnects(-1): with nats.go's default of 60 reconnect attempts,
// an outage of about two minutes closes the connection for good, and no
// event is published again until the process creates a new connection (the
// Publisher logs that once, as an error).
//
// # Formats
//
// Every message carries Nats-Msg-Id = event ID (JetStream's dedupe ID) and
// the event's own headers, trace context included; event headers named
// Content-Type, or starting with "Nats-", in any case, are dropped.
// [Config.Format] decides the rest:
//
//   - [wire.Native] (the default, unchanged from earlier releases): the
//     Outbox-* headers of [wire.Headers], Content-Type: application/json,
//     the JSON payload as the body.
//   - [wire.CloudEvents]: CloudEvents 1.0 binary content mode per the NATS
//     protocol binding (NATS 2.2 headers): one ce- header per attribute
//     (ce-specversion, ce-id, ce-source, ce-type, ce-subject, ce-time,
//     ce-datacontenttype, and the extensions ce-aggregatetype,
//     ce-aggregateid, ce-idempotencykey when not the ID, ce-traceparent,
//     ce-tracestate), values percent-encoded as the binding asks;
//     Content-Type: application/json; the payload as the body. No Outbox-*
//     headers.
//   - [wire.CloudEventsJSON]: structured content mode: Content-Type:
//     application/cloudevents+json, the body one JSON document with the
//     same attributes and the payload as "data".
//
// The attributes are mapped as package wire's doc says. [Config.Source]
// sets the source attribute ([wire.DefaultSource] when empty). The
// [Consumer] reads all three formats ([wire.Decode]); the CloudEvents Go
// SDK's NATS JetStream binding reads the CloudEvents ones (tested).
//
// # Telemetry
//
// Each publish is reported to a [wire.Telemetry] as a PRODUCER span "send
// {subject}" (messaging.system "nats"), and the message carries that span's
// trace context (the traceparent/tracestate headers, and the CloudEvents
// extensions in the CloudEvents formats); the Consumer reports each message
// it applies as a CONSUMER span. The spans come from package outboxotel,
// whose instrumentation puts its Telemetry in every delivery's context, so
// a Publisher needs no setting ([Config.Telemetry] overrides it); a Consumer
// runs outside deliveries: give it one in [ConsumerConfig.Telemetry] (or
// Run's context).
//
// The package shares its name with github.com/nats-io/nats.go; import it
// under another name, for example outboxnats.
package nats

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/wire"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// HeaderContentType is set on every message: "application/json" when the
// body is the event's JSON payload (Native and CloudEvents formats),
// "application/cloudevents+json" in CloudEventsJSON. The headers that
// carry the event's fields are named in package
// [github.com/gorm-outbox/outbox/wire], as in every outbox adapter.
const HeaderContentType = "Content-Type"

// Defaults of [Config].
const (
	// DefaultSubjectPrefix is [Config.SubjectPrefix]'s default.
	DefaultSubjectPrefix = "outbox."
	// DefaultTimeout is [Config.Timeout]'s default.
	DefaultTimeout = 5 * time.Second
	// DefaultMaxPending is [Config.MaxPending]'s default, nats.go's own.
	DefaultMaxPending = 4000
)

// JetStream is the part of [jetstream.JetStream] the adapter uses. A value
// from jetstream.New satisfies it.
type JetStream interface {
	// PublishMsg publishes msg and waits for the stream's ack.
	PublishMsg(ctx context.Context, msg *natsgo.Msg, opts ...jetstream.PublishOpt) (*jetstream.PubAck, error)
}

// AsyncJetStream is what [Publisher.AsyncHandler] publishes through when
// the JetStream given to [New] has no connection to open a publisher of
// its own on (a test double, a wrapper): a value with PublishMsgAsync,
// which must put messages on the wire in the order it is called and must
// not wait for their acks. A value from jetstream.New has a connection
// (Conn), and is not used for it.
type AsyncJetStream interface {
	// PublishMsgAsync publishes msg and returns the future of its ack.
	PublishMsgAsync(msg *natsgo.Msg, opts ...jetstream.PublishOpt) (jetstream.PubAckFuture, error)
}

// Config configures a [Publisher]. Its zero value is usable.
type Config struct {
	// SubjectPrefix is put before the event type to form the subject when
	// Subject is nil. Defaults to "outbox.", so "order.created" is published
	// on "outbox.order.created" and a stream bound to "outbox.>" captures
	// every event.
	SubjectPrefix string

	// Subject maps an event to the subject it is published on, overriding
	// SubjectPrefix; for example, to put the aggregate in the subject so that
	// consumers can filter by it. An invalid subject (empty, with spaces or
	// wildcards) fails the event permanently. Defaults to SubjectPrefix +
	// event type.
	Subject func(e outbox.Event) string

	// ExpectStream, when set, makes JetStream reject a message whose subject
	// is not bound to this stream, instead of storing it in another stream
	// that happens to match. Defaults to "" (any stream).
	ExpectStream string

	// Timeout bounds one publish, ack included, from the handler's call
	// (an AsyncHandler's start) to the ack; the relay's deadline applies
	// too. While the server is unreachable the publish fails after it as
	// [outbox.Unavailable], and the relay pauses until the server is back.
	// Defaults to 5 seconds.
	Timeout time.Duration

	// MaxPending bounds the publishes of [Publisher.AsyncHandler] that
	// await their ack at once, for all the relays sharing the Publisher: a
	// start beyond it waits for one to end, within Timeout and the relay's
	// deadline (the event is then reported as the server not keeping up,
	// [outbox.Unavailable]). Unused by Handler, and when AsyncHandler
	// publishes through an [AsyncJetStream]. Defaults to 4000.
	MaxPending int

	// Logger receives the adapter's own messages, which never contain
	// payloads: a warning from [New] when the connection would give up
	// reconnecting during a long outage, and an error, logged once, when
	// the connection has closed for good. Defaults to slog.Default().
	Logger *slog.Logger

	// Format is how events are laid out on the wire (see the package
	// doc's Formats): [wire.Native] (the default: the Outbox-* headers),
	// [wire.CloudEvents] (CloudEvents binary mode per the NATS binding:
	// ce- headers) or [wire.CloudEventsJSON] (structured mode: one
	// application/cloudevents+json document). Every format keeps
	// Nats-Msg-Id = event ID, so JetStream's deduplication works in all.
	// [New] refuses another value.
	Format wire.Format

	// Source is the CloudEvents source attribute in the CloudEvents
	// formats; "" is [wire.DefaultSource]. Set one URI-reference per
	// producing service (for example "/orders") when consumers receive
	// events from several: CloudEvents consumers deduplicate by source and
	// id. Keep it stable, since a retried event must keep its source.
	// Unused in Native format.
	Source string

	// Telemetry reports each publish as a PRODUCER span, whose trace
	// context the message carries (traceparent header, and the
	// CloudEvents extension in the CloudEvents formats). Nil uses the one
	// in the handler's context, which outboxotel puts there for every
	// delivery, so it is needed only to override that; with neither,
	// publishes are not instrumented.
	Telemetry wire.Telemetry
}

// Publisher publishes outbox events to JetStream. Create it with [New]; it is
// safe for concurrent use.
type Publisher struct {
	js     JetStream
	nc     *natsgo.Conn   // js's connection, when it exposes it: the server's address for telemetry
	async  AsyncJetStream // AsyncHandler's publisher; nil: it publishes as Handler does
	cfg    Config
	log    *slog.Logger
	closed atomic.Bool // the closed connection has been logged
}

// New returns a publisher that sends events through js, typically the value
// of jetstream.New(nc). Create the stream (bound to the subjects events are
// published on, with a duplicate window at least as long as the relay's
// retry horizon) before events flow; without one, publishing fails as
// [outbox.Unavailable] and the relay waits for the stream.
//
// When js exposes its connection (a jetstream.JetStream does) and that
// connection gives up reconnecting after a number of attempts (nats.go's
// default is 60, two seconds apart), New logs a warning: an outage longer
// than that closes the connection for good. Connect with
// nats.MaxReconnects(-1).
//
// Create one Publisher per connection and keep it: its
// [Publisher.AsyncHandler] publishes through a JetStream publisher of its
// own, which subscribes to its acks on the connection at its first
// publish (a subscription and a goroutine per Publisher, until the
// connection closes).
func New(js JetStream, cfg Config) (*Publisher, error) {
	if js == nil {
		return nil, errors.New("outbox/nats: New needs a JetStream (jetstream.New(nc))")
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("outbox/nats: negative Timeout %v; use 0 for the default", cfg.Timeout)
	}
	if cfg.MaxPending < 0 {
		return nil, fmt.Errorf("outbox/nats: negative MaxPending %d; use 0 for the default", cfg.MaxPending)
	}
	if err := cfg.Format.Check(); err != nil {
		return nil, fmt.Errorf("outbox/nats: Config.Format: %w", err)
	}
	if err := wire.CheckSource(cfg.Source); err != nil {
		return nil, fmt.Errorf("outbox/nats: Config.Source: %w", err)
	}
	cfg.SubjectPrefix = cmp.Or(cfg.SubjectPrefix, DefaultSubjectPrefix)
	cfg.Timeout = cmp.Or(cfg.Timeout, DefaultTimeout)
	cfg.MaxPending = cmp.Or(cfg.MaxPending, DefaultMaxPending)
	p := &Publisher{js: js, cfg: cfg, log: cfg.Logger}
	if p.log == nil {
		p.log = slog.Default()
	}
	if c, ok := js.(interface{ Conn() *natsgo.Conn }); ok {
		p.nc = c.Conn()
		p.checkReconnects(p.nc)
	}
	if p.nc != nil {
		// A publisher of its own, so that an ack that never comes (a
		// stream leader lost with the message) ends after Timeout and
		// frees its place among the MaxPending: without an ack timeout,
		// nats.go keeps it forever, and enough of them stall every publish.
		// Publishes use neither the API prefix nor the domain of js.
		async, err := jetstream.New(p.nc, jetstream.WithPublishAsyncTimeout(cfg.Timeout), jetstream.WithPublishAsyncMaxPending(cfg.MaxPending))
		if err != nil {
			return nil, fmt.Errorf("outbox/nats: the async publisher: %w", err)
		}
		p.async = async
	} else if a, ok := js.(AsyncJetStream); ok {
		p.async = a
	}
	return p, nil
}

// checkReconnects warns about a connection that stops reconnecting after a
// while: a broker outage longer than that stops every publish until the
// process restarts.
func (p *Publisher) checkReconnects(nc *natsgo.Conn) {
	if nc == nil {
		return
	}
	o := nc.Opts
	switch {
	case !o.AllowReconnect:
		p.log.Warn("outbox/nats: the nats.Conn does not reconnect (nats.NoReconnect): the first broker outage closes it for good, and no event is published again until the process creates a new connection; connect with nats.MaxReconnects(-1)")
	case o.MaxReconnect >= 0:
		p.log.Warn("outbox/nats: the nats.Conn gives up reconnecting after a bounded number of attempts: a longer broker outage closes it for good, and no event is published again until the process creates a new connection; connect with nats.MaxReconnects(-1)",
			slog.Int("max_reconnects", o.MaxReconnect), slog.Duration("reconnect_wait", o.ReconnectWait),
			slog.Duration("gives_up_after_about", time.Duration(o.MaxReconnect)*o.ReconnectWait))
	}
}

// Handler returns the outbox handler that publishes each event it is given
// and waits for its ack: register it with ob.Handle(eventType,
// p.Handler()). [Publisher.AsyncHandler] builds the same messages and
// returns the same errors without waiting for each ack in turn.
//
// In Native format the message body is the event's JSON payload. Its
// headers are those [wire.Headers] gives: the event's headers (trace
// context such as "traceparent" included, names kept as they are; those
// with a reserved Outbox-* name, in any case, dropped), then the Outbox-*
// fields; plus [HeaderContentType] and Nats-Msg-Id = event ID. The
// CloudEvents formats replace the Outbox-* fields with attributes (see the
// package doc's Formats). In every format, event headers named
// Content-Type, in any case, are dropped, and so are those whose names start
// with "Nats-": they would steer JetStream itself (expected sequences,
// message TTL, the dedupe ID).
//
// Each call is reported to the Telemetry of [Config.Telemetry] or the
// context, with its outcome (the error the handler returns).
//
// Errors that retrying cannot fix (an invalid subject or header, a message
// over the server's size limit) are marked [outbox.Permanent]. Errors that
// say the server cannot be reached (see the package doc), and a subject no
// stream is bound to, are marked [outbox.Unavailable]: the relay pauses
// without counting attempts. Others, such as a stream that refuses the
// message (ExpectStream mismatch, limits), are retried with backoff.
func (p *Publisher) Handler() outbox.Handler {
	return func(ctx context.Context, e outbox.Event) error {
		return p.start(ctx, e, p.sendSync)()
	}
}

// AsyncHandler returns the outbox handler that starts publishing each event
// it is given, with JetStream's PublishMsgAsync, and returns a wait for the
// ack: register it with ob.HandleAsync(eventType, p.AsyncHandler()). A
// relay starts the publishes of a batch (with OrderByAggregate, of a wave:
// one event per aggregate) in batch order, then waits for each, so the
// batch costs about one round trip to the server instead of one per event.
//
// The message, the telemetry (the send span starts with the publish and
// ends when wait returns, with its outcome) and the errors are those of
// [Publisher.Handler]. The start puts the message on the wire (or, while
// the client reconnects, in its reconnect buffer) in the order of the calls
// and returns without waiting for the ack, unless [Config.MaxPending]
// publishes await theirs already: it then waits for one to end. wait
// returns nil once the stream has stored the event (or already held it: a
// duplicate is a success), and an error otherwise: the server's refusal,
// classified as Handler's, or [outbox.Unavailable] when the ack does not
// come within [Config.Timeout] (or the context's deadline), the
// connection is lost while the ack is awaited (nats.go fails the pending
// publishes; the stream may have stored them, and Nats-Msg-Id drops the
// re-sends), or the connection is closed.
//
// It publishes through a JetStream publisher of its own on the connection
// of the JetStream given to [New] (its acks time out after Config.Timeout,
// at most Config.MaxPending of them pending). A JetStream without a
// connection is used itself when it is an [AsyncJetStream]; otherwise each
// event is published and its ack awaited at the start, as Handler does.
func (p *Publisher) AsyncHandler() outbox.AsyncHandler {
	send := p.sendAsync
	if p.async == nil {
		send = p.sendSync
	}
	return func(ctx context.Context, e outbox.Event) func() error {
		return p.start(ctx, e, send)
	}
}

// sender sends msg, within ctx and by deadline (Config.Timeout from the
// start), and returns the wait for the raw outcome; Handler's waits before
// it returns, AsyncHandler's after.
type sender func(ctx context.Context, deadline time.Time, msg *natsgo.Msg, opts []jetstream.PublishOpt) (wait func() error)

// start is one publish of e, Handler's or AsyncHandler's: it builds the
// message, hands it to send and returns the wait for the classified
// outcome, which ends the send span. wait may be called more than once.
func (p *Publisher) start(ctx context.Context, e outbox.Event, send sender) (wait func() error) {
	subject := p.subject(e)
	// The span starts before anything can fail, so that it records every
	// outcome; e becomes the event with the span's trace context, which is
	// what the message must carry.
	ctx, e, end := wire.StartSend(ctx, p.cfg.Telemetry, p.operation(ctx, subject), e)
	msg, opts, err := p.message(subject, e)
	if err != nil {
		end(err)
		return func() error { return err }
	}
	sent := send(ctx, time.Now().Add(p.cfg.Timeout), msg, opts)
	return sync.OnceValue(func() error {
		err := p.classify(sent(), subject)
		end(err)
		return err
	})
}

// operation describes a publish to subject for [wire.StartSend], with the
// server's address when the connection is known and a Telemetry will use
// it (it is looked up per publish: a reconnect may change the server).
func (p *Publisher) operation(ctx context.Context, subject string) wire.Operation {
	op := wire.Operation{System: "nats", Destination: subject}
	if p.nc == nil || (p.cfg.Telemetry == nil && wire.TelemetryFrom(ctx) == nil) {
		return op
	}
	if u, err := url.Parse(p.nc.ConnectedUrlRedacted()); err == nil && u.Hostname() != "" {
		op.ServerAddress = u.Hostname()
		op.ServerPort, _ = strconv.Atoi(u.Port())
	}
	return op
}

// message is e's message on subject and its publish options, or the
// permanent error that keeps it from being sent.
func (p *Publisher) message(subject string, e outbox.Event) (*natsgo.Msg, []jetstream.PublishOpt, error) {
	if err := checkSubject(subject); err != nil {
		// Quoted: it may hold whitespace.
		return nil, nil, outbox.Permanent(fmt.Errorf("%w: subject %q (outbox/nats)", err, subject))
	}
	m, err := wire.NATSBinding.Encode(p.cfg.Format, e, wire.CloudEventOptions{Source: p.cfg.Source})
	if err != nil {
		return nil, nil, outbox.Permanent(publishError(err, subject))
	}
	hdr, err := headers(m)
	if err != nil {
		return nil, nil, outbox.Permanent(publishError(err, subject))
	}
	// Room for the stall wait sendAsync adds.
	opts := make([]jetstream.PublishOpt, 1, 3)
	opts[0] = jetstream.WithMsgID(e.ID)
	if p.cfg.ExpectStream != "" {
		opts = append(opts, jetstream.WithExpectStream(p.cfg.ExpectStream))
	}
	return &natsgo.Msg{Subject: subject, Data: m.Body, Header: hdr}, opts, nil
}

// sendSync publishes msg and waits for the ack before it returns.
func (p *Publisher) sendSync(ctx context.Context, deadline time.Time, msg *natsgo.Msg, opts []jetstream.PublishOpt) func() error {
	ctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	_, err := p.js.PublishMsg(ctx, msg, opts...)
	return func() error { return err }
}

// stallWait is how long one PublishMsgAsync waits for room among the
// MaxPending publishes before sendAsync checks its context and tries again.
const stallWait = 100 * time.Millisecond

// sendAsync puts msg on the wire and returns the wait for its ack. Its
// errors are in the terms of the synchronous publish, which classify
// knows. It keeps to deadline without a context of its own: a context
// with a timeout per message was a fifth of the adapter's CPU on a
// relay's path, and most waits find their ack already there.
func (p *Publisher) sendAsync(ctx context.Context, deadline time.Time, msg *natsgo.Msg, opts []jetstream.PublishOpt) func() error {
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	var (
		paf  jetstream.PubAckFuture
		err  error
		base = len(opts)
	)
	for {
		wait := min(stallWait, time.Until(deadline))
		if wait <= 0 || ctx.Err() != nil {
			err = p.connState(fmt.Errorf("%w waiting for one of the publishes awaiting their ack to end (Config.MaxPending)", cmp.Or(ctx.Err(), context.DeadlineExceeded)))
			return func() error { return err }
		}
		paf, err = p.async.PublishMsgAsync(msg, append(opts[:base], jetstream.WithStallWait(wait))...)
		if !errors.Is(err, jetstream.ErrTooManyStalledMsgs) {
			break
		}
	}
	if err != nil {
		err = p.connState(err)
		return func() error { return err }
	}
	ok, failed := paf.Ok(), paf.Err()
	return func() error {
		select {
		case <-ok:
			return nil
		case err := <-failed:
			return p.connState(ackError(err))
		default:
		}
		timer := time.NewTimer(time.Until(deadline))
		defer timer.Stop()
		var cause error
		select {
		case <-ok:
			return nil
		case err := <-failed:
			return p.connState(ackError(err))
		case <-ctx.Done():
			cause = ctx.Err()
		case <-timer.C:
			cause = context.DeadlineExceeded
		}
		select {
		case <-ok: // both were ready: the ack wins
			return nil
		default:
		}
		return p.connState(cause)
	}
}

// ackError is the error of a failed async publish as the synchronous
// publish reports it: the stream's refusal wrapped as "nats: ...".
func ackError(err error) error {
	if _, ok := err.(*jetstream.APIError); ok {
		return fmt.Errorf("nats: %w", err)
	}
	return err
}

// connState adds the connection's state to an async publish's error when
// the connection is closed or draining and err does not say so: nats.go
// reports the failure to subscribe to acks on a closed connection as text
// only, and does not fail the publishes awaiting their acks when the
// connection closes (they time out).
func (p *Publisher) connState(err error) error {
	if p.nc == nil || errors.Is(err, natsgo.ErrConnectionClosed) || errors.Is(err, natsgo.ErrConnectionDraining) {
		return err
	}
	switch {
	case p.nc.IsClosed():
		return withCause{err, natsgo.ErrConnectionClosed}
	case p.nc.IsDraining():
		return withCause{err, natsgo.ErrConnectionDraining}
	}
	return err
}

// withCause is err, whose text it keeps, with cause in its chain too.
type withCause struct{ err, cause error }

func (w withCause) Error() string   { return w.err.Error() }
func (w withCause) Unwrap() []error { return []error{w.err, w.cause} }

// classify is the error of a publish to subject that failed with err (nil
// for a success), for Handler and AsyncHandler alike. A duplicate ack is a
// success: the stream already holds this event from an earlier attempt
// whose outcome the relay did not record.
func (p *Publisher) classify(err error, subject string) error {
	if err == nil {
		return nil
	}
	err = publishError(err, subject)
	switch {
	case errors.Is(err, natsgo.ErrMaxPayload) || errors.Is(err, jetstream.ErrStreamMessageExceedsMaximum) ||
		errors.Is(err, natsgo.ErrBadSubject):
		return outbox.Permanent(err)
	case errors.Is(err, natsgo.ErrConnectionClosed):
		p.connectionClosed(err)
		return outbox.Unavailable(err)
	case unavailable(err):
		return outbox.Unavailable(err)
	}
	return err
}

// publishError is the error of a publish to subject that failed with err:
// err first, then the destination and the adapter, such as "nats: no
// responders available for request: subject orders.created (outbox/nats)".
// The event ID is left out: the relay's logs and the outbox row carry it,
// and a reader of a column cut to a width wants the cause.
func publishError(err error, subject string) error {
	return fmt.Errorf("%w: subject %s (outbox/nats)", err, subject)
}

// connectionClosed logs, once, that the connection will not come back.
// The relay only logs that the destination is unavailable; this says why,
// and what to change.
func (p *Publisher) connectionClosed(err error) {
	if p.closed.Swap(true) {
		return
	}
	p.log.Error("outbox/nats: the nats.Conn is closed for good (nats.go stopped reconnecting, or the application closed it): no event can be published until the process creates a new connection and Publisher; events stay pending meanwhile. Connect with nats.MaxReconnects(-1) so that the client keeps reconnecting through broker outages",
		slog.String("error", err.Error()))
}

// unavailable reports whether err says that the server, not the event, is
// the problem: it cannot be reached, or does not answer in time, or
// JetStream (or a stream for the subject) is not there to store messages.
func unavailable(err error) bool {
	for _, target := range []error{
		natsgo.ErrConnectionClosed, natsgo.ErrConnectionDraining, natsgo.ErrDisconnected,
		natsgo.ErrNoServers, natsgo.ErrReconnectBufExceeded, natsgo.ErrStaleConnection,
		natsgo.ErrTimeout, natsgo.ErrNoResponders, natsgo.ErrInvalidConnection,
		jetstream.ErrNoStreamResponse, jetstream.ErrJetStreamNotEnabled, jetstream.ErrJetStreamNotEnabledForAccount,
		jetstream.ErrAsyncPublishTimeout, context.DeadlineExceeded,
	} {
		if errors.Is(err, target) {
			return true
		}
	}
	// JetStream answers 503 while it cannot store messages (no quorum, a
	// stream without a leader, the system not ready after a restart).
	if apiErr, ok := errors.AsType[*jetstream.APIError](err); ok && apiErr.Code == 503 {
		return true
	}
	_, ok := errors.AsType[net.Error](err)
	return ok
}

func (p *Publisher) subject(e outbox.Event) string {
	if p.cfg.Subject != nil {
		return p.cfg.Subject(e)
	}
	return p.cfg.SubjectPrefix + e.Type
}

// checkSubject rejects what NATS cannot publish to. Catching it here gives a
// permanent error instead of a protocol error that would reach the
// connection.
func checkSubject(s string) error {
	if s == "" {
		return errors.New("empty subject")
	}
	if strings.ContainsAny(s, " \t\r\n\f\v\x00") {
		return errors.New("subject contains whitespace")
	}
	for tok := range strings.SplitSeq(s, ".") {
		switch tok {
		case "":
			return errors.New("subject has an empty token")
		case "*", ">":
			return errors.New("subject has a wildcard token")
		}
	}
	return nil
}

// headers returns the NATS headers of m: its headers but those NATS or
// JetStream would act on, checked, and its content type.
func headers(m wire.Message) (natsgo.Header, error) {
	h := make(natsgo.Header, len(m.Header)+1)
	// One array holds every value: natsgo.Header.Set allocates one per
	// header. Each header's slice is capped at its own value.
	vals := make([]string, 0, len(m.Header)+1)
	set := func(k, v string) {
		vals = append(vals, v)
		h[k] = vals[len(vals)-1 : len(vals) : len(vals)]
	}
	for _, a := range m.Header {
		k, v := a.Name, a.Value
		if strings.EqualFold(k, HeaderContentType) || (len(k) >= 5 && strings.EqualFold(k[:5], "Nats-")) {
			continue
		}
		// The Outbox-* values come from the event too: a CR or LF in them
		// would split the header block.
		if err := checkHeader(k, v); err != nil {
			return nil, err
		}
		set(k, v)
	}
	set(HeaderContentType, m.ContentType)
	return h, nil
}

// checkHeader enforces the NATS header syntax (like HTTP/1: a token name,
// a value on one line). Only the name is quoted in errors; values may carry
// personal data.
func checkHeader(k, v string) error {
	if k == "" {
		return errors.New("empty header name")
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; c <= ' ' || c >= 0x7f || c == ':' {
			return fmt.Errorf("header name %q is not a token (printable ASCII without spaces or colons)", k)
		}
	}
	if strings.IndexByte(v, '\r') >= 0 || strings.IndexByte(v, '\n') >= 0 {
		return fmt.Errorf("header %q: value contains CR or LF", k)
	}
	return nil
}
