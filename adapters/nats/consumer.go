package nats

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/wire"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"gorm.io/gorm"
)

// Defaults of [ConsumerConfig].
const (
	// DefaultAckWait is [ConsumerConfig.AckWait]'s default, JetStream's own.
	DefaultAckWait = 30 * time.Second
	// DefaultFetchBatch is [ConsumerConfig.FetchBatch]'s default.
	DefaultFetchBatch = 32
	// DefaultFetchMaxWait is [ConsumerConfig.FetchMaxWait]'s default.
	DefaultFetchMaxWait = 10 * time.Second
	// DefaultNakDelay is [ConsumerConfig.NakDelay]'s default.
	DefaultNakDelay = time.Second
	// DefaultAckTimeout is [ConsumerConfig.AckTimeout]'s default.
	DefaultAckTimeout = 5 * time.Second
)

// ConsumerConfig configures a [Consumer]. Consumer and Handle are required,
// and so is either Stream or JetStreamConsumer.
type ConsumerConfig struct {
	// Consumer names this consumer in the inbox (outbox.Consume's
	// consumer). It is also the durable JetStream consumer's name when
	// Durable is empty.
	Consumer string

	// Handle applies one message's effect inside the inbox transaction tx:
	// write through tx only. Its error decides the message's fate: nil
	// acknowledges the message once the transaction has committed; an
	// error marked [outbox.Permanent] terminates it (JetStream Term: never
	// redelivered); any other error, or a panic, rolls back and
	// redelivers it after NakDelay.
	Handle func(ctx context.Context, tx *gorm.DB, m Message) error

	// MessageID returns the ID the inbox records for m. Defaults to
	// m.Event.ID (the Outbox-Event-Id header, or the CloudEvents id, the
	// outbox put on it); set it for messages of other producers without
	// either, for example to
	// m.Raw.Headers().Get(jetstream.MsgIDHeader) (Nats-Msg-Id, which this
	// package's Publisher also sets to the event ID). An empty ID is
	// refused as permanent: the message is terminated.
	MessageID func(m Message) string

	// Logger receives the consumer's messages, which carry identifiers
	// (stream, consumer, stream sequence, message ID, subject), never
	// payloads. Defaults to slog.Default().
	Logger *slog.Logger

	// Stream is the stream to consume from. Run creates the durable pull
	// consumer Durable on it, or updates it if it exists, with
	// AckExplicit, AckWait and FilterSubjects. Required unless
	// JetStreamConsumer is set.
	Stream string

	// Durable is the durable JetStream consumer's name. Defaults to
	// Consumer. Several processes with the same Durable share its
	// messages (each message goes to one of them).
	Durable string

	// FilterSubjects, when set, restricts the durable consumer to these
	// subjects of the stream. One subject works on any server; several need
	// nats-server 2.10 or later. Defaults to every subject of the stream.
	FilterSubjects []string

	// JetStreamConsumer, when set, is an existing pull consumer to consume
	// from instead of Stream/Durable, which must then be empty (as
	// FilterSubjects and AckWait: the consumer's own configuration
	// applies). Its ack policy must be AckExplicit. js may then be nil.
	JetStreamConsumer jetstream.Consumer

	// AckWait is how long JetStream waits for an ack before it redelivers
	// a message. A Handle that runs longer is not redelivered meanwhile:
	// the Consumer tells JetStream it is still working on every message it
	// holds (InProgress), every third of AckWait, until the message's
	// transaction has ended. So AckWait only bounds how soon a message held
	// by a crashed process comes back. Defaults to 30 seconds (for
	// JetStreamConsumer, that consumer's AckWait).
	AckWait time.Duration

	// FetchBatch is how many messages one pull asks for at most. Messages
	// fetched wait their turn in the process (kept alive by InProgress).
	// Defaults to 32.
	FetchBatch int

	// FetchMaxWait is how long one pull waits for messages before the next
	// is sent. Defaults to 10 seconds.
	FetchMaxWait time.Duration

	// Concurrency is how many messages are handled at once, each in its own
	// transaction. Above 1, messages are no longer handled in stream
	// order. Defaults to 1.
	Concurrency int

	// NakDelay is how long JetStream waits before it redelivers a message
	// whose Handle failed (NakWithDelay). Defaults to 1 second. Bound the
	// number of attempts with the durable consumer's MaxDeliver (create it
	// yourself and pass JetStreamConsumer), or let Handle return
	// [outbox.Permanent] once it knows retrying is pointless.
	NakDelay time.Duration

	// AckTimeout bounds the wait for the server's confirmation of an ack
	// (DoubleAck). Defaults to 5 seconds.
	AckTimeout time.Duration

	// Telemetry reports each message decoded as a CONSUMER span "process
	// {subject}", a child of the trace context the message carries (the
	// producer's send span), ended with the outcome of outbox.Consume;
	// Handle runs in that span's context. Nil uses the one in Run's
	// context, if any: set it (to what outboxotel.Messaging returns, for
	// example) in a consumer process, where no outbox delivery puts one
	// there.
	Telemetry wire.Telemetry
}

