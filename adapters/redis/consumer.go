package redis

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/wire"
	goredis "github.com/redis/go-redis/v9"
	"gorm.io/gorm"
)

// Defaults of [ConsumerConfig].
const (
	// DefaultStartID is [ConsumerConfig.StartID]'s default: a group the
	// Consumer creates reads the stream from its first entry.
	DefaultStartID = "0"
	// DefaultCount is [ConsumerConfig.Count]'s default.
	DefaultCount = 10
	// DefaultBlock is [ConsumerConfig.Block]'s default.
	DefaultBlock = 2 * time.Second
	// DefaultClaimIdle is [ConsumerConfig.ClaimIdle]'s default.
	DefaultClaimIdle = time.Minute
)

// ackTimeout bounds one XACK or dead-letter XADD. They run even once Run's
// context is done, so that an effect committed during shutdown is still
// acknowledged.
const ackTimeout = 5 * time.Second

// beforeAck, when not nil, runs right before a committed message's XACK:
// tests use it to crash a Consumer between the commit and the ack.
var beforeAck func(m Message)

// ConsumerClient is the part of a go-redis client a [Consumer] uses.
// *redis.Client, *redis.ClusterClient, *redis.Ring and
// redis.UniversalClient satisfy it.
type ConsumerClient interface {
	Client
	// XGroupCreateMkStream creates the consumer group (and the stream).
	XGroupCreateMkStream(ctx context.Context, stream, group, start string) *goredis.StatusCmd
	// XReadGroup reads new entries for the group.
	XReadGroup(ctx context.Context, a *goredis.XReadGroupArgs) *goredis.XStreamSliceCmd
	// XAutoClaim takes over entries pending for too long.
	XAutoClaim(ctx context.Context, a *goredis.XAutoClaimArgs) *goredis.XAutoClaimCmd
	// XAck acknowledges entries.
	XAck(ctx context.Context, stream, group string, ids ...string) *goredis.IntCmd
}

// ConsumerConfig configures a [Consumer]. Consumer, Handle, Stream and Group
// are required.
type ConsumerConfig struct {
	// Consumer names this consumer in the inbox (outbox.Consume's consumer).
	Consumer string

	// Handle applies one message's effect inside the inbox transaction tx:
	// write through tx only. Its error decides the message's fate: nil
	// acknowledges it (XACK) after the commit; an error marked with
	// [outbox.Permanent] terminates it (XACK, or a move to
	// DeadLetterStream, and an Error log); any other error leaves it
	// pending, to be processed again after ClaimIdle. Errors are logged:
	// keep payloads out of them.
	Handle func(ctx context.Context, tx *gorm.DB, m Message) error

	// MessageID returns the ID the inbox records for m. Defaults to
	// m.Event.ID (the entry's "id" field the publisher put on it, or its
	// CloudEvents document's id); set it for entries of other producers,
	// for example to the entry ID Redis assigned:
	// func(m Message) string { return m.Raw.ID }. An empty ID is refused
	// as permanent.
	MessageID func(m Message) string

	// Logger; defaults to slog.Default(). Payloads are never logged.
	Logger *slog.Logger

	// Stream is the key of the stream to read. Required; the publisher's
	// default is [DefaultStream].
	Stream string

	// Group is the consumer group. Required. Run creates it (and the
	// stream) with XGROUP CREATE ... MKSTREAM when it does not exist, and
	// again if the stream is deleted while it runs.
	Group string

	// StartID is where a group that Run creates starts reading: "0" (the
	// default) reads every entry already in the stream, "$" only those
	// appended from then on. It does not move an existing group.
	StartID string

	// Name names this consumer within the group (XREADGROUP's consumer).
	// Defaults to "<hostname>-<pid>". Consumers of one group must have
	// distinct names.
	Name string

	// Count is the most entries one XREADGROUP or XAUTOCLAIM returns.
	// Defaults to 10.
	Count int64

	// Block is how long one XREADGROUP waits for new entries. Run notices
	// its context's end within about Block. Defaults to 2 seconds.
	Block time.Duration

	// ClaimIdle is how long an entry must have been pending (delivered,
	// not acknowledged) before Run takes it over with XAUTOCLAIM and
	// processes it again: an entry of a consumer that crashed, or this
	// one's after a transient error. So it is also the retry delay of a
	// transient error. Run claims at start and then about every
	// ClaimIdle/2. It must exceed the longest Handle takes, or a slow
	// message is processed twice at once (harmless: the inbox runs Handle
	// once, the second waits). Defaults to 1 minute.
	ClaimIdle time.Duration

	// DeadLetterStream, when set, is the stream a terminated entry is
	// appended to (its fields as they were, plus dead_letter_stream,
	// dead_letter_id and dead_letter_reason) before it is acknowledged.
	// Defaults to "": a terminated entry is only acknowledged and logged.
	DeadLetterStream string

	// Telemetry reports the processing of each decoded entry as a CONSUMER
	// span "process {stream}", a child of the trace context the entry
	// carries (the publisher's send span), in whose context Handle runs.
	// Defaults to nil: the Telemetry in Run's context, if any
	// (wire.ContextWithTelemetry); with neither, no spans. Set it, for
	// example to outboxotel.Messaging(), in a consumer process, which has
	// no relay to put one in its context.
	Telemetry wire.Telemetry
}

