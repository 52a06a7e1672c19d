package main

import (
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// cpuTimes is what the machine and this process have spent on the CPU so
// far. On a shared machine a throughput moves with the other tenants' load;
// the CPU a transaction costs moves far less, and on 2 cores with 8 writers
// it is what sets the throughput. Linux only: elsewhere ok is false.
type cpuTimes struct {
	machine time.Duration // every CPU's user, nice, system, irq and softirq time
	self    time.Duration // this process's user and system time
	ok      bool
}

// clockTick is USER_HZ, the unit of /proc/stat: 100 on every Linux
// architecture Go supports.
const clockTick = 10 * time.Millisecond

func readCPU() cpuTimes {
	var c cpuTimes
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return c
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 8 || f[0] != "cpu" {
		return c
	}
	// user nice system idle iowait irq softirq [steal ...]
	for _, i := range []int{1, 2, 3, 6, 7} {
		v, err := strconv.ParseInt(f[i], 10, 64)
		if err != nil {
			return c
		}
		c.machine += time.Duration(v) * clockTick
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return c
	}
	c.self = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	c.ok = true
	return c
}

// sub is c minus an earlier reading.
func (c cpuTimes) sub(earlier cpuTimes) cpuTimes {
	return cpuTimes{machine: c.machine - earlier.machine, self: c.self - earlier.self, ok: c.ok && earlier.ok}
}

func (c cpuTimes) add(o cpuTimes) cpuTimes {
	return cpuTimes{machine: c.machine + o.machine, self: c.self + o.self, ok: c.ok && o.ok}
}