// Message is one message received: the outbox event decoded from its
// headers and body ([wire.Decode]; Payload is the body) and the JetStream
// message itself, for its subject, headers and metadata. Do not ack, nak or
// term Raw: the [Consumer] does.
type Message struct {
	Event outbox.Event
	Raw   jetstream.Msg
}

// Consumer consumes a JetStream pull consumer into a database through the
// outbox inbox ([outbox.Consume]): each message's effect commits once, and
// the message is acknowledged only after that commit. Create it with
// [NewConsumer] and start it with [Consumer.Run].
type Consumer struct {
	db  *gorm.DB
	js  jetstream.JetStream
	cfg ConsumerConfig
	log *slog.Logger

	group   string // the durable consumer's name, for telemetry
	running atomic.Bool

	// beforeAck, when set (by tests), runs right before a committed
	// message's ack.
	beforeAck func(jetstream.Msg)
}

// NewConsumer returns a Consumer that applies, through db (which must have
// the outbox plugin installed), the messages of the durable pull consumer
// cfg.Durable on cfg.Stream, created or updated through js when Run starts,
// or of cfg.JetStreamConsumer. Invalid settings are errors wrapping
// [outbox.ErrInvalidConfig].
func NewConsumer(db *gorm.DB, js jetstream.JetStream, cfg ConsumerConfig) (*Consumer, error) {
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%w: outbox/nats: NewConsumer: %s", outbox.ErrInvalidConfig, fmt.Sprintf(format, args...))
	}
	switch {
	case db == nil:
		return nil, bad("nil db")
	case db.Config == nil || db.Config.Plugins["outbox"] == nil:
		return nil, bad("the db has no outbox plugin (db.Use(outbox.Plugin(...)))")
	case cfg.Consumer == "":
		return nil, bad("empty Consumer")
	case len(cfg.Consumer) > outbox.MaxInboxIDLen:
		return nil, bad("Consumer longer than %d bytes", outbox.MaxInboxIDLen)
	case cfg.Handle == nil:
		return nil, bad("nil Handle")
	case cfg.AckWait < 0, cfg.FetchBatch < 0, cfg.FetchMaxWait < 0, cfg.Concurrency < 0, cfg.NakDelay < 0, cfg.AckTimeout < 0:
		return nil, bad("negative AckWait, FetchBatch, FetchMaxWait, Concurrency, NakDelay or AckTimeout; use 0 for the default")
	}
	var group string
	if cfg.JetStreamConsumer != nil {
		if cfg.Stream != "" || cfg.Durable != "" || len(cfg.FilterSubjects) > 0 || cfg.AckWait != 0 {
			return nil, bad("JetStreamConsumer excludes Stream, Durable, FilterSubjects and AckWait (the consumer's own configuration applies)")
		}
		info := cfg.JetStreamConsumer.CachedInfo()
		if info == nil {
			return nil, bad("JetStreamConsumer has no info")
		}
		if info.Config.AckPolicy != jetstream.AckExplicitPolicy {
			return nil, bad("JetStreamConsumer %s has ack policy %s; it needs AckExplicit", info.Name, info.Config.AckPolicy)
		}
		cfg.AckWait = cmp.Or(info.Config.AckWait, DefaultAckWait)
		group = cmp.Or(info.Config.Durable, info.Name)
	} else {
		if js == nil {
			return nil, bad("nil JetStream and no JetStreamConsumer")
		}
		if cfg.Stream == "" {
			return nil, bad("empty Stream and no JetStreamConsumer")
		}
		cfg.Durable = cmp.Or(cfg.Durable, cfg.Consumer)
		if err := checkName(cfg.Durable); err != nil {
			return nil, bad("durable consumer name %q (Durable, or Consumer when Durable is empty): %v", cfg.Durable, err)
		}
		if err := checkName(cfg.Stream); err != nil {
			return nil, bad("Stream %q: %v", cfg.Stream, err)
		}
		cfg.AckWait = cmp.Or(cfg.AckWait, DefaultAckWait)
		group = cfg.Durable
	}
	cfg.FetchBatch = cmp.Or(cfg.FetchBatch, DefaultFetchBatch)
	cfg.FetchMaxWait = cmp.Or(cfg.FetchMaxWait, DefaultFetchMaxWait)
	cfg.Concurrency = cmp.Or(cfg.Concurrency, 1)
	cfg.NakDelay = cmp.Or(cfg.NakDelay, DefaultNakDelay)
	cfg.AckTimeout = cmp.Or(cfg.AckTimeout, DefaultAckTimeout)
	if cfg.MessageID == nil {
		cfg.MessageID = func(m Message) string { return m.Event.ID }
	}
	c := &Consumer{db: db, js: js, cfg: cfg, log: cfg.Logger, group: group}
	if c.log == nil {
		c.log = slog.Default()
	}
	return c, nil
}