// Message is one stream entry received: the outbox event decoded from its
// fields, in any [wire.Format] the publisher writes, and the entry itself (Raw.ID is the entry ID Redis assigned, such
// as "1700000000000-0"; Raw.Values its fields).
type Message struct {
	Event outbox.Event
	Raw   goredis.XMessage
}

// Consumer reads a stream through a consumer group and applies each entry
// once per [ConsumerConfig.Consumer] with [outbox.Consume]. Create it with
// [NewConsumer] and call [Consumer.Run].
type Consumer struct {
	db    *gorm.DB
	rdb   ConsumerClient
	cfg   ConsumerConfig
	log   *slog.Logger
	every time.Duration // between two claim passes
	host  string        // the server's address and port for telemetry, when known
	port  int
}

// NewConsumer returns a Consumer that reads cfg.Stream through rdb and
// consumes each entry on db, which must have the outbox plugin installed
// (its inbox table holds what was consumed). A missing Consumer, Handle,
// Stream or Group, an unusable setting or a db without the plugin is an
// error wrapping [outbox.ErrInvalidConfig].
func NewConsumer(db *gorm.DB, rdb ConsumerClient, cfg ConsumerConfig) (*Consumer, error) {
	invalid := func(format string, args ...any) error {
		return fmt.Errorf("%w: outbox/redis: "+format, append([]any{outbox.ErrInvalidConfig}, args...)...)
	}
	switch {
	case db == nil:
		return nil, invalid("NewConsumer needs a database")
	case db.Config == nil || db.Config.Plugins["outbox"] == nil:
		return nil, invalid("NewConsumer needs a database with the outbox plugin installed (db.Use(outbox.Plugin(...)))")
	case rdb == nil:
		return nil, invalid("NewConsumer needs a client (redis.NewClient(...))")
	case cfg.Consumer == "":
		return nil, invalid("ConsumerConfig.Consumer is empty")
	case outbox.CheckInboxID(cfg.Consumer) != nil:
		return nil, invalid("ConsumerConfig.Consumer must be UTF-8 without NUL bytes, at most %d characters", outbox.MaxInboxIDLen)
	case cfg.Handle == nil:
		return nil, invalid("ConsumerConfig.Handle is nil")
	case cfg.Stream == "":
		return nil, invalid("ConsumerConfig.Stream is empty")
	case cfg.Group == "":
		return nil, invalid("ConsumerConfig.Group is empty")
	case cfg.Count < 0:
		return nil, invalid("negative Count %d; use 0 for the default", cfg.Count)
	case cfg.Block < 0:
		return nil, invalid("negative Block %v; use 0 for the default", cfg.Block)
	case cfg.ClaimIdle < 0:
		return nil, invalid("negative ClaimIdle %v; use 0 for the default", cfg.ClaimIdle)
	case cfg.ClaimIdle > 0 && cfg.ClaimIdle < time.Millisecond:
		return nil, invalid("ClaimIdle %v is below Redis's millisecond resolution", cfg.ClaimIdle)
	case cfg.DeadLetterStream != "" && cfg.DeadLetterStream == cfg.Stream:
		return nil, invalid("DeadLetterStream is the stream consumed")
	}
	cfg.StartID = cmp.Or(cfg.StartID, DefaultStartID)
	if cfg.Name == "" {
		host, _ := os.Hostname()
		cfg.Name = cmp.Or(host, "consumer") + "-" + strconv.Itoa(os.Getpid())
	}
	cfg.Count = cmp.Or(cfg.Count, DefaultCount)
	cfg.Block = max(cmp.Or(cfg.Block, DefaultBlock), time.Millisecond) // 0 would block forever
	cfg.ClaimIdle = cmp.Or(cfg.ClaimIdle, DefaultClaimIdle)
	if cfg.MessageID == nil {
		cfg.MessageID = func(m Message) string { return m.Event.ID }
	}
	log := cfg.Logger
	if log == nil {
		log = slog.Default()
	}
	host, port := serverAddr(rdb)
	return &Consumer{db: db, rdb: rdb, cfg: cfg, log: log, every: max(cfg.ClaimIdle/2, time.Millisecond), host: host, port: port}, nil
}

