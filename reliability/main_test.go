package reliability

import (
	"fmt"
	"os"
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run if a test leaves goroutines behind, and ends with
// a line per reason tests were skipped (set OUTBOX_TEST_FULL=1, or a
// database's variable, to run them): go test prints it with -v, or when
// the package fails.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(summary{m},
		// GORM's prepared-statement cache starts a janitor it never stops.
		goleak.IgnoreAnyFunction("gorm.io/gorm/internal/lru.NewLRU[...].func1"),
	)
}

// summary prints the skip summary after the tests, before goleak's check.
type summary struct{ m *testing.M }

func (s summary) Run() int {
	code := s.m.Run()
	fmt.Fprint(os.Stdout, skipSummary())
	return code
}
