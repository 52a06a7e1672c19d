package rabbitmq

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/wire"
)

// Defaults of [ConsumerConfig] and of the connection settings [NewConsumer]
// takes from [Config].
const (
	// DefaultPrefetch is [ConsumerConfig.Prefetch]'s default.
	DefaultPrefetch = 16
	// DefaultRequeueDelay is [ConsumerConfig.RequeueDelay]'s default.
	DefaultRequeueDelay = time.Second
	// DefaultConsumerConnectionName is the Consumer's connection name when
	// [Config.ConnectionName] is empty.
	DefaultConsumerConnectionName = "gorm-outbox-consumer"
)

// Reconnection backoff of [Consumer.Run], doubling from the first to the
// last.
const (
	consumerMinBackoff = 100 * time.Millisecond
	consumerMaxBackoff = 5 * time.Second
)

// ConsumerConfig configures a [Consumer]. Consumer, Handle and Queue are
// required.
type ConsumerConfig struct {
	// Consumer names this consumer in the inbox (outbox.Consume's
	// consumer): messages are deduplicated per (Consumer, message ID).
	Consumer string

	// Handle applies one message's effect inside the inbox transaction tx:
	// write through tx only. Its error decides the message's fate: nil
	// acknowledges it (after the commit), an [outbox.Permanent] error
	// rejects it without requeue (to the queue's dead-letter exchange, if
	// it has one), any other error requeues it after RequeueDelay. A panic
	// is recovered, logged and treated as a non-permanent error.
	Handle func(ctx context.Context, tx *gorm.DB, m Message) error

	// MessageID returns the ID the inbox records for m. Defaults to
	// m.Event.ID (the Outbox-Event-Id header the outbox put on it, or the
	// CloudEvents id attribute in the CloudEvents formats); set it
	// for messages of other producers, for example to m.Raw.MessageId, the
	// AMQP message-id property (which the [Publisher] sets to the event ID
	// too). An empty ID, one longer than [outbox.MaxInboxIDLen] characters
	// or not valid UTF-8 without NUL bytes is refused as permanent.
	MessageID func(m Message) string

	// Logger; defaults to slog.Default(). Payloads are never logged.
	Logger *slog.Logger

	// Queue is the queue to consume from. It must exist (declare and bind
	// it where the topology is provisioned); while it does not, Run keeps
	// retrying as during an outage.
	Queue string

	// Prefetch is the channel's prefetch count (basic.qos): how many
	// unacknowledged messages the broker hands this Consumer at once, each
	// handled in its own goroutine, so also how many Handle calls run at a
	// time. A message waiting for its RequeueDelay holds its slot. Set 1 to
	// handle the queue in order, one message at a time (a failing message
	// then holds back the rest). Defaults to [DefaultPrefetch] (16); at
	// most 65535.
	Prefetch int

	// RequeueDelay is how long a message whose Handle failed with a
	// non-permanent error stays unacknowledged before it is nacked with
	// requeue, so that a failing message does not spin. Defaults to
	// [DefaultRequeueDelay] (1 s).
	RequeueDelay time.Duration

	// Telemetry reports each message applied: a CONSUMER span "process
	// {exchange}" (the default exchange named "amq.default"), a child of
	// the trace context the message carries, in whose context Handle runs.
	// Nil uses the one in Run's context, if any; without either there are
	// no spans. Set it to outboxotel.Messaging()'s.
	Telemetry wire.Telemetry
}

// Message is one message received: the outbox event decoded from its
// headers, content-type property and body ([wire.Decode], which reads
// every [wire.Format]) and the AMQP delivery itself. Handle must
// not acknowledge Raw: the Consumer does.
type Message struct {
	Event outbox.Event
	Raw   amqp.Delivery
}

