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
	PacketRate float64 `json:"xdp_to_udp_packet_rate"` // ratio of the zero-loss packet rates
	CPURatio   float64 `json:"udp_to_xdp_recv_cpu"`    // recv CPU per packet, udp over xdp
}

// XDPOptions describe `bench xdp`: the UDP options of both searches, and the XDP attach mode.
type XDPOptions struct {
	UDPOptions
	Mode string // auto, native or generic
}

// XDP compares `recv --transport xdp` with `--transport udp` over one veth pair between two network
// namespaces it creates (addresses exist only inside them) and removes afterwards: the same lossless-rate
// search for both, per heap size.
func XDP(ctx context.Context, env Env, o XDPOptions) ([]XDPResult, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	if err := testnet.Available(); err != nil {
		return nil, fmt.Errorf("bench xdp creates network namespaces and attaches an XDP program: %w", err)
	}
	suffix := strconv.Itoa(os.Getpid())
	pair, err := testnet.NewVethPair(testnet.VethConfig{Prefix: "ibvb-bench-" + suffix, RecvIf: "vbr" + suffix,
		SendIf: "vbs" + suffix, RecvAddr: netip.MustParseAddr("10.199.0.1"), SendAddr: netip.MustParseAddr("10.199.0.2")})
	if err != nil {
		return nil, err
	}
	defer pair.Remove()
	udpPath := Path{RecvWrap: pair.Exec(pair.RecvNS), SendWrap: pair.Exec(pair.SendNS), Dest: pair.RecvAddr.String(), Port: 7148}
	xdpPath := udpPath
	xdpPath.RecvArgs = []string{"--transport", "xdp", "--interface", pair.RecvIf, "--xdp-mode", o.Mode}
	var results []XDPResult
	for _, hs := range o.HeapSizes {
		r := XDPResult{HeapSize: hs}
		uo, xo := o.UDPOptions, o.UDPOptions
		uo.Label, xo.Label = "bench xdp (udp)", "bench xdp (xdp)"
		if r.UDP, err = SearchLossless(ctx, env, udpPath, uo, hs); err != nil {
			return nil, err
		}
		if r.XDP, err = SearchLossless(ctx, env, xdpPath, xo, hs); err != nil {
			return nil, err
		}
		if r.UDP.PacketsPerS > 0 {
			r.PacketRate = r.XDP.PacketsPerS / r.UDP.PacketsPerS
		}
		if r.XDP.RecvCPUNs > 0 {
			r.CPURatio = r.UDP.RecvCPUNs / r.XDP.RecvCPUNs
		}
		results = append(results, r)
	}
	return results, nil
}

// PrintXDP writes `bench xdp`'s table.
func PrintXDP(w io.Writer, results []XDPResult) {
	fmt.Fprintf(w, "%10s %8s %10s %12s %12s %14s %13s %12s %16s\n", "heap", "packet", "transport", "max Gb/s", "heaps/s",
		"packets/s", "unpaced Gb/s", "unpaced loss", "recv CPU ns/pkt")
	for _, r := range results {
		for _, t := range []struct {
			name string
			s    UDPSize
		}{{"udp", r.UDP}, {"xdp", r.XDP}} {
			maxs := fmt.Sprintf("%.2f", t.s.MaxGbps)
			if !t.s.LosslessSeen {
				maxs = "none"
			}
			fmt.Fprintf(w, "%10d %8d %10s %12s %12.0f %14.0f %13.2f %11.2f%% %16.0f\n", r.HeapSize, t.s.PacketSize, t.name,
				maxs, t.s.HeapsPerS, t.s.PacketsPerS, t.s.UnpacedGbps, 100*t.s.UnpacedLoss, t.s.RecvCPUNs)
		}
		fmt.Fprintf(w, "%10s %8s %10s xdp/udp packet rate at zero loss %.2f; recv CPU per packet udp/xdp %.2f\n", "", "", "",
			r.PacketRate, r.CPURatio)
	}
}