// checkName enforces JetStream's rules for stream and consumer names.
func checkName(s string) error {
	if strings.ContainsAny(s, " \t\r\n.*>/\\") {
		return errors.New("contains whitespace, '.', '*', '>', '/' or '\\'")
	}
	return nil
}

// Run consumes messages until ctx is done, then returns nil once the
// messages in hand have been settled, or returns an error that retrying
// cannot fix: the durable consumer cannot be created (no such stream, a
// configuration the server refuses), or the connection has closed for good.
// While the server is unreachable Run keeps trying, logging a warning.
//
// For each message, Run decodes the event ([wire.Decode]: any [wire.Format]
// the Publisher sends, CloudEvents of other producers too), starts its
// span ([ConsumerConfig.Telemetry]), takes its ID
// ([ConsumerConfig.MessageID]) and calls [outbox.Consume] with Handle.
// Then: nil (the effect committed, or the message was a duplicate already
// consumed) acknowledges it with DoubleAck, which waits for the server's
// confirmation; a permanent error ([outbox.IsPermanent]), a message that
// does not decode or has no valid ID terminates it (Term, logged as an
// error); any other error naks it with NakDelay. A message in hand when ctx
// is done is nakked at once, for another process to take.
//
// Run may be called again after it returned; a second Run while one runs
// is an error (run more Consumers, or raise Concurrency, to consume in
// parallel).
func (c *Consumer) Run(ctx context.Context) error {
	if !c.running.CompareAndSwap(false, true) {
		return fmt.Errorf("outbox/nats: consumer %s: Run is already running", c.cfg.Consumer)
	}
	defer c.running.Store(false)
	cons, err := c.consumer(ctx)
	if err != nil || cons == nil {
		return err
	}
	h := &held{msgs: map[jetstream.Msg]struct{}{}}
	work := make(chan jetstream.Msg)
	var wg sync.WaitGroup
	for range c.cfg.Concurrency {
		wg.Go(func() {
			for msg := range work {
				c.process(ctx, h, msg)
			}
		})
	}
	hbCtx, stopHB := context.WithCancel(context.Background())
	wg.Go(func() { h.heartbeat(hbCtx, c.cfg.AckWait/3) })
	defer func() {
		close(work)
		stopHB()
		wg.Wait()
	}()

	var failures int
	for ctx.Err() == nil {
		fctx, cancel := context.WithTimeout(ctx, c.cfg.FetchMaxWait)
		batch, err := cons.Fetch(c.cfg.FetchBatch, jetstream.FetchContext(fctx))
		if err == nil {
			for msg := range batch.Messages() {
				h.add(msg)
				select {
				case work <- msg:
				case <-ctx.Done():
					h.remove(msg)
					_ = msg.Nak()
				}
			}
			err = batch.Error()
		}
		cancel()
		switch {
		case ctx.Err() != nil:
			return nil
		case err == nil, errors.Is(err, context.DeadlineExceeded), errors.Is(err, natsgo.ErrTimeout):
			failures = 0
			continue
		case errors.Is(err, natsgo.ErrConnectionClosed):
			return fmt.Errorf("outbox/nats: consumer %s: the nats.Conn is closed for good; create a new connection and Consumer: %w", c.cfg.Consumer, err)
		}
		failures++
		c.log.WarnContext(ctx, "outbox/nats: fetching messages failed; retrying",
			slog.String("consumer", c.cfg.Consumer), slog.String("error", err.Error()))
		if !wait(ctx, backoff(failures)) {
			return nil
		}
		if c.js != nil && (errors.Is(err, jetstream.ErrConsumerNotFound) || errors.Is(err, jetstream.ErrConsumerDeleted)) {
			// Deleted under us: create it again.
			if cons, err = c.consumer(ctx); err != nil || cons == nil {
				return err
			}
		}
	}
	return nil
}

