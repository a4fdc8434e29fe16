package bench

import (
	"context"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strconv"

	"github.com/ibvbridge/ibvbridge/internal/testnet"
)

// XDPResult is one heap size of `bench xdp`: the same search over the same veth for both transports.
type XDPResult struct {
	HeapSize   int     `json:"heap_size"`
	UDP        UDPSize `json:"udp"`
	XDP        UDPSize `json:"xdp"`
	PacketRate float64 `json:"xdp_to_udp_packet_rate"` // ratio of the zero-loss packet rates (fixed rate: of the sent rates)
	CPURatio   float64 `json:"udp_to_xdp_recv_cpu"`    // recv CPU per packet, udp over xdp
	// CPUPerByte is recv's CPU per payload byte, xdp over udp (the goal: at most 1.1 with jumbo
	// frames). Search: of each transport's fastest lossless run; fixed rate: of the medians.
	CPUPerByte float64 `json:"xdp_to_udp_recv_cpu_per_byte"`
}

// XDPOptions describe `bench xdp`: the UDP options of both searches, and the XDP attach mode.
type XDPOptions struct {
	UDPOptions
	Mode string // auto, native or generic
	// SendTransport is how both streams are sent: "udp" (sockets, the default) or "xdp" (send
	// --transport xdp on the sender's end of the veth).
	SendTransport string
	// RecvArgs are extra flags for the AF_XDP recv (e.g. --xdp-prefer-busy-poll).
	RecvArgs []string
}

// vethMTU is the MTU both ends of the pair get: the standard 1500 unless packets need more (jumbo frames).
func vethMTU(packetSize int) int {
	if l := packetSize + 28; l > 1500 {
		return max(9000, l)
	}
	return 0
}

// XDP compares `recv --transport xdp` with `--transport udp` over one veth pair between two network
// namespaces it creates (addresses exist only inside them) and removes afterwards: the same lossless-rate
// search for both, per heap size.
func XDP(ctx context.Context, env Env, o XDPOptions) ([]XDPResult, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	if o.SendTransport != "" && o.SendTransport != "udp" && o.SendTransport != "xdp" {
		return nil, fmt.Errorf("%w: send transport %q (want udp or xdp)", ErrBadOption, o.SendTransport)
	}
	if err := testnet.Available(); err != nil {
		return nil, fmt.Errorf("bench xdp creates network namespaces and attaches an XDP program: %w", err)
	}
	suffix := strconv.Itoa(os.Getpid())
	pair, err := testnet.NewVethPair(testnet.VethConfig{Prefix: "ibvb-bench-" + suffix, RecvIf: "vbr" + suffix,
		SendIf: "vbs" + suffix, RecvAddr: netip.MustParseAddr("10.199.0.1"), SendAddr: netip.MustParseAddr("10.199.0.2"),
		MTU: vethMTU(o.PacketSize)})
	if err != nil {
		return nil, err
	}
	defer pair.Remove()
	udpPath := Path{RecvWrap: pair.Exec(pair.RecvNS), SendWrap: pair.Exec(pair.SendNS), Dest: pair.RecvAddr.String(), Port: 7148}
	if o.SendTransport == "xdp" {
		udpPath.SendArgs = []string{"--transport", "xdp", "--interface", pair.SendIf}
	}
	xdpPath := udpPath
	xdpPath.RecvArgs = append([]string{"--transport", "xdp", "--interface", pair.RecvIf, "--xdp-mode", o.Mode}, o.RecvArgs...)
	var results []XDPResult
	for _, hs := range o.HeapSizes {
		r := XDPResult{HeapSize: hs}
		uo, xo := o.UDPOptions, o.UDPOptions
		uo.Label, xo.Label = "bench xdp (udp)", "bench xdp (xdp)"
		if o.Rate > 0 {
			if r.UDP, r.XDP, err = fixedRatePair(ctx, env, udpPath, xdpPath, uo, xo, hs); err != nil {
				return nil, err
			}
		} else {
			if r.UDP, err = SearchLossless(ctx, env, udpPath, uo, hs); err != nil {
				return nil, err
			}
			if r.XDP, err = SearchLossless(ctx, env, xdpPath, xo, hs); err != nil {
				return nil, err
			}
		}
		if r.UDP.PacketsPerS > 0 {
			r.PacketRate = r.XDP.PacketsPerS / r.UDP.PacketsPerS
		}
		if r.XDP.RecvCPUNs > 0 {
			r.CPURatio = r.UDP.RecvCPUNs / r.XDP.RecvCPUNs
		}
		switch {
		case o.Rate > 0 && r.UDP.RecvCPUSecPerGB > 0:
			r.CPUPerByte = r.XDP.RecvCPUSecPerGB / r.UDP.RecvCPUSecPerGB
		case r.UDP.RecvCPUNs > 0: // the same packet size on both paths: per packet is per byte
			r.CPUPerByte = r.XDP.RecvCPUNs / r.UDP.RecvCPUNs
		}
		results = append(results, r)
	}
	return results, nil
}

