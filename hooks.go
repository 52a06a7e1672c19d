package outbox

import (
	"context"
	"maps"
	"slices"
	"time"

	"github.com/gorm-outbox/outbox/internal/encode"
)

// Hooks are the extension points instrumentation plugs into: tracing that
// carries a request's trace context through the table to the consumers,
// metrics of every delivery. The OpenTelemetry module
// (github.com/gorm-outbox/outbox/outboxotel) is built on them; the core
// itself imports no instrumentation library. Every field is optional.
type Hooks struct {
	// Publish is called by [Publish], and so by a [Recorder]'s harvest, for
	// every event, with the publishing statement's context, before the
	// event is validated and stored: it may add headers, such as trace
	// context. e is the event's own copy, its ID already assigned; its
	// Headers map is a copy of the caller's (nil when there are none), so
	// the hook may change it. What the hook leaves is validated like any
	// event.
	Publish func(ctx context.Context, e *Event)

	// Stored is called by [Publish], once it is done with them, for every
	// event it was given, with the same e the Publish hooks received (so a
	// hook may key state of its own on the pointer): stored reports
	// whether the event was written. In [Persistent] mode that is an
	// INSERT on the publishing transaction (committed or rolled back with
	// it); in [Logical] mode, the message emitted into its WAL; in
	// [Memory] mode, the event queued for after the commit. stored is
	// false for every event of a Publish call that returns an error (or
	// that a panic ends), on a dry run (gorm.Session{DryRun: true}), and,
	// in Persistent mode, for an event skipped as a duplicate of one the
	// table holds (its idempotency key is taken). Logical and Memory mode
	// tell duplicates apart only when they deliver. e must not be changed.
	Stored func(ctx context.Context, e *Event, stored bool)

	// Deliver wraps the delivery of one event, in every mode (a relay's
	// attempt, memory mode's after-commit dispatch). next calls every
	// handler the event matches, in registration order, and returns their
	// errors joined, or an error wrapping [ErrNoHandler] when no handler
	// matches; what the wrapped handler returns is the delivery's outcome.
	// ctx carries the attempt ([Attempt]); e is the handlers' copy, so the
	// wrapper may change its headers for them. A panic is recovered as a
	// handler's is.
	Deliver func(next Handler) Handler

	// Duplicate is called by [Consume] for a message the consumer has
	// already consumed (a redelivery): its function was not called, and
	// Consume returns nil. Consume also logs it at Debug. It must be fast
	// and safe for concurrent use (outboxotel counts them).
	Duplicate func(ctx context.Context, consumer, messageID string)

	// Delivered is called after every delivery attempt with its outcome
	// and timings, from the delivering goroutine, for every relay of this
	// Outbox: build metrics or traces on it (package outboxotel does). In
	// memory mode too, after each event's dispatch, with Attempt 0, Status
	// StatusSent or StatusFailed (memory mode does not retry), and Latency
	// counted from the start of the after-commit dispatch. It must be fast
	// and safe for concurrent use.
	Delivered func(Delivery)
}

// hookSet is the hooks added so far, composed; replaced as a whole.
type hookSet struct {
	publish   []func(context.Context, *Event)
	stored    []func(context.Context, *Event, bool)
	deliver   Handler // the Deliver wrappers around matching; nil when none
	wrappers  []func(Handler) Handler
	delivered []func(Delivery)
	duplicate []func(context.Context, string, string)
}

