// Package xdp owns the AF_XDP receive and send transports: an XDP program (written with cilium/ebpf's asm
// package, no clang) that steers the IPv4/UDP frames of a stream's endpoints into AF_XDP sockets and passes everything
// else to the kernel stack; attaching it (native or generic XDP, through a bpf_link the kernel removes when
// the process dies) and replacing one a crashed run left behind; the AF_XDP sockets themselves (UMEM over
// the ring's packet area, fill/rx rings, XDP_STATISTICS); the multicast joins that make IGMP work; and a
// transport.Source that runs the sockets with internal/rxloop's completion loop, the one the ibverbs
// transport uses. It also owns the AF_XDP send transport (Sender, HeapSender: send --transport xdp), which
// builds frames in its own UMEM and transmits them through a TX ring, jumbo frames as multi-buffer chains.
//
// What the XDP program matches: untagged Ethernet II, IPv4 without options (IHL 5), unfragmented UDP
// whose (destination address, destination port) is an endpoint, or whose port is that of an endpoint
// without an address (0.0.0.0 or none). VLAN-tagged frames, IPv4 options, fragments, IPv6 and everything
// else get XDP_PASS: the kernel stack sees them exactly as without ibvbridge (ARP, ICMP, other UDP
// ports keep working). A matching frame arriving on a queue without a socket is passed too, and counted
// (Stats.NoSocket).
//
// Jumbo frames (multi-buffer AF_XDP, kernel 6.6+): the program is loaded frags-aware
// (BPF_F_XDP_HAS_FRAGS, what C's xdp.frags section sets: it parses the headers in the first buffer only)
// and the sockets are bound with XDP_USE_SG, so a frame larger than a UMEM frame minus the kernel's
// 256-byte headroom (3840 bytes with the default 4096-byte frames) arrives as a chain of descriptors,
// XDP_PKT_CONTD on all but the last. The rx ring is read in whole chains only; a chain's headers are
// checked against the length of all its pieces (a short chain is counted as truncated, never handed
// over in part), and its payload is copied once, straight into the ring slot the heap assembler names
// (transport.Placer), else joined in a scratch buffer. Without multi-buffer (Config.SingleBuffer, or an
// older kernel) larger frames are dropped by the kernel and counted in Stats.RxDropped.
//
// need_wakeup (default on) and preferred busy polling (SO_PREFER_BUSY_POLL, SO_BUSY_POLL,
// SO_BUSY_POLL_BUDGET: Config.SocketBusyPoll) are options; with SO_PREFER_BUSY_POLL every empty poll makes
// the recvfrom that runs the driver's NAPI poll in the receive thread.
//
// Using it (ibvbridge recv --transport xdp):
//
//	cfg := xdp.Config{Interface: "eth0", Endpoints: eps, Log: &log}
//	r, _ := ring.Create(name, ring.Config{..., PacketArea: xdp.RequiredUMEM(cfg)})
//	src, err := xdp.Open(cfg, r.PacketArea()) // the UMEM lives in the ring's hugepage data file
//	defer src.Close()
//	err = src.Run(ctx, assembler)             // src.Stats() from any goroutine meanwhile
//
// The package is Linux-only; elsewhere it is empty.
package xdp
