// Package ibv owns the ibverbs transport, spead2's udp_ibv over package verbs' device layer:
//
//   - Source, the receive side, in two steps as transport.AreaSource wants: NewSource checks the
//     configuration and that libibverbs, a device and one behind the interface are there before the ring
//     exists; Open starts a verbs.Receiver on the ring's packet area, so the NIC writes frames straight
//     into the ring's data file. The opened Receiver runs internal/rxloop over it, parses each frame
//     (frame.Parse), hands the UDP payloads to a transport.Sink and counts what it drops, by reason.
//   - with verbs.RecvConfig.Place (--ibv-place; off by default), direct placement (place.go): when the
//     sink is a transport.Placer, receive work requests are split — frame and SPEAD headers into the
//     packet area, the payload straight into the ring slot Place predicts for the frame that work request
//     will receive — so a hit is taken with Placed and never copied; a miss is joined back and copied
//     (placement_misses), and packets that could touch a region a posted work request still awaits are
//     held until none does (placement_holds). Work requests are posted a queue length ahead, so each
//     heap's first buffer/max-size + 2 or so packets are still copied.
//   - HeapSender, the send side: SPEAD heaps packetized (spead.Encoder) straight into a verbs.Sender's
//     registered frame buffers, posted in batches, paced by the NIC or in software.
//
// Nothing here has run on RDMA hardware (no machine had a NIC for it). What runs in tests is everything
// above the device: the receive path over internal/rxloop/rxlooptest's fake queue (parse, drop counting,
// the counters, captured frames through the assembler into a ring; placement over verbs/verbstest's fake
// split queue, in order and disordered, against a real assembler and ring), the send path over verbs/verbstest's
// fake send queues (frames, endpoints, checksum offload, draining, zero allocations), and the checks made
// before any device is opened. Never run: opening the receiver and sender on a real NIC, the NIC writing
// into the ring's packet area (and, placing, into ring slots), split work requests and the QP's error
// state (the flush a held stream stop makes) on hardware.
package ibv
