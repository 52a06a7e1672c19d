package outboxotel

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/semconv/v1.43.0/messagingconv"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
)

// Attribute keys of the metrics that the semantic conventions do not name.
const (
	// OutcomeKey is the outcome of a delivery attempt: sent, retry,
	// failed, no_handler or unavailable. Each attempt counts exactly one;
	// failed is the attempt after which the event is failed for good,
	// whatever the cause (no handler included).
	OutcomeKey = attribute.Key("outbox.outcome")
	// StatusKey is a row's status in the outbox.events gauge.
	StatusKey = attribute.Key("outbox.status")
	// ConsumerKey is the inbox consumer (the consumer name given to
	// outbox.Consume) in the outbox.inbox.duplicates counter.
	ConsumerKey = attribute.Key("outbox.consumer")
)

// Outcomes, the values of [OutcomeKey].
const (
	OutcomeSent        = "sent"        // delivered
	OutcomeRetry       = "retry"       // failed; a retry is scheduled
	OutcomeFailed      = "failed"      // failed for good, whatever the cause (in memory mode, dropped)
	OutcomeNoHandler   = "no_handler"  // no handler is registered for the event's type; a retry is scheduled
	OutcomeUnavailable = "unavailable" // the destination was down; handed back, attempt not counted
)

// durationBuckets are the semantic conventions' advised boundaries for
// messaging durations, in seconds.
var durationBuckets = []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10}

// waitBuckets reach further: an event that is retried waits minutes.
var waitBuckets = []float64{0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600}

type metrics struct {
	deliveries metric.Int64Counter
	publishedN metric.Int64Counter
	duplicates metric.Int64Counter
	duration   metric.Float64Histogram
	wait       metric.Float64Histogram

	// system is the attribute every measurement carries.
	system attribute.KeyValue
	sets   sync.Map // attrKey -> *attrSets
	// publishedSets holds the published counter's attribute set per event
	// type, duplicateSets the duplicates counter's per consumer.
	publishedSets, duplicateSets sync.Map // string -> metric.MeasurementOption
}

