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
// Plug a [Producer] into an outbox with
// ob.HandleAsync(outbox.AnyEvent, p.AsyncHandler()). Every event becomes one
// record: by default on the topic "outbox.events", keyed by its aggregate
// ID, laid out in [Config.Format] (see Formats). A relay starts the records
// of a whole batch before it waits for their acknowledgements, so they are
// in flight together; [Producer.Handler], for ob.Handle, produces one
// record per relay worker at a time and waits for each. Either way an
// event counts as sent once the broker has acknowledged its record, and an
// attempt ends when its context does.
//
// Ordering: the key puts all events of an aggregate in one partition, which
// keeps them in the order they were produced. Without
// RelayConfig.OrderByAggregate a relay's concurrent deliveries and retries
// can reorder an aggregate's events, so set it: an aggregate's events are
// then produced one at a time, oldest first, each after the previous one's
// ack (the AsyncHandler still has one record per aggregate in flight
// together), and that is the order consumers of the partition see. A
// single topic (the default) keeps that order across event types; a topic
// per type would split an aggregate's history over several partitions.
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
	// idempotent writes on, must not be transactional and must not flush
	// manually ([New] refuses it otherwise). Build it with
	// kgo.AllowIdempotentProduceCancellation, as the Producer does for its
	// own client: otherwise a publish that timed out stays buffered and is
	// produced later anyway, besides the relay's retry. Its ProducerLinger
	// (franz-go's default: 10ms) delays each wave of an
	// [Producer.AsyncHandler] by up to that long; the Producer's own client
	// has none. Defaults to a client the Producer builds from SeedBrokers
	// and ClientOptions and closes in [Producer.Close].
	Client *kgo.Client

	// SeedBrokers are the brokers the built client first contacts. Ignored
	// when Client is set. Defaults to ["localhost:9092"].
	SeedBrokers []string

	// ClientOptions are added when building the client: TLS, SASL,
	// compression, timeouts. Ignored when Client is set. The built client
	// always has kgo.AllowIdempotentProduceCancellation, and
	// kgo.ProducerLinger(0) unless these options set a linger. Defaults to
	// none.
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
		// ProducerLinger(0): franz-go holds a partition's records for 10ms
		// by default, hoping for more, but a relay waits for a wave's acks
		// right after starting it; records that come in while requests are
		// in flight are batched anyway. ClientOptions come after, so a
		// linger of the application's own wins.
		opts := append([]kgo.Opt{kgo.SeedBrokers(seeds...), kgo.AllowIdempotentProduceCancellation(), kgo.ProducerLinger(0)}, cfg.ClientOptions...)
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
	// A record waits for the ack; with manual flushing it would wait for a
	// Flush the Producer never calls (or be refused, the buffer full).
	if manual, _ := p.cl.OptValue(kgo.ManualFlushing).(bool); manual {
		p.Close()
		return nil, errors.New("outbox/kafka: the client flushes manually; the Producer needs it to send records as they come (remove kgo.ManualFlushing)")
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

// Handler returns the outbox handler that produces each event it receives
// and waits for its acknowledgement ([Producer.Publish]); register it with
// ob.Handle. A relay then has at most one record in flight per worker
// (RelayConfig.Workers): [Producer.AsyncHandler] pipelines a whole batch.
func (p *Producer) Handler() outbox.Handler { return p.Publish }

// AsyncHandler returns the outbox handler that starts producing each event
// it receives and returns a wait for the broker's acknowledgement; register
// it with ob.HandleAsync. A relay starts every event of a batch (with
// RelayConfig.OrderByAggregate, of a wave: each aggregate's next event)
// before it waits for any, so the batch's records are in flight together
// and a batch costs about one produce round trip, where a [Producer.Handler]
// costs one per event on each relay worker.
//
// The record, its span and its errors are [Producer.Publish]'s: the start
// builds the record (an invalid topic or an unencodable payload is the
// wait's [outbox.Permanent] error, with no produce), opens the send span
// and hands the record to the client without flushing; records are
// produced in the order of the calls, so an aggregate's events keep their
// order in its partition. When the client already buffers
// MaxBufferedRecords (or MaxBufferedBytes), the start blocks until there is
// room or ctx ends: the record is never dropped, and a start that gave up
// is the wait's error ("context deadline exceeded": [outbox.Unavailable]).
// The wait returns nil once the broker has stored the record, or the error
// Publish would have returned (a closed client, for instance, is
// [outbox.Unavailable]: the relay hands the event back without counting an
// attempt), and ends the span with it; it returns when ctx ends at the
// latest.
//
// Records wait in the client for ProducerLinger before they are sent. The
// relay waits right after starting a wave, so the client [New] builds has
// kgo.ProducerLinger(0) (franz-go's default is 10ms); a shared
// [Config.Client] keeps its own linger, which each wave then waits out.
func (p *Producer) AsyncHandler() outbox.AsyncHandler {
	return func(ctx context.Context, e outbox.Event) func() error { return p.start(ctx, e, false) }
}

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
func (p *Producer) Publish(ctx context.Context, e outbox.Event) error {
	return p.start(ctx, e, true)()
}

// start is Publish and AsyncHandler: it opens the send span, builds e's
// record and hands it to the client, and returns the wait for its
// outcome, which ends the span. sync produces with ProduceSync, which
// sends the record at once whatever the client's linger (Publish waits
// for it right away); otherwise the record goes in the client's buffer
// behind the records of earlier calls, to be sent with them.
func (p *Producer) start(ctx context.Context, e outbox.Event, sync bool) (wait func() error) {
	topic := p.topic(e)
	key := p.key(e)
	ctx, e, end := wire.StartSend(ctx, p.tel, wire.Operation{
		System: "kafka", Destination: topic, ServerAddress: p.host, ServerPort: p.port,
	}, e)
	rec, err := p.build(topic, key, e)
	if err != nil {
		return func() error { end(err); return err }
	}

	// Once the request is on the wire an idempotent client will not give
	// the record up, even when ctx ends: it must learn the outcome to keep
	// its sequence numbers right. The wait returns when ctx ends all the
	// same; the record still resolves in the background, into done.
	done := make(chan error, 1)
	if sync {
		go func() { done <- p.cl.ProduceSync(ctx, rec).FirstErr() }()
	} else {
		p.cl.Produce(ctx, rec, func(_ *kgo.Record, err error) { done <- err })
	}
	return func() error {
		err := outcome(ctx, done, topic)
		end(err)
		return err
	}
}

// build checks topic and lays e out as its record; its errors are
// permanent.
func (p *Producer) build(topic string, key []byte, e outbox.Event) (*kgo.Record, error) {
	if err := checkTopic(topic); err != nil {
		// Quoted: it may hold anything.
		return nil, outbox.Permanent(fmt.Errorf("%w: topic %q (outbox/kafka)", err, topic))
	}
	rec, err := p.record(topic, key, e)
	if err != nil {
		return nil, outbox.Permanent(publishError(err, topic))
	}
	return rec, nil
}

// outcome waits for a produce's result in done, or for ctx to end, and
// classifies it. A result that is there when ctx ends wins.
func outcome(ctx context.Context, done <-chan error, topic string) error {
	select {
	case err := <-done:
		return classify(err, topic)
	case <-ctx.Done():
		select {
		case err := <-done:
			return classify(err, topic)
		default:
		}
		return classify(fmt.Errorf("no ack from the broker: %w", ctx.Err()), topic)
	}
}

// classify is the error a produce to topic that failed with err returns:
// nil for nil, [outbox.Permanent] when the record can never be stored,
// [outbox.Unavailable] when the brokers cannot take it now ([unavailable]),
// plain otherwise (retried with backoff).
func classify(err error, topic string) error {
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