// Consumer consumes a queue and applies each message's effect exactly once
// per (consumer, message ID) through [outbox.Consume]: the effect and the
// inbox entry commit together, and the message is acknowledged only after
// that commit. Create it with [NewConsumer] and start it with
// [Consumer.Run].
type Consumer struct {
	db        *gorm.DB
	url       string
	amqpCfg   amqp.Config
	name      string
	handle    func(ctx context.Context, tx *gorm.DB, m Message) error
	messageID func(m Message) string
	log       *slog.Logger
	queue     string
	prefetch  int
	delay     time.Duration
	telemetry wire.Telemetry
	op        wire.Operation // what Telemetry is told of every receive, but the destination and message ID

	running atomic.Bool

	mu   sync.Mutex
	conn *amqp.Connection // the current connection, nil between sessions

	// beforeAck, when set (by tests), runs right before a message is
	// acknowledged, after its transaction committed.
	beforeAck func(Message)
}

// NewConsumer returns a Consumer of cfg.Queue that records what it consumed
// in db's inbox. conn gives the broker's connection settings as it does to
// [New]: URL, AMQP and ConnectionName (defaulting to
// [DefaultConsumerConnectionName]); its publishing settings (Exchange,
// DeclareExchange, RoutingKey, AllowUnroutable) are not used, so one Config
// can serve both. The Consumer opens a connection of its own, apart from any
// Publisher's, as RabbitMQ recommends (a publisher blocked by a resource
// alarm does not stall acknowledgements).
//
// NewConsumer checks the configuration but does not connect: [Consumer.Run]
// does. Its errors wrap [outbox.ErrInvalidConfig]: a db without the outbox
// plugin, a missing Consumer, Handle or Queue, an invalid Prefetch,
// RequeueDelay, URL or AMQP.Recovery.
func NewConsumer(db *gorm.DB, conn Config, cfg ConsumerConfig) (*Consumer, error) {
	invalid := func(format string, args ...any) error {
		return fmt.Errorf("%w: outbox/rabbitmq: consumer: %s", outbox.ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case db == nil || db.Config == nil || db.Config.Plugins["outbox"] == nil:
		return nil, invalid("the database has no outbox plugin installed (db.Use(outbox.Plugin(...))): %v", outbox.ErrNotInstalled)
	case cfg.Handle == nil:
		return nil, invalid("Handle is required")
	case cfg.Queue == "":
		return nil, invalid("Queue is required")
	case cfg.Prefetch < 0 || cfg.Prefetch > 65535:
		return nil, invalid("Prefetch %d is not between 0 (the default, %d) and 65535", cfg.Prefetch, DefaultPrefetch)
	case cfg.RequeueDelay < 0:
		return nil, invalid("RequeueDelay %v is negative", cfg.RequeueDelay)
	}
	if err := checkInboxID(cfg.Consumer); err != nil {
		return nil, invalid("Consumer: %v", err)
	}
	c := &Consumer{
		db:        db,
		url:       cmp.Or(conn.URL, DefaultURL),
		name:      cfg.Consumer,
		handle:    cfg.Handle,
		messageID: cfg.MessageID,
		log:       cfg.Logger,
		queue:     cfg.Queue,
		prefetch:  cmp.Or(cfg.Prefetch, DefaultPrefetch),
		delay:     cmp.Or(cfg.RequeueDelay, DefaultRequeueDelay),
		telemetry: cfg.Telemetry,
	}
	var err error
	if c.amqpCfg, err = dialConfig(conn, c.url, DefaultConsumerConnectionName); err != nil {
		return nil, fmt.Errorf("%w: %w", outbox.ErrInvalidConfig, err)
	}
	c.op = operation(c.url, "")
	c.op.ConsumerGroup = c.queue
	if c.messageID == nil {
		c.messageID = func(m Message) string { return m.Event.ID }
	}
	if c.log == nil {
		c.log = slog.Default()
	}
	return c, nil
}

// checkInboxID refuses what outbox.Consume would refuse as a consumer name
// or message ID, so that an unusable ID is told apart from Handle's errors.
func checkInboxID(s string) error { return outbox.CheckInboxID(s) }

// Run consumes the queue until ctx is done, then returns nil once the
// Handle calls under way have returned (their ctx is ctx, so they are
// cancelled) and the connection is closed; messages not acknowledged by
// then are redelivered by the broker.
//
// Each message is decoded (in any [wire.Format]), given its ID by
// MessageID and passed to [outbox.Consume] with Handle, in the context of
// the Telemetry's receive span when there is a Telemetry (see
// [ConsumerConfig.Telemetry]); the span ends with Consume's outcome:
//
//   - committed, or a duplicate already consumed: acknowledged (basic.ack),
//     only now;
//   - Handle's error is [outbox.Permanent], the message cannot be decoded,
//     or its ID is empty or unusable: rejected without requeue
//     (basic.reject, requeue=false) and logged at Error level, so the queue's
//     dead-letter exchange (x-dead-letter-exchange), if it has one, receives
//     it; without one the broker drops it;
//   - any other error: kept unacknowledged for RequeueDelay, then nacked
//     with requeue (basic.nack, requeue=true), so the broker delivers it
//     again; the wait is a timer in the message's own goroutine, so other
//     messages keep flowing through the other prefetch slots.
//
// Run connects by itself and reconnects after the connection or channel is
// lost (a broker restart, a network failure, the consumer cancelled by the
// broker), with a backoff from 0.1 s to 5 s; it logs the outage once at
// Warn level and the recovery at Info. The broker redelivers what was
// unacknowledged on the lost connection, and the inbox skips what had
// already committed. Run returns an error only when it is already running.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return errors.New("outbox/rabbitmq: Consumer.Run is already running")
	}
	defer c.running.Store(false)
	backoff := consumerMinBackoff
	down := false
	for ctx.Err() == nil {
		s, err := c.open(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			if !down {
				c.log.WarnContext(ctx, "outbox/rabbitmq: consumer cannot reach the broker; retrying", c.attrs(slog.Any("error", err))...)
				down = true
			} else {
				c.log.DebugContext(ctx, "outbox/rabbitmq: consumer still cannot reach the broker", c.attrs(slog.Any("error", err))...)
			}
			if !sleep(ctx, backoff) {
				break
			}
			backoff = min(2*backoff, consumerMaxBackoff)
			continue
		}
		if down {
			c.log.InfoContext(ctx, "outbox/rabbitmq: consumer connected; consuming resumed", c.attrs()...)
			down = false
		}
		backoff = consumerMinBackoff
		err = c.serve(ctx, s)
		if ctx.Err() != nil {
			break
		}
		c.log.WarnContext(ctx, "outbox/rabbitmq: consumer lost its connection; reconnecting (unacknowledged messages will be redelivered)", c.attrs(slog.Any("error", err))...)
		down = true
	}
	return nil
}