// consumer returns the JetStream consumer to pull from: the configured one,
// or the durable one created or updated now. It returns nil, nil when ctx
// ends first.
func (c *Consumer) consumer(ctx context.Context) (jetstream.Consumer, error) {
	if c.cfg.JetStreamConsumer != nil {
		return c.cfg.JetStreamConsumer, nil
	}
	cc := jetstream.ConsumerConfig{
		Durable:   c.cfg.Durable,
		AckPolicy: jetstream.AckExplicitPolicy,
		AckWait:   c.cfg.AckWait,
	}
	if len(c.cfg.FilterSubjects) == 1 {
		cc.FilterSubject = c.cfg.FilterSubjects[0] // any server version
	} else {
		cc.FilterSubjects = c.cfg.FilterSubjects
	}
	for failures := 1; ; failures++ {
		cctx, cancel := context.WithTimeout(ctx, c.cfg.AckTimeout)
		cons, err := c.js.CreateOrUpdateConsumer(cctx, c.cfg.Stream, cc)
		cancel()
		switch {
		case err == nil:
			return cons, nil
		case ctx.Err() != nil:
			return nil, nil
		case errors.Is(err, natsgo.ErrConnectionClosed), !unavailable(err):
			return nil, fmt.Errorf("outbox/nats: consumer %s: create or update the durable consumer %s on stream %s: %w", c.cfg.Consumer, c.cfg.Durable, c.cfg.Stream, err)
		}
		c.log.WarnContext(ctx, "outbox/nats: creating the durable consumer failed; retrying",
			slog.String("consumer", c.cfg.Consumer), slog.String("stream", c.cfg.Stream),
			slog.String("durable", c.cfg.Durable), slog.String("error", err.Error()))
		if !wait(ctx, backoff(failures)) {
			return nil, nil
		}
	}
}

