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
	"sync/atomic"
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

// AsyncHandler starts delivering one event and returns without waiting
// for its destination; wait blocks until the destination has the event
// (the broker's acknowledgement) and returns what a [Handler] would. A
// relay starts the deliveries of a batch one after the other, in batch
// order, with no wait between them, then calls each wait: a pipelined
// client (NATS's PublishMsgAsync, a Kafka produce with a promise, RabbitMQ's
// publisher confirms, a Redis pipeline) takes a batch in about one round
// trip instead of one per event. With [RelayConfig.OrderByAggregate] the
// relay starts an aggregate's next event only once the previous one's wait
// returned nil, so an aggregate's events reach the destination in order
// and none after one that failed; the handler only has to start the
// deliveries in the order it is called. Everywhere else (memory mode, a
// relay delivering an event one at a time) the event is delivered by
// calling wait at once.
//
// ctx bounds the whole delivery: wait must return once ctx is done. wait
// is called once, from any goroutine. Errors mean what they mean for a
// Handler: [Permanent], [Unavailable], [RetryAfter].
type AsyncHandler func(ctx context.Context, e Event) (wait func() error)

type route struct {
	eventType string
	h         Handler
	async     AsyncHandler // h, started; nil for a Handler
}

func (r *route) matches(eventType string) bool {
	return r.eventType == eventType || r.eventType == AnyEvent
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
	o.addRoute(route{eventType: eventType, h: h})
}

// HandleAsync registers h for events of type eventType, or for every event
// when eventType is "*" ([AnyEvent]), as [Outbox.Handle] registers a
// Handler: handlers of an event run in registration order, whichever kind
// they are. The broker adapters' AsyncHandler methods return one.
func (o *Outbox) HandleAsync(eventType string, h AsyncHandler) {
	if h == nil {
		panic("outbox: HandleAsync called with a nil AsyncHandler")
	}
	if eventType == "" {
		panic("outbox: HandleAsync called with an empty event type (use \"*\" for every event)")
	}
	o.addRoute(route{eventType: eventType, async: h, h: func(ctx context.Context, e Event) error {
		return h(ctx, e)()
	}})
}

func (o *Outbox) addRoute(r route) {
	o.mu.Lock()
	defer o.mu.Unlock()
	old := *o.handlers.Load()
	next := make([]route, len(old), len(old)+1)
	copy(next, old)
	next = append(next, r)
	o.handlers.Store(&next)
}

// pipelines reports whether an AsyncHandler is registered: a relay then
// delivers its batches in waves ([Outbox.deliverWave]).
func (o *Outbox) pipelines() bool {
	for _, r := range *o.handlers.Load() {
		if r.async != nil {
			return true
		}
	}
	return false
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
		if !r.matches(e.Type) {
			continue
		}
		matched = true
		if err := o.callHandler(ctx, r.h, e); err != nil {
			failed(err)
		}
	}
	return matched
}

// call is one event's delivery in a wave, with its context.
type call struct {
	ctx context.Context
	e   Event
}

// deliverWave delivers several events at once and returns each one's
// error, as [Outbox.deliver] would: the Deliver hooks wrap each event's
// delivery; inside them, the handlers run route by route in registration
// order, an AsyncHandler's deliveries all started (in the order of calls)
// before any is waited for, a Handler's called from up to workers
// goroutines.
func (o *Outbox) deliverWave(calls []call, workers int) []error {
	hs := o.hooks.Load()
	if hs == nil || len(hs.wrappers) == 0 {
		return o.matchingWave(calls, workers)
	}
	return o.hookedWave(hs.wrappers, calls, workers)
}

