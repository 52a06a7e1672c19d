package outboxui_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run if a test leaves goroutines behind: a relay that
// does not stop, a server or database a test does not close.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