// sleep waits d or until ctx is done; it reports whether d passed.
func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

func (c *Consumer) attrs(more ...any) []any {
	return append([]any{slog.String("queue", c.queue), slog.String("consumer", c.name)}, more...)
}

// consumerSession is one connection with one channel consuming the queue.
type consumerSession struct {
	conn       *amqp.Connection
	ch         *amqp.Channel
	deliveries <-chan amqp.Delivery
	chClose    chan *amqp.Error
	connClose  chan *amqp.Error
	lost       chan struct{} // closed when the session stops taking deliveries
}

// open connects and starts consuming. The dial runs in its own goroutine so
// that Run can return when ctx ends during a slow connect; a session it
// opens after that is closed.
func (c *Consumer) open(ctx context.Context) (*consumerSession, error) {
	type result struct {
		s   *consumerSession
		err error
	}
	res := make(chan result, 1)
	go func() {
		s, err := c.dial()
		res <- result{s, err}
	}()
	select {
	case r := <-res:
		return r.s, r.err
	case <-ctx.Done():
		go func() {
			if r := <-res; r.s != nil {
				_ = r.s.conn.Close()
			}
		}()
		return nil, ctx.Err()
	}
}

func (c *Consumer) dial() (*consumerSession, error) {
	conn, err := amqp.DialConfig(c.url, c.amqpCfg)
	if err != nil {
		return nil, fmt.Errorf("dial: %w", err)
	}
	fail := func(what string, err error) (*consumerSession, error) {
		_ = conn.Close()
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	ch, err := conn.Channel()
	if err != nil {
		return fail("open channel", err)
	}
	if err := ch.Qos(c.prefetch, 0, false); err != nil {
		return fail("set prefetch", err)
	}
	s := &consumerSession{
		conn: conn, ch: ch,
		// Close notifications are sent without waiting for a reader.
		chClose:   ch.NotifyClose(make(chan *amqp.Error, 1)),
		connClose: conn.NotifyClose(make(chan *amqp.Error, 1)),
		lost:      make(chan struct{}),
	}
	// Manual acknowledgement (autoAck false), not exclusive: several
	// Consumers may share the queue.
	if s.deliveries, err = ch.Consume(c.queue, "", false, false, false, false, nil); err != nil {
		return fail(fmt.Sprintf("consume queue %q", c.queue), err)
	}
	return s, nil
}

// serve hands each delivery to its own goroutine until ctx ends or the
// session is lost, then waits for those goroutines, so that what committed
// is acknowledged while the channel is still open, and closes the
// connection.
func (c *Consumer) serve(ctx context.Context, s *consumerSession) error {
	c.mu.Lock()
	c.conn = s.conn
	c.mu.Unlock()
	var wg sync.WaitGroup
	defer func() {
		close(s.lost)
		wg.Wait()
		c.mu.Lock()
		c.conn = nil
		c.mu.Unlock()
		_ = s.conn.Close()
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case d, ok := <-s.deliveries:
			if !ok {
				return s.reason()
			}
			wg.Go(func() { c.process(ctx, s, d) })
		}
	}
}

