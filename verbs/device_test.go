package verbs

import (
	"bytes"
	"strings"
	"syscall"
	"testing"
)

func TestFormatNoDevices(t *testing.T) {
	var b bytes.Buffer
	if err := Format(&b, nil); err != nil {
		t.Fatal(err)
	}
	if b.String() != NoDevicesLine+"\n" {
		t.Fatalf("%q", b.String())
	}
}

func TestFormatTable(t *testing.T) {
	devs := []Device{{
		Name: "mlx5_0", NodeGUID: 0x0c42a1030065_8e4a, NumCompVectors: 63,
		Caps: Capabilities{ManagedFlowSteering: true, RawIPChecksum: true, CVLANStripping: true, ScatterFCS: true,
			PacingMinKbps: 1, PacingMaxKbps: 100000000, PacingRawPacket: true},
		Ports: []Port{{Num: 1, State: 4, LinkLayer: LinkLayerEthernet, ActiveMTU: 4096, Width: 4, SpeedGbps: 4 * ibLaneGbps(32)}},
	}, {
		Name: "mlx4_0", NodeGUID: 1,
		Caps:  Capabilities{RawPacketQP: syscall.EPERM},
		Ports: []Port{{Num: 1, State: 1, LinkLayer: LinkLayerInfiniBand, ActiveMTU: 2048, Width: 4, SpeedGbps: 40}, {Num: 2, QueryError: syscall.EIO}},
	}, {
		Name: "broken", OpenErr: syscall.EACCES,
	}}
	var b bytes.Buffer
	if err := Format(&b, devs); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	t.Log("\n" + out)
	for _, want := range []string{
		"DEVICE", "mlx5_0", "0c42:a103:0065:8e4a", "ACTIVE", "Ethernet", "4096", "103.1 Gb/s", "1k-100G", "63",
		"no(CAP_NET_RAW)", "InfiniBand", "40 Gb/s", "DOWN", "error: input/output error", "broken", "error: permission denied",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q", want)
		}
	}
	if n := strings.Count(out, "\n"); n != 5 {
		t.Errorf("%d lines, want header + 4 rows", n)
	}
}

func TestDecoders(t *testing.T) {
	if ibMTU(5) != 4096 || ibMTU(1) != 256 || ibMTU(0) != 0 {
		t.Fatal("mtu")
	}
	if ibWidth(2) != 4 || ibWidth(16) != 2 || ibWidth(3) != 0 {
		t.Fatal("width")
	}
	if PortState(4).String() != "ACTIVE" || LinkLayerUnspecified.String() != "unspecified" {
		t.Fatal("strings")
	}
}
