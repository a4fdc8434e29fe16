//go:build linux

package xdp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"net/netip"

	"github.com/cilium/ebpf"
	"github.com/cilium/ebpf/asm"
	"golang.org/x/sys/unix"
)

// ProgramName is the name the kernel shows for ibvbridge's XDP program (bpftool, ip link). A program of this
// name found on the interface at Open is one a crashed run left behind, and is replaced.
const ProgramName = "ibvb_xdp"

// XDP actions.
const (
	xdpPass     = 2
	xdpRedirect = 4
)

// Counter indices in the program's per-CPU counters map.
const (
	counterRedirected = 0 // matched an endpoint and redirected to a socket
	counterNoSocket   = 1 // matched an endpoint on a queue without a socket: passed to the kernel
	numCounters       = 2
)

// struct xdp_md offsets.
const (
	xdpMDData         = 0
	xdpMDDataEnd      = 4
	xdpMDRxQueueIndex = 16
)

// endpointKey is the endpoints map key: destination IPv4 address and UDP port, both in network byte order as
// they appear in the frame, then two bytes of zero padding. Address 0.0.0.0 is the port-only (any address)
// entry.
type endpointKey [8]byte

func keyFor(ap netip.AddrPort) endpointKey {
	var k endpointKey
	if a := ap.Addr(); a.IsValid() && !a.IsUnspecified() {
		ip := a.As4()
		copy(k[0:4], ip[:])
	}
	binary.BigEndian.PutUint16(k[4:6], ap.Port())
	return k
}

// objects are the program and its maps.
type objects struct {
	frags     bool // loaded with BPF_F_XDP_HAS_FRAGS: frames may span several buffers
	prog      *ebpf.Program
	endpoints *ebpf.Map // endpointKey → u32 1
	xsks      *ebpf.Map // XSKMAP: rx queue index → AF_XDP socket
	counters  *ebpf.Map // per-CPU u64[numCounters]
}

func (o *objects) Close() error {
	var errs []error
	if o.prog != nil {
		errs = append(errs, o.prog.Close())
	}
	for _, m := range []*ebpf.Map{o.endpoints, o.xsks, o.counters} {
		if m != nil {
			errs = append(errs, m.Close())
		}
	}
	return errors.Join(errs...)
}

// xdpHasFrags is BPF_F_XDP_HAS_FRAGS (the xdp.frags section of a C program): the program sees only a
// multi-buffer frame's first buffer through data/data_end, and the driver may hand it frames larger than
// a page (a veth or NIC with a jumbo MTU refuses a program without it).
const xdpHasFrags = 1 << 5

// loadObjects creates the maps, fills the endpoints map and loads the program, frags-aware if frags and the
// kernel takes it (5.18+; an older one gets the program without). xskEntries sizes the XSKMAP: it must
// exceed the largest queue index.
func loadObjects(endpoints []netip.AddrPort, xskEntries int, frags bool) (o *objects, err error) {
	o = &objects{}
	defer func() {
		if err != nil {
			o.Close()
			o = nil
		}
	}()
	if o.endpoints, err = ebpf.NewMap(&ebpf.MapSpec{
		Name: "ibvb_endpoints", Type: ebpf.Hash, KeySize: 8, ValueSize: 4, MaxEntries: uint32(max(len(endpoints), 1)),
	}); err != nil {
		return o, bpfError("create endpoints map", err)
	}
	for _, ep := range endpoints {
		if err = o.endpoints.Put(keyFor(ep), uint32(1)); err != nil {
			return o, bpfError("add endpoint "+ep.String(), err)
		}
	}
	if o.xsks, err = ebpf.NewMap(&ebpf.MapSpec{
		Name: "ibvb_xsks", Type: ebpf.XSKMap, KeySize: 4, ValueSize: 4, MaxEntries: uint32(xskEntries),
	}); err != nil {
		return o, bpfError("create XSKMAP", err)
	}
	if o.counters, err = ebpf.NewMap(&ebpf.MapSpec{
		Name: "ibvb_counters", Type: ebpf.PerCPUArray, KeySize: 4, ValueSize: 8, MaxEntries: numCounters,
	}); err != nil {
		return o, bpfError("create counters map", err)
	}
	spec := &ebpf.ProgramSpec{
		Name:         ProgramName,
		Type:         ebpf.XDP,
		License:      "Dual MIT/GPL",
		Instructions: programInstructions(o.endpoints.FD(), o.xsks.FD(), o.counters.FD()),
	}
	if frags {
		spec.Flags = xdpHasFrags
		if o.prog, err = ebpf.NewProgram(spec); err == nil {
			o.frags = true
			return o, nil
		}
		if !errors.Is(err, unix.EINVAL) {
			return o, bpfError("load XDP program (frags-aware)", err)
		}
		spec.Flags = 0
	}
	if o.prog, err = ebpf.NewProgram(spec); err != nil {
		return o, bpfError("load XDP program", err)
	}
	return o, nil
}

