// Package ring owns the shared-memory heap ring between the ibvbridge producer and its consumers (layout
// 2.x of docs/ring-layout.md; layout.go is that document as constants): the producer that creates a ring,
// serves its consumers and publishes assembled heaps into it, and a Go consumer.
//
// A ring is three kinds of sealed memfd handed over a Unix SOCK_SEQPACKET socket in the ring directory
// (dir.go, lookup.go): the control memory (header, head cursor, counters, consumer table) and the data
// memory (descriptors, item tables, metadata, payload slots, on hugepages when there are any), both
// read-only for consumers, and one small region per consumer, the only memory a consumer writes (its
// cursor and wait flags) and which the producer never trusts. Nothing is a file in /dev/shm; a producer's
// death is its socket's hang-up.
//
// The fast path takes no lock and makes no system call: producer and consumer exchange free-running
// cursors through typed atomics over the mapping (u64at/u32at) and sleep on a futex only after announcing
// it. A consumer copies each descriptor and item table before validating it, and under the drop policy a
// consumer that falls a whole ring behind is detached as overrun before any slot it holds is reused: a
// heap's bytes are the heap's while Consumer.Valid says so (validate after read, layout 2.1).
//
// Tests make rings with the ringtest package.
package ring
