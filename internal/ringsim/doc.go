// Package ringsim owns the deterministic simulation of the ring's consumer and group protocol (layout 2.2,
// docs/ring-layout.md §7 and §14): a reference model of the producer written from the spec, a seeded
// generator of operations (attach, detach, death, stalls, reads, holds, releases, bogus cursors, row reuse,
// publishing, end of stream, under drop and block), the invariants checked after every step, and drivers
// that play the same operations against the real producers (Go in-process, C and Python through small
// driver programs reading operations on stdin). The model and the producers are each other's oracle: a
// failing seed is a one-line reproduction.
package ringsim
