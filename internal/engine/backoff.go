package engine

import (
	"sync"
	"time"
)

// Backoff is the relay's one family of waits between tries: Min first,
// then doubling, up to Max, until Reset.
type Backoff struct {
	Min, Max time.Duration
	cur      time.Duration
}

// Next is the wait before the next try.
func (b *Backoff) Next() time.Duration {
	if b.cur == 0 {
		b.cur = b.Min
	} else {
		b.cur = min(2*b.cur, b.Max)
	}
	return b.cur
}

// Peek is the wait Next would return, without moving on.
func (b *Backoff) Peek() time.Duration {
	if b.cur == 0 {
		return b.Min
	}
	return min(2*b.cur, b.Max)
}

// Reset starts again from Min.
func (b *Backoff) Reset() { b.cur = 0 }

// Episode is a condition logged once when it starts and once when it ends
// (a database that cannot be reached, a destination that is down), not at
// every try. It is safe for concurrent use, so that the loops of one relay
// share an episode and say it once.
type Episode struct {
	mu    sync.Mutex
	on    bool
	since time.Time
}

// Begin reports whether the condition starts now (false while it lasts).
func (e *Episode) Begin() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.on {
		return false
	}
	e.on, e.since = true, time.Now()
	return true
}

// End reports whether the condition was on, and for how long.
func (e *Episode) End() (bool, time.Duration) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.on {
		return false, 0
	}
	e.on = false
	return true, time.Since(e.since)
}

// On reports whether the condition lasts.
func (e *Episode) On() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.on
}

// Sleep waits d or until ctx ends.
func Sleep(ctx interface{ Done() <-chan struct{} }, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}
