package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/bench"
	"github.com/ibvbridge/ibvbridge/internal/testnet"
	"github.com/ibvbridge/ibvbridge/internal/testutil"
)

// xdpCase is one stream through `recv --transport xdp`: where it goes and its shape.
type xdpCase struct {
	name, dest, flavour string
	heaps, heapSize     int
	packet, slots, slot string
	rate                string // Gb/s
	recvArgs            []string
	wantChains          bool     // jumbo frames: every data frame arrives as a multi-buffer chain
	recvTransport       string   // default xdp
	sendArgs            []string // extra send flags (--transport xdp --interface ...)
}

// TestRecvXDPOverVeth runs `recv --transport xdp` in one network namespace and `send` in another, joined
// by a veth pair (addresses only inside them), for unicast and multicast, and a consumer checks every byte.
// After recv exits the interface carries no XDP program.
func TestRecvXDPOverVeth(t *testing.T) {
	pair := testutil.VethPair(t, testnet.VethConfig{})
	for _, tc := range []xdpCase{
		{name: "unicast", dest: pair.RecvAddr.String(), flavour: "64-40", heaps: 300, heapSize: 20000, packet: "1472", slots: "256", slot: "64K", rate: "0.2"},
		{name: "multicast", dest: "239.77.0.1", flavour: "64-48", heaps: 300, heapSize: 20000, packet: "1472", slots: "256", slot: "64K", rate: "0.2"},
	} {
		t.Run(tc.name, func(t *testing.T) { runRecvXDP(t, pair, tc) })
	}
}

// TestSendXDPIntoSocketRecv: `send --transport xdp` (AF_XDP TX, jumbo frames as multi-buffer chains) in
// one namespace into `recv` on the socket path in the other, over a veth pair with MTU 9000; every heap
// byte-exact, for 1 MiB heaps in 8972-byte packets and 64 KiB heaps in 1472-byte packets, and jumbo
// frames AF_XDP both ways (into `recv --transport xdp`). A packet
// larger than the MTU allows is refused with one clear line.
func TestSendXDPIntoSocketRecv(t *testing.T) {
	pair := testutil.VethPair(t, testnet.VethConfig{MTU: 9000})
	xdpSend := []string{"--transport", "xdp", "--interface", pair.SendIf}
	for _, tc := range []xdpCase{
		{name: "jumbo", dest: pair.RecvAddr.String(), flavour: "64-48", heaps: 40, heapSize: 1 << 20, packet: "8972",
			slots: "64", slot: "2M", rate: "1", recvTransport: "udp", sendArgs: xdpSend},
		{name: "1472", dest: pair.RecvAddr.String(), flavour: "64-40", heaps: 200, heapSize: 65536, packet: "1472",
			slots: "256", slot: "128K", rate: "0.5", recvTransport: "udp", sendArgs: xdpSend},
		{name: "jumbo-into-xdp", dest: pair.RecvAddr.String(), flavour: "64-48", heaps: 40, heapSize: 1 << 20, packet: "8972",
			slots: "64", slot: "2M", rate: "1", sendArgs: xdpSend, wantChains: true},
	} {
		t.Run(tc.name, func(t *testing.T) { runRecvXDP(t, pair, tc) })
	}
	out, err := exec.Command("ip", "netns", "exec", pair.SendNS, binary(t), "send", pair.RecvAddr.String()+":7148",
		"--transport", "xdp", "--interface", pair.SendIf, "--packet-size", "9000", "--heaps", "1").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "more than "+pair.SendIf+"'s MTU 9000") || strings.Count(strings.TrimSpace(string(out)), "\n") > 0 {
		t.Fatalf("9000-byte packets over MTU 9000: %v, want one line naming the MTU:\n%s", err, out)
	}
}

// TestRecvXDPJumboMultiBuffer: 1 MiB heaps in 8972-byte packets over a veth pair with MTU 9000, received
// through multi-buffer AF_XDP (each frame a chain of descriptors assembled into its slot), every heap
// byte-exact; with need_wakeup off and preferred busy polling on, the options the kernel must accept.
func TestRecvXDPJumboMultiBuffer(t *testing.T) {
	pair := testutil.VethPair(t, testnet.VethConfig{MTU: 9000})
	for _, tc := range []xdpCase{
		{name: "default", dest: pair.RecvAddr.String(), flavour: "64-48", heaps: 40, heapSize: 1 << 20, packet: "8972",
			slots: "64", slot: "2M", rate: "1", wantChains: true},
		{name: "busy-poll-no-wakeup", dest: pair.RecvAddr.String(), flavour: "64-48", heaps: 40, heapSize: 1 << 20, packet: "8972",
			slots: "64", slot: "2M", rate: "1", wantChains: true,
			recvArgs: []string{"--xdp-need-wakeup=false", "--xdp-prefer-busy-poll", "--xdp-busy-poll-usecs", "20", "--xdp-busy-poll-budget", "64"}},
	} {
		t.Run(tc.name, func(t *testing.T) { runRecvXDP(t, pair, tc) })
	}
}

