// Package outboxotel instruments an outbox with OpenTelemetry: one trace
// from the business request that publishes an event, through the relay that
// delivers it, to the broker message and its consumer; and metrics of every
// delivery. Install it with one line, before events are published:
//
//	ob := outbox.Plugin(outbox.Config{})
//	if err := outboxotel.Instrument(ob, outboxotel.WithStats(db)); err != nil { ... }
//
// It uses the global TracerProvider and MeterProvider unless given others
// ([WithTracerProvider], [WithMeterProvider]).
//
// # Traces
//
// Publish, called with a context that carries a span (the request's),
// starts a short PRODUCER span "create {event type}" and stores its W3C
// trace context in the event's headers (traceparent, tracestate), unless
// the event already has a traceparent. Only the W3C trace context is
// written by default, not the global propagator, which may carry baggage
// with personal data into the table; [WithPropagator] chooses another.
// The span ends once the event is written (an INSERT on the publishing
// transaction, the Logical mode WAL message, memory mode's queue) and is
// recorded only then: an event Publish does not store (every event of a
// call that returns an error, in Persistent mode one whose idempotency
// key is taken, a dry run) has no create
// span. That span is started and never ended, which the SDK does not
// export; a span processor that tracks running spans (zpages) sees it
// start.
//
// The broker adapters open a PRODUCER span "send {destination}" of their
// own, a child of the process span below, and write its trace context into
// the message they send (see [Messaging]); [Instrument] hands them the
// instrumentation in the handlers' ctx ([wire.ContextWithTelemetry]).
//
// Every delivery attempt runs in a CONSUMER span "process {event type}", a
// child of the stored context ([WithLinkOnly]: a new trace) and linked to
// it either way, with the messaging attributes of the OpenTelemetry
// semantic conventions (messaging.system "outbox", messaging.operation.type
// "process", messaging.message.id, messaging.destination.name = the event
// type), the attempt (outbox.delivery.attempt) and, on failure, error.type
// and an error status. The handlers' ctx carries that span, and the event's
// traceparent and tracestate headers are rewritten to it before the
// handlers run, so that a handler of your own that copies headers into a
// message continues the trace from it (the broker adapters put their send
// span there instead). In memory mode the span is also linked to the span
// of the request that committed.
//
// # Metrics
//
// Names and units follow the semantic conventions; no event ID is an
// attribute.
//
//   - outbox.deliveries ({delivery}): delivery attempts by
//     messaging.destination.name (the event type) and outbox.outcome, one
//     per attempt: sent; failed, the attempt after which the event is
//     failed for good whatever the cause (a permanent error, the last
//     attempt, no handler on the last attempt; in memory mode, which does
//     not retry, every failure); otherwise retry, or no_handler when no
//     handler matches the event's type (a retry is scheduled), or
//     unavailable (the destination was down: handed back, no attempt
//     counted). The cause stays in the process span's error.type.
//   - outbox.events.published ({event}): events Publish wrote, by
//     messaging.destination.name (the event type), counted when written:
//     an event whose transaction then rolls back counts too.
//   - messaging.process.duration (s): how long the handlers of one
//     attempt ran, by messaging.destination.name and error.type.
//   - outbox.delivery.wait (s): from the event's INSERT to the start of
//     the attempt that delivered or failed it, by
//     messaging.destination.name.
//   - outbox.inbox.duplicates ({message}): messages outbox.Consume
//     skipped because the consumer had consumed them already (a
//     redelivery), by outbox.consumer ([outbox.Hooks] Duplicate).
//   - outbox.events ({event}) and outbox.pending.oldest_age (s):
//     observable gauges of the table's rows by outbox.status (pending,
//     failed) and of the oldest pending event's age; outbox.relays
//     ({relay}), the relays alive (recorded within the last 15 s), and
//     outbox.last_delivery.age (s), the time since a relay last delivered
//     an event (not reported until one has): all read with one
//     [outbox.Outbox.Stats] at most once per [WithStatsInterval]. Only
//     with [WithStats].
//   - Logical mode, with [WithStats]: outbox.slot.lag (By) and
//     outbox.slot.active, the slot's; outbox.events.dropped and
//     outbox.slot.lost ({loss}), this process's counts of
//     [outbox.Stats.Dropped] and [outbox.Stats.SlotLost]: alert on any
//     increase of either.
//
// The adapters' sends and their consumers' receives add
// messaging.client.sent.messages, messaging.client.operation.duration and
// messaging.client.consumed.messages, with the adapter's messaging.system
// ([Messaging]).
package outboxotel

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"strings"
	"sync"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/baggage"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"
	"gorm.io/gorm"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/wire"
)

// ScopeName is the instrumentation scope of the tracer and meter.
const ScopeName = "github.com/gorm-outbox/outbox/outboxotel"

// System is the messaging.system attribute of every span and metric.
const System = "outbox"

// AttemptKey is the span attribute that carries the delivery attempt (1 for
// the first; 0 in memory mode).
const AttemptKey = attribute.Key("outbox.delivery.attempt")

