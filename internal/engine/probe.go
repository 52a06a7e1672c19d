package engine

import (
	"time"

	"github.com/gorm-outbox/outbox/internal/errs"
)

// The pace of deliveries while a destination is down: from ProbeMin,
// doubling, to ProbeMax between probes, or what the destination asked for
// (a RetryAfter inside its Unavailable error), bounded by MaxProbePause.
const (
	ProbeMin      = 500 * time.Millisecond
	ProbeMax      = 5 * time.Second
	MaxProbePause = 10 * time.Minute
)

// Probe paces a loop's deliveries while a destination is down: every
// source's loop pauses by it.
type Probe struct{ b Backoff }

// Pause is the wait after a batch that down refused.
func (p *Probe) Pause(down error) time.Duration {
	if p.b.Min == 0 {
		p.b = Backoff{Min: ProbeMin, Max: ProbeMax}
	}
	next := p.b.Next()
	if d, ok := errs.RetryDelay(down); ok {
		return min(d, MaxProbePause)
	}
	return next
}

// Reset starts from ProbeMin again: a delivery went through.
func (p *Probe) Reset() { p.b.Reset() }