func runRecvXDP(t *testing.T, pair *testnet.VethPair, tc xdpCase) {
	name := testRing(t, "xdp-"+tc.name)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	if tc.recvTransport == "" {
		tc.recvTransport = "xdp"
	}
	args := []string{"recv", "--ring", name, "--transport", tc.recvTransport, "--slots", tc.slots,
		"--slot-size", tc.slot, "--hugepages", "off", "--log-format", "json"}
	if tc.recvTransport == "xdp" {
		args = append(args, "--interface", pair.RecvIf)
	}
	args = append(args, tc.recvArgs...)
	recv := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", pair.RecvNS, binary(t)}, append(args, tc.dest+":7148")...)...)
	var rout bytes.Buffer
	var rerr bench.LockedBuffer
	recv.Stdout, recv.Stderr = &rout, &rerr
	if err := recv.Start(); err != nil {
		t.Fatal(err)
	}
	defer recv.Process.Kill()
	// Logged once the AF_XDP socket is open: the ring exists a little earlier.
	if !testutil.WaitFor(10*time.Second, func() bool { return strings.Contains(rerr.String(), `"message":"receiving"`) }) {
		t.Fatalf("recv did not start receiving: %s", rerr.String())
	}
	cons := startConsumer(t, name, true)
	sargs := append([]string{"netns", "exec", pair.SendNS, binary(t), "send", tc.dest + ":7148",
		"--heaps", strconv.Itoa(tc.heaps), "--heap-size", strconv.Itoa(tc.heapSize), "--items", "2", "--packet-size", tc.packet,
		"--flavour", tc.flavour, "--pattern", "--rate", tc.rate, "--ttl", "4"}, tc.sendArgs...)
	send := exec.CommandContext(ctx, "ip", sargs...)
	if out, err := send.CombinedOutput(); err != nil {
		t.Fatalf("send: %v\n%s", err, out)
	}
	if err := recv.Wait(); err != nil {
		t.Fatalf("recv: %v\n%s", err, rerr.String())
	}
	var m map[string]any
	if err := json.Unmarshal(bench.LastLine(rout.Bytes()), &m); err != nil {
		t.Fatalf("recv output %q: %v", rout.String(), err)
	}
	cr := waitConsumer(t, cons)
	if m["result"] != "stream_stop" || num(m, "heaps") != uint64(tc.heaps) || num(m, "incomplete_heaps") != 0 {
		t.Fatalf("recv counters %v\n%s", m, rerr.String())
	}
	tcm, _ := m["transport_counters"].(map[string]any)
	if tc.recvTransport == "xdp" && num(tcm, "xdp_redirected") == 0 {
		t.Fatalf("no frame went through AF_XDP: %v", tcm)
	}
	if tc.wantChains && (num(tcm, "multi_buffer") != 1 || num(tcm, "chain_frames") < uint64(tc.heaps*(tc.heapSize/8900)) ||
		num(tcm, "chains_dropped") != 0 || num(tcm, "rx_dropped") != 0 || num(tcm, "chains_placed") == 0) {
		t.Fatalf("jumbo frames did not arrive as assembled multi-buffer chains, placed in their slots: %v", tcm)
	}
	t.Logf("transport counters: %v", tcm)
	if cr.Heaps != uint64(tc.heaps) || cr.VerifyErrors != 0 || cr.Result != "eos" {
		t.Fatalf("consumer %+v", cr)
	}
	out, _ := exec.Command("ip", "-n", pair.RecvNS, "link", "show", "dev", pair.RecvIf).CombinedOutput()
	if strings.Contains(string(out), "xdp") || strings.Contains(string(out), "prog/") {
		t.Fatalf("XDP program left on %s after recv exited:\n%s", pair.RecvIf, out)
	}
}
