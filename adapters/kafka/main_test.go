package kafka_test

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run if a test leaves goroutines behind: a relay that
// does not stop, a Producer whose franz-go client is not closed.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
