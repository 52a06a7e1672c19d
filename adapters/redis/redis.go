// Package redis appends outbox events to Redis streams with XADD, and reads
// them back through a consumer group with [Consumer], which applies each
// entry once with [outbox.Consume] and acknowledges it after the commit.
//
// Delivery guarantee: at least once; a retried XADD (after a lost reply, a
// relay crash before "mark sent", or the client's own retry) appends a second
// entry, so consumers deduplicate by the event ID: the entry's "id" field,
// or the document's id in the CloudEvents formats.
//
// Each event becomes one stream entry with the fields listed under
// [Publisher.Handler]. By default every event goes to the one stream
// "outbox:events": a single stream keeps the relay's delivery order across
// event types (a consumer group reads one stream, filtering on "type"),
// whereas a stream per type would split an aggregate's history over several
// keys. Use [Config.Stream] for another name or [Config.StreamFor] for a
// per-type or per-tenant layout.
//
// Pipelining: register [Publisher.AsyncHandler] with ob.HandleAsync. A
// relay starts the XADDs of a whole batch before it waits for any, and the
// publisher sends them in one pipeline, one round trip for the batch (with
// [Config.WaitReplicas], one WAIT for it too) instead of one per event.
// [Publisher.Handler], one XADD and its reply at a time, still works with
// ob.Handle.
//
// Ordering: an AsyncHandler's entries reach their streams in the order it
// was called (a publisher sends its pipelines one after the other), so a
// stream holds a batch's events in batch order; with
// [outbox.RelayConfig.OrderByAggregate] an aggregate's events arrive in
// order and none after one that failed. A Handler waits for each XADD, so
// a stream holds events in the order the relay's workers deliver them. A
// retried event lands after those delivered meanwhile, and several relays
// interleave.
//
// Outages: an XADD that fails because Redis cannot be reached or cannot take
// writes (connection refused, reset or closed, a timeout, DNS, the client
// or its pool closed or exhausted, LOADING, READONLY, MASTERDOWN,
// CLUSTERDOWN, BUSY, OOM, NOREPLICAS, max clients, authentication) is
// reported as [outbox.Unavailable]: the relay hands the event back without
// counting an attempt and pauses delivery until Redis answers again. A
// Sentinel failover is such an outage (see [Config.WaitReplicas] for what
// asynchronous replication can lose in one).
//
// The package shares its name with go-redis; import it under another name,
// for example outboxredis.
//
// # Formats
//
// [Config.Format] picks the entry layout. [wire.Native], the default, is
// the fields listed under [Publisher.Handler]. Redis Streams have no
// CloudEvents protocol binding, nor headers, so [wire.CloudEvents] and
// [wire.CloudEventsJSON] are both structured mode: the field
// [FieldCloudEvent] holds the CloudEvents JSON document (every attribute,
// the payload as "data"), and [FieldHeaders] the event's other headers, only
// when it has some beyond the traceparent and tracestate the document
// holds. [Config.Source] is the source attribute. The [Consumer] reads
// every format.
//
// # Telemetry
//
// Spans come from package outboxotel, whose [wire.Telemetry] is in every
// delivery's context: each XADD is a PRODUCER span "send {stream}", whose
// trace context the entry carries. [Config.Telemetry] overrides it;
// [ConsumerConfig.Telemetry] gives a Consumer, which has no relay, its
// CONSUMER spans "process {stream}".
package redis

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/wire"
	goredis "github.com/redis/go-redis/v9"
)

// Field names of a stream entry in [wire.Native] format. Every such entry
// has all of them.
const (
	// FieldID holds the event ID, the consumer's deduplication key.
	FieldID = "id"
	// FieldType holds the event type.
	FieldType = "type"
	// FieldAggregateType holds the aggregate type, "" when none.
	FieldAggregateType = "aggregate_type"
	// FieldAggregateID holds the aggregate ID, "" when none.
	FieldAggregateID = "aggregate_id"
	// FieldIdempotencyKey holds the publisher's idempotency key.
	FieldIdempotencyKey = "idempotency_key"
	// FieldOccurredAt holds when the event happened, formatted with
	// [wire.TimeFormat] (RFC 3339, UTC, microseconds), "" when not set.
	FieldOccurredAt = "occurred_at"
	// FieldHeaders holds the event's headers as a JSON object, "{}" when
	// there are none.
	FieldHeaders = "headers"
	// FieldPayload holds the event's JSON payload.
	FieldPayload = "payload"
)