// reason says why the deliveries stopped: the connection's or the
// channel's close, or a cancel by the broker (the queue deleted).
func (s *consumerSession) reason() error {
	for _, n := range []struct {
		what string
		ch   chan *amqp.Error
	}{{"connection", s.connClose}, {"channel", s.chClose}} {
		select {
		case e, ok := <-n.ch:
			return closeReason(n.what, e, ok)
		default:
		}
	}
	return errors.New("the broker cancelled the consumer (queue deleted?)")
}

// process settles one delivery: see [Consumer.Run].
func (c *Consumer) process(ctx context.Context, s *consumerSession, d amqp.Delivery) {
	m := Message{Raw: d}
	ev, err := wire.Decode(decodeHeaders(d), d.Body)
	m.Event = ev
	if err != nil {
		c.reject(ctx, m, "", "message cannot be decoded", err)
		return
	}
	op := c.op
	op.Destination = cmp.Or(d.Exchange, "amq.default")
	op.MessageID = d.MessageId
	ctx, end := wire.StartReceive(ctx, c.telemetry, op, ev)
	id := c.messageID(m)
	if err := checkInboxID(id); err != nil {
		err = fmt.Errorf("message ID %w", err)
		end(outbox.Permanent(err)) // rejected: the outcome of a permanent failure
		c.reject(ctx, m, id, "message has no usable ID", err)
		return
	}
	err = c.consume(ctx, id, m)
	// The span is the processing: it ends before the ack or the requeue
	// delay.
	end(err)
	switch {
	case err == nil:
		if c.beforeAck != nil {
			c.beforeAck(m)
		}
		if err := d.Ack(false); err != nil {
			c.log.WarnContext(ctx, "outbox/rabbitmq: ack failed after the commit; the broker will redeliver the message and the inbox skip it", c.msgAttrs(m, id, slog.Any("error", err))...)
			return
		}
		c.log.DebugContext(ctx, "outbox/rabbitmq: message consumed", c.msgAttrs(m, id)...)
	case outbox.IsPermanent(err):
		c.reject(ctx, m, id, "handler failed permanently", err)
	default:
		c.requeue(ctx, s, m, id, err)
	}
}

