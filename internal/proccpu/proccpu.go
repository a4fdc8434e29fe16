// Package proccpu owns one measurement: the CPU time this process has used (getrusage), which recv
// reports at its end and the benchmarks compare.
package proccpu

import (
	"time"

	"golang.org/x/sys/unix"
)

// Used is the CPU time (user + system) this process has used so far; 0 if the kernel will not say.
func Used() time.Duration {
	var ru unix.Rusage
	if err := unix.Getrusage(unix.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
