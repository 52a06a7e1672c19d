//go:build !unix

package outboxotel_test

import "time"

// cpuTime is not measured here; the benchmarks report 0 µs-cpu/event.
func cpuTime() time.Duration { return 0 }
