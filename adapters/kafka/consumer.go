package kafka

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/wire"
)

// DefaultRetryDelay is [ConsumerConfig.RetryDelay]'s default.
const DefaultRetryDelay = time.Second

const (
	// pollRecords bounds the records one poll hands to the partitions.
	pollRecords = 1000
	// maxQueued is how many records a partition may hold before its
	// fetching pauses (it resumes when they are done): a partition
	// blocked on a failing record does not fill memory.
	maxQueued = 1000
	// commitEvery is how long a partition with a steady stream of records
	// goes at most between commits; one also commits whenever it runs out
	// of records and before it waits to retry one.
	commitEvery = time.Second
	// commitTimeout bounds one offset commit.
	commitTimeout = 10 * time.Second
)

// ConsumerConfig configures a [Consumer]. Consumer and Handle are required.
type ConsumerConfig struct {
	// Consumer names this consumer in the inbox (outbox.Consume's consumer).
	Consumer string

	// Handle applies one message's effect inside the inbox transaction tx:
	// write through tx only. Its error decides the message's fate: nil
	// commits the record's offset; an [outbox.Permanent] error logs the
	// record and commits past it; any other error retries the record after
	// RetryDelay, holding back the rest of its partition; a panic counts
	// as such an error. ctx ends when Run's context does.
	Handle func(ctx context.Context, tx *gorm.DB, m Message) error

	// MessageID returns the ID the inbox records for m. Defaults to
	// m.Event.ID (the event ID the outbox put on it, in any [wire.Format]:
	// the Outbox-Event-Id header, the ce_id header or the structured
	// document's id); set it for messages of other producers, for example
	//
	//	func(m kafka.Message) string {
	//		return fmt.Sprintf("%s/%d/%d", m.Raw.Topic, m.Raw.Partition, m.Raw.Offset)
	//	}
	//
	// (a record's position, unique while the topic is not recreated). An
	// empty ID, or one the inbox cannot store (longer than
	// [outbox.MaxInboxIDLen] characters, not UTF-8, holding a NUL byte), is
	// refused as permanent.
	MessageID func(m Message) string

	// Logger; defaults to slog.Default(). Never log payloads.
	Logger *slog.Logger

	// Group is the Kafka consumer group the Consumer joins. Defaults to
	// Consumer.
	Group string

	// Topics are the topics consumed. Defaults to ["outbox.events"].
	Topics []string

	// RetryDelay is how long a record whose Handle (or transaction) failed
	// with a transient error waits before it is tried again. Its partition
	// waits with it, so that the partition's records keep their order.
	// Defaults to 1s.
	RetryDelay time.Duration

	// Telemetry reports each attempt at a record as a CONSUMER span
	// "process {topic}", a child of the trace context the record carries
	// (its producer's send span); Handle runs in that span's context.
	// Defaults to nil: the Telemetry in Run's context, if any (put there
	// with wire.ContextWithTelemetry); with neither, no spans. Set it to
	// outboxotel.Messaging() to trace the consumer.
	Telemetry wire.Telemetry
}

// Message is one record received: the outbox event decoded from its headers
// and value ([wire.Decode], which reads every [wire.Format]) and the record
// itself.
type Message struct {
	Event outbox.Event
	Raw   *kgo.Record
}

// Consumer consumes outbox events from Kafka in a consumer group and applies
// each one through [outbox.Consume], at most once per message ID. Create it
// with [NewConsumer] and run it with [Consumer.Run].
//
// Offsets: a partition's offset is committed only once every record before
// it in the partition is done: its Handle committed (or it was a duplicate
// the inbox skipped), or it was given up as permanent. Each partition's
// records are processed one at a time, in order; partitions run
// concurrently, one goroutine each. A record that fails transiently is
// retried after [ConsumerConfig.RetryDelay], and its partition waits for it
// (fetching for it pauses once 1,000 records are queued behind it): order
// is kept, and no offset past it is committed.
//
// Rebalances: when partitions are revoked, their processing stops after the
// record in progress (a record waiting to be retried is left to the next
// owner) and what is done is committed before the partitions move; lost
// partitions (the member fell out of the group) stop without a commit, and
// their new owner reads the uncommitted records again, which the inbox
// deduplicates.
type Consumer struct {
	db     *gorm.DB
	opts   []kgo.Opt
	cfg    ConsumerConfig
	id     func(Message) string
	log    *slog.Logger
	delay  time.Duration
	active atomic.Bool

	// beforeAck, nil in production, runs after a record's transaction
	// committed and before the record counts as done; a non-nil error
	// stops Run with it as if the process had died there (tests).
	beforeAck func(Message) error
}

