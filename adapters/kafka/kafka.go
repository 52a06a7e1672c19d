// Package kafka publishes outbox events to Apache Kafka with franz-go, and
// consumes them.
//
// Delivery is at least once: the idempotent producer (always on) makes the
// client's own retries of a record land once within a producer session, but
// an event the relay hands over again (after a timed-out or failed attempt,
// a relay crash, or a lost "mark sent") becomes a new record, so consumers
// deduplicate by the event ID (the Outbox-Event-Id header, or the
// CloudEvents id).
//
// Plug a [Producer] into an outbox with ob.Handle(eventType, p.Handler()).
// Every event becomes one record: by default on the topic "outbox.events",
// keyed by its aggregate ID, laid out in [Config.Format] (see Formats). The
// handler returns once the broker has acknowledged the record, or when its
// context ends.
//
// Ordering: the key puts all events of an aggregate in one partition, which
// keeps them in the order they were produced. The relay delivers with
// several workers, so run it with RelayConfig.OrderByAggregate: an
// aggregate's events are then produced one at a time, oldest first, and
// that is the order consumers of the partition see. A single topic (the
// default) keeps that order across event types; a topic per type would
// split an aggregate's history over several partitions.
//
// Outages: a produce that fails because the brokers cannot be reached or
// cannot take the record (no ack before the handler's deadline, network
// errors, no leader, not enough replicas, an unknown topic, the client
// closed) is reported as [outbox.Unavailable]: the relay hands the event
// back without counting an attempt and pauses delivery until a produce goes
// through. franz-go retries unreachable brokers by itself until the
// context ends, so the handler's deadline (RelayConfig.HandlerTimeout) is
// how long one attempt waits before the relay pauses.
//
// Consuming: a [Consumer] ([NewConsumer]) is a consumer-group member that
// applies each record through [outbox.Consume], at most once per message ID
// (the event ID by default, in every format), and commits a partition's
// offset only past records whose transaction committed or that failed
// permanently.
//
// # Formats
//
// [wire.Native] (the default): the value is the JSON payload; the headers
// are the event's own (trace context included, sorted by name), then its
// fields as [wire.Headers] gives them (Outbox-Event-Id, Outbox-Event-Type,
// ...), as in every outbox adapter, then [HeaderContentType]
// (Content-Type: application/json).
//
// [wire.CloudEvents]: the CloudEvents Kafka binding's binary content mode.
// The value is the JSON payload; the headers are the event's own, then one
// ce_ header per attribute ([wire.KafkaBinding]: ce_specversion, ce_id,
// ce_source, ce_type, ce_subject, ce_time, ce_aggregatetype,
// ce_aggregateid, ce_idempotencykey, ce_traceparent, ce_tracestate,
// ce_partitionkey; UTF-8 values as they are), then content-type:
// application/json, which the binding reads as datacontenttype.
//
// [wire.CloudEventsJSON]: the binding's structured content mode. The value
// is one CloudEvents JSON document ([wire.StructuredJSON]); the headers are
// the event's own, then content-type: application/cloudevents+json.
//
// In both CloudEvents formats the record key (when not empty) is also the
// partitionkey extension, as the binding asks; [Config.Source] is the
// source attribute ([wire.DefaultSource] by default); the event's
// traceparent and tracestate travel both as plain headers and as
// extensions. Event headers named Content-Type (in any case), the reserved
// Outbox-* names and, in the CloudEvents formats, names starting with ce_
// are dropped. The [Consumer] reads all three formats ([wire.Decode]).
//
// Telemetry: the spans come from outboxotel, which puts its
// [wire.Telemetry] in every delivery's context. Each produce is then a
// PRODUCER span "send {topic}" (messaging.system kafka; server.address and
// port when the client has a single seed broker), and the record carries
// that span's trace context instead of the event's. [Config.Telemetry]
// only overrides the context's. A Consumer's Run context has none unless
// you put one there: set [ConsumerConfig.Telemetry] (outboxotel.Messaging())
// for a CONSUMER span "process {topic}" per attempt at a record.
package kafka

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"

	"github.com/twmb/franz-go/pkg/kerr"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/wire"
)

