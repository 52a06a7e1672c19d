package outboxotel

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/semconv/v1.43.0/messagingconv"
	"go.opentelemetry.io/otel/trace"

	"github.com/gorm-outbox/outbox"
	"github.com/gorm-outbox/outbox/wire"
)

// Messaging returns the [wire.Telemetry] the broker adapters report their
// sends and their consumers' receives through, with the providers and
// propagator of opts ([WithTracerProvider], [WithMeterProvider],
// [WithPropagator]; the other options do not apply). [Instrument] hands
// one to every delivery's handlers, so a publisher needs no setting; give
// one to a consumer's Config (Telemetry), which runs outside deliveries.
//
// Each send is a PRODUCER span "send {destination}" (a child of the
// delivery's process span) whose trace context the adapter writes into the
// message; each message a consumer applies is a CONSUMER span "process
// {destination}", a child of the message's trace context (or of the span
// already in the consumer's ctx, such as an HTTP server's) and linked to
// it. Both carry messaging.system (the adapter's: nats, kafka, rabbitmq,
// redis, http), messaging.operation.type and .name, messaging.destination.name,
// messaging.message.id, messaging.consumer.group.name (consumers with a
// group), server.address and server.port when the adapter knows them,
// and on failure error.type and an error status.
//
// Metrics, per the semantic conventions: messaging.client.sent.messages
// and messaging.client.operation.duration (s) for sends,
// messaging.client.consumed.messages and messaging.process.duration (s)
// for received messages, each with error.type on failure.
func Messaging(opts ...Option) (wire.Telemetry, error) {
	var c config
	for _, o := range opts {
		o(&c)
	}
	return newMessaging(c)
}

// messaging implements wire.Telemetry.
type messaging struct {
	tracer   trace.Tracer
	prop     propagation.TextMapPropagator
	fields   []string
	sent     messagingconv.ClientSentMessages
	consumed messagingconv.ClientConsumedMessages
	sendDur  messagingconv.ClientOperationDuration
	procDur  metric.Float64Histogram
}

func newMessaging(c config) (*messaging, error) {
	tp, mp, prop := c.tp, c.mp, c.prop
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	if prop == nil {
		prop = propagation.TraceContext{}
	}
	m := mp.Meter(ScopeName)
	ms := &messaging{tracer: tp.Tracer(ScopeName), prop: prop, fields: prop.Fields()}
	var errs [4]error
	ms.sent, errs[0] = messagingconv.NewClientSentMessages(m)
	ms.consumed, errs[1] = messagingconv.NewClientConsumedMessages(m)
	ms.sendDur, errs[2] = messagingconv.NewClientOperationDuration(m, metric.WithExplicitBucketBoundaries(durationBuckets...))
	// The same instrument as the outbox's own process duration: the
	// system attribute tells them apart.
	ms.procDur, errs[3] = m.Float64Histogram(messagingconv.ProcessDuration{}.Name(),
		metric.WithDescription("Duration of one delivery attempt's handlers."),
		metric.WithUnit("s"),
		metric.WithExplicitBucketBoundaries(durationBuckets...))
	if err := errors.Join(errs[:]...); err != nil {
		return nil, fmt.Errorf("outboxotel: create messaging instruments: %w", err)
	}
	return ms, nil
}

// attributes are op's span and metric attributes beside the operation's.
func (ms *messaging) attributes(op wire.Operation, e outbox.Event) (span, met []attribute.KeyValue) {
	met = make([]attribute.KeyValue, 0, 6)
	met = append(met, semconv.MessagingSystemKey.String(op.System))
	if op.Destination != "" {
		met = append(met, semconv.MessagingDestinationName(op.Destination))
	}
	if op.ConsumerGroup != "" {
		met = append(met, semconv.MessagingConsumerGroupName(op.ConsumerGroup))
	}
	if op.ServerAddress != "" {
		met = append(met, semconv.ServerAddress(op.ServerAddress))
		if op.ServerPort > 0 {
			met = append(met, semconv.ServerPort(op.ServerPort))
		}
	}
	id := op.MessageID
	if id == "" {
		id = e.ID
	}
	span = append(append(make([]attribute.KeyValue, 0, len(met)+3), met...), semconv.MessagingMessageID(id))
	return span, met
}

// StartSend implements [wire.Telemetry].
func (ms *messaging) StartSend(ctx context.Context, op wire.Operation, e outbox.Event) (context.Context, outbox.Event, func(error)) {
	spanAttrs, metAttrs := ms.attributes(op, e)
	spanAttrs = append(spanAttrs, semconv.MessagingOperationTypeSend, semconv.MessagingOperationName("send"))
	ctx, span := ms.tracer.Start(ctx, "send "+op.Destination, producerKind, trace.WithAttributes(spanAttrs...))

	e.Headers = withTraceContext(ctx, ms.prop, ms.fields, e.Headers)

	start := time.Now()
	return ctx, e, func(err error) {
		attrs := endSpan(span, err, metAttrs)
		sys := messagingconv.SystemAttr(op.System)
		ms.sent.Add(context.Background(), 1, "send", sys, attrs...)
		ms.sendDur.Record(context.Background(), time.Since(start).Seconds(), "send", sys, attrs...)
	}
}

// StartReceive implements [wire.Telemetry].
func (ms *messaging) StartReceive(ctx context.Context, op wire.Operation, e outbox.Event) (context.Context, func(error)) {
	spanAttrs, metAttrs := ms.attributes(op, e)
	spanAttrs = append(spanAttrs, semconv.MessagingOperationTypeProcess, semconv.MessagingOperationName("process"))
	opts := []trace.SpanStartOption{consumerKind, trace.WithAttributes(spanAttrs...)}
	parent := ctx
	if sent := trace.SpanContextFromContext(ms.prop.Extract(context.Background(), headerCarrier(e.Headers))); sent.IsValid() {
		opts = append(opts, trace.WithLinks(trace.Link{SpanContext: sent}))
		if !trace.SpanContextFromContext(ctx).IsValid() {
			parent = trace.ContextWithRemoteSpanContext(ctx, sent)
		}
	}
	ctx, span := ms.tracer.Start(parent, "process "+op.Destination, opts...)
	start := time.Now()
	return ctx, func(err error) {
		attrs := endSpan(span, err, metAttrs)
		ms.consumed.Add(context.Background(), 1, "process", messagingconv.SystemAttr(op.System), attrs...)
		ms.procDur.Record(context.Background(), time.Since(start).Seconds(),
			metric.WithAttributes(append(attrs, semconv.MessagingOperationName("process"))...))
	}
}

// endSpan ends span with err's outcome and returns the metric attributes
// with error.type added for a failure.
func endSpan(span trace.Span, err error, attrs []attribute.KeyValue) []attribute.KeyValue {
	if err != nil {
		t := semconv.ErrorTypeKey.String(errorType(err))
		attrs = append(attrs[:len(attrs):len(attrs)], t)
		span.SetAttributes(t)
		span.RecordError(err)
		span.SetStatus(codes.Error, t.Value.AsString())
	}
	span.End()
	return attrs
}
