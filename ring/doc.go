// Package ring owns the shared-memory heap ring between the ibvbridge producer and its consumers: the file
// layout of docs/ring-layout.md (layout.go is that document as constants), the producer that creates the
// ring and publishes assembled heaps into it, and a Go consumer.
//
// A ring is a control file in /dev/shm (cursors, wait flags, counters; writable by the consumer) and a data
// file on hugetlbfs (descriptors, item tables, payload slots; read-only for the consumer). Producer and
// consumer never take a lock or make a syscall on the fast path: they exchange free-running cursors with
// acquire/release atomics, and sleep on a futex only after announcing it.
package ring
