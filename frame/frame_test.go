package frame_test

import (
	"bytes"
	"errors"
	"net/netip"
	"path/filepath"
	"testing"

	"github.com/ibvbridge/ibvbridge/frame"
	"github.com/ibvbridge/ibvbridge/frame/frametest"
)

// sampleHeader is the header of the hand-checked frame below.
var sampleHeader = frame.Header{
	SrcMAC:       [6]byte{0x02, 0x00, 0x00, 0x00, 0x00, 0x01},
	DstMAC:       [6]byte{0x01, 0x00, 0x5e, 0x01, 0x02, 0x03},
	SrcIP:        netip.MustParseAddr("10.0.0.1"),
	DstIP:        netip.MustParseAddr("239.1.2.3"),
	SrcPort:      50000,
	DstPort:      7148,
	TTL:          4,
	TOS:          0xB8, // DSCP 46 (EF) << 2
	ID:           0x1234,
	DontFragment: true,
}

var samplePayload = []byte{0xde, 0xad, 0xbe, 0xef}

// sampleFrame is sampleHeader + samplePayload, written out by hand.
var sampleFrame = []byte{
	// Ethernet: destination MAC (239.1.2.3 → 01:00:5e + low 23 bits 01:02:03), source MAC, EtherType IPv4.
	0x01, 0x00, 0x5e, 0x01, 0x02, 0x03,
	0x02, 0x00, 0x00, 0x00, 0x00, 0x01,
	0x08, 0x00,
	// IPv4: version 4 / IHL 5 words; TOS 0xB8.
	0x45, 0xB8,
	// Total length 20 (IP) + 8 (UDP) + 4 (payload) = 32.
	0x00, 0x20,
	// Identification 0x1234; flags DF (0x4000), fragment offset 0.
	0x12, 0x34, 0x40, 0x00,
	// TTL 4, protocol 17 (UDP).
	0x04, 0x11,
	// Header checksum: the 16-bit words 45B8 0020 1234 4000 0411 0000 0A00 0001 EF01 0203 sum to 0x19722;
	// folding the carry gives 0x9722 + 1 = 0x9723, and its complement is 0x68DC.
	0x68, 0xDC,
	// Source 10.0.0.1, destination 239.1.2.3.
	0x0a, 0x00, 0x00, 0x01,
	0xef, 0x01, 0x02, 0x03,
	// UDP: source port 50000 = 0xC350, destination port 7148 = 0x1BEC, length 8 + 4 = 12, checksum 0.
	0xc3, 0x50, 0x1b, 0xec,
	0x00, 0x0c, 0x00, 0x00,
	// Payload.
	0xde, 0xad, 0xbe, 0xef,
}

func buildSample(t *testing.T, b *frame.Builder) []byte {
	t.Helper()
	buf := make([]byte, frame.HeaderLen+len(samplePayload))
	if err := b.Build(buf, len(samplePayload)); err != nil {
		t.Fatal(err)
	}
	copy(buf[frame.HeaderLen:], samplePayload)
	return buf
}

func TestBuildMatchesHandCheckedFrame(t *testing.T) {
	got := buildSample(t, &frame.Builder{Header: sampleHeader})
	if !bytes.Equal(got, sampleFrame) {
		t.Fatalf("built frame\n got %x\nwant %x", got, sampleFrame)
	}
}

func TestBuildWithoutIPChecksum(t *testing.T) {
	got := buildSample(t, &frame.Builder{Header: sampleHeader, NoIPChecksum: true})
	want := bytes.Clone(sampleFrame)
	want[24], want[25] = 0, 0
	if !bytes.Equal(got, want) {
		t.Fatalf("built frame\n got %x\nwant %x", got, want)
	}
}

