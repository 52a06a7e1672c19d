package webhook_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run if a test leaves goroutines behind: a relay that
// does not stop, a Sender request or test server left running.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
