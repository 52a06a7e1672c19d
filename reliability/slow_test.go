package reliability

import (
	"fmt"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"
)

// slowdownEnv multiplies every bound below by a factor of one's own, for a
// machine one knows to be slow beyond what the load average says.
const slowdownEnv = "OUTBOX_TEST_SLOWDOWN"

// slowdown is how many times slower than an idle machine this run may be,
// now: the race detector's cost (about 2x), times the load on the
// machine's CPUs (the 1-minute load average per CPU, when above 1: other
// packages' tests, other jobs), times OUTBOX_TEST_SLOWDOWN. The bounds that
// only guard against a hang (how long to wait for a condition, for a child
// to start, for Run to return) are multiplied by it, so that a slow machine
// makes a test slower, never failed.
func slowdown() float64 {
	f := 1.0
	if raceEnabled {
		f *= 2
	}
	f *= loadFactor()
	if v, err := strconv.ParseFloat(os.Getenv(slowdownEnv), 64); err == nil && v > 0 {
		f *= v
	}
	return f
}

// loadFactor is the load part of slowdown alone: the 1-minute load average
// per CPU when above 1. byLoad multiplies d by it, for the bounds on
// latencies that the race detector does not lengthen much but a busy
// machine does.
func loadFactor() float64 {
	if b, err := os.ReadFile("/proc/loadavg"); err == nil {
		if fields := strings.Fields(string(b)); len(fields) > 0 {
			if load, err := strconv.ParseFloat(fields[0], 64); err == nil {
				return math.Max(1, load/float64(runtime.NumCPU()))
			}
		}
	}
	return 1
}

func byLoad(d time.Duration) time.Duration { return time.Duration(float64(d) * loadFactor()) }

// scaled is d multiplied by slowdown.
func scaled(d time.Duration) time.Duration { return time.Duration(float64(d) * slowdown()) }

// bound is scaled(d), but never past the test's own deadline (go test
// -timeout) less a minute, so that the test still fails with its own
// message, not the timeout's panic.
func bound(t testing.TB, d time.Duration) time.Duration {
	d = scaled(d)
	if dt, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if deadline, ok := dt.Deadline(); ok {
			if left := time.Until(deadline) - time.Minute; left < d {
				d = max(left, time.Second)
			}
		}
	}
	return d
}

// childTimeout is the -test.timeout of a child process (this test binary
// re-executed): the parent's own time left, so that a child living as
// long as its parent's test (a relay killed at random, which a slow machine
// may leave alive for many minutes) is never ended by a timeout of its
// own. Children also stop when their parent goes away (it holds their
// stdin).
func childTimeout(t testing.TB) string {
	if dt, ok := t.(interface{ Deadline() (time.Time, bool) }); ok {
		if deadline, ok := dt.Deadline(); ok {
			return "-test.timeout=" + (time.Until(deadline) + time.Minute).Round(time.Second).String()
		}
	}
	return "-test.timeout=0"
}

// waitDrained waits until remaining returns 0 (and no error), failing the
// test only when it has not gone down for bound(stall): a slow machine
// drains slowly, a defect does not drain at all. remaining returns what is
// left (or -1 when it could not tell) and, optionally, an error that
// describes it. It returns how long the drain took.
func waitDrained(t testing.TB, stall time.Duration, remaining func() (int64, error)) time.Duration {
	t.Helper()
	start := time.Now()
	best, bestAt := int64(math.MaxInt64), time.Now()
	var lastErr error
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		n, err := remaining()
		if n == 0 && err == nil {
			return time.Since(start)
		}
		if n >= 0 && n < best {
			best, bestAt = n, time.Now()
		}
		if lastErr = err; lastErr == nil {
			lastErr = fmt.Errorf("%d left", n)
		}
		if limit := bound(t, stall); time.Since(bestAt) > limit {
			t.Fatalf("not drained after %v: no progress for %v (%v; slowdown %.1f)", time.Since(start).Round(time.Millisecond), limit.Round(time.Millisecond), lastErr, slowdown())
		}
		<-tick.C
	}
}
