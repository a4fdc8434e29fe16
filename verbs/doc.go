// Package verbs is ibvbridge's ibverbs device layer (RDMA raw packet QPs),
// modelled on spead2's udp_ibv reader and UdpIbvStream. It owns:
//
//   - run-time binding to libibverbs.so.1 (Load): the library is dlopen()ed, never
//     linked, so the ibvbridge binary starts on hosts without rdma-core and only
//     the ibverbs transport reports ErrLibraryNotFound;
//   - device discovery (Devices, Format) and the interface → RDMA device → port
//     mapping (DeviceForAddr, DeviceForNetdev) that spead2 gets from rdma_cm;
//   - receive and send configuration and their environment variables
//     (RecvConfig, SendConfig, ApplyEnv);
//   - flow steering rules in the exact struct ibv_flow_attr byte layout (FlowRule);
//   - carving the ring's packet area into receive work-request slots (PlanRegion);
//   - the device Receiver: PD, MR, CQ, completion channel, raw packet QP, flows
//     and IGMP joins, exposed as an internal/rxloop Queue that transport/ibv runs;
//     with RecvConfig.Place also a SplitQueue, whose receive work requests may
//     scatter a frame's payload into other registered memory (ring slots);
//   - the frame-level send path (OpenSender, Sender): UDP payloads written
//     straight into registered frame buffers, framed, posted in batches whose
//     last work request is signaled, completions reaped in batches, hardware
//     packet pacing (QP rate limit) or software pacing, IPv4 checksum offload
//     when the NIC has it. Its batching, buffer reuse and pacing live in a
//     pure-Go loop over the SendQueue interface, tested with verbstest's fakes.
//
// It knows nothing of SPEAD, rings or the transport interfaces: transport/ibv
// builds the ibverbs transport (heaps, sinks, counters) on top of it.
//
// It is one of the project's two cgo packages (internal/chunkplace, recv's
// placement plug-ins, is the other), and the C is confined to
// ibvb_shim.c and ibv_linux.go. Everything else is pure Go so it builds and is
// tested without RDMA hardware; without cgo the package still builds and its
// device entry points return ErrUnsupported.
//
// Environment:
//
//	IBVBRIDGE_LIBIBVERBS        path given to dlopen instead of "libibverbs.so.1"
//	                            (tests set it to a missing file to simulate a host
//	                            without rdma-core)
//	IBVBRIDGE_IBV_INTERFACE     default receive interface address (IPv4)
//	IBVBRIDGE_IBV_COMP_VECTOR   default completion vector (<0: busy poll)
//	SPEAD2_IBV_INTERFACE        as above, honoured for spead2 compatibility
//	SPEAD2_IBV_COMP_VECTOR      as above, honoured for spead2 compatibility
//
// Precedence is command-line flag > IBVBRIDGE_* > SPEAD2_* > built-in default.
package verbs