// fixedRatePair runs heap size hs o.Runs times at o.Rate on each path, alternating run by run so both
// see the same machine state, and summarises each path's medians.
func fixedRatePair(ctx context.Context, env Env, udpPath, xdpPath Path, uo, xo UDPOptions, hs int) (u, x UDPSize, err error) {
	u = UDPSize{HeapSize: hs, PacketSize: uo.PacketSize}
	x = u
	heaps := uint64(max(64, min(200_000, uo.BytesPerRun/hs)))
	for range uo.Runs {
		for _, p := range []struct {
			path Path
			o    UDPOptions
			res  *UDPSize
		}{{udpPath, uo, &u}, {xdpPath, xo, &x}} {
			r, err := udpRun(ctx, env, p.path, p.o, hs, heaps, p.o.Rate)
			if err != nil {
				return u, x, err
			}
			env.logf("%s: heap %d B at %.3g Gb/s: sent %.3f Gb/s, %d/%d heaps consumed, recv %.0f ns/packet %.3f s/GB, consumer %.0f ns/heap\n",
				p.o.Label, hs, p.o.Rate, r.SentGbps, r.HeapsCons, r.HeapsSent, r.RecvCPUNsPerPacket, r.RecvCPUSecPerGB, r.ConsCPUNsPerHeap)
			p.res.Runs = append(p.res.Runs, r)
		}
	}
	u.summarise()
	x.summarise()
	return u, x, nil
}

// PrintXDP writes `bench xdp`'s table: recv's CPU per packet and per GB beside the consumer's per heap
// (a user pays both).
func PrintXDP(w io.Writer, results []XDPResult) {
	fmt.Fprintf(w, "%10s %8s %10s %12s %12s %14s %13s %12s %16s %14s %17s\n", "heap", "packet", "transport", "max Gb/s", "heaps/s",
		"packets/s", "unpaced Gb/s", "unpaced loss", "recv CPU ns/pkt", "recv CPU s/GB", "consumer ns/heap")
	for _, r := range results {
		for _, t := range []struct {
			name string
			s    UDPSize
		}{{"udp", r.UDP}, {"xdp", r.XDP}} {
			maxs := fmt.Sprintf("%.2f", t.s.MaxGbps)
			if !t.s.LosslessSeen {
				maxs = "none"
			}
			perGB, cons := t.s.RecvCPUSecPerGB, t.s.ConsCPUNsPerHeap
			if perGB == 0 && t.s.PacketSize > 0 { // a search's fastest lossless run: per packet / packet size
				perGB = t.s.RecvCPUNs / float64(t.s.PacketSize)
			}
			conss := "-" // a search does not summarise the consumer
			if cons > 0 {
				conss = fmt.Sprintf("%.0f", cons)
			}
			fmt.Fprintf(w, "%10d %8d %10s %12s %12.0f %14.0f %13.2f %11.2f%% %16.0f %14.3f %17s\n", r.HeapSize, t.s.PacketSize, t.name,
				maxs, t.s.HeapsPerS, t.s.PacketsPerS, t.s.UnpacedGbps, 100*t.s.UnpacedLoss, t.s.RecvCPUNs, perGB, conss)
		}
		fmt.Fprintf(w, "%10s %8s %10s xdp/udp packet rate %.2f; recv CPU per byte xdp/udp %.2f\n", "", "", "",
			r.PacketRate, r.CPUPerByte)
	}
}