// Option configures [Instrument].
type Option func(*config)

type config struct {
	tp         trace.TracerProvider
	mp         metric.MeterProvider
	prop       propagation.TextMapPropagator
	linkOnly   bool
	statsDB    *gorm.DB
	statsEvery time.Duration
}

// WithTracerProvider sets the TracerProvider. Defaults to otel's global one.
func WithTracerProvider(tp trace.TracerProvider) Option {
	return func(c *config) { c.tp = tp }
}

// WithMeterProvider sets the MeterProvider. Defaults to otel's global one.
func WithMeterProvider(mp metric.MeterProvider) Option {
	return func(c *config) { c.mp = mp }
}

// WithPropagator sets how trace context is written to and read from event
// headers. Defaults to propagation.TraceContext{} (traceparent and
// tracestate only). To carry baggage too, knowing it is stored in the table
// with the event, pass
// propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{}).
func WithPropagator(p propagation.TextMapPropagator) Option {
	return func(c *config) { c.prop = p }
}

// WithLinkOnly starts each delivery's span in a new trace linked to the
// publishing one, rather than as its child: for events that can wait long
// (retries over hours), where one trace spanning them is more confusing
// than useful.
func WithLinkOnly() Option {
	return func(c *config) { c.linkOnly = true }
}

// WithStats enables the gauges of the outbox table (events by status, the
// oldest pending event's age, the relays alive, the time since the last
// delivery), read from db, the *gorm.DB the outbox is
// installed on, with [outbox.Outbox.Stats] at most once per
// [WithStatsInterval] however often metrics are collected. Persistent and
// Logical mode only (Memory mode has no table: [Instrument] errs).
func WithStats(db *gorm.DB) Option {
	return func(c *config) { c.statsDB = db }
}

// WithStatsInterval sets how old the gauges' reading of the table may be.
// Defaults to 5 seconds.
func WithStatsInterval(d time.Duration) Option {
	return func(c *config) { c.statsEvery = d }
}

const defaultStatsEvery = 5 * time.Second

// Instrument installs OpenTelemetry tracing and metrics on ob through its
// hooks ([outbox.Outbox.AddHooks]). Call it once, before events are
// published or delivered. It returns an error if an instrument cannot be
// created, or if [WithStats] is used on a memory-mode outbox.
func Instrument(ob *outbox.Outbox, opts ...Option) error {
	_, err := instrument(ob, opts...)
	return err
}

func instrument(ob *outbox.Outbox, opts ...Option) (*instrumentation, error) {
	c := config{statsEvery: defaultStatsEvery}
	for _, o := range opts {
		o(&c)
	}
	if c.tp == nil {
		c.tp = otel.GetTracerProvider()
	}
	if c.mp == nil {
		c.mp = otel.GetMeterProvider()
	}
	if c.prop == nil {
		c.prop = propagation.TraceContext{}
	}
	if c.statsEvery <= 0 {
		c.statsEvery = defaultStatsEvery
	}
	if c.statsDB != nil && ob.Mode() == outbox.Memory {
		return nil, fmt.Errorf("outboxotel: WithStats on a memory-mode outbox, which has no table: %w", outbox.ErrMemoryMode)
	}
	in := &instrumentation{
		cfg:    c,
		tracer: c.tp.Tracer(ScopeName),
		fields: c.prop.Fields(),
	}
	m, err := newMetrics(c.mp.Meter(ScopeName), ob, c.statsDB, c.statsEvery)
	if err != nil {
		return nil, err
	}
	in.metrics = m
	if in.messaging, err = newMessaging(c); err != nil {
		return nil, err
	}
	ob.AddHooks(outbox.Hooks{Publish: in.publish, Stored: in.stored, Deliver: in.deliver, Delivered: m.delivered, Duplicate: m.duplicate})
	return in, nil
}

type instrumentation struct {
	cfg     config
	tracer  trace.Tracer
	fields  []string // the header names the propagator writes
	metrics *metrics
	// messaging is the wire.Telemetry the handlers' ctx carries, for the
	// adapters' send spans.
	messaging *messaging

	// creating holds the recording create spans Publish started, by the
	// event they were started for (the *outbox.Event the Publish and
	// Stored hooks both get), until the Stored hook ends or drops them.
	creating sync.Map
}

// The span kinds' options, built once: each is an allocation per span.
var (
	producerKind = trace.WithSpanKind(trace.SpanKindProducer)
	consumerKind = trace.WithSpanKind(trace.SpanKindConsumer)
)

// publish stores the request's trace context in e's headers, through a
// short PRODUCER span, which stored ends once e is written.
func (in *instrumentation) publish(ctx context.Context, e *outbox.Event) {
	if !trace.SpanContextFromContext(ctx).IsValid() || hasHeader(e.Headers, "traceparent") {
		return
	}
	ctx, span := in.tracer.Start(ctx, "create "+e.Type,
		producerKind,
		trace.WithAttributes(
			semconv.MessagingSystemKey.String(System),
			semconv.MessagingOperationTypeCreate,
			semconv.MessagingOperationName("create"),
			semconv.MessagingDestinationName(e.Type),
			semconv.MessagingMessageID(e.ID),
		))
	if e.Headers == nil {
		e.Headers = make(map[string]string, 2)
	}
	in.cfg.prop.Inject(ctx, propagation.MapCarrier(e.Headers))
	if span.IsRecording() { // an unsampled span records nothing to end
		in.creating.Store(e, span)
	}
}

