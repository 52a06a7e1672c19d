package rabbitmq

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run if a test leaves goroutines behind: a relay that
// does not stop, a Publisher whose session loop outlives Close.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