// NewConsumer returns a Consumer that consumes into db (with the outbox
// plugin installed) as cfg says. opts are the franz-go options of the
// client it builds for each [Consumer.Run]: seed brokers (kgo.SeedBrokers;
// localhost:9092 by default), TLS, SASL, fetch sizes, where a new group
// starts (kgo.ConsumeResetOffset / ConsumeStartOffset: the log start by
// default). The Consumer builds its own client rather than taking one
// because it must own the group membership: it adds kgo.ConsumerGroup,
// kgo.ConsumeTopics, kgo.DisableAutoCommit (offsets are committed only
// as described on [Consumer]), kgo.BlockRebalanceOnPoll and its
// OnPartitionsRevoked and OnPartitionsLost callbacks, which override any
// in opts; do not pass kgo.AutoCommitMarks or other commit options.
//
// A missing Consumer or Handle, a db without the outbox plugin, an
// invalid topic name or a negative RetryDelay is an error wrapping
// [outbox.ErrInvalidConfig]; so is an option franz-go refuses.
func NewConsumer(db *gorm.DB, opts []kgo.Opt, cfg ConsumerConfig) (*Consumer, error) {
	bad := func(format string, args ...any) (*Consumer, error) {
		return nil, fmt.Errorf("%w: outbox/kafka: consumer: "+format, append([]any{outbox.ErrInvalidConfig}, args...)...)
	}
	switch {
	case db == nil:
		return bad("nil database")
	case db.Config == nil || db.Config.Plugins["outbox"] == nil:
		return bad("the database has no outbox plugin installed (db.Use(outbox.Plugin(...)))")
	case cfg.Handle == nil:
		return bad("Handle is required")
	}
	if err := checkID(cfg.Consumer); err != nil {
		return bad("Consumer: %v", err)
	}
	if cfg.Group == "" {
		cfg.Group = cfg.Consumer
	}
	if len(cfg.Topics) == 0 {
		cfg.Topics = []string{DefaultTopic}
	}
	cfg.Topics = append([]string(nil), cfg.Topics...)
	for _, t := range cfg.Topics {
		if err := checkTopic(t); err != nil {
			return bad("topic %q: %v", t, err)
		}
	}
	c := &Consumer{db: db, opts: append([]kgo.Opt(nil), opts...), cfg: cfg, id: cfg.MessageID, log: cfg.Logger, delay: cfg.RetryDelay}
	switch {
	case c.delay < 0:
		return bad("negative RetryDelay %v", c.delay)
	case c.delay == 0:
		c.delay = DefaultRetryDelay
	}
	if c.id == nil {
		c.id = func(m Message) string { return m.Event.ID }
	}
	if c.log == nil {
		c.log = slog.Default()
	}
	// The options alone, so that a bad one fails here, not in Run; this
	// client joins nothing and contacts no broker.
	probe, err := kgo.NewClient(c.opts...)
	if err != nil {
		return bad("client options: %v", err)
	}
	probe.Close()
	return c, nil
}

// Run joins the group and consumes until ctx is done, then commits what is
// done, leaves the group and returns nil. It returns an error if the client
// cannot be built, or if it is called while another Run of c is running.
// Broker and group errors are logged (Warn) and retried by the client;
// Run keeps going.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.active.CompareAndSwap(false, true) {
		return errors.New("outbox/kafka: consumer: Run is already running")
	}
	defer c.active.Store(false)

	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	r := &run{c: c, ctx: ctx, cancel: cancel, parts: map[tp]*partition{}}
	opts := append(append([]kgo.Opt(nil), c.opts...),
		kgo.ConsumerGroup(c.cfg.Group),
		kgo.ConsumeTopics(c.cfg.Topics...),
		kgo.DisableAutoCommit(),
		kgo.BlockRebalanceOnPoll(),
		kgo.OnPartitionsRevoked(r.revoked),
		kgo.OnPartitionsLost(r.lost),
	)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("outbox/kafka: consumer: build client: %w", err)
	}
	r.cl = cl

	r.poll()

	// Stop every partition, commit what is done, then leave the group
	// (whose final revoke finds nothing left to do).
	r.stop(nil, true)
	cl.CloseAllowingRebalance()
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.fatal
}

type tp struct {
	topic string
	part  int32
}

// run is one Run: its client and the partitions it is processing.
type run struct {
	c      *Consumer
	cl     *kgo.Client
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu    sync.Mutex
	parts map[tp]*partition
	fatal error // what stopped Run, if not its context
}

// fail stops Run with err.
func (r *run) fail(err error) {
	r.mu.Lock()
	if r.fatal == nil {
		r.fatal = err
	}
	r.mu.Unlock()
	r.cancel()
}