func TestParseHandCheckedFrame(t *testing.T) {
	for _, p := range []frame.Parser{{}, {VerifyIPChecksum: true}} {
		u, err := p.Parse(sampleFrame)
		if err != nil {
			t.Fatal(err)
		}
		if u.Header != sampleHeader {
			t.Errorf("header\n got %+v\nwant %+v", u.Header, sampleHeader)
		}
		if !bytes.Equal(u.Payload, samplePayload) {
			t.Errorf("payload %x, want %x", u.Payload, samplePayload)
		}
	}
	// Ethernet pads short frames to 60 bytes: the padding is not payload.
	padded := append(bytes.Clone(sampleFrame), make([]byte, 60-len(sampleFrame))...)
	if u, err := frame.Parse(padded); err != nil || !bytes.Equal(u.Payload, samplePayload) {
		t.Errorf("padded frame: payload %x, err %v", u.Payload, err)
	}
}

func TestParseBuildRoundTrip(t *testing.T) {
	headers := []frame.Header{
		sampleHeader,
		{SrcIP: netip.MustParseAddr("0.0.0.0"), DstIP: netip.MustParseAddr("255.255.255.255")},
		{SrcMAC: [6]byte{1, 2, 3, 4, 5, 6}, DstMAC: [6]byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
			SrcIP: netip.MustParseAddr("192.168.1.200"), DstIP: netip.MustParseAddr("127.0.0.1"),
			SrcPort: 65535, DstPort: 1, TTL: 255, TOS: 0xff, ID: 0xffff},
	}
	for _, h := range headers {
		for _, n := range []int{0, 1, 1472, 8972, frame.MaxPayloadLen} {
			buf := make([]byte, frame.HeaderLen+n)
			for i := range n {
				buf[frame.HeaderLen+i] = byte(i * 7)
			}
			b := frame.Builder{Header: h}
			if err := b.Build(buf, n); err != nil {
				t.Fatal(err)
			}
			u, err := frame.Parser{VerifyIPChecksum: true}.Parse(buf)
			if err != nil {
				t.Fatalf("%+v payload %d: %v", h, n, err)
			}
			if u.Header != h || !bytes.Equal(u.Payload, buf[frame.HeaderLen:]) {
				t.Fatalf("round trip of %+v payload %d: got %+v, %d bytes", h, n, u.Header, len(u.Payload))
			}
		}
	}
}

func TestBuildErrors(t *testing.T) {
	b := frame.Builder{Header: sampleHeader}
	if err := b.Build(make([]byte, frame.HeaderLen-1), 0); !errors.Is(err, frame.ErrBufferTooSmall) {
		t.Errorf("short buffer: %v", err)
	}
	if err := b.Build(make([]byte, frame.HeaderLen), frame.MaxPayloadLen+1); !errors.Is(err, frame.ErrPayloadTooLarge) {
		t.Errorf("huge payload: %v", err)
	}
	b.DstIP = netip.MustParseAddr("::1")
	if err := b.Build(make([]byte, frame.HeaderLen), 0); !errors.Is(err, frame.ErrNotIPv4Address) {
		t.Errorf("IPv6 address: %v", err)
	}
}

// mutate returns a copy of the sample frame changed by f (the IPv4 checksum is left stale).
func mutate(f func(b []byte)) []byte {
	b := bytes.Clone(sampleFrame)
	f(b)
	return b
}