// FieldCloudEvent is the field of an entry in [wire.CloudEvents] or
// [wire.CloudEventsJSON] format: the event as one CloudEvents JSON document
// (structured content mode, application/cloudevents+json; see
// [wire.StructuredJSON]). Redis Streams have no CloudEvents protocol
// binding and no headers, so both formats are structured here. Such an
// entry has one more field, [FieldHeaders], only when the event has
// headers the document does not carry (all but the traceparent and
// tracestate the document holds as extensions).
const FieldCloudEvent = "cloudevent"

// Defaults of [Config].
const (
	// DefaultStream is [Config.Stream]'s default.
	DefaultStream = "outbox:events"
	// DefaultTimeout is [Config.Timeout]'s default.
	DefaultTimeout = 5 * time.Second
	// DefaultWaitTimeout is [Config.WaitTimeout]'s default.
	DefaultWaitTimeout = time.Second
)

// ErrUnderReplicated is in the error of a publish whose entry fewer replicas
// acknowledged than [Config.WaitReplicas] asks for, within
// [Config.WaitTimeout]. Such an error is [outbox.Unavailable]: the relay
// keeps the event and sends it again once Redis has its replicas back; the
// entry is in the primary's stream already, so the retry appends a second
// one.
var ErrUnderReplicated = errors.New("fewer replicas than Config.WaitReplicas acknowledged the entry")

// Client is the part of a go-redis client the adapter uses. *redis.Client
// (from redis.NewClient, or redis.NewFailoverClient for Sentinel),
// *redis.ClusterClient, *redis.Ring and redis.UniversalClient satisfy it.
type Client interface {
	// XAdd appends an entry to a stream.
	XAdd(ctx context.Context, a *goredis.XAddArgs) *goredis.StringCmd
}

// Config configures a [Publisher]. Its zero value is usable.
type Config struct {
	// Stream is the key of the stream every event is appended to when
	// StreamFor is nil. Defaults to "outbox:events".
	Stream string

	// StreamFor maps an event to its stream key, overriding Stream; for
	// example func(e outbox.Event) string { return "events:" + e.Type }.
	// An empty result fails the event permanently. Defaults to nil (use
	// Stream).
	StreamFor func(e outbox.Event) string

	// MaxLen caps each stream's length by trimming its oldest entries on
	// every XADD. Trimming is approximate ("MAXLEN ~"): Redis removes only
	// whole internal nodes, which is much cheaper, so the stream may hold
	// somewhat more than MaxLen entries. Defaults to 0: no trimming.
	MaxLen int64

	// ExactTrim makes MaxLen exact ("MAXLEN ="), at a higher cost per XADD.
	// Defaults to false (approximate).
	ExactTrim bool

	// Timeout bounds one XADD (with its WAIT, if any): for
	// [Publisher.AsyncHandler], from the start of the event's delivery to
	// its reply, its pipeline's round trip and any pipeline sent before it
	// included. The relay's deadline applies too. go-redis honours context
	// deadlines only on clients created with Options.ContextTimeoutEnabled;
	// otherwise its own ReadTimeout and WriteTimeout bound the call.
	// Defaults to 5 seconds.
	Timeout time.Duration

	// Format is how an event is laid out in its entry. [wire.Native] (the
	// default) writes the Field constants' fields, as before formats
	// existed. [wire.CloudEvents] and [wire.CloudEventsJSON] are the same
	// here: Redis Streams have no CloudEvents binding, so both write one
	// structured JSON document in [FieldCloudEvent] (plus [FieldHeaders]
	// when needed), for consumers that read CloudEvents in any language.
	// [New] refuses other values.
	Format wire.Format

	// Source is the CloudEvents source attribute in the CloudEvents
	// formats: a URI-reference naming the producing service, such as
	// "/orders". It must not change for an event's life, since consumers
	// deduplicate by source and id. Defaults to [wire.DefaultSource].
	// Native format ignores it.
	Source string

	// Telemetry reports each XADD as a PRODUCER span "send {stream}" and
	// puts that span's trace context in the entry. Defaults to nil: the
	// Telemetry in the handler's context, which outboxotel puts in every
	// delivery's, so set it only to override that one.
	Telemetry wire.Telemetry

	// WaitReplicas, when positive, has every XADD followed by
	// WAIT WaitReplicas WaitTimeout in the same round trip (a pipeline;
	// [Publisher.AsyncHandler] sends one WAIT after all the XADDs of its
	// pipeline): the event counts as sent only once that many replicas
	// acknowledged its entry. Replication is asynchronous, so without it an entry the
	// primary acknowledged can be missing from the replica Sentinel
	// promotes when the primary is lost: the outbox marked the event sent,
	// and it is gone. With it, fewer replicas within WaitTimeout is an
	// [outbox.Unavailable] error wrapping [ErrUnderReplicated]: the relay
	// sends the event again later (a second entry, never a loss) and
	// delivery pauses while the primary has fewer replicas connected; with
	// AsyncHandler every event of the pipeline gets that error. Each event
	// (each pipeline, with AsyncHandler) waits for a replica's
	// acknowledgement, about a round trip to it. Sentinel promotes the replica with the largest replication offset
	// it knows of, so with fewer than all replicas the promoted one almost
	// always has the entry; only all of them rules a loss out, at the price
	// of a pause whenever one is down. It needs a client with one primary
	// ([goredis.NewClient], [goredis.NewFailoverClient]): [New] refuses a
	// cluster or ring client, which would send WAIT to a node of its
	// choosing. Defaults to 0: no WAIT, the primary's acknowledgement is
	// the event's.
	WaitReplicas int

	// WaitTimeout bounds how long WAIT waits for the replicas, in Redis.
	// It must be less than Timeout and, on a client with a read timeout,
	// than Options.ReadTimeout (3 s by default): the reply comes after it.
	// Defaults to 1 second. Used only with WaitReplicas.
	WaitTimeout time.Duration
}

