package main

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the run if a test leaves goroutines behind: a command that
// returns with its relay, dashboard server or database still running.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