func TestParseRejects(t *testing.T) {
	cases := []struct {
		name  string
		frame []byte
		want  error
	}{
		{"empty", nil, frame.ErrTruncated},
		{"ethernet only", sampleFrame[:14], frame.ErrTruncated},
		{"ip cut", sampleFrame[:30], frame.ErrTruncated},
		{"udp cut", sampleFrame[:40], frame.ErrTruncated},
		{"payload cut", sampleFrame[:44], frame.ErrTruncated},
		{"arp", mutate(func(b []byte) { b[12], b[13] = 0x08, 0x06 }), frame.ErrNotIPv4},
		{"ipv6", mutate(func(b []byte) { b[12], b[13] = 0x86, 0xdd }), frame.ErrNotIPv4},
		{"802.1Q", mutate(func(b []byte) { b[12], b[13] = 0x81, 0x00 }), frame.ErrVLAN},
		{"QinQ", mutate(func(b []byte) { b[12], b[13] = 0x88, 0xa8 }), frame.ErrVLAN},
		{"version 6 in IPv4 EtherType", mutate(func(b []byte) { b[14] = 0x65 }), frame.ErrBadIPHeader},
		{"IHL 4", mutate(func(b []byte) { b[14] = 0x44 }), frame.ErrBadIPHeader},
		{"IHL 6", mutate(func(b []byte) { b[14] = 0x46 }), frame.ErrIPOptions},
		{"total length 19", mutate(func(b []byte) { b[16], b[17] = 0, 19 }), frame.ErrBadIPHeader},
		{"total length 21", mutate(func(b []byte) { b[16], b[17] = 0, 21 }), frame.ErrTruncated},
		{"total length past frame", mutate(func(b []byte) { b[16], b[17] = 0, 33 }), frame.ErrTruncated},
		{"more fragments", mutate(func(b []byte) { b[20] = 0x20 }), frame.ErrFragmented},
		{"fragment offset", mutate(func(b []byte) { b[20], b[21] = 0x00, 0x01 }), frame.ErrFragmented},
		{"tcp", mutate(func(b []byte) { b[23] = 6 }), frame.ErrNotUDP},
		{"udp length short", mutate(func(b []byte) { b[39] = 11 }), frame.ErrBadUDPLength},
		{"udp length long", mutate(func(b []byte) { b[39] = 13 }), frame.ErrBadUDPLength},
	}
	for _, c := range cases {
		_, err := frame.Parse(c.frame)
		if !errors.Is(err, c.want) {
			t.Errorf("%s: got %v, want %v", c.name, err, c.want)
		}
		if frame.ReasonOf(err) == frame.ReasonNone || frame.ReasonOf(err).String() == "unknown" {
			t.Errorf("%s: reason %v", c.name, frame.ReasonOf(err))
		}
	}
	bad := mutate(func(b []byte) { b[25] ^= 1 })
	if _, err := (frame.Parser{VerifyIPChecksum: true}).Parse(bad); !errors.Is(err, frame.ErrBadIPChecksum) {
		t.Errorf("bad checksum with verification: %v", err)
	}
	if _, err := frame.Parse(bad); err != nil {
		t.Errorf("bad checksum without verification: %v", err)
	}
}

func TestReasonStrings(t *testing.T) {
	seen := map[string]bool{}
	for r := frame.ReasonNone; r < frame.NumReasons; r++ {
		s := r.String()
		if s == "" || s == "unknown" || seen[s] {
			t.Errorf("reason %d: %q", r, s)
		}
		seen[s] = true
	}
	if frame.ReasonOf(errors.New("x")) != frame.ReasonOther {
		t.Error("foreign error not ReasonOther")
	}
}

func TestMulticastMAC(t *testing.T) {
	cases := []struct {
		ip   string
		mac  [6]byte
		isMC bool
	}{
		{"239.1.2.3", [6]byte{0x01, 0x00, 0x5e, 0x01, 0x02, 0x03}, true},
		// The 24th bit is dropped: 239.129.2.3 and 239.1.2.3 share a MAC.
		{"239.129.2.3", [6]byte{0x01, 0x00, 0x5e, 0x01, 0x02, 0x03}, true},
		{"224.0.0.1", [6]byte{0x01, 0x00, 0x5e, 0x00, 0x00, 0x01}, true},
		{"239.255.255.255", [6]byte{0x01, 0x00, 0x5e, 0x7f, 0xff, 0xff}, true},
		{"10.0.0.1", [6]byte{}, false},
		{"ff02::1", [6]byte{}, false},
	}
	for _, c := range cases {
		mac, ok := frame.MulticastMAC(netip.MustParseAddr(c.ip))
		if mac != c.mac || ok != c.isMC {
			t.Errorf("%s: got %x %v, want %x %v", c.ip, mac, ok, c.mac, c.isMC)
		}
	}
}