// Publisher appends outbox events to Redis streams. Create it with [New]; it
// is safe for concurrent use.
type Publisher struct {
	rdb  Client
	pipe pipeliner // rdb, when it has a Pipeline method (every go-redis client)
	cfg  Config
	host string // the server's address and port for telemetry, when known
	port int

	mu   sync.Mutex
	open *flight // the pipeline AsyncHandler's starts join; nil when none
	last *flight // the pipeline sealed last: the next one is sent after it
}

// pipeliner is a client that sends several commands in one round trip.
type pipeliner interface {
	Pipeline() goredis.Pipeliner
}

// New returns a publisher that appends events through rdb.
func New(rdb Client, cfg Config) (*Publisher, error) {
	if rdb == nil {
		return nil, errors.New("outbox/redis: New needs a client (redis.NewClient(...))")
	}
	if cfg.MaxLen < 0 {
		return nil, fmt.Errorf("outbox/redis: negative MaxLen %d; use 0 for no trimming", cfg.MaxLen)
	}
	if cfg.Timeout < 0 {
		return nil, fmt.Errorf("outbox/redis: negative Timeout %v; use 0 for the default", cfg.Timeout)
	}
	if err := cfg.Format.Check(); err != nil {
		return nil, fmt.Errorf("outbox/redis: Config.Format: %w", err)
	}
	if err := wire.CheckSource(cfg.Source); err != nil {
		return nil, fmt.Errorf("outbox/redis: Config.Source: %w", err)
	}
	cfg.Stream = cmp.Or(cfg.Stream, DefaultStream)
	cfg.Timeout = cmp.Or(cfg.Timeout, DefaultTimeout)
	p := &Publisher{rdb: rdb, cfg: cfg}
	p.pipe, _ = rdb.(pipeliner)
	if err := p.checkWait(); err != nil {
		return nil, err
	}
	p.host, p.port = serverAddr(rdb)
	return p, nil
}

