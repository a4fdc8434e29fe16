// Package spead owns the SPEAD wire format (SPEAD version 4, 64-bit item pointers, flavours SPEAD-64-40 and
// SPEAD-64-48): decoding one packet into a zero-copy view, parsing and encoding item descriptors, and
// encoding heaps into packets the way spead2_send lays them out. It knows nothing of the shared-memory
// ring: assembling heaps from packets into the ring is package spead/assemble's.
//
// The hot path starts with Decode: it allocates nothing, never panics, and reads the flavour from each packet's own
// header, because real senders mix flavours within one stream (spead2_send's stop heap honours --addr-bits
// while its data heaps do not).
package spead