// Defaults of [Config].
const (
	// DefaultTopic is [Config.Topic]'s default.
	DefaultTopic = "outbox.events"
	// DefaultSeedBroker is [Config.SeedBrokers]' default.
	DefaultSeedBroker = "localhost:9092"
)

// Config configures a [Producer]. Its zero value produces to a broker on
// localhost:9092, to the topic "outbox.events", which must exist (or the
// broker must create topics on first use).
type Config struct {
	// Client is an existing client to produce with, shared with the rest of
	// the application; the Producer never closes it. It must keep
	// idempotent writes on and must not be transactional. Build it with
	// kgo.AllowIdempotentProduceCancellation, as the Producer does for its
	// own client: otherwise a publish that timed out stays buffered and is
	// produced later anyway, besides the relay's retry. Defaults to a
	// client the Producer builds from SeedBrokers and ClientOptions and
	// closes in [Producer.Close].
	Client *kgo.Client

	// SeedBrokers are the brokers the built client first contacts. Ignored
	// when Client is set. Defaults to ["localhost:9092"].
	SeedBrokers []string

	// ClientOptions are added when building the client: TLS, SASL,
	// compression, timeouts. Ignored when Client is set. The built client
	// always has kgo.AllowIdempotentProduceCancellation. Defaults to none.
	ClientOptions []kgo.Opt

	// Topic receives every event when TopicFor is nil. Defaults to
	// "outbox.events".
	Topic string

	// TopicFor maps an event to its topic, overriding Topic; for example
	// func(e outbox.Event) string { return "events." + e.AggregateType }.
	// A name Kafka cannot accept (empty, longer than 249 bytes, characters
	// other than ASCII letters, digits, '.', '_' and '-') fails the event
	// permanently. Defaults to nil (use Topic).
	TopicFor func(outbox.Event) string

	// Key returns the record key, which picks the partition. Defaults to
	// the event's AggregateID, or no key (any partition) when it is empty.
	// In the CloudEvents formats a non-empty key is also the partitionkey
	// extension, as the Kafka binding asks.
	Key func(outbox.Event) []byte

	// Format is how a record carries its event: [wire.Native] (the
	// default: Outbox-* headers, the payload as the value),
	// [wire.CloudEvents] (the CloudEvents Kafka binding's binary content
	// mode: ce_* headers, the payload as the value) or
	// [wire.CloudEventsJSON] (its structured mode: one JSON document as the
	// value). Use a CloudEvents format when consumers read records with a
	// CloudEvents SDK rather than with package wire; the package doc shows
	// each layout. [New] refuses any other value.
	Format wire.Format

	// Source is the CloudEvents source attribute in the CloudEvents
	// formats: a URI-reference naming the producing service, such as
	// "/orders". Keep it stable: consumers may deduplicate by source and
	// id. Ignored in Native format. Defaults to [wire.DefaultSource].
	Source string

	// Telemetry reports each produce as a PRODUCER span "send {topic}" and
	// puts that span's trace context on the record. Defaults to nil: the
	// Telemetry in the handler's context, which outboxotel puts there for
	// every delivery, so set it only to override that one; with neither,
	// records are produced without spans.
	Telemetry wire.Telemetry
}

// Producer produces outbox events to Kafka. Create it with [New]; it is
// safe for concurrent use.
type Producer struct {
	cl     *kgo.Client
	owned  bool
	topic  func(outbox.Event) string
	key    func(outbox.Event) []byte
	format wire.Format
	source string
	tel    wire.Telemetry
	// host and port name the broker in telemetry when the client has one
	// seed broker; with several, which one takes a record is not known
	// before it is sent, and they stay empty.
	host string
	port int
}

