// Package spead owns the SPEAD wire format (SPEAD version 4, 64-bit item pointers, flavours SPEAD-64-40 and
// SPEAD-64-48): decoding one packet into a zero-copy view, parsing item descriptors, and encoding heaps into
// packets the way spead2_send lays them out; and assembling heaps from packets straight into the slots of
// a shared-memory ring (Assembler).
//
// The hot path starts with Decode: it allocates nothing, never panics, and reads the flavour from each packet's own
// header, because real senders mix flavours within one stream (spead2_send's stop heap honours --addr-bits
// while its data heaps do not). Everything that concerns a heap as a whole (reassembly, duplicate detection,
// item lengths, descriptors, stream stop) is the Assembler's, which follows spead2's receive rules; its doc
// comment lists them. Where a heap lands (its slot, the slots taken ahead for the heaps expected next, the
// guesses that let a source read payloads straight into place) is a placer's (placer.go), which the
// Assembler calls through a small interface; on a chunk-mode ring the chunk placer (chunks.go) puts each
// heap at its position in a chunk, by its time and axis items, and publishes whole chunks.
package spead
