// Package version owns ibvbridge's one version number: the Go binary's --version, the version a producer
// writes into a ring's control memory (producer_version, spec §2) and, by TestOneVersionEverywhere, the C
// library's pkg-config Version and the Python package's version, which carry the same number.
package version

// Version is the release of ibvbridge: the Go tools, the C library (its pkg-config Version; the soname,
// libibvbridge.so.N, is the ABI and moves on its own) and the Python package.
const Version = "0.3.0"

// Producer is what a Go producer writes into a ring's producer_version field: the program and its
// version.
func Producer(program string) string { return program + " " + Version }
