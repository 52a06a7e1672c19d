package wire

import (
	"context"

	"github.com/gorm-outbox/outbox"
)

// Telemetry instruments the messages an adapter sends to a broker and the
// ones its consumer receives: spans, trace context on the message, and
// counters. Package outboxotel implements it with OpenTelemetry; the
// adapters depend on this interface only, so that they need no tracing
// library of their own.
//
// An adapter uses its Config's Telemetry, or else the one in the handler's
// context ([TelemetryFrom]), which outboxotel.Instrument puts there for
// every delivery; with neither, it sends and receives without spans.
type Telemetry interface {
	// StartSend starts the span of one message about to be sent for e (a
	// PRODUCER span "send {destination}"). It returns the span's context,
	// e with its trace context headers (traceparent, tracestate) rewritten
	// to that span, to be encoded into the message, and a function to call
	// once with the send's outcome.
	StartSend(ctx context.Context, op Operation, e outbox.Event) (context.Context, outbox.Event, func(error))

	// StartReceive starts the span of processing one received message,
	// decoded as e (a CONSUMER span "process {destination}"), as a child of
	// the trace context in e's headers and linked to it. It returns the
	// span's context, in which the consumer applies the message, and a
	// function to call once with the outcome.
	StartReceive(ctx context.Context, op Operation, e outbox.Event) (context.Context, func(error))
}

// Operation describes one send or receive to [Telemetry], in the terms of
// the OpenTelemetry messaging conventions.
type Operation struct {
	// System is the messaging system: "nats", "kafka", "rabbitmq",
	// "redis" or "http".
	System string
	// Destination is where the message goes or came from: a subject, a
	// topic, an exchange, a stream, a URL's host and path.
	Destination string
	// MessageID is the message's ID on the broker when it has one of its
	// own; "" means the event's ID.
	MessageID string
	// ConsumerGroup is the consumer's group or durable name, when it has
	// one.
	ConsumerGroup string
	// ServerAddress and ServerPort name the broker, when known.
	ServerAddress string
	ServerPort    int
}

type telemetryKey struct{}

// ContextWithTelemetry returns ctx carrying t, for the adapters called with
// it. outboxotel calls it for every delivery.
func ContextWithTelemetry(ctx context.Context, t Telemetry) context.Context {
	return context.WithValue(ctx, telemetryKey{}, t)
}

// TelemetryFrom returns the Telemetry ctx carries, or nil.
func TelemetryFrom(ctx context.Context) Telemetry {
	t, _ := ctx.Value(telemetryKey{}).(Telemetry)
	return t
}

// StartSend is what an adapter calls before a send: it uses t, or else
// ctx's Telemetry, and does nothing (returning ctx, e and a no-op) when
// there is neither.
func StartSend(ctx context.Context, t Telemetry, op Operation, e outbox.Event) (context.Context, outbox.Event, func(error)) {
	if t == nil {
		t = TelemetryFrom(ctx)
	}
	if t == nil {
		return ctx, e, func(error) {}
	}
	return t.StartSend(ctx, op, e)
}

// StartReceive is what a consumer calls before applying a message: it uses
// t, or else ctx's Telemetry, and does nothing when there is neither.
func StartReceive(ctx context.Context, t Telemetry, op Operation, e outbox.Event) (context.Context, func(error)) {
	if t == nil {
		t = TelemetryFrom(ctx)
	}
	if t == nil {
		return ctx, func(error) {}
	}
	return t.StartReceive(ctx, op, e)
}