// AddHooks installs h on o. Hooks added earlier run first: their Publish
// before a later one's, their Deliver wrapped around a later one's. Add
// hooks before events are published or dispatched; like [Outbox.Handle],
// AddHooks is safe for concurrent use but applies to later events only.
func (o *Outbox) AddHooks(h Hooks) {
	o.mu.Lock()
	defer o.mu.Unlock()
	next := &hookSet{}
	if old := o.hooks.Load(); old != nil {
		next.publish = slices.Clone(old.publish)
		next.stored = slices.Clone(old.stored)
		next.wrappers = slices.Clone(old.wrappers)
		next.delivered = slices.Clone(old.delivered)
		next.duplicate = slices.Clone(old.duplicate)
	}
	if h.Publish != nil {
		next.publish = append(next.publish, h.Publish)
	}
	if h.Stored != nil {
		next.stored = append(next.stored, h.Stored)
	}
	if h.Deliver != nil {
		next.wrappers = append(next.wrappers, h.Deliver)
	}
	if h.Delivered != nil {
		next.delivered = append(next.delivered, h.Delivered)
	}
	if h.Duplicate != nil {
		next.duplicate = append(next.duplicate, h.Duplicate)
	}
	if len(next.wrappers) > 0 {
		next.deliver = o.matching
		for i := len(next.wrappers) - 1; i >= 0; i-- {
			next.deliver = next.wrappers[i](next.deliver)
		}
	}
	o.hooks.Store(next)
}

// publishHooks runs the Publish hooks on copies of events and returns the
// copies, or events itself when no hook looks at them. The copies are
// appended to *seen as each is handed to the hooks, which a panic in one
// leaves as far as it got. generated reports, per event, that its ID and
// key were both left to the outbox: an ID assigned here so that the hooks
// see the one stored is still a generated one, unless a hook changed it
// or set a key.
func (o *Outbox) publishHooks(ctx context.Context, hs *hookSet, events []Event, seen *[]Event) (out []Event, generated []bool, err error) {
	if hs == nil || len(hs.publish)+len(hs.stored) == 0 {
		return events, nil, nil
	}
	*seen = make([]Event, 0, len(events)) // never grown: the hooks keep pointers into it
	generated = make([]bool, len(events))
	for i, e := range events {
		gen := e.ID == "" && e.IdempotencyKey == ""
		if e.ID == "" {
			id, err := encode.NewID()
			if err != nil {
				return nil, nil, err
			}
			e.ID = id
		}
		assigned := e.ID
		e.Headers = maps.Clone(e.Headers)
		*seen = append(*seen, e)
		for _, f := range hs.publish {
			f(ctx, &(*seen)[i])
		}
		generated[i] = gen && (*seen)[i].ID == assigned && (*seen)[i].IdempotencyKey == ""
	}
	return *seen, generated, nil
}

// storedHooks reports to the Stored hooks which of events were written:
// none when err is set, all but the skipped ones otherwise.
func (o *Outbox) storedHooks(ctx context.Context, hs *hookSet, events []Event, skipped []bool, err error) {
	if hs == nil || len(hs.stored) == 0 {
		return
	}
	for i := range events {
		stored := err == nil && (skipped == nil || !skipped[i])
		for _, f := range hs.stored {
			f(ctx, &events[i], stored)
		}
	}
}

// delivered reports d to the Delivered hooks.
func (o *Outbox) delivered(d Delivery) {
	if hs := o.hooks.Load(); hs != nil {
		for _, f := range hs.delivered {
			f(d)
		}
	}
}

// observesDeliveries reports whether a Delivered hook is installed, so
// that memory mode times its dispatch only then.
func (o *Outbox) observesDeliveries() bool {
	hs := o.hooks.Load()
	return hs != nil && len(hs.delivered) > 0
}

// memoryDelivery is the Delivery memory mode reports for one event.
func memoryDelivery(e Event, errs []error, matched bool, began, dispatchStart time.Time) Delivery {
	d := Delivery{Event: e, Outcome: OutcomeSent, Status: StatusSent, Duration: time.Since(began), Latency: time.Since(dispatchStart)}
	switch {
	case !matched:
		d.Outcome, d.Status, d.Err = OutcomeFailed, StatusFailed, noHandler(e)
	case len(errs) > 0:
		d.Outcome, d.Status, d.Err = OutcomeFailed, StatusFailed, joinErrs(errs)
	}
	return d
}
