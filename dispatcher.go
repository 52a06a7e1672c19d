package outbox

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/gorm-outbox/outbox/internal/engine"
)

// Handler delivers one event: pushes it to a websocket, calls a webhook,
// publishes it to a broker. It receives the payload as json.RawMessage.
//
// Delivery is at least once: in persistent mode a handler can see the same
// event again (after a crash, a lost lease, or a failed "mark sent"), so it
// must be idempotent or deduplicate by [Event.ID]. Return an error to have
// the relay retry later, or wrap it with [Permanent] to fail the event at
// once. ctx carries a deadline that ends before the relay's claim on the
// event does.
type Handler func(ctx context.Context, e Event) error

// AnyEvent is the event type whose handlers receive every event.
const AnyEvent = "*"

type route struct {
	eventType string
	h         Handler
}

// Handle registers h for events of type eventType, or for every event when
// eventType is "*" ([AnyEvent]). Handlers of an event run in registration
// order. Register handlers before events can be dispatched (before starting
// a relay, or before the first commit in memory mode); handlers registered
// later apply to later deliveries only.
func (o *Outbox) Handle(eventType string, h Handler) {
	if h == nil {
		panic("outbox: Handle called with a nil Handler")
	}
	if eventType == "" {
		panic("outbox: Handle called with an empty event type (use \"*\" for every event)")
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	old := *o.handlers.Load()
	next := make([]route, len(old), len(old)+1)
	copy(next, old)
	next = append(next, route{eventType: eventType, h: h})
	o.handlers.Store(&next)
}

// deliver runs every handler that matches e, in registration order, and
// returns their errors joined (nil if all succeeded). A panic is recovered
// and becomes an error. An event no handler matches fails with ErrNoHandler
// so that it is never silently counted as delivered.
func (o *Outbox) deliver(ctx context.Context, e Event) error {
	var errs []error
	if !o.runHandlers(ctx, e, func(err error) { errs = append(errs, err) }) {
		return noHandler(e)
	}
	return errors.Join(errs...)
}

func noHandler(e Event) error { return fmt.Errorf("%w %q", ErrNoHandler, e.Type) }

func joinErrs(errs []error) error { return errors.Join(errs...) }

// runHandlers calls every handler that matches e, in registration order,
// passes each failure to failed, and reports whether any handler matched.
// Every mode dispatches through it, so they match handlers alike and all
// run the Deliver hooks ([Hooks]); with hooks, failed gets the one error
// the outermost hook returns.
func (o *Outbox) runHandlers(ctx context.Context, e Event, failed func(error)) (matched bool) {
	if hs := o.hooks.Load(); hs != nil && hs.deliver != nil {
		err := o.callHandler(ctx, hs.deliver, e)
		if errors.Is(err, ErrNoHandler) {
			return false
		}
		if err != nil {
			failed(err)
		}
		return true
	}
	return o.callMatching(ctx, e, failed)
}

// matching is the Handler the Deliver hooks wrap: every matching handler.
func (o *Outbox) matching(ctx context.Context, e Event) error {
	var errs []error
	if !o.callMatching(ctx, e, func(err error) { errs = append(errs, err) }) {
		return noHandler(e)
	}
	return errors.Join(errs...)
}

func (o *Outbox) callMatching(ctx context.Context, e Event, failed func(error)) (matched bool) {
	for _, r := range *o.handlers.Load() {
		if r.eventType != e.Type && r.eventType != AnyEvent {
			continue
		}
		matched = true
		if err := o.callHandler(ctx, r.h, e); err != nil {
			failed(err)
		}
	}
	return matched
}

// errHandlerPanic is wrapped by the error a recovered handler panic becomes.
var errHandlerPanic = errors.New("handler panicked")

// panicFrames is how many frames of the panicking code a recovered panic's
// error names. The error becomes the row's last_error, which the CLI and
// the dashboard show: a few frames say where, the full stack (logged
// once) says the rest, and the build machine's paths stay out of the table.
const panicFrames = 3

func (o *Outbox) callHandler(ctx context.Context, h Handler, e Event) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: %s", errHandlerPanic, panicText(r, panicSite()))
			o.logger.ErrorContext(ctx, "outbox: handler panicked", append(eventAttrs(e, err), slog.String("stack", string(debug.Stack())))...)
		}
	}()
	return h(ctx, e)
}

