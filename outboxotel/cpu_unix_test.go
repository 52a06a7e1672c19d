//go:build unix

package outboxotel_test

import (
	"syscall"
	"time"
)

// cpuTime is the CPU time this process has used (user and system): what
// the relay itself costs, which the load of other processes on the machine
// sways far less than wall-clock throughput.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