// New returns a Producer configured by cfg. Building a client does not
// contact the brokers; the first publish does. An unknown Format is an
// error wrapping [wire.ErrFormat].
func New(cfg Config) (*Producer, error) {
	if err := cfg.Format.Check(); err != nil {
		return nil, fmt.Errorf("outbox/kafka: Format: %w", err)
	}
	if err := wire.CheckSource(cfg.Source); err != nil {
		return nil, fmt.Errorf("outbox/kafka: Config.Source: %w", err)
	}
	p := &Producer{cl: cfg.Client, topic: cfg.TopicFor, key: cfg.Key, format: cfg.Format, source: cfg.Source, tel: cfg.Telemetry}
	if p.topic == nil {
		topic := cfg.Topic
		if topic == "" {
			topic = DefaultTopic
		}
		if err := checkTopic(topic); err != nil {
			return nil, fmt.Errorf("outbox/kafka: Topic %q: %w", topic, err)
		}
		p.topic = func(outbox.Event) string { return topic }
	}
	if p.key == nil {
		p.key = aggregateKey
	}
	if p.cl == nil {
		seeds := cfg.SeedBrokers
		if len(seeds) == 0 {
			seeds = []string{DefaultSeedBroker}
		}
		// Without AllowIdempotentProduceCancellation a record whose produce
		// was attempted (even one refused at dial) stays buffered when the
		// handler gives up, and is produced whenever the broker returns, on
		// top of the relay's retry: an outage would leave one copy per
		// attempt. With it, a record the handler gave up on is dropped,
		// and a copy remains only if the broker had in fact stored it.
		opts := append([]kgo.Opt{kgo.SeedBrokers(seeds...), kgo.AllowIdempotentProduceCancellation()}, cfg.ClientOptions...)
		cl, err := kgo.NewClient(opts...)
		if err != nil {
			return nil, fmt.Errorf("outbox/kafka: build client: %w", err)
		}
		p.cl, p.owned = cl, true
	}
	// The guarantee in the package doc rests on idempotence; a
	// transactional client would fail every produce outside a transaction.
	if disabled, _ := p.cl.OptValue(kgo.DisableIdempotentWrite).(bool); disabled {
		p.Close()
		return nil, errors.New("outbox/kafka: the client disables idempotent writes; the Producer needs them (remove kgo.DisableIdempotentWrite)")
	}
	if txn, _ := p.cl.OptValue(kgo.TransactionalID).(string); txn != "" {
		p.Close()
		return nil, errors.New("outbox/kafka: the client is transactional; use a client without kgo.TransactionalID")
	}
	if seeds, _ := p.cl.OptValue(kgo.SeedBrokers).([]string); len(seeds) == 1 {
		p.host, p.port = brokerAddr(seeds[0])
	}
	return p, nil
}

// brokerAddr splits a seed broker's address as franz-go reads it: the port
// defaults to 9092.
func brokerAddr(seed string) (string, int) {
	host, port, err := net.SplitHostPort(seed)
	if err != nil {
		return seed, 9092
	}
	n, err := strconv.Atoi(port)
	if err != nil {
		return host, 0
	}
	return host, n
}

// Client returns the client the Producer produces with, for instance to
// ping the brokers in a readiness check.
func (p *Producer) Client() *kgo.Client { return p.cl }

// Handler returns the outbox handler that produces each event it receives;
// register it with ob.Handle.
func (p *Producer) Handler() outbox.Handler { return p.Publish }

// Publish produces e and waits, at most until ctx ends, for the broker's
// acknowledgement. A nil error means the record is stored (by all in-sync
// replicas, franz-go's default acks). An error leaves the event to the
// relay's retry; if the record was already on its way it may still be
// stored, and the retry then adds a second copy.
//
// Errors that retrying cannot fix (an invalid topic name, a record larger
// than the broker accepts, an unencodable payload) are marked
// [outbox.Permanent]. Errors that say the brokers cannot take records (see
// the package doc) are marked [outbox.Unavailable]: the relay pauses
// without counting attempts. Others (an authorization refused for the
// topic, a corrupt record) are retried with backoff and count attempts.
//
// With a [wire.Telemetry] (Config's, or the one in ctx) the produce is a
// PRODUCER span, ended with the error Publish returns, and the record
// carries that span's trace context instead of the event's.
func (p *Producer) Publish(ctx context.Context, e outbox.Event) (err error) {
	topic := p.topic(e)
	key := p.key(e)
	ctx, e, end := wire.StartSend(ctx, p.tel, wire.Operation{
		System: "kafka", Destination: topic, ServerAddress: p.host, ServerPort: p.port,
	}, e)
	defer func() { end(err) }()
	return p.publish(ctx, topic, key, e)
}

