// Package xdp owns the AF_XDP receive transport: an XDP program (written with cilium/ebpf's asm package, no
// clang) that steers the IPv4/UDP frames of a stream's endpoints into AF_XDP sockets and passes everything
// else to the kernel stack; attaching it (native or generic XDP, through a bpf_link the kernel removes when
// the process dies) and replacing one a crashed run left behind; the AF_XDP sockets themselves (UMEM over
// the ring's packet area, fill/rx rings, XDP_STATISTICS); the multicast joins that make IGMP work; and a
// transport.Source that runs the sockets with internal/rxloop's completion loop, the one the ibverbs
// transport uses.
//
// What the XDP program matches: untagged Ethernet II, IPv4 without options (IHL 5), unfragmented UDP
// whose (destination address, destination port) is an endpoint, or whose port is that of an endpoint
// without an address (0.0.0.0 or none). VLAN-tagged frames, IPv4 options, fragments, IPv6 and everything
// else get XDP_PASS: the kernel stack sees them exactly as without ibvbridge (ARP, ICMP, other UDP
// ports keep working). A matching frame arriving on a queue without a socket is passed too, and counted
// (Stats.NoSocket).
//
// Frames must fit one UMEM frame minus the kernel's XDP_PACKET_HEADROOM (256 bytes): FrameSize 2048 takes
// Ethernet frames up to 1792 bytes, 4096 up to 3840. Larger frames (9000-byte jumbo) are dropped by the
// kernel and counted in Stats.RxDropped; multi-buffer AF_XDP (XDP_USE_SG) is not implemented.
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