// Run creates the group if needed and consumes until ctx is done, then
// returns nil. Each entry, new (XREADGROUP) or claimed (XAUTOCLAIM), is
// decoded, given its message ID and run through [outbox.Consume]:
//
//   - nil (the effect committed, or a duplicate skipped): XACK, only then;
//   - a [outbox.Permanent] error (or one wrapping [outbox.ErrInvalidEvent]
//     or [outbox.ErrInvalidInboxID]),
//     an entry that does not decode or has no message ID: the entry will
//     never succeed; it is moved to DeadLetterStream if set, acknowledged,
//     and logged at Error with its identifiers;
//   - any other error: logged at Warn and left pending; it is claimed and
//     processed again once pending for ClaimIdle.
//
// A crash between the commit and the XACK leaves the entry pending: it is
// claimed after ClaimIdle, by this consumer or another of the group, and
// Consume then skips Handle and the entry is acknowledged.
//
// Redis being unreachable is logged once and retried with backoff; Run
// returns an error only for a reply that says the stream cannot be read
// (for example a key of another type, or an ACL that forbids it).
// Entries are processed one at a time, in the order received; run more
// Consumers (with distinct Names) to process more at once.
func (c *Consumer) Run(ctx context.Context) error {
	var down downLog
	nextClaim := time.Time{} // claim at start
	grouped := false
	for ctx.Err() == nil {
		if !grouped {
			if err := c.createGroup(ctx); err != nil {
				if fatal := c.failed(ctx, &down, "create group", err); fatal != nil {
					return fatal
				}
				continue
			}
			grouped = true
		}
		if !time.Now().Before(nextClaim) {
			err := c.claim(ctx)
			if err != nil {
				if isNoGroup(err) {
					grouped = false
					continue
				}
				if fatal := c.failed(ctx, &down, "XAUTOCLAIM", err); fatal != nil {
					return fatal
				}
				continue
			}
			nextClaim = time.Now().Add(c.every)
		}
		block := min(c.cfg.Block, max(time.Until(nextClaim), time.Millisecond))
		streams, err := c.rdb.XReadGroup(ctx, &goredis.XReadGroupArgs{
			Group: c.cfg.Group, Consumer: c.cfg.Name, Streams: []string{c.cfg.Stream, ">"},
			Count: c.cfg.Count, Block: block,
		}).Result()
		switch {
		case errors.Is(err, goredis.Nil):
			down.up(ctx, c)
			continue
		case isNoGroup(err):
			grouped = false
			continue
		case err != nil:
			if fatal := c.failed(ctx, &down, "XREADGROUP", err); fatal != nil {
				return fatal
			}
			continue
		}
		down.up(ctx, c)
		for _, s := range streams {
			for _, msg := range s.Messages {
				if ctx.Err() != nil {
					return nil // the rest stays pending: claimed later
				}
				c.process(ctx, msg)
			}
		}
	}
	return nil
}

