//go:build !unix

package outbox

import (
	"testing"
	"time"
)

// processCPU is 0 where getrusage is not available: the benchmarks'
// cpu-ns/op then reads 0.
func processCPU(*testing.B) time.Duration { return 0 }
