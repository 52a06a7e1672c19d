package engine

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/gorm-outbox/outbox/internal/errs"
	"github.com/gorm-outbox/outbox/internal/store"
)

// Kind is what an attempt came to.
type Kind int

const (
	// Deferred: not delivered and no attempt counted: never started (the
	// batch stopped), held behind its aggregate, or handed back by a
	// destination that is down.
	Deferred Kind = iota
	// Sent: delivered.
	Sent
	// Failed: the attempt failed; Result.Out says whether it is retried.
	Failed
)

// Result is one item's outcome in a batch.
type Result struct {
	Kind Kind
	// Out, when Failed: the row's next status (pending for a retry, failed
	// for good), error text and due time.
	Out store.Outcome
	// Down, when Deferred by the handler: the destination's Unavailable
	// error.
	Down error
}

// Outcome is what the attempt came to: "sent", "retry", "failed" or
// "handed_back" (outbox.Outcome).
func (r Result) Outcome() string {
	switch {
	case r.Kind == Sent:
		return "sent"
	case r.Kind == Failed && r.Out.Status == "failed":
		return "failed"
	case r.Kind == Failed:
		return "retry"
	}
	return "handed_back"
}

// Status is the row's status after the result.
func (r Result) Status() string {
	switch r.Kind {
	case Sent:
		return "sent"
	case Failed:
		return r.Out.Status
	}
	return "pending"
}

// Policy turns a handler's error into an attempt's result: the one
// retry, backoff and give-up rule of every mode.
type Policy struct {
	MaxAttempts int
	Backoff     func(attempt int) time.Duration
	Now         func() time.Time
	Logger      *slog.Logger
	// Attrs are an event's log attributes (identifiers only).
	Attrs func(e *Event, err error) []any
}

// Decide is the result of an attempt that returned err.
func (p *Policy) Decide(it *Item, err error) Result {
	switch {
	case err == nil:
		return Result{Kind: Sent}
	case errs.IsUnavailable(err) && !errs.IsPermanent(err):
		// The destination is down, not this event: handed back without
		// counting the attempt; the relay pauses and probes.
		return Result{Kind: Deferred, Down: err}
	}
	out := store.Outcome{Seq: it.Seq, ID: it.Event.ID, Status: "pending", Err: LastError(err)}
	now := p.Now()
	if errs.IsPermanent(err) || it.Attempts >= p.MaxAttempts {
		out.Status, out.Due = "failed", now
		p.Logger.Error("outbox: event failed for good; it stays in the table until replayed",
			append(p.Attrs(&it.Event, err), slog.Int("attempts", it.Attempts))...)
		return Result{Kind: Failed, Out: out}
	}
	delay, ok := errs.RetryDelay(err)
	if !ok {
		delay = p.Backoff(it.Attempts)
	}
	out.Due = now.Add(delay).Truncate(time.Microsecond)
	p.Logger.Warn("outbox: delivery failed; will retry",
		append(p.Attrs(&it.Event, err), slog.Int("attempts", it.Attempts), slog.Time("retry_at", out.Due))...)
	return Result{Kind: Failed, Out: out}
}

// Abandoned is the error of an item claimed more often than allowed
// without an outcome ever being recorded: its relays keep dying or losing
// the lease while delivering it.
func (p *Policy) Abandoned(it *Item) error {
	if it.Attempts <= p.MaxAttempts {
		return nil
	}
	return errs.Permanent(fmt.Errorf("outbox: abandoned after %d claims without an outcome (the relay holding it stopped or lost its lease each time)", it.Attempts))
}

// maxLastError bounds the last_error column: enough for an error chain,
// not unbounded.
const maxLastError = 4 << 10

// LastError is err's text as every database's text column takes it: valid
// UTF-8 without NUL bytes (PostgreSQL refuses both, and would fail the
// whole batch's outcome write), at most maxLastError bytes.
func LastError(err error) string {
	s := strings.ToValidUTF8(err.Error(), "\uFFFD")
	s = strings.ReplaceAll(s, "\x00", "\uFFFD")
	return Truncate(s, maxLastError)
}

// Truncate cuts s to at most n bytes on a rune boundary, marking the cut.
func Truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	// Cut on a rune boundary so the column stays valid UTF-8.
	for n > 0 && n < len(s) && s[n]&0xC0 == 0x80 {
		n--
	}
	return s[:n] + "…"
}
