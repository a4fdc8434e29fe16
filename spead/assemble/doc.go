// Package assemble owns heap assembly: it takes SPEAD packets (decoded with package spead, which owns the
// wire format) and assembles heaps from them straight into the slots of a shared-memory ring (Assembler).
// Data flows one way: a transport hands packets to the bridge, the bridge to an Assembler, the Assembler
// writes the ring.
//
// Everything that concerns a heap as a whole (reassembly, duplicate detection, item lengths, descriptors,
// stream stop) is the Assembler's, which follows spead2's receive rules; its doc comment lists them. Where
// a heap lands (its slot, the slots taken ahead for the heaps expected next, the guesses that let a
// source read payloads straight into place) is a placer's (placer.go), which the Assembler calls through a
// small interface; on a chunk-mode ring the chunk placer (chunks.go) puts each heap at the position in a
// chunk its Placement names, by default by its time and axis items, and publishes whole chunks.
package assemble