// programInstructions is the XDP program. In C it would read:
//
//	if (data + 42 > data_end) return XDP_PASS;              // Ethernet + IPv4 (no options) + UDP
//	if (eth->h_proto != htons(ETH_P_IP)) return XDP_PASS;   // VLAN-tagged frames included: PASS
//	if (ip->version_ihl != 0x45) return XDP_PASS;           // IP options: PASS
//	if (ip->protocol != IPPROTO_UDP) return XDP_PASS;
//	if (ip->frag_off & htons(IP_MF | IP_OFFSET)) return XDP_PASS; // fragments: the kernel reassembles
//	key = {ip->daddr, udp->dest, 0};
//	if (!lookup(&endpoints, &key)) { key.addr = 0; if (!lookup(&endpoints, &key)) return XDP_PASS; }
//	act = bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS); // no socket on this queue: PASS
//	counters[act == XDP_REDIRECT ? 0 : 1]++;
//	return act;
//
// Everything that is not a matching IPv4/UDP datagram goes on to the kernel stack untouched.
func programInstructions(endpointsFD, xsksFD, countersFD int) asm.Instructions {
	const (
		ethProto  = 12
		ipVerIHL  = 14
		ipFrag    = 14 + 6
		ipProto   = 14 + 9
		ipDst     = 14 + 16
		udpDst    = 14 + 20 + 2
		hdrLen    = 14 + 20 + 8
		keyOff    = -8  // endpointKey on the stack
		ctrKeyOff = -12 // counters index on the stack
	)
	// Loads from the packet are little-endian on the (little-endian) hosts ibvbridge supports, so the
	// network-order constants are byte-swapped: htons(0x0800) reads as 0x0008, htons(0x3fff) as 0xff3f.
	return asm.Instructions{
		asm.Mov.Reg(asm.R6, asm.R1),
		asm.LoadMem(asm.R2, asm.R6, xdpMDData, asm.Word),
		asm.LoadMem(asm.R3, asm.R6, xdpMDDataEnd, asm.Word),
		asm.Mov.Reg(asm.R4, asm.R2),
		asm.Add.Imm(asm.R4, hdrLen),
		asm.JGT.Reg(asm.R4, asm.R3, "pass"),
		asm.LoadMem(asm.R5, asm.R2, ethProto, asm.Half),
		asm.JNE.Imm(asm.R5, 0x0008, "pass"),
		asm.LoadMem(asm.R5, asm.R2, ipVerIHL, asm.Byte),
		asm.JNE.Imm(asm.R5, 0x45, "pass"),
		asm.LoadMem(asm.R5, asm.R2, ipProto, asm.Byte),
		asm.JNE.Imm(asm.R5, unix.IPPROTO_UDP, "pass"),
		asm.LoadMem(asm.R5, asm.R2, ipFrag, asm.Half),
		asm.And.Imm(asm.R5, 0xff3f),
		asm.JNE.Imm(asm.R5, 0, "pass"),
		asm.LoadMem(asm.R5, asm.R2, ipDst, asm.Word),
		asm.StoreMem(asm.RFP, keyOff, asm.R5, asm.Word),
		asm.LoadMem(asm.R5, asm.R2, udpDst, asm.Half),
		asm.StoreMem(asm.RFP, keyOff+4, asm.R5, asm.Half),
		asm.StoreImm(asm.RFP, keyOff+6, 0, asm.Half),
		asm.LoadMapPtr(asm.R1, endpointsFD),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, keyOff),
		asm.FnMapLookupElem.Call(),
		asm.JNE.Imm(asm.R0, 0, "match"),
		asm.StoreImm(asm.RFP, keyOff, 0, asm.Word),
		asm.LoadMapPtr(asm.R1, endpointsFD),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, keyOff),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "pass"),

		asm.LoadMem(asm.R2, asm.R6, xdpMDRxQueueIndex, asm.Word).WithSymbol("match"),
		asm.LoadMapPtr(asm.R1, xsksFD),
		asm.Mov.Imm(asm.R3, xdpPass),
		asm.FnRedirectMap.Call(),
		asm.Mov.Reg(asm.R7, asm.R0),
		asm.StoreImm(asm.RFP, ctrKeyOff, counterRedirected, asm.Word),
		asm.JEq.Imm(asm.R7, xdpRedirect, "count"),
		asm.StoreImm(asm.RFP, ctrKeyOff, counterNoSocket, asm.Word),
		asm.LoadMapPtr(asm.R1, countersFD).WithSymbol("count"),
		asm.Mov.Reg(asm.R2, asm.RFP),
		asm.Add.Imm(asm.R2, ctrKeyOff),
		asm.FnMapLookupElem.Call(),
		asm.JEq.Imm(asm.R0, 0, "out"),
		asm.LoadMem(asm.R1, asm.R0, 0, asm.DWord),
		asm.Add.Imm(asm.R1, 1),
		asm.StoreMem(asm.R0, 0, asm.R1, asm.DWord),
		asm.Mov.Reg(asm.R0, asm.R7).WithSymbol("out"),
		asm.Return(),

		asm.Mov.Imm(asm.R0, xdpPass).WithSymbol("pass"),
		asm.Return(),
	}
}

// readCounters sums the program's per-CPU counters.
func (o *objects) readCounters() (redirected, noSocket uint64, err error) {
	var vals []uint64
	for i, dst := range []*uint64{&redirected, &noSocket} {
		if err := o.counters.Lookup(uint32(i), &vals); err != nil {
			return 0, 0, fmt.Errorf("xdp: read program counters: %w", err)
		}
		for _, v := range vals {
			*dst += v
		}
	}
	return redirected, noSocket, nil
}

// bpfError wraps a BPF syscall failure with the package's sentinel errors.
func bpfError(what string, err error) error {
	switch {
	case errors.Is(err, unix.EPERM), errors.Is(err, unix.EACCES):
		return fmt.Errorf("xdp: %s: %w: %w", what, ErrPermission, err)
	case errors.Is(err, ebpf.ErrNotSupported), errors.Is(err, unix.ENOSYS):
		return fmt.Errorf("xdp: %s: %w: %w", what, ErrNotSupported, err)
	}
	return fmt.Errorf("xdp: %s: %w", what, err)
}