// createGroup creates the group, and the stream if missing; a group that
// exists already is fine.
func (c *Consumer) createGroup(ctx context.Context) error {
	err := c.rdb.XGroupCreateMkStream(ctx, c.cfg.Stream, c.cfg.Group, c.cfg.StartID).Err()
	if err != nil && strings.HasPrefix(err.Error(), "BUSYGROUP") {
		return nil
	}
	return err
}

// claim takes over, and processes, every entry pending for at least
// ClaimIdle, one XAUTOCLAIM page of Count entries at a time. Entries
// deleted from the stream while pending leave the pending list in the
// same call (Redis 7) and are not returned.
func (c *Consumer) claim(ctx context.Context) error {
	start := "0-0"
	for ctx.Err() == nil {
		msgs, next, err := c.rdb.XAutoClaim(ctx, &goredis.XAutoClaimArgs{
			Stream: c.cfg.Stream, Group: c.cfg.Group, Consumer: c.cfg.Name,
			MinIdle: c.cfg.ClaimIdle, Start: start, Count: c.cfg.Count,
		}).Result()
		if err != nil {
			return err
		}
		for _, msg := range msgs {
			if ctx.Err() != nil {
				return nil
			}
			c.process(ctx, msg)
		}
		if next == "0-0" || next == "" {
			return nil
		}
		start = next
	}
	return nil
}

// process decodes one entry, consumes it, and acknowledges, terminates or
// leaves it pending. A decoded entry is processed in the span of
// StartReceive, which ends with Consume's outcome.
func (c *Consumer) process(ctx context.Context, msg goredis.XMessage) {
	ev, err := decodeEntry(msg.Values)
	m := Message{Event: ev, Raw: msg}
	if err != nil {
		c.terminate(ctx, m, "", "undecodable", err)
		return
	}
	ctx, end := wire.StartReceive(ctx, c.cfg.Telemetry, wire.Operation{
		System: "redis", Destination: c.cfg.Stream, ConsumerGroup: c.cfg.Group, MessageID: msg.ID,
		ServerAddress: c.host, ServerPort: c.port,
	}, ev)
	id := c.cfg.MessageID(m)
	if id == "" {
		c.terminate(ctx, m, "", "no message ID", nil)
		end(outbox.Permanent(errors.New("outbox/redis: no message ID")))
		return
	}
	err = c.consume(ctx, id, m)
	defer func() { end(err) }()
	switch {
	case err == nil:
		if beforeAck != nil {
			beforeAck(m)
		}
		c.ack(ctx, m, id)
	case ctx.Err() != nil:
		// Shutting down: the entry stays pending and is claimed later.
	case outbox.IsPermanent(err) || errors.Is(err, outbox.ErrInvalidEvent) || errors.Is(err, outbox.ErrInvalidInboxID):
		c.terminate(ctx, m, id, "permanent error", err)
	default:
		c.log.WarnContext(ctx, "outbox/redis: consuming a message failed; left pending, retried after ClaimIdle",
			c.attrs(m, id, slog.Duration("claim_idle", c.cfg.ClaimIdle), slog.Any("error", err))...)
	}
}

// consume runs Handle through outbox.Consume. A panic in Handle (its
// transaction rolled back) is an error like any other: the entry stays
// pending and is claimed again, as the other adapters' consumers retry it,
// instead of taking the process down with it.
func (c *Consumer) consume(ctx context.Context, id string, m Message) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("outbox/redis: Handle panicked: %v", r)
		}
	}()
	return outbox.Consume(c.db.WithContext(ctx), c.cfg.Consumer, id, func(tx *gorm.DB) error {
		return c.cfg.Handle(ctx, tx, m)
	})
}

