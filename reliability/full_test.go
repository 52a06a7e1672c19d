package reliability

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/gorm-outbox/outbox/internal/testenv"
)

// skips records the tests skipped for a reason worth a line at the end of
// the run (TestMain prints it; go test shows it with -v, or when the
// package fails).
var skips struct {
	sync.Mutex
	byReason map[string][]string
}

func noteSkip(reason, test string) {
	skips.Lock()
	defer skips.Unlock()
	if skips.byReason == nil {
		skips.byReason = map[string][]string{}
	}
	skips.byReason[reason] = append(skips.byReason[reason], test)
}

// skipSummary is the lines TestMain prints after the run, one per reason.
func skipSummary() string {
	skips.Lock()
	defer skips.Unlock()
	var b strings.Builder
	reasons := make([]string, 0, len(skips.byReason))
	for r := range skips.byReason {
		reasons = append(reasons, r)
	}
	slices.Sort(reasons)
	for _, r := range reasons {
		tests := slices.Clone(skips.byReason[r])
		slices.Sort(tests)
		fmt.Fprintf(&b, "reliability: %d skipped (%s): %s\n", len(tests), r, strings.Join(tests, ", "))
	}
	return b.String()
}

// long marks one of the long suites (crash, faults, server restarts,
// failover, clusters of its own, ordering under kills): it runs with
// OUTBOX_TEST_FULL=1, or when -run selects tests by name (RELIABILITY.md's
// commands), and skips otherwise, saying why. what says what the test
// does that makes it long.
func long(t *testing.T, what string) {
	t.Helper()
	if testenv.Full() || testenv.Selected() {
		return
	}
	noteSkip(testenv.FullEnv+" is not set", t.Name())
	testenv.Long(t, what)
}

// strict: a missing prerequisite (PostgreSQL's server binaries) fails the
// test instead of skipping it (testenv.Strict).
func strict() bool { return testenv.Strict() }