// matchingWave runs every handler each call's event matches.
func (o *Outbox) matchingWave(calls []call, workers int) []error {
	failed := make([][]error, len(calls))
	matched := make([]bool, len(calls))
	var idx []int
	for _, r := range *o.handlers.Load() {
		idx = idx[:0]
		for i := range calls {
			if r.matches(calls[i].e.Type) {
				idx = append(idx, i)
				matched[i] = true
			}
		}
		if len(idx) == 0 {
			continue
		}
		if r.async != nil {
			waits := make([]func() error, len(idx))
			for k, i := range idx {
				waits[k] = o.start(calls[i].ctx, r.async, calls[i].e)
			}
			for k, i := range idx {
				wait := waits[k]
				if err := o.callHandler(calls[i].ctx, func(context.Context, Event) error { return wait() }, calls[i].e); err != nil {
					failed[i] = append(failed[i], err)
				}
			}
			continue
		}
		var next atomic.Int64
		engine.Run(min(workers, len(idx)), func() {
			for k := int(next.Add(1)) - 1; k < len(idx); k = int(next.Add(1)) - 1 {
				i := idx[k]
				if err := o.callHandler(calls[i].ctx, r.h, calls[i].e); err != nil {
					failed[i] = append(failed[i], err)
				}
			}
		})
	}
	out := make([]error, len(calls))
	for i := range calls {
		if !matched[i] {
			out[i] = noHandler(calls[i].e)
		} else {
			out[i] = errors.Join(failed[i]...)
		}
	}
	return out
}

// start starts an AsyncHandler's delivery; a panic, or a nil wait, is the
// delivery's error.
func (o *Outbox) start(ctx context.Context, h AsyncHandler, e Event) func() error {
	var wait func() error
	err := o.callHandler(ctx, func(ctx context.Context, e Event) error {
		wait = h(ctx, e)
		if wait == nil {
			return errors.New("outbox: the AsyncHandler returned no wait function")
		}
		return nil
	}, e)
	if err != nil {
		return func() error { return err }
	}
	return wait
}

// A wave slot's states: its event's hooks are running, or have called
// next (parked: waiting for the wave's handlers), or have returned
// without calling it.
const (
	slotRunning int32 = iota
	slotParked
	slotDone
)

type waveSlotKey struct{}

// hookedWave is deliverWave through the Deliver hooks: each event's hooks
// run on a goroutine of its own, and the next they call parks the event
// (with the context and headers the hooks gave it) until every event of
// the wave has either parked or returned; the parked events are then
// delivered together and each next returns its event's error.
func (o *Outbox) hookedWave(wrappers []func(Handler) Handler, calls []call, workers int) []error {
	type slot struct {
		state  atomic.Int32
		parked call
		result chan error
	}
	slots := make([]slot, len(calls))
	arrived := make(chan struct{}, len(calls))
	park := func(ctx context.Context, e Event) error {
		i, ok := ctx.Value(waveSlotKey{}).(int)
		if !ok || !slots[i].state.CompareAndSwap(slotRunning, slotParked) {
			// next called twice, or with a context not derived from the
			// hook's: delivered on its own.
			return o.matching(ctx, e)
		}
		slots[i].parked = call{ctx: ctx, e: e}
		arrived <- struct{}{}
		return <-slots[i].result
	}
	chain := Handler(park)
	for i := len(wrappers) - 1; i >= 0; i-- {
		chain = wrappers[i](chain)
	}
	out := make([]error, len(calls))
	var wg sync.WaitGroup
	for i := range calls {
		slots[i].result = make(chan error, 1)
		wg.Go(func() {
			out[i] = o.callHandler(context.WithValue(calls[i].ctx, waveSlotKey{}, i), chain, calls[i].e)
			if slots[i].state.CompareAndSwap(slotRunning, slotDone) {
				arrived <- struct{}{}
			}
		})
	}
	for range calls {
		<-arrived
	}
	var (
		parked []call
		at     []int
	)
	for i := range slots {
		if slots[i].state.Load() == slotParked {
			parked, at = append(parked, slots[i].parked), append(at, i)
		}
	}
	for j, err := range o.matchingWave(parked, workers) {
		slots[at[j]].result <- err
	}
	wg.Wait()
	return out
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