// poll hands each partition's polled records to its goroutine, until the
// context ends. Rebalances wait while it does (BlockRebalanceOnPoll), so
// a record is never queued for a partition already revoked.
func (r *run) poll() {
	for r.ctx.Err() == nil {
		fs := r.cl.PollRecords(r.ctx, pollRecords)
		if fs.IsClientClosed() || r.ctx.Err() != nil {
			r.cl.AllowRebalance()
			return
		}
		fs.EachError(func(topic string, p int32, err error) {
			r.c.log.WarnContext(r.ctx, "outbox/kafka: consumer: fetch failed; the client retries",
				slog.String("consumer", r.c.cfg.Consumer), slog.String("topic", topic), slog.Int("partition", int(p)), slog.Any("error", err))
		})
		fs.EachPartition(func(f kgo.FetchTopicPartition) {
			if len(f.Records) > 0 {
				r.partition(f.Topic, f.Partition).add(f.Records)
			}
		})
		r.cl.AllowRebalance()
	}
}

// partition returns the goroutine of t/p, starting it if needed.
func (r *run) partition(topic string, p int32) *partition {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := tp{topic, p}
	if pt := r.parts[k]; pt != nil {
		return pt
	}
	pt := &partition{r: r, tp: k, wake: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
	r.parts[k] = pt
	r.wg.Go(pt.work)
	return pt
}

// revoked stops the revoked partitions and commits what they finished
// before they move to another member.
func (r *run) revoked(_ context.Context, _ *kgo.Client, ps map[string][]int32) { r.stop(ps, true) }

// lost stops the lost partitions; a commit would be refused.
func (r *run) lost(_ context.Context, _ *kgo.Client, ps map[string][]int32) { r.stop(ps, false) }

// stop stops the partitions in ps (all when ps is nil), waits for their
// goroutines, resumes their fetching if it was paused, and commits what
// they finished if commit is set.
func (r *run) stop(ps map[string][]int32, commit bool) {
	r.mu.Lock()
	var stopped []*partition
	for k, pt := range r.parts {
		if ps != nil && !has(ps, k) {
			continue
		}
		delete(r.parts, k)
		close(pt.quit)
		stopped = append(stopped, pt)
	}
	r.mu.Unlock()
	resume := map[string][]int32{}
	for _, pt := range stopped {
		<-pt.done
		resume[pt.tp.topic] = append(resume[pt.tp.topic], pt.tp.part)
		if commit {
			pt.commit()
		}
	}
	if len(resume) > 0 {
		r.cl.ResumeFetchPartitions(resume)
	}
	if ps == nil {
		r.wg.Wait()
	}
}

func has(ps map[string][]int32, k tp) bool {
	for _, p := range ps[k.topic] {
		if p == k.part {
			return true
		}
	}
	return false
}

// partition processes one partition's records in order, in its own
// goroutine.
type partition struct {
	r    *run
	tp   tp
	wake chan struct{} // a record was queued
	quit chan struct{} // closed to stop: revoked, lost, or Run ends
	done chan struct{} // closed when work has returned

	mu     sync.Mutex
	queue  []*kgo.Record
	paused bool

	// Only work touches these until done is closed; then stop does.
	finished  *kgo.Record // the last record done, not yet committed
	committed time.Time
}

// add queues recs, pausing the partition's fetching when too many wait.
func (pt *partition) add(recs []*kgo.Record) {
	pt.mu.Lock()
	pt.queue = append(pt.queue, recs...)
	if len(pt.queue) >= maxQueued && !pt.paused {
		pt.paused = true
		pt.r.cl.PauseFetchPartitions(map[string][]int32{pt.tp.topic: {pt.tp.part}})
	}
	pt.mu.Unlock()
	select {
	case pt.wake <- struct{}{}:
	default:
	}
}

// next returns the next queued record, or nil when there is none,
// resuming fetching once the queue is short again.
func (pt *partition) next() *kgo.Record {
	pt.mu.Lock()
	defer pt.mu.Unlock()
	if pt.paused && len(pt.queue) < maxQueued/2 {
		pt.paused = false
		pt.r.cl.ResumeFetchPartitions(map[string][]int32{pt.tp.topic: {pt.tp.part}})
	}
	if len(pt.queue) == 0 {
		return nil
	}
	rec := pt.queue[0]
	pt.queue[0] = nil
	pt.queue = pt.queue[1:]
	return rec
}

func (pt *partition) work() {
	defer close(pt.done)
	pt.committed = time.Now()
	for {
		rec := pt.next()
		if rec == nil {
			pt.commit()
			select {
			case <-pt.wake:
				continue
			case <-pt.quit:
				return
			}
		}
		select {
		case <-pt.quit:
			return
		default:
		}
		if !pt.process(rec) {
			return
		}
		pt.finished = rec
		if time.Since(pt.committed) >= commitEvery {
			pt.commit()
		}
	}
}

// process applies rec until it is done (true), retrying transient
// failures, or until the partition stops (false).
func (pt *partition) process(rec *kgo.Record) bool {
	c, ctx := pt.r.c, pt.r.ctx
	for {
		m, id, err := c.message(rec)
		// A record that does not decode gets its span too, ended with
		// the error that commits past it.
		sctx, end := wire.StartReceive(ctx, c.cfg.Telemetry, wire.Operation{
			System: "kafka", Destination: rec.Topic, ConsumerGroup: c.cfg.Group,
		}, m.Event)
		if err == nil {
			err = c.consume(sctx, id, m)
		}
		end(err)
		switch {
		case err == nil:
			if c.beforeAck != nil {
				if err := c.beforeAck(m); err != nil {
					pt.r.fail(err)
					return false
				}
			}
			return true
		case outbox.IsPermanent(err):
			c.log.ErrorContext(ctx, "outbox/kafka: consumer: record failed permanently; committing past it",
				append(recordAttrs(c, rec, id), slog.Any("error", err))...)
			return true
		case ctx.Err() != nil:
			return false
		}
		c.log.WarnContext(ctx, "outbox/kafka: consumer: record failed; retrying it, its partition waits",
			append(recordAttrs(c, rec, id), slog.Duration("retry_in", c.delay), slog.Any("error", err))...)
		pt.commit()
		t := time.NewTimer(c.delay)
		select {
		case <-t.C:
		case <-pt.quit:
			t.Stop()
			return false
		}
	}
}

// commit commits the offset after the last record done, if any is not yet
// committed. A failed commit is logged; the next one covers it.
func (pt *partition) commit() {
	rec := pt.finished
	if rec == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(pt.r.ctx), commitTimeout)
	defer cancel()
	if err := pt.r.cl.CommitRecords(ctx, rec); err != nil {
		pt.r.c.log.WarnContext(ctx, "outbox/kafka: consumer: offset commit failed; records after the last commit may be read again",
			slog.String("consumer", pt.r.c.cfg.Consumer), slog.String("topic", rec.Topic), slog.Int("partition", int(rec.Partition)),
			slog.Int64("offset", rec.Offset), slog.Any("error", err))
		return
	}
	pt.finished, pt.committed = nil, time.Now()
}