// process settles one message: see Run.
func (c *Consumer) process(ctx context.Context, h *held, msg jetstream.Msg) {
	attrs := []any{slog.String("consumer", c.cfg.Consumer), slog.String("subject", msg.Subject())}
	if md, err := msg.Metadata(); err == nil {
		attrs = append(attrs, slog.String("stream", md.Stream), slog.String("durable", md.Consumer),
			slog.Uint64("stream_seq", md.Sequence.Stream), slog.Uint64("num_delivered", md.NumDelivered))
	}
	ev, err := wire.Decode(firstValues(msg.Headers()), msg.Data())
	if err != nil {
		c.term(ctx, h, msg, "outbox/nats: terminating a message that does not decode", append(attrs, slog.String("error", err.Error())))
		return
	}
	m := Message{Event: ev, Raw: msg}
	ctx, end := wire.StartReceive(ctx, c.cfg.Telemetry,
		wire.Operation{System: "nats", Destination: msg.Subject(), ConsumerGroup: c.group}, ev)
	id := c.cfg.MessageID(m)
	attrs = append(attrs, slog.String("message_id", id))
	if id == "" {
		end(outbox.Permanent(errors.New("outbox/nats: no message ID")))
		c.term(ctx, h, msg, "outbox/nats: terminating a message without a message ID", attrs)
		return
	}
	called := false
	err = c.consume(ctx, id, func(tx *gorm.DB) error {
		called = true
		return c.cfg.Handle(ctx, tx, m)
	})
	end(err)
	switch {
	case err == nil:
		h.remove(msg)
		if c.beforeAck != nil {
			c.beforeAck(msg)
		}
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.cfg.AckTimeout)
		defer cancel()
		if err := msg.DoubleAck(actx); err != nil {
			c.log.WarnContext(ctx, "outbox/nats: ack after commit failed; the message will be redelivered and skipped as consumed",
				append(attrs, slog.String("error", err.Error()))...)
		}
	case outbox.IsPermanent(err):
		c.term(ctx, h, msg, "outbox/nats: terminating a message whose Handle failed permanently", append(attrs, slog.String("error", err.Error())))
	case !called && errors.Is(err, outbox.ErrInvalidInboxID):
		// Consume refused the ID itself (too long, not UTF-8, a NUL).
		c.term(ctx, h, msg, "outbox/nats: terminating a message with an invalid message ID", append(attrs, slog.String("error", err.Error())))
	case ctx.Err() != nil:
		h.remove(msg)
		_ = msg.Nak() // shutting down: let another process take it now
	default:
		h.remove(msg)
		c.log.WarnContext(ctx, "outbox/nats: handling a message failed; it will be redelivered",
			append(attrs, slog.Duration("nak_delay", c.cfg.NakDelay), slog.String("error", err.Error()))...)
		if err := msg.NakWithDelay(c.cfg.NakDelay); err != nil {
			c.log.WarnContext(ctx, "outbox/nats: nak failed; the message comes back after the ack wait",
				append(attrs, slog.String("error", err.Error()))...)
		}
	}
}

// consume is outbox.Consume with a panic of Handle turned into an error, so
// that one bad message does not end the process.
func (c *Consumer) consume(ctx context.Context, id string, fn func(tx *gorm.DB) error) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("outbox/nats: Handle panicked: %v", r)
		}
	}()
	return outbox.Consume(c.db.WithContext(ctx), c.cfg.Consumer, id, fn)
}

func (c *Consumer) term(ctx context.Context, h *held, msg jetstream.Msg, text string, attrs []any) {
	h.remove(msg)
	c.log.ErrorContext(ctx, text, attrs...)
	// Term, not TermWithReason: servers before 2.10.4 ignore the latter
	// and would redeliver the message.
	if err := msg.Term(); err != nil {
		c.log.WarnContext(ctx, "outbox/nats: term failed; the message comes back after the ack wait",
			append(attrs, slog.String("error", err.Error()))...)
	}
}

// held is the set of messages received and not yet settled: each is kept
// alive with InProgress, so that JetStream does not redeliver a message
// while it waits for its turn or its transaction runs.
type held struct {
	mu   sync.Mutex
	msgs map[jetstream.Msg]struct{}
}

func (h *held) add(m jetstream.Msg) {
	h.mu.Lock()
	h.msgs[m] = struct{}{}
	h.mu.Unlock()
}

// remove stops the InProgress of m; after it returns, none is sent, so it
// cannot follow the message's ack, nak or term.
func (h *held) remove(m jetstream.Msg) {
	h.mu.Lock()
	delete(h.msgs, m)
	h.mu.Unlock()
}

func (h *held) heartbeat(ctx context.Context, every time.Duration) {
	t := time.NewTicker(max(every, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		h.mu.Lock()
		for m := range h.msgs {
			_ = m.InProgress() // a buffered publish; a lost one costs a redelivery the inbox skips
		}
		h.mu.Unlock()
	}
}

// firstValues flattens NATS headers for wire.Decode: the first value of
// each.
func firstValues(h natsgo.Header) map[string]string {
	out := make(map[string]string, len(h))
	for k, v := range h {
		if len(v) > 0 {
			out[k] = v[0]
		}
	}
	return out
}

// backoff is the wait after the n-th failure in a row: 0.5 s doubling to 5 s.
func backoff(n int) time.Duration {
	d := 500 * time.Millisecond
	for i := 1; i < n && d < 5*time.Second; i++ {
		d *= 2
	}
	return min(d, 5*time.Second)
}

// wait waits d, or until ctx is done; it reports whether ctx is still live.
func wait(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