// checkWait checks WaitReplicas and WaitTimeout, sets WaitTimeout's
// default, and checks that the client pipelines, as WAIT needs.
func (p *Publisher) checkWait() error {
	cfg := &p.cfg
	if cfg.WaitReplicas < 0 {
		return fmt.Errorf("outbox/redis: negative WaitReplicas %d; use 0 for no WAIT", cfg.WaitReplicas)
	}
	if cfg.WaitTimeout < 0 {
		return fmt.Errorf("outbox/redis: negative WaitTimeout %v; use 0 for the default", cfg.WaitTimeout)
	}
	if cfg.WaitReplicas == 0 {
		return nil
	}
	cfg.WaitTimeout = cmp.Or(cfg.WaitTimeout, DefaultWaitTimeout)
	if cfg.WaitTimeout >= cfg.Timeout {
		return fmt.Errorf("outbox/redis: WaitTimeout %v must be less than Timeout %v", cfg.WaitTimeout, cfg.Timeout)
	}
	switch p.rdb.(type) {
	case *goredis.ClusterClient, *goredis.Ring:
		return fmt.Errorf("outbox/redis: WaitReplicas needs a client with one primary (redis.NewClient, redis.NewFailoverClient), not a %T: WAIT would go to a node of its choosing", p.rdb)
	}
	if p.pipe == nil {
		return fmt.Errorf("outbox/redis: WaitReplicas needs a client with a Pipeline method (redis.NewClient, redis.NewFailoverClient), not a %T", p.rdb)
	}
	if c, ok := p.rdb.(interface{ Options() *goredis.Options }); ok {
		if o := c.Options(); o != nil && o.ReadTimeout > 0 && cfg.WaitTimeout >= o.ReadTimeout {
			return fmt.Errorf("outbox/redis: WaitTimeout %v must be less than the client's ReadTimeout %v", cfg.WaitTimeout, o.ReadTimeout)
		}
	}
	return nil
}

// serverAddr returns the address and port of the server a single-node
// client (*redis.Client) talks to, for telemetry; "", 0 for other clients
// (a cluster or ring has no one address).
func serverAddr(rdb any) (string, int) {
	c, ok := rdb.(interface{ Options() *goredis.Options })
	if !ok {
		return "", 0
	}
	o := c.Options()
	if o == nil || o.Addr == "" {
		return "", 0
	}
	if o.Network == "unix" {
		return o.Addr, 0
	}
	host, port, err := net.SplitHostPort(o.Addr)
	if err != nil {
		return "", 0
	}
	n, _ := strconv.Atoi(port)
	return host, n
}

// Handler returns the outbox handler that appends each event it is given,
// one XADD and its reply at a time: register it with ob.Handle(eventType,
// p.Handler()). [Publisher.AsyncHandler] appends the same entries, a
// batch's in one round trip.
//
// In [wire.Native] format the entry's fields, always all present and in
// this order, are id, type, aggregate_type, aggregate_id, idempotency_key,
// occurred_at, headers and payload (see the Field constants). In the
// CloudEvents formats they are [FieldCloudEvent] and, when the event has
// headers the document does not hold, [FieldHeaders]. Its entry ID is
// assigned by Redis.
//
// Each XADD is reported to the Telemetry (Config's or the context's) as a
// send to the stream, whose trace context the entry carries: in the
// headers field (Native), in the document's traceparent and tracestate
// extensions (CloudEvents).
//
// An event that cannot be encoded, or whose stream key is empty, fails
// permanently ([outbox.Permanent]). Network errors and the Redis errors that
// say the server cannot take writes are [outbox.Unavailable] (see the
// package doc), as is, with [Config.WaitReplicas], an entry too few
// replicas acknowledged: the relay pauses without counting attempts. Other
// Redis errors (a key of another type, an ACL that forbids the key) are
// retried with backoff.
func (p *Publisher) Handler() outbox.Handler {
	return p.publish
}