// stored ends e's create span if e was written, and forgets it either way.
// A span never ended is never exported: the SDK's span processors hand a
// span to the exporter in OnEnd (the batch and simple processors do
// nothing in OnStart), and once dropped here it is garbage.
func (in *instrumentation) stored(_ context.Context, e *outbox.Event, stored bool) {
	if stored {
		in.metrics.published(e.Type)
	}
	if span, ok := in.creating.LoadAndDelete(e); ok && stored {
		span.(trace.Span).End()
	}
}

// deliver wraps each delivery in a CONSUMER span and hands the handlers
// that span's context, in ctx and in the event's headers.
func (in *instrumentation) deliver(next outbox.Handler) outbox.Handler {
	return func(ctx context.Context, e outbox.Event) error {
		extracted := in.cfg.prop.Extract(context.Background(), headerCarrier(e.Headers))
		stored := trace.SpanContextFromContext(extracted)
		current := trace.SpanContextFromContext(ctx) // memory mode: the committing request's
		if bag := baggage.FromContext(extracted); bag.Len() > 0 {
			// Only a propagator that reads baggage (WithPropagator) finds any.
			ctx = baggage.ContextWithBaggage(ctx, bag)
		}
		opts := []trace.SpanStartOption{
			consumerKind,
			trace.WithAttributes(
				semconv.MessagingSystemKey.String(System),
				semconv.MessagingOperationTypeProcess,
				semconv.MessagingOperationName("process"),
				semconv.MessagingDestinationName(e.Type),
				semconv.MessagingMessageID(e.ID),
				AttemptKey.Int(outbox.Attempt(ctx)),
			),
		}
		parent := ctx
		if stored.IsValid() {
			// The semantic conventions: a process span SHOULD link to the
			// message's creation context, also when it is its parent.
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: stored}))
			if in.cfg.linkOnly {
				opts = append(opts, trace.WithNewRoot())
			} else {
				parent = trace.ContextWithRemoteSpanContext(ctx, stored)
			}
		}
		if current.IsValid() && !current.Equal(stored) {
			opts = append(opts, trace.WithLinks(trace.Link{SpanContext: current}))
		}
		ctx, span := in.tracer.Start(parent, "process "+e.Type, opts...)
		defer span.End()

		// A handler that copies the event's headers into a message makes
		// it carry this span, so consumers continue from it.
		e.Headers = withTraceContext(ctx, in.cfg.prop, in.fields, e.Headers)

		err := next(wire.ContextWithTelemetry(ctx, in.messaging), e)
		if err != nil {
			span.SetAttributes(semconv.ErrorTypeKey.String(errorType(err)))
			span.RecordError(err)
			span.SetStatus(codes.Error, errorType(err))
		}
		return err
	}
}

// errorType is the error.type of a failed delivery: a low-cardinality
// class, never the error's text.
func errorType(err error) string {
	switch {
	case errors.Is(err, outbox.ErrNoHandler):
		return "no_handler"
	case outbox.IsPermanent(err):
		return "permanent"
	case outbox.IsUnavailable(err):
		return "unavailable"
	case errors.Is(err, context.DeadlineExceeded):
		return "timeout"
	case errors.Is(err, context.Canceled):
		return "canceled"
	}
	return semconv.ErrorTypeOther.Value.AsString()
}

// headerCarrier reads event headers ignoring the case of their names, as
// HTTP bridges fold them ("Traceparent").
type headerCarrier map[string]string

func (c headerCarrier) Get(key string) string {
	if v, ok := c[key]; ok {
		return v
	}
	for k, v := range c {
		if strings.EqualFold(k, key) {
			return v
		}
	}
	return ""
}

func (c headerCarrier) Set(key, value string) { c[key] = value }

func (c headerCarrier) Keys() []string {
	keys := make([]string, 0, len(c))
	for k := range c {
		keys = append(keys, k)
	}
	return keys
}

// withTraceContext returns a copy of headers whose trace context (the
// propagator's fields, in any case) is ctx's span: the event of a
// delivery, or of a message an adapter sends.
func withTraceContext(ctx context.Context, prop propagation.TextMapPropagator, fields []string, headers map[string]string) map[string]string {
	h := make(map[string]string, len(headers)+2)
	maps.Copy(h, headers)
	for _, f := range fields {
		deleteHeader(h, f)
	}
	prop.Inject(ctx, propagation.MapCarrier(h))
	return h
}

func hasHeader(h map[string]string, name string) bool {
	return headerCarrier(h).Get(name) != ""
}

func deleteHeader(h map[string]string, name string) {
	for k := range h {
		if strings.EqualFold(k, name) {
			delete(h, k)
		}
	}
}