// consume runs Handle through outbox.Consume; a panic becomes an error.
func (c *Consumer) consume(ctx context.Context, id string, m Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("outbox/rabbitmq: handler panicked: %v", r)
			c.log.ErrorContext(ctx, "outbox/rabbitmq: handler panicked; the message will be requeued", c.msgAttrs(m, id, slog.Any("panic", r))...)
		}
	}()
	return outbox.Consume(c.db.WithContext(ctx), c.name, id, func(tx *gorm.DB) error {
		return c.handle(ctx, tx, m)
	})
}

// reject terminates a message that will never succeed.
func (c *Consumer) reject(ctx context.Context, m Message, id, why string, cause error) {
	c.log.ErrorContext(ctx, "outbox/rabbitmq: "+why+"; rejecting it without requeue (to the dead-letter exchange, if the queue has one)", c.msgAttrs(m, id, slog.Any("error", cause))...)
	if err := m.Raw.Reject(false); err != nil {
		c.log.WarnContext(ctx, "outbox/rabbitmq: reject failed; the broker will redeliver the message", c.msgAttrs(m, id, slog.Any("error", err))...)
	}
}

// requeue keeps the message unacknowledged for the delay, or until the
// consumer stops or loses its session, then nacks it with requeue.
func (c *Consumer) requeue(ctx context.Context, s *consumerSession, m Message, id string, cause error) {
	if ctx.Err() != nil {
		c.log.DebugContext(ctx, "outbox/rabbitmq: consumer stopping; requeueing the message", c.msgAttrs(m, id, slog.Any("error", cause))...)
	} else {
		c.log.WarnContext(ctx, "outbox/rabbitmq: handler failed; the message will be requeued", c.msgAttrs(m, id, slog.Any("error", cause), slog.Duration("delay", c.delay))...)
		t := time.NewTimer(c.delay)
		select {
		case <-t.C:
		case <-ctx.Done():
		case <-s.lost:
		}
		t.Stop()
	}
	if err := m.Raw.Nack(false, true); err != nil {
		// The channel is gone, which requeues the message anyway.
		c.log.DebugContext(ctx, "outbox/rabbitmq: nack failed; the broker requeues the message with the lost channel", c.msgAttrs(m, id, slog.Any("error", err))...)
	}
}

// msgAttrs identifies a message in the logs: never its payload or headers.
func (c *Consumer) msgAttrs(m Message, id string, more ...any) []any {
	a := c.attrs(slog.String("message_id", id), slog.Uint64("delivery_tag", m.Raw.DeliveryTag),
		slog.Bool("redelivered", m.Raw.Redelivered), slog.String("exchange", m.Raw.Exchange),
		slog.String("routing_key", m.Raw.RoutingKey))
	if m.Event.Type != "" {
		a = append(a, slog.String("event_type", m.Event.Type))
	}
	return append(a, more...)
}

// decodeHeaders returns what [wire.Decode] reads of d: its headers as
// strings, and its content-type property as "Content-Type", by which
// Decode tells a structured CloudEvent; the property wins over a header of
// that name.
func decodeHeaders(d amqp.Delivery) map[string]string {
	h := stringHeaders(d.Headers)
	if d.ContentType != "" {
		h["Content-Type"] = d.ContentType
	}
	return h
}

// stringHeaders turns AMQP headers into the strings [wire.Decode] reads:
// strings and byte arrays as they are, other scalars formatted, tables and
// arrays (such as x-death) left out.
func stringHeaders(t amqp.Table) map[string]string {
	h := make(map[string]string, len(t))
	for k, v := range t {
		switch v := v.(type) {
		case string:
			h[k] = v
		case []byte:
			h[k] = string(v)
		case nil, amqp.Table, []any:
		default:
			h[k] = fmt.Sprint(v)
		}
	}
	return h
}