// AsyncHandler returns the outbox handler that pipelines the XADDs of a
// batch: register it with ob.HandleAsync(eventType, p.AsyncHandler()).
// Each call queues its event's XADD, the same entry as [Publisher.Handler]
// appends, with its send span started; the first wait sends every XADD
// queued so far in one pipeline, in the order they were queued, with one
// WAIT after them when [Config.WaitReplicas] is set, and returns its own
// event's outcome; the later waits of that pipeline read theirs. Calls
// made meanwhile queue into the next pipeline, which is sent once the one
// before it has its replies: entries reach Redis in the order of the
// calls. The handler is safe for concurrent use, and each wait returns
// its own event's outcome.
//
// A relay starts every event of a batch (or, with
// [outbox.RelayConfig.OrderByAggregate], of a wave) before it waits for
// any, so a batch costs one round trip to Redis instead of one per event.
// Called with wait at once (memory mode, a relay probing an outage), an
// event is a pipeline of its own, a round trip as with Handler.
//
// Its errors are Handler's, event by event: [outbox.Permanent] for an
// event that cannot be encoded or an empty stream key (found when it is
// started), [outbox.Unavailable] for an outage, and with WaitReplicas for
// every event of a pipeline whose WAIT too few replicas answered, each
// naming its own entry; other Redis errors are the event's own, retried
// with backoff. A wait whose context ends before its pipeline's reply
// returns the context's error (a deadline is Unavailable); its XADD may
// still land, as a lost reply's does. A client without a Pipeline method
// (the [Client] interface alone) has each XADD sent when it is started.
func (p *Publisher) AsyncHandler() outbox.AsyncHandler {
	return p.start
}

// xadd is one event's XADD, as both handlers send it.
type xadd struct {
	ctx    context.Context // the delivery's, with the send span, within Config.Timeout
	cancel context.CancelFunc
	end    func(error) // ends the send span
	stream string
	args   *goredis.XAddArgs
	err    error // its outcome: set before it is sent when it cannot be
}

// prepare resolves e's stream, starts its send span and builds its XADD;
// x.err is set when the event cannot be sent.
func (p *Publisher) prepare(ctx context.Context, e outbox.Event) *xadd {
	x := &xadd{cancel: func() {}, end: func(error) {}, stream: p.cfg.Stream}
	if p.cfg.StreamFor != nil {
		x.stream = p.cfg.StreamFor(e)
	}
	if x.stream == "" {
		x.err = outbox.Permanent(errors.New("StreamFor returned an empty stream key (outbox/redis)"))
		return x
	}
	ctx, e, x.end = wire.StartSend(ctx, p.cfg.Telemetry, wire.Operation{
		System: "redis", Destination: x.stream, ServerAddress: p.host, ServerPort: p.port,
	}, e)
	// The entry carries e as StartSend returned it, with the span's trace
	// context.
	values, err := p.entry(e)
	if err != nil {
		x.err = outbox.Permanent(fmt.Errorf("%w: stream %s (outbox/redis)", err, x.stream))
		return x
	}
	x.args = &goredis.XAddArgs{Stream: x.stream, ID: "*", Values: values}
	if p.cfg.MaxLen > 0 {
		x.args.MaxLen, x.args.Approx = p.cfg.MaxLen, !p.cfg.ExactTrim
	}
	x.ctx, x.cancel = context.WithTimeout(ctx, p.cfg.Timeout)
	return x
}

// finish ends x's span with err, x's outcome, and returns it.
func (x *xadd) finish(err error) error {
	x.cancel()
	x.end(err)
	return err
}

func (p *Publisher) publish(ctx context.Context, e outbox.Event) error {
	x := p.prepare(ctx, e)
	if x.err == nil {
		p.send(x)
	}
	return x.finish(x.err)
}

// send sends x alone and sets its outcome: with WaitReplicas, the XADD and
// its WAIT in one round trip.
func (p *Publisher) send(x *xadd) {
	if p.cfg.WaitReplicas > 0 {
		p.exec(x.ctx, []*xadd{x})
		return
	}
	x.err = failed("stream "+x.stream, p.rdb.XAdd(x.ctx, x.args).Err())
}

// exec sends the XADDs of xs, in order, and with WaitReplicas one WAIT
// after them, in one round trip (a pipeline), and sets each one's outcome.
// The WAIT runs even when an XADD failed; it waits for the connection's
// writes before it, so it answers for every entry appended.
func (p *Publisher) exec(ctx context.Context, xs []*xadd) {
	pipe := p.pipe.Pipeline()
	cmds := make([]*goredis.StringCmd, len(xs))
	for i, x := range xs {
		cmds[i] = pipe.XAdd(ctx, x.args)
	}
	var wait *goredis.IntCmd
	if p.cfg.WaitReplicas > 0 {
		wait = goredis.NewIntCmd(ctx, "wait", p.cfg.WaitReplicas, p.cfg.WaitTimeout.Milliseconds())
		_ = pipe.Process(ctx, wait) // queued; Exec sends it
	}
	_, _ = pipe.Exec(ctx) // the commands hold the errors
	for i, x := range xs {
		x.err = p.outcome(x.stream, cmds[i], wait)
	}
}