// ack acknowledges a committed entry. A failed XACK leaves it pending: it
// is claimed again and Consume skips it then.
func (c *Consumer) ack(ctx context.Context, m Message, id string) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ackTimeout)
	defer cancel()
	if err := c.rdb.XAck(actx, c.cfg.Stream, c.cfg.Group, m.Raw.ID).Err(); err != nil {
		c.log.WarnContext(ctx, "outbox/redis: XACK after the commit failed; the message stays pending and is skipped when claimed again",
			c.attrs(m, id, slog.Any("error", err))...)
	}
}

// terminate ends an entry that will never succeed: to the dead-letter
// stream if there is one, then XACK, and an Error log. If either command
// fails the entry stays pending and comes back after ClaimIdle.
func (c *Consumer) terminate(ctx context.Context, m Message, id, reason string, cause error) {
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ackTimeout)
	defer cancel()
	attrs := c.attrs(m, id, slog.String("reason", reason))
	if cause != nil {
		attrs = append(attrs, slog.Any("error", cause))
	}
	if dl := c.cfg.DeadLetterStream; dl != "" {
		values := make([]any, 0, 2*len(m.Raw.Values)+6)
		for k, v := range m.Raw.Values {
			values = append(values, k, v)
		}
		values = append(values, "dead_letter_stream", c.cfg.Stream, "dead_letter_id", m.Raw.ID, "dead_letter_reason", reason)
		if err := c.rdb.XAdd(actx, &goredis.XAddArgs{Stream: dl, ID: "*", Values: values}).Err(); err != nil {
			c.log.WarnContext(ctx, "outbox/redis: moving a message to the dead-letter stream failed; left pending",
				append(attrs, slog.String("dead_letter_stream", dl), slog.Any("xadd_error", err))...)
			return
		}
		attrs = append(attrs, slog.String("dead_letter_stream", dl))
	}
	if err := c.rdb.XAck(actx, c.cfg.Stream, c.cfg.Group, m.Raw.ID).Err(); err != nil {
		c.log.WarnContext(ctx, "outbox/redis: XACK of a terminated message failed; left pending",
			append(attrs, slog.Any("xack_error", err))...)
		return
	}
	c.log.ErrorContext(ctx, "outbox/redis: message terminated: it cannot succeed", attrs...)
}

// attrs are a log line's identifiers: never the payload.
func (c *Consumer) attrs(m Message, id string, more ...any) []any {
	a := []any{
		slog.String("consumer", c.cfg.Consumer), slog.String("stream", c.cfg.Stream),
		slog.String("group", c.cfg.Group), slog.String("entry_id", m.Raw.ID),
	}
	if id != "" {
		a = append(a, slog.String("message_id", id))
	}
	if m.Event.Type != "" {
		a = append(a, slog.String("event_type", m.Event.Type))
	}
	return append(a, more...)
}

// failed handles an error of a group, read or claim command: Run's
// context ending returns nil (stop), Redis being unreachable waits and
// returns nil (try again), anything else is fatal.
func (c *Consumer) failed(ctx context.Context, down *downLog, what string, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	if !unavailable(err) {
		return fmt.Errorf("outbox/redis: consumer %s of group %s on stream %s: %s: %w", c.cfg.Name, c.cfg.Group, c.cfg.Stream, what, err)
	}
	down.down(ctx, c, what, err)
	t := time.NewTimer(down.backoff)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
	return nil
}

// downLog logs an outage once, when it starts and when it ends, and keeps
// the backoff between attempts (100 ms doubling to 5 s).
type downLog struct {
	since   time.Time
	backoff time.Duration
}

func (d *downLog) down(ctx context.Context, c *Consumer, what string, err error) {
	if d.since.IsZero() {
		d.since, d.backoff = time.Now(), 100*time.Millisecond
		c.log.WarnContext(ctx, "outbox/redis: Redis unavailable; consumer paused",
			slog.String("consumer", c.cfg.Consumer), slog.String("stream", c.cfg.Stream),
			slog.String("group", c.cfg.Group), slog.String("command", what), slog.Any("error", err))
		return
	}
	d.backoff = min(2*d.backoff, 5*time.Second)
}