func (p *Producer) publish(ctx context.Context, topic string, key []byte, e outbox.Event) error {
	if err := checkTopic(topic); err != nil {
		// Quoted: it may hold anything.
		return outbox.Permanent(fmt.Errorf("%w: topic %q (outbox/kafka)", err, topic))
	}
	rec, err := p.record(topic, key, e)
	if err != nil {
		return outbox.Permanent(publishError(err, topic))
	}

	// ProduceSync flushes the record at once instead of letting it linger,
	// but once the request is on the wire an idempotent client will not
	// give it up, even when ctx ends: it must learn the outcome to keep its
	// sequence numbers right. Waiting in a goroutine keeps the handler
	// within its deadline; the record still resolves in the background.
	done := make(chan error, 1)
	go func() { done <- p.cl.ProduceSync(ctx, rec).FirstErr() }()
	select {
	case err := <-done:
		if err == nil {
			return nil
		}
		err = publishError(err, topic)
		switch {
		case errors.Is(err, kerr.MessageTooLarge) || errors.Is(err, kerr.RecordListTooLarge) ||
			errors.Is(err, kerr.InvalidTopicException) || errors.Is(err, kerr.InvalidRecord):
			return outbox.Permanent(err)
		case unavailable(err):
			return outbox.Unavailable(err)
		}
		return err
	case <-ctx.Done():
		err := publishError(fmt.Errorf("no ack from the broker: %w", ctx.Err()), topic)
		if unavailable(err) {
			return outbox.Unavailable(err)
		}
		return err
	}
}

// publishError is the error of a produce to topic that failed with err:
// err first, then the destination and the adapter, such as "unable to
// dial: dial tcp 10.0.0.7:9092: connect: connection refused: topic orders
// (outbox/kafka)". The event ID is left out: the relay's logs and the
// outbox row carry it, and a reader of a column cut to a width wants the
// cause.
func publishError(err error, topic string) error {
	return fmt.Errorf("%w: topic %s (outbox/kafka)", err, topic)
}

// unavailable reports whether err says that the brokers, not the record,
// are the problem: they cannot be reached or answered in time, or cannot
// take records now (no leader, not enough in-sync replicas, storage
// errors, an unknown topic), or the client is closed. A cancelled context
// says nothing about the brokers.
func unavailable(err error) bool {
	for _, target := range []error{
		context.DeadlineExceeded, kgo.ErrRecordTimeout, kgo.ErrRecordRetries, kgo.ErrClientClosed, kgo.ErrMaxBuffered,
		kerr.BrokerNotAvailable, kerr.LeaderNotAvailable, kerr.NotLeaderForPartition, kerr.ReplicaNotAvailable,
		kerr.NotEnoughReplicas, kerr.NotEnoughReplicasAfterAppend, kerr.RequestTimedOut, kerr.NetworkException,
		kerr.KafkaStorageError, kerr.UnknownTopicOrPartition, kerr.NotController, kerr.CoordinatorNotAvailable,
		kerr.CoordinatorLoadInProgress, kerr.SaslAuthenticationFailed,
	} {
		if errors.Is(err, target) {
			return true
		}
	}
	_, ok := errors.AsType[net.Error](err)
	return ok
}

// Close closes the client if the Producer built it, failing records still
// waiting for an ack; a client passed in Config.Client is left open.
func (p *Producer) Close() {
	if p.owned {
		p.cl.Close()
	}
}

func aggregateKey(e outbox.Event) []byte {
	if e.AggregateID == "" {
		return nil
	}
	return []byte(e.AggregateID)
}

// checkTopic applies Kafka's rules for topic names, so that a bad mapping
// fails at once instead of after the client's retries.
func checkTopic(t string) error {
	switch {
	case t == "":
		return errors.New("empty topic name")
	case t == "." || t == "..":
		return errors.New(`topic name cannot be "." or ".."`)
	case len(t) > 249:
		return errors.New("topic name longer than 249 bytes")
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return errors.New("topic name may hold only ASCII letters, digits, '.', '_' and '-'")
		}
	}
	return nil
}