// outcome is a sent XADD's outcome: its own error, or with WaitReplicas
// the WAIT's after it.
func (p *Publisher) outcome(stream string, xadd *goredis.StringCmd, wait *goredis.IntCmd) error {
	if err := xadd.Err(); err != nil {
		return failed("stream "+stream, err)
	}
	if wait == nil {
		return nil
	}
	appended := "entry " + xadd.Val() + " appended to stream " + stream
	if err := wait.Err(); err != nil {
		return failed("WAIT after "+appended, err)
	}
	if n := wait.Val(); n < int64(p.cfg.WaitReplicas) {
		return failed(appended, fmt.Errorf("%w: %d of %d within %v", ErrUnderReplicated, n, p.cfg.WaitReplicas, p.cfg.WaitTimeout))
	}
	return nil
}

// flight is a pipeline of AsyncHandler's XADDs: open while starts join
// it, sealed by its first wait, then sent once the flight sealed before it
// is done, so that pipelines reach Redis in the order of their XADDs.
type flight struct {
	xs     []*xadd
	sealed bool          // under Publisher.mu
	prev   *flight       // sealed before it
	done   chan struct{} // closed once every XADD of xs has its outcome
}

// start is the AsyncHandler: it queues e's XADD into the open flight.
func (p *Publisher) start(ctx context.Context, e outbox.Event) func() error {
	x := p.prepare(ctx, e)
	if x.err != nil || p.pipe == nil {
		if x.err == nil {
			p.send(x)
		}
		return func() error { return x.finish(x.err) }
	}
	p.mu.Lock()
	f := p.open
	if f == nil {
		f = &flight{done: make(chan struct{})}
		p.open = f
	}
	f.xs = append(f.xs, x)
	p.mu.Unlock()
	return func() error {
		p.seal(f)
		select {
		case <-f.done:
		case <-x.ctx.Done():
			select {
			case <-f.done: // both: the outcome is known
			default:
				return x.finish(failed("stream "+x.stream, x.ctx.Err()))
			}
		}
		return x.finish(x.err)
	}
}

// seal closes f to new starts, unless a wait did already, and sends it.
func (p *Publisher) seal(f *flight) {
	p.mu.Lock()
	if f.sealed {
		p.mu.Unlock()
		return
	}
	f.sealed = true
	p.open = nil // f was open: the next start opens another
	f.prev, p.last = p.last, f
	p.mu.Unlock()
	go p.run(f)
}

// run sends f once the flight before it is done. An XADD whose context
// ended meanwhile (its wait returned) is left out. The pipeline runs until
// the latest deadline of its XADDs, whoever of them called wait first, so
// that one delivery's cancellation does not fail the others.
func (p *Publisher) run(f *flight) {
	defer close(f.done)
	if f.prev != nil {
		<-f.prev.done
		f.prev = nil
	}
	live := make([]*xadd, 0, len(f.xs))
	var deadline time.Time
	for _, x := range f.xs {
		if err := x.ctx.Err(); err != nil {
			x.err = failed("stream "+x.stream, err)
			continue
		}
		live = append(live, x)
		if d, _ := x.ctx.Deadline(); d.After(deadline) {
			deadline = d
		}
	}
	f.xs = nil
	if len(live) == 0 {
		return
	}
	ctx, cancel := context.WithDeadline(context.WithoutCancel(live[0].ctx), deadline)
	defer cancel()
	p.exec(ctx, live)
}

// failed returns err, the outcome of a publish, as the relay's error (nil
// stays nil): err first, then where it happened (the stream, and the entry
// once appended) and the adapter, such as "READONLY You can't write
// against a read only replica.: stream orders (outbox/redis)". The event ID
// is left out: the relay's logs and the outbox row carry it, and a reader
// of a column cut to a width wants the cause. An outage, as err says, is
// [outbox.Unavailable].
func failed(where string, err error) error {
	if err == nil {
		return nil
	}
	down := unavailable(err)
	err = fmt.Errorf("%w: %s (outbox/redis)", err, where)
	if down {
		return outbox.Unavailable(err)
	}
	return err
}