// message decodes rec and returns its message ID; an error is permanent.
// Every header goes to wire.Decode (the first value of a repeated one),
// content-type included: it tells the structured CloudEvents format.
func (c *Consumer) message(rec *kgo.Record) (Message, string, error) {
	h := make(map[string]string, len(rec.Headers))
	for _, x := range rec.Headers {
		if _, ok := h[x.Key]; !ok {
			h[x.Key] = string(x.Value)
		}
	}
	e, err := wire.Decode(h, rec.Value)
	m := Message{Event: e, Raw: rec}
	if err != nil {
		return m, "", outbox.Permanent(fmt.Errorf("outbox/kafka: consumer: decode record: %w", err))
	}
	id := c.id(m)
	if err := checkID(id); err != nil {
		return m, id, outbox.Permanent(fmt.Errorf("outbox/kafka: consumer: message ID: %w", err))
	}
	return m, id, nil
}

// consume runs Handle for m in the inbox transaction; a panic in it is
// an error, retried like any other.
func (c *Consumer) consume(ctx context.Context, id string, m Message) (err error) {
	defer func() {
		if p := recover(); p != nil {
			err = fmt.Errorf("outbox/kafka: consumer: Handle panicked: %v", p)
		}
	}()
	return outbox.Consume(c.db.WithContext(ctx), c.cfg.Consumer, id, func(tx *gorm.DB) error {
		return c.cfg.Handle(ctx, tx, m)
	})
}

// checkID applies the inbox's rules for consumer names and message IDs,
// so that an ID it would refuse is permanent instead of retried forever.
func checkID(s string) error { return outbox.CheckInboxID(s) }

// recordAttrs identifies rec in a log line: never its value or headers.
func recordAttrs(c *Consumer, rec *kgo.Record, id string) []any {
	return []any{
		slog.String("consumer", c.cfg.Consumer), slog.String("topic", rec.Topic), slog.Int("partition", int(rec.Partition)),
		slog.Int64("offset", rec.Offset), slog.String("key", string(rec.Key)), slog.String("message_id", id),
	}
}