func (d *downLog) up(ctx context.Context, c *Consumer) {
	if d.since.IsZero() {
		return
	}
	c.log.InfoContext(ctx, "outbox/redis: Redis available again; consumer resumed",
		slog.String("consumer", c.cfg.Consumer), slog.String("stream", c.cfg.Stream),
		slog.String("group", c.cfg.Group), slog.Duration("paused", time.Since(d.since)))
	*d = downLog{}
}

func isNoGroup(err error) bool {
	return err != nil && strings.HasPrefix(err.Error(), "NOGROUP")
}

// decodeEntry reads an event back from the fields [Publisher.Handler]
// writes, in any format: an entry with a [FieldCloudEvent] field is
// CloudEvents (see [decodeCloudEvent]), any other Native (the Field
// constants). It and decodeCloudEvent are the one place that knows those
// layouts. In Native, a missing field leaves its event field empty, so an
// entry of another producer decodes too; a field present in the wrong
// format (headers that are not a JSON object of strings, an occurred_at
// that is not RFC 3339, a value that is not a string) is an error.
func decodeEntry(values map[string]any) (outbox.Event, error) {
	str := func(name string) (string, error) {
		v, ok := values[name]
		if !ok || v == nil {
			return "", nil
		}
		s, ok := v.(string)
		if !ok {
			return "", fmt.Errorf("outbox/redis: field %s is a %T, not a string", name, v)
		}
		return s, nil
	}
	if _, ok := values[FieldCloudEvent]; ok {
		return decodeCloudEvent(str)
	}
	var e outbox.Event
	var err error
	for _, f := range []struct {
		name string
		dst  *string
	}{
		{FieldID, &e.ID}, {FieldType, &e.Type}, {FieldAggregateType, &e.AggregateType},
		{FieldAggregateID, &e.AggregateID}, {FieldIdempotencyKey, &e.IdempotencyKey},
	} {
		if *f.dst, err = str(f.name); err != nil {
			return e, err
		}
	}
	occurred, err := str(FieldOccurredAt)
	if err != nil {
		return e, err
	}
	if occurred != "" {
		t, err := time.Parse(time.RFC3339Nano, occurred)
		if err != nil {
			return e, fmt.Errorf("outbox/redis: field %s is not RFC 3339 (%s)", FieldOccurredAt, wire.TimeFormat)
		}
		e.OccurredAt = t.UTC()
	}
	if e.Headers, err = headersField(str); err != nil {
		return e, err
	}
	if v, ok := values[FieldPayload]; ok && v != nil {
		payload, err := str(FieldPayload)
		if err != nil {
			return e, err
		}
		e.Payload = json.RawMessage(payload)
	}
	return e, nil
}

// decodeCloudEvent reads an entry of the CloudEvents formats: the
// structured document of [FieldCloudEvent] with [wire.DecodeStructured],
// and the headers of [FieldHeaders], if any, added to those the document
// gave (traceparent, tracestate); on a name both have, the document's
// value is kept.
func decodeCloudEvent(str func(string) (string, error)) (outbox.Event, error) {
	doc, err := str(FieldCloudEvent)
	if err != nil {
		return outbox.Event{}, err
	}
	e, err := wire.DecodeStructured([]byte(doc))
	if err != nil {
		return e, fmt.Errorf("outbox/redis: field %s: %w", FieldCloudEvent, err)
	}
	h, err := headersField(str)
	if err != nil {
		return e, err
	}
	for k, v := range h {
		if _, ok := e.Headers[k]; ok {
			continue
		}
		if e.Headers == nil {
			e.Headers = make(map[string]string, len(h))
		}
		e.Headers[k] = v
	}
	return e, nil
}

// headersField reads [FieldHeaders]: nil when missing or "{}".
func headersField(str func(string) (string, error)) (map[string]string, error) {
	headers, err := str(FieldHeaders)
	if err != nil || headers == "" {
		return nil, err
	}
	var h map[string]string
	if err := json.Unmarshal([]byte(headers), &h); err != nil {
		return nil, fmt.Errorf("outbox/redis: field %s is not a JSON object of strings", FieldHeaders)
	}
	if len(h) == 0 {
		return nil, nil
	}
	return h, nil
}
