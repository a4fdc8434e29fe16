package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/bench"
	"github.com/ibvbridge/ibvbridge/internal/testnet"
	"github.com/ibvbridge/ibvbridge/internal/testutil"
)

// TestRecvXDPOverVeth runs `recv --transport xdp` in one network namespace and `send` in another, joined
// by a veth pair (addresses only inside them), for unicast and multicast, and a consumer checks every byte.
// After recv exits the interface carries no XDP program.
func TestRecvXDPOverVeth(t *testing.T) {
	pair := testutil.VethPair(t, testnet.VethConfig{})
	for _, tc := range []struct{ name, dest, flavour string }{
		{"unicast", pair.RecvAddr.String(), "64-40"},
		{"multicast", "239.77.0.1", "64-48"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := testRing(t, "xdp-"+tc.name)
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			args := []string{"recv", "--ring", name, "--transport", "xdp", "--interface", pair.RecvIf, "--slots", "256",
				"--slot-size", "64K", "--hugepages", "off", "--log-format", "json"}
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
			send := exec.CommandContext(ctx, "ip", "netns", "exec", pair.SendNS, binary(t), "send", tc.dest+":7148",
				"--heaps", "300", "--heap-size", "20000", "--items", "2", "--packet-size", "1472", "--flavour", tc.flavour,
				"--pattern", "--rate", "0.2", "--ttl", "4")
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
			if m["result"] != "stream_stop" || num(m, "heaps") != 300 || num(m, "incomplete_heaps") != 0 {
				t.Fatalf("recv counters %v\n%s", m, rerr.String())
			}
			if tcm, _ := m["transport_counters"].(map[string]any); num(tcm, "xdp_redirected") == 0 {
				t.Fatalf("no frame went through AF_XDP: %v", tcm)
			}
			if cr.Heaps != 300 || cr.VerifyErrors != 0 || cr.Result != "eos" {
				t.Fatalf("consumer %+v", cr)
			}
			out, _ := exec.Command("ip", "-n", pair.RecvNS, "link", "show", "dev", pair.RecvIf).CombinedOutput()
			if strings.Contains(string(out), "xdp") || strings.Contains(string(out), "prog/") {
				t.Fatalf("XDP program left on %s after recv exited:\n%s", pair.RecvIf, out)
			}
		})
	}
}