func newMetrics(m metric.Meter, ob *outbox.Outbox, db *gorm.DB, every time.Duration) (*metrics, error) {
	var (
		ms   = &metrics{system: semconv.MessagingSystemKey.String(System)}
		errs []error
		err  error
	)
	ms.deliveries, err = m.Int64Counter("outbox.deliveries",
		metric.WithDescription("Delivery attempts, by event type and outcome."),
		metric.WithUnit("{delivery}"))
	errs = append(errs, err)
	ms.publishedN, err = m.Int64Counter("outbox.events.published",
		metric.WithDescription("Events Publish wrote, by event type (rolled back ones included)."),
		metric.WithUnit("{event}"))
	errs = append(errs, err)
	ms.duplicates, err = m.Int64Counter("outbox.inbox.duplicates",
		metric.WithDescription("Messages outbox.Consume skipped because the consumer had consumed them already (redeliveries), by consumer."),
		metric.WithUnit("{message}"))
	errs = append(errs, err)
	ms.duration, err = m.Float64Histogram(messagingconv.ProcessDuration{}.Name(),
		metric.WithDescription("Duration of one delivery attempt's handlers."),
		metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	errs = append(errs, err)
	ms.wait, err = m.Float64Histogram("outbox.delivery.wait",
		metric.WithDescription("Time from an event's insert to the start of the delivery attempt that ended it (sent or failed)."),
		metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(waitBuckets...))
	errs = append(errs, err)
	if db != nil {
		errs = append(errs, registerGauges(m, ob, db, every, ms.system))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("outboxotel: create instruments: %w", err)
	}
	return ms, nil
}

// delivered records one delivery attempt.
func (ms *metrics) delivered(d outbox.Delivery) {
	ctx := context.Background()
	errType := ""
	if d.Err != nil {
		errType = errorType(d.Err)
	}
	a := ms.attrs(d.Event.Type, outcome(d), errType)
	ms.deliveries.Add(ctx, 1, a.deliveries)
	ms.duration.Record(ctx, d.Duration.Seconds(), a.duration)
	if d.Outcome == outbox.OutcomeSent || d.Outcome == outbox.OutcomeFailed {
		// Only the attempt that ends an event's wait measures it.
		ms.wait.Record(ctx, max(d.Latency-d.Duration, 0).Seconds(), a.wait)
	}
}

// published counts one event Publish wrote.
func (ms *metrics) published(eventType string) {
	opt, ok := ms.publishedSets.Load(eventType)
	if !ok {
		opt, _ = ms.publishedSets.LoadOrStore(eventType, metric.WithAttributeSet(attribute.NewSet(
			ms.system, semconv.MessagingDestinationName(eventType))))
	}
	ms.publishedN.Add(context.Background(), 1, opt.(metric.MeasurementOption))
}

// duplicate counts one message Consume skipped as consumed already (the
// Duplicate hook). The message ID is no attribute: one per message would
// make a series each.
func (ms *metrics) duplicate(_ context.Context, consumer, _ string) {
	opt, ok := ms.duplicateSets.Load(consumer)
	if !ok {
		opt, _ = ms.duplicateSets.LoadOrStore(consumer, metric.WithAttributeSet(attribute.NewSet(
			ms.system, ConsumerKey.String(consumer))))
	}
	ms.duplicates.Add(context.Background(), 1, opt.(metric.MeasurementOption))
}

// attrKey is one combination of attribute values; there are a few per
// event type.
type attrKey struct{ eventType, outcome, errType string }

// attrSets are the attribute sets of one attrKey, built once: building a
// set sorts and hashes its attributes, a large part of a measurement.
type attrSets struct {
	deliveries, duration, wait metric.MeasurementOption
}

func (ms *metrics) attrs(eventType, outcome, errType string) *attrSets {
	k := attrKey{eventType, outcome, errType}
	if v, ok := ms.sets.Load(k); ok {
		return v.(*attrSets)
	}
	dest := semconv.MessagingDestinationName(eventType)
	op := semconv.MessagingOperationName("process")
	dur := []attribute.KeyValue{ms.system, dest, op}
	if errType != "" {
		dur = append(dur, semconv.ErrorTypeKey.String(errType))
	}
	v, _ := ms.sets.LoadOrStore(k, &attrSets{
		deliveries: metric.WithAttributeSet(attribute.NewSet(ms.system, dest, OutcomeKey.String(outcome))),
		duration:   metric.WithAttributeSet(attribute.NewSet(dur...)),
		wait:       metric.WithAttributeSet(attribute.NewSet(ms.system, dest)),
	})
	return v.(*attrSets)
}

// outcome classifies one attempt by the relay's own outcome
// (Delivery.Outcome). The attempt that fails an event for good is failed
// whatever the cause, so that counting failed counts every such event;
// no_handler marks the retries before it.
func outcome(d outbox.Delivery) string {
	switch d.Outcome {
	case outbox.OutcomeSent:
		return OutcomeSent
	case outbox.OutcomeFailed:
		return OutcomeFailed
	case outbox.OutcomeHandedBack:
		return OutcomeUnavailable
	}
	if errors.Is(d.Err, outbox.ErrNoHandler) {
		return OutcomeNoHandler
	}
	return OutcomeRetry
}

// registerGauges registers the observable gauges of the table, read
// through a cache so that frequent collection does not scan the table.
func registerGauges(m metric.Meter, ob *outbox.Outbox, db *gorm.DB, every time.Duration, system attribute.KeyValue) error {
	events, err := m.Int64ObservableGauge("outbox.events",
		metric.WithDescription("Rows in the outbox table waiting for delivery (pending) or for a human (failed), by status."),
		metric.WithUnit("{event}"))
	if err != nil {
		return err
	}
	oldest, err := m.Float64ObservableGauge("outbox.pending.oldest_age",
		metric.WithDescription("Age of the oldest pending event; 0 when none is pending."),
		metric.WithUnit("s"))
	if err != nil {
		return err
	}
	// The relays: how many are alive, and how long since one delivered.
	// Pending events with no relay alive are delivered by nothing.
	relays, err := m.Int64ObservableGauge("outbox.relays",
		metric.WithDescription("Relays of the table alive: those that recorded themselves within the last 15 s (each does every 5 s while it runs)."),
		metric.WithUnit("{relay}"))
	if err != nil {
		return err
	}
	lastDelivery, err := m.Float64ObservableGauge("outbox.last_delivery.age",
		metric.WithDescription("Time since a relay of the table last delivered an event, as the relays recorded it; not reported until one has."),
		metric.WithUnit("s"))
	if err != nil {
		return err
	}
	instruments := []metric.Observable{events, oldest, relays, lastDelivery}
	var lag, active metric.Int64ObservableGauge
	var dropped, slotLost metric.Int64ObservableCounter
	if ob.Mode() == outbox.Logical {
		// The mode's one way to lose an event (an ID reused by another
		// event), counted by this process's relays: alert on any increase.
		if dropped, err = m.Int64ObservableCounter("outbox.events.dropped",
			metric.WithDescription("Committed events this process's Logical mode relays dropped because another event took their ID first."),
			metric.WithUnit("{event}")); err != nil {
			return err
		}
		// A lost slot (a failover to a standby without it) is a window of
		// committed events never streamed: alert on any increase.
		if slotLost, err = m.Int64ObservableCounter("outbox.slot.lost",
			metric.WithDescription("Times this process found the Logical mode replication slot lost (missing, or replaced by a new one): each a window of committed events that will not be delivered."),
			metric.WithUnit("{loss}")); err != nil {
			return err
		}
		// The slot's risk is WAL kept on disk while no relay confirms it.
		if lag, err = m.Int64ObservableGauge("outbox.slot.lag",
			metric.WithDescription("WAL the Logical mode replication slot keeps because no relay has confirmed it yet."),
			metric.WithUnit("By")); err != nil {
			return err
		}
		if active, err = m.Int64ObservableGauge("outbox.slot.active",
			metric.WithDescription("1 while a relay streams the Logical mode replication slot, 0 otherwise."),
			metric.WithUnit("1")); err != nil {
			return err
		}
		instruments = append(instruments, lag, active, dropped, slotLost)
	}
	c := &statsCache{ob: ob, db: db, every: every}
	pending := metric.WithAttributes(system, StatusKey.String(string(outbox.StatusPending)))
	failed := metric.WithAttributes(system, StatusKey.String(string(outbox.StatusFailed)))
	sys := metric.WithAttributes(system)
	_, err = m.RegisterCallback(func(ctx context.Context, o metric.Observer) error {
		st, ok := c.get(ctx)
		if !ok {
			// No reading of the table yet: report none of its gauges rather
			// than zeros, but the process's own counts.
			if lag != nil {
				o.ObserveInt64(dropped, st.Dropped, sys)
				o.ObserveInt64(slotLost, st.SlotLost, sys)
			}
			return nil
		}
		o.ObserveInt64(events, st.Pending, pending)
		o.ObserveInt64(events, st.Failed, failed)
		o.ObserveFloat64(oldest, st.OldestPending.Seconds(), sys)
		o.ObserveInt64(relays, int64(len(st.Relays)), sys)
		if !st.LastDelivery.IsZero() {
			// From the same reading, aged to now: the reading may be up to
			// WithStatsInterval old, the relays' record 5 s more.
			o.ObserveFloat64(lastDelivery, max(time.Since(st.LastDelivery), 0).Seconds(), sys)
		}
		if lag != nil {
			o.ObserveInt64(lag, st.SlotLagBytes, sys)
			var on int64
			if st.SlotActive {
				on = 1
			}
			o.ObserveInt64(active, on, sys)
			o.ObserveInt64(dropped, st.Dropped, sys)
			o.ObserveInt64(slotLost, st.SlotLost, sys)
		}
		return nil
	}, instruments...)
	return err
}

// statsCache reads Stats at most once per interval.
type statsCache struct {
	ob    *outbox.Outbox
	db    *gorm.DB
	every time.Duration

	mu   sync.Mutex
	at   time.Time
	last outbox.Stats
	ok   bool
}

// get returns the latest reading, refreshed when older than the interval.
// A failed read keeps the previous one (reported to otel's error handler)
// and is not retried before the interval passes, so that an unreachable
// database is not queried on every collection.
func (c *statsCache) get(ctx context.Context) (outbox.Stats, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.at.IsZero() || time.Since(c.at) >= c.every {
		c.at = time.Now()
		st, err := c.ob.Stats(c.db.WithContext(ctx).WithContext(ctx))
		if err != nil {
			otel.Handle(fmt.Errorf("outboxotel: read the outbox table's stats: %w", err))
			// The process's own counts are there whatever the database
			// says; a missing slot (ErrNoSlot) is when SlotLost matters.
			c.last.Dropped, c.last.SlotLost = st.Dropped, st.SlotLost
		} else {
			c.last, c.ok = st, true
		}
	}
	return c.last, c.ok
}
