package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
)

// xdpBenchResult is one heap size of `bench xdp`: the same search over the same veth for both transports.
type xdpBenchResult struct {
	HeapSize   int          `json:"heap_size"`
	UDP        udpBenchSize `json:"udp"`
	XDP        udpBenchSize `json:"xdp"`
	PacketRate float64      `json:"xdp_to_udp_packet_rate"` // ratio of the zero-loss packet rates
	CPURatio   float64      `json:"udp_to_xdp_recv_cpu"`    // recv CPU per packet, udp over xdp
}

// runBenchXDP compares `recv --transport xdp` with `--transport udp` over one veth pair between two network
// namespaces it creates (addresses exist only inside them) and removes afterwards.
func runBenchXDP(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench xdp", stderr)
	sizes := fs.String("heap-sizes", "8K,1M", "comma-separated heap sizes")
	packet := sizeFlag(fs, "packet-size", 1472, "UDP payload per packet (veth MTU 1500; AF_XDP frames hold up to 3840 bytes)")
	bytesPerRun := sizeFlag(fs, "bytes", 256<<20, "payload bytes per run (bounds each run)")
	runs := fs.Int("runs", 6, "runs per heap size and transport: one unpaced, then a search on the rate")
	consumer := fs.String("consumer", "c", "consumer process: go, c or python")
	mode := fs.String("xdp-mode", "auto", "XDP attach mode: auto, native or generic")
	asJSON := fs.Bool("json", false, "print one JSON object")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	heapSizes, err := parseSizeList(*sizes)
	if err != nil {
		return err
	}
	if os.Geteuid() != 0 {
		return errors.New("bench xdp needs root: it creates network namespaces and attaches an XDP program")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return errors.New("bench xdp needs the ip tool (Debian package iproute2)")
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	pair, err := newVethPair(fmt.Sprintf("ibvb-bench-%d", os.Getpid()))
	if err != nil {
		return err
	}
	defer pair.remove()
	udpPath := benchPath{recvWrap: pair.in(pair.recvNS), sendWrap: pair.in(pair.sendNS), dest: pair.recvAddr, port: 7148}
	xdpPath := udpPath
	xdpPath.recvArgs = []string{"--transport", "xdp", "--interface", pair.recvIf, "--xdp-mode", *mode}
	var results []xdpBenchResult
	for _, hs := range heapSizes {
		r := xdpBenchResult{HeapSize: hs}
		if r.UDP, err = searchLossless(udpPath, self, *consumer, hs, *packet, *bytesPerRun, *runs, "bench xdp (udp)", stderr); err != nil {
			return err
		}
		if r.XDP, err = searchLossless(xdpPath, self, *consumer, hs, *packet, *bytesPerRun, *runs, "bench xdp (xdp)", stderr); err != nil {
			return err
		}
		if r.UDP.PacketsPerS > 0 {
			r.PacketRate = r.XDP.PacketsPerS / r.UDP.PacketsPerS
		}
		if r.XDP.RecvCPUNs > 0 {
			r.CPURatio = r.UDP.RecvCPUNs / r.XDP.RecvCPUNs
		}
		results = append(results, r)
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(map[string]any{"consumer": *consumer, "packet_size": *packet, "sizes": results})
	}
	fmt.Fprintf(stdout, "%10s %8s %10s %12s %12s %14s %13s %12s %16s\n", "heap", "packet", "transport", "max Gb/s", "heaps/s",
		"packets/s", "unpaced Gb/s", "unpaced loss", "recv CPU ns/pkt")
	for _, r := range results {
		for _, t := range []struct {
			name string
			s    udpBenchSize
		}{{"udp", r.UDP}, {"xdp", r.XDP}} {
			maxs := fmt.Sprintf("%.2f", t.s.MaxGbps)
			if !t.s.LosslessSeen {
				maxs = "none"
			}
			fmt.Fprintf(stdout, "%10d %8d %10s %12s %12.0f %14.0f %13.2f %11.2f%% %16.0f\n", r.HeapSize, t.s.PacketSize, t.name,
				maxs, t.s.HeapsPerS, t.s.PacketsPerS, t.s.UnpacedGbps, 100*t.s.UnpacedLoss, t.s.RecvCPUNs)
		}
		fmt.Fprintf(stdout, "%10s %8s %10s xdp/udp packet rate at zero loss %.2f; recv CPU per packet udp/xdp %.2f\n", "", "", "",
			r.PacketRate, r.CPURatio)
	}
	return nil
}

func parseSizeList(list string) ([]int, error) {
	var out []int
	for _, s := range strings.Split(list, ",") {
		n, err := parseByteSize(s)
		if err != nil || n < 1 {
			return nil, usageError("%q is not a size", s)
		}
		out = append(out, n)
	}
	return out, nil
}

// vethPair is two network namespaces joined by a veth pair, 10.199.0.1 (receiver) and 10.199.0.2 (sender):
// addresses that exist only inside namespaces this process made.
type vethPair struct {
	recvNS, sendNS     string
	recvIf, sendIf     string
	recvAddr, sendAddr string
}

func newVethPair(prefix string) (*vethPair, error) {
	suffix := prefix[strings.LastIndexByte(prefix, '-')+1:]
	p := &vethPair{recvNS: prefix + "-r", sendNS: prefix + "-s", recvIf: "vbr" + suffix, sendIf: "vbs" + suffix,
		recvAddr: "10.199.0.1", sendAddr: "10.199.0.2"}
	steps := [][]string{
		{"netns", "add", p.recvNS},
		{"netns", "add", p.sendNS},
		{"link", "add", p.recvIf, "netns", p.recvNS, "type", "veth", "peer", "name", p.sendIf, "netns", p.sendNS},
		{"-n", p.recvNS, "addr", "add", p.recvAddr + "/24", "dev", p.recvIf},
		{"-n", p.sendNS, "addr", "add", p.sendAddr + "/24", "dev", p.sendIf},
		{"-n", p.recvNS, "link", "set", p.recvIf, "up"},
		{"-n", p.sendNS, "link", "set", p.sendIf, "up"},
		{"-n", p.recvNS, "link", "set", "lo", "up"},
		{"-n", p.sendNS, "link", "set", "lo", "up"},
	}
	for _, s := range steps {
		if out, err := exec.Command("ip", s...).CombinedOutput(); err != nil {
			p.remove()
			return nil, fmt.Errorf("ip %s: %v: %s", strings.Join(s, " "), err, strings.TrimSpace(string(out)))
		}
	}
	return p, nil
}

func (p *vethPair) in(ns string) []string { return []string{"ip", "netns", "exec", ns} }

// remove deletes both namespaces, which destroys the veth pair with them.
func (p *vethPair) remove() {
	for _, ns := range []string{p.recvNS, p.sendNS} {
		_ = exec.Command("ip", "netns", "del", ns).Run()
	}
}