func TestParseCaptures(t *testing.T) {
	dir := frametest.Dir(t)
	for _, c := range frametest.Captures {
		t.Run(c.Name, func(t *testing.T) {
			frames := frametest.ReadFrames(t, filepath.Join(dir, c.Name))
			if len(frames) != c.Frames {
				t.Errorf("%d frames, want %d", len(frames), c.Frames)
			}
			loopback := netip.MustParseAddr("127.0.0.1")
			for i, f := range frames {
				u, err := frame.Parser{VerifyIPChecksum: true}.Parse(f)
				if err != nil {
					t.Fatalf("frame %d: %v", i, err)
				}
				if u.DstIP != loopback || u.SrcIP != loopback {
					t.Fatalf("frame %d: %v -> %v", i, u.SrcIP, u.DstIP)
				}
				if len(u.Payload) > c.PacketSize {
					t.Fatalf("frame %d: payload %d > --packet %d", i, len(u.Payload), c.PacketSize)
				}
			}
		})
	}
}

func TestZeroAllocs(t *testing.T) {
	buf := make([]byte, frame.HeaderLen+8972)
	b := frame.Builder{Header: sampleHeader}
	var sink int
	allocs := testing.AllocsPerRun(1000, func() {
		if err := b.Build(buf, 8972); err != nil {
			t.Fatal(err)
		}
		u, err := frame.Parser{VerifyIPChecksum: true}.Parse(buf)
		if err != nil {
			t.Fatal(err)
		}
		_, err = frame.Parse(buf[:20])
		sink += len(u.Payload) + int(frame.ReasonOf(err))
	})
	if allocs != 0 {
		t.Errorf("%v allocations per build+parse, want 0", allocs)
	}
}

func FuzzParse(f *testing.F) {
	f.Add(sampleFrame)
	f.Add(sampleFrame[:40])
	f.Add(mutate(func(b []byte) { b[14] = 0x46 }))
	f.Add(mutate(func(b []byte) { b[12], b[13] = 0x81, 0x00 }))
	f.Add(mutate(func(b []byte) { b[16], b[17] = 0xff, 0xff }))
	f.Add(mutate(func(b []byte) { b[38], b[39] = 0, 0 }))
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, p := range []frame.Parser{{}, {VerifyIPChecksum: true}} {
			u, err := p.Parse(data)
			if err != nil {
				if frame.ReasonOf(err) == frame.ReasonOther || frame.ReasonOf(err) == frame.ReasonNone {
					t.Fatalf("error %v without a reason", err)
				}
				continue
			}
			if len(data) < frame.HeaderLen+len(u.Payload) {
				t.Fatalf("payload %d bytes from a %d-byte frame", len(u.Payload), len(data))
			}
			// The payload must be the bytes right after the 42 header bytes.
			if len(u.Payload) > 0 && &u.Payload[0] != &data[frame.HeaderLen] {
				t.Fatal("payload not at offset 42")
			}
			// Rebuilding the headers must reproduce the frame (checksum aside, unless verified).
			re := make([]byte, frame.HeaderLen+len(u.Payload))
			b := frame.Builder{Header: u.Header, NoIPChecksum: !p.VerifyIPChecksum}
			if err := b.Build(re, len(u.Payload)); err != nil {
				t.Fatal(err)
			}
			orig := bytes.Clone(data[:frame.HeaderLen])
			if !p.VerifyIPChecksum {
				orig[24], orig[25] = 0, 0
			}
			// Fields Parse ignores: IP flags other than DF/MF (the reserved bit) and the UDP checksum.
			orig[20] &= 0x40
			orig[40], orig[41] = 0, 0
			if !bytes.Equal(re[:frame.HeaderLen], orig) {
				t.Fatalf("rebuilt headers\n got %x\nwant %x", re[:frame.HeaderLen], orig)
			}
		}
	})
}

func BenchmarkParse(b *testing.B) {
	buf := make([]byte, frame.HeaderLen+8972)
	builder := frame.Builder{Header: sampleHeader}
	if err := builder.Build(buf, 8972); err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		if _, err := frame.Parse(buf); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkBuild(b *testing.B) {
	buf := make([]byte, frame.HeaderLen+8972)
	builder := frame.Builder{Header: sampleHeader}
	b.ReportAllocs()
	for b.Loop() {
		if err := builder.Build(buf, 8972); err != nil {
			b.Fatal(err)
		}
	}
}