// panicSite names the innermost frames of the code that panicked, from
// the deferred function that recovered it: the frames below the runtime's
// panic machinery, function and file base name only.
func panicSite() []string {
	pcs := make([]uintptr, 32)
	frames := runtime.CallersFrames(pcs[:runtime.Callers(3, pcs)])
	var site []string
	for len(site) < panicFrames {
		f, more := frames.Next()
		switch {
		case f.Function == "":
		case strings.HasPrefix(f.Function, "runtime."):
			site = site[:0] // the panic machinery, and what called it
		case strings.HasSuffix(f.Function, ".(*Outbox).callHandler"):
			return site // the handler's frames end here
		default:
			site = append(site, fmt.Sprintf("%s (%s:%d)", f.Function, filepath.Base(f.File), f.Line))
		}
		if !more {
			break
		}
	}
	return site
}

// maxPanicValue bounds the panic value's text in the error.
const maxPanicValue = 512

func panicText(r any, site []string) string {
	s := engine.Truncate(fmt.Sprint(r), maxPanicValue)
	if len(site) > 0 {
		s += " at " + strings.Join(site, " < ")
	}
	return s
}

// dispatchMemory hands committed memory-mode events to their handlers. A
// handler's error or panic is logged and affects neither the committed
// transaction nor the other handlers.
func (o *Outbox) dispatchMemory(ctx context.Context, events []encoded) {
	start := time.Now()
	for i := range events {
		if !o.keys.first(events[i].IdempotencyKey) {
			continue // first write wins, as in persistent mode
		}
		e := Event(events[i].Received())
		observe := o.observesDeliveries()
		var (
			began = time.Now()
			errs  []error
		)
		matched := o.runHandlers(ctx, e, func(err error) {
			o.logger.ErrorContext(ctx, "outbox: handler failed", eventAttrs(e, err)...)
			if observe {
				errs = append(errs, err)
			}
		})
		if !matched {
			o.logger.WarnContext(ctx, "outbox: no handler for event; dropped (memory mode)", eventAttrs(e, nil)...)
		}
		if observe {
			o.delivered(memoryDelivery(e, errs, matched, began, start))
		}
	}
}

// memoryKeys is how many idempotency keys memory mode remembers.
const memoryKeys = 10000

// recentKeys remembers the most recent idempotency keys memory mode
// dispatched, so that a duplicate is skipped as persistent mode skips it;
// the oldest are forgotten first.
type recentKeys struct {
	mu   sync.Mutex
	set  map[string]struct{}
	ring []string
	next int
}

// first records key and reports whether it was not already there.
func (k *recentKeys) first(key string) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	if _, ok := k.set[key]; ok {
		return false
	}
	if k.set == nil {
		k.set = make(map[string]struct{}, memoryKeys)
		k.ring = make([]string, memoryKeys)
	}
	if old := k.ring[k.next]; old != "" {
		delete(k.set, old)
	}
	k.ring[k.next] = key
	k.next = (k.next + 1) % memoryKeys
	k.set[key] = struct{}{}
	return true
}

// eventAttrs are the log attributes of an event: identifiers only, never the
// payload or headers, which may hold personal data.
func eventAttrs(e Event, err error) []any {
	attrs := []any{
		slog.String("event_id", e.ID),
		slog.String("event_type", e.Type),
	}
	if e.AggregateType != "" || e.AggregateID != "" {
		attrs = append(attrs, slog.String("aggregate_type", e.AggregateType), slog.String("aggregate_id", e.AggregateID))
	}
	if err != nil {
		attrs = append(attrs, slog.Any("error", err))
	}
	return attrs
}