// unavailable reports whether err, as go-redis returned it, says that Redis
// cannot be reached or cannot take writes at all, rather than refusing this
// event.
func unavailable(err error) bool {
	for _, target := range []error{
		context.DeadlineExceeded, io.EOF, io.ErrUnexpectedEOF, net.ErrClosed,
		syscall.ECONNREFUSED, syscall.ECONNRESET, syscall.EPIPE,
		goredis.ErrClosed, goredis.ErrPoolTimeout, goredis.ErrPoolExhausted, ErrUnderReplicated,
	} {
		if errors.Is(err, target) {
			return true
		}
	}
	if _, ok := errors.AsType[net.Error](err); ok {
		return true
	}
	return goredis.IsLoadingError(err) || goredis.IsReadOnlyError(err) || goredis.IsMasterDownError(err) ||
		goredis.IsClusterDownError(err) || goredis.IsMaxClientsError(err) || goredis.IsOOMError(err) ||
		goredis.IsAuthError(err) || strings.HasPrefix(err.Error(), "BUSY ") || strings.HasPrefix(err.Error(), "NOREPLICAS ")
}

// entry returns the fields of e's entry in the configured format.
func (p *Publisher) entry(e outbox.Event) ([]any, error) {
	if p.cfg.Format == wire.Native {
		return nativeEntry(e)
	}
	m, err := wire.NoBinding.Encode(p.cfg.Format, e, wire.CloudEventOptions{Source: p.cfg.Source})
	if err != nil {
		return nil, err
	}
	values := []any{FieldCloudEvent, string(m.Body)}
	// m.Header holds the event's headers (reserved names dropped); the
	// document carries traceparent and tracestate, so the headers field
	// leaves out the one header each that the document took them from.
	var extra map[string]string
	for _, h := range m.Header {
		if inDocument(e.Headers, h) {
			continue
		}
		if extra == nil {
			extra = map[string]string{}
		}
		extra[h.Name] = h.Value
	}
	if len(extra) > 0 {
		headers, err := json.Marshal(extra)
		if err != nil {
			return nil, fmt.Errorf("encode headers: %w", err)
		}
		values = append(values, FieldHeaders, string(headers))
	}
	return values, nil
}

// inDocument reports whether header h of an event with headers hs is the
// one [wire.Attributes] made its traceparent or tracestate extension of:
// the header of that exact name, or else the only one of that name in
// another case (the consumer gives it back under the lowercase name).
// With several in other cases and none exact, which one Attributes took is
// not fixed, so they all stay in the headers field.
func inDocument(hs map[string]string, h wire.Attribute) bool {
	for _, name := range [...]string{wire.ExtTraceParent, wire.ExtTraceState} {
		if !strings.EqualFold(h.Name, name) {
			continue
		}
		if _, ok := hs[name]; ok {
			return h.Name == name
		}
		n := 0
		for k := range hs {
			if strings.EqualFold(k, name) {
				n++
			}
		}
		return n == 1
	}
	return false
}

// nativeEntry returns the fields of e's entry in [wire.Native] format.
func nativeEntry(e outbox.Event) ([]any, error) {
	payload, err := e.PayloadJSON()
	if err != nil {
		return nil, err
	}
	headers := []byte("{}")
	if len(e.Headers) > 0 {
		if headers, err = json.Marshal(e.Headers); err != nil {
			return nil, fmt.Errorf("encode headers: %w", err)
		}
	}
	var occurred string
	if !e.OccurredAt.IsZero() {
		occurred = e.OccurredAt.UTC().Format(wire.TimeFormat)
	}
	// A slice, not a map, so that every entry lists its fields in the same
	// order.
	return []any{
		FieldID, e.ID,
		FieldType, e.Type,
		FieldAggregateType, e.AggregateType,
		FieldAggregateID, e.AggregateID,
		FieldIdempotencyKey, e.IdempotencyKey,
		FieldOccurredAt, occurred,
		FieldHeaders, string(headers),
		FieldPayload, string(payload),
	}, nil
}
