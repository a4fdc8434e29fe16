package main

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"

	"github.com/ibvbridge/ibvbridge/bench"
)

// optionCase is one command line and the one usage line its validation must give ("" : valid).
type optionCase struct {
	args []string
	want string
}

// checkOptions runs parse on each case's command line (nothing is opened) and checks the result: a usage
// error (exit status 2) of one line containing want, or no error.
func checkOptions(t *testing.T, cases []optionCase, parse func(fs *flag.FlagSet, args []string) error) {
	t.Helper()
	for _, c := range cases {
		fs := newFlagSet("test", io.Discard)
		err := parse(fs, c.args)
		if c.want == "" {
			if err != nil {
				t.Errorf("%q: %v, want valid", c.args, err)
			}
			continue
		}
		var ee *exitError
		switch {
		case err == nil:
			t.Errorf("%q: valid, want %q", c.args, c.want)
		case !errors.As(err, &ee) || ee.code != 2:
			t.Errorf("%q: %v is not a usage error", c.args, err)
		case strings.Contains(err.Error(), "\n") || !strings.Contains(err.Error(), c.want):
			t.Errorf("%q: %q, want one line with %q", c.args, err, c.want)
		}
	}
}

func TestSendOptionsValidateGivesOneUsageLine(t *testing.T) {
	checkOptions(t, []optionCase{
		{[]string{"9000"}, ""},
		{[]string{"127.0.0.1:9000", "127.0.0.1:9001", "--threads", "2", "--transport", "udp"}, ""},
		{[]string{"--ring", "r", "9000", "--incomplete"}, ""},
		{nil, "want exactly one destination HOST:PORT"},
		{[]string{"--ring", "r", "9000", "9001"}, "want exactly one destination"},
		{[]string{"9000", "--threads", "2"}, "--threads 2: want 1..1"},
		{[]string{"9000", "--flavour", "64-32"}, `--flavour "64-32": want 64-40 or 64-48`},
		{[]string{"9000", "--heap-size", "0"}, "--heap-size must be positive"},
		{[]string{"9000", "--heaps", "0"}, "--heaps must be positive"},
		{[]string{"9000", "--rate", "NaN"}, "--rate NaN: want Gb/s >= 0"},
		{[]string{"9000", "--rate", "-1"}, "--rate -1: want Gb/s >= 0"},
		{[]string{"9000", "--items", "0"}, "--items 0: want 1..heap size"},
		{[]string{"9000", "--packet-size", "65508"}, "a UDP payload is at most 65507 bytes"},
		{[]string{"9000", "--packet-size", "10"}, "--packet-size 10:"},
		{[]string{"9000", "--batch", "0"}, "--batch 0: want 1..1024"},
		{[]string{"9000", "--ttl", "256"}, "--ttl 256: want 0..255"},
		{[]string{"9000", "--interface", "eth0"}, `--interface "eth0": want the interface's local IPv4 address`},
		{[]string{"9000", "--transport", "tcp"}, `--transport "tcp": want udp, xdp or ibv`},
		{[]string{"9000", "--transport", "pcap"}, `--transport "pcap": want udp, xdp or ibv`},
		{[]string{"9000", "--ibv", "--transport", "udp"}, "--ibv means --transport ibv"},
		{[]string{"9000", "--axis", "0x4101:4"}, "--axis goes with --timestamp-step"},
		{[]string{"9000", "--timestamp-step", "4", "--axis", "0x4101"}, "want ITEM:COUNT"},
		{[]string{"9000", "--timestamp-step", "4", "--timestamp-item", "x"}, `--timestamp-item "x"`},
		{[]string{"--ring", "r", "9000", "--heaps", "5"}, "--heaps describes a generated stream: it does not go with --ring"},
		{[]string{"9000", "--incomplete"}, "--incomplete goes with --ring"},
		{[]string{"9000", "--wait-dir", "/tmp"}, "--wait-dir and --wait-consumers go with --wait-ring"},
		{[]string{"9000", "--wait-ring", "r", "--wait-timeout", "0s"}, "--wait-timeout positive"},
		{[]string{"nohost:port"}, "nohost:port"},
	}, func(fs *flag.FlagSet, args []string) error { return parseSend(fs, sendFlags(fs), args) })
}

// TestSendRingDefaultsRateToTheRingsPace: with --ring and no --rate, send relays at the ring's pace.
func TestSendRingDefaultsRateToTheRingsPace(t *testing.T) {
	for _, c := range []struct {
		args []string
		rate float64
	}{{[]string{"9000"}, defaultSendRate}, {[]string{"--ring", "r", "9000"}, 0}, {[]string{"--ring", "r", "9000", "--rate", "3"}, 3}} {
		fs := newFlagSet("send", io.Discard)
		o := sendFlags(fs)
		if err := parseSend(fs, o, c.args); err != nil || o.rate != c.rate {
			t.Errorf("%q: rate %g (%v), want %g", c.args, o.rate, err, c.rate)
		}
	}
}

func TestRecvOptionsValidateGivesOneUsageLine(t *testing.T) {
	r := []string{"--ring", "r"}
	with := func(a ...string) []string { return append(append([]string{}, r...), a...) }
	checkOptions(t, []optionCase{
		{with("9000"), ""},
		{with("--pcap", "x.pcap"), ""},
		{with("--chunk-heaps", "8", "--chunk-by", "0x1600", "--chunk-heap-size", "8K", "9000"), ""},
		{with("--transport", "xdp", "--interface", "lo", "9000"), ""},
		{[]string{"9000"}, "--ring is required"},
		{[]string{"--ring", "bad/name", "9000"}, `--ring "bad/name"`},
		{with("--slots", "3", "9000"), "--slots 3: want a power of two"},
		{with("--slot-size", "512", "9000"), "--slot-size 512: want at least"},
		{with("--max-items", "0", "9000"), "--max-items 0"},
		{with("--max-observers", "0", "9000"), "--max-observers 0"},
		{with("--max-consumers", "0", "9000"), "--max-consumers 0"},
		{with("--max-heaps", "0", "9000"), "--max-heaps 0"},
		{with("--max-packet", "10", "9000"), "--max-packet 10: want 64..65535"},
		{with("--log-format", "xml", "9000"), `--log-format "xml": want console or json`},
		{with("--hugepages", "maybe", "9000"), `--hugepages "maybe"`},
		{with("--policy", "sometimes", "9000"), `--policy "sometimes": want drop or block`},
		{with("--interface", "eth0", "9000"), `--interface "eth0"`},
		{with("--transport", "tcp", "9000"), `--transport "tcp": want udp, pcap, xdp or ibv`},
		{with("--ibv", "--transport", "udp", "9000"), "--ibv means --transport ibv"},
		{r, "no endpoints: give host:port or port (or --pcap FILE)"},
		{with("--transport", "udp", "--pcap", "x.pcap", "9000"), "--pcap replays a file: it does not go with --transport udp"},
		{with("--threads", "2", "9000"), "--threads 2: want 1..1"},
		{with("--cpus", "a", "9000"), `--cpus "a"`},
		{with("--transport", "pcap", "9000"), "--transport pcap needs --pcap FILE"},
		{with("--transport", "xdp", "9000"), "--transport xdp needs --interface"},
		{with("--transport", "xdp", "--interface", "lo", "--zero-copy", "--copy", "9000"), "exclude each other"},
		{with("--transport", "ibv", "9000"), "receives multicast only"},
		{with("--transport", "ibv", "--pcap", "x.pcap", "239.1.2.3:9000"), "it does not go with --transport ibv"},
		{with("--chunk-by", "0x1600", "9000"), "--chunk-by goes with --chunk-heaps"},
		{with("--chunk-place-items", "1", "9000"), "--chunk-place-items goes with --chunk-place"},
		{with("--chunk-heaps", "8", "--chunk-heap-size", "8K", "9000"), "needs --chunk-by"},
		{with("--chunk-heaps", "8", "--chunk-by", "0x1600", "9000"), "needs --chunk-heap-size"},
		{with("--chunk-heaps", "8", "--chunk-by", "0x1600", "--chunk-heap-size", "8K", "--slot-size", "1M", "9000"), "--slot-size does not go"},
		{with("--consumer-group", "work=0", "--consumer-group", "work=1", "9000"), "given twice"},
		{with("nohost:port"), "nohost:port"},
	}, func(fs *flag.FlagSet, args []string) error { return parseRecv(fs, recvFlags(fs), args) })
}

// TestRecvPolicyDefaultsToBlockForReplay: a replay blocks on a full ring unless --policy says otherwise.
func TestRecvPolicyDefaultsToBlockForReplay(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{{[]string{"--ring", "r", "9000"}, "drop"}, {[]string{"--ring", "r", "--pcap", "f"}, "block"}, {[]string{"--ring", "r", "--pcap", "f", "--policy", "drop"}, "drop"}} {
		fs := newFlagSet("recv", io.Discard)
		o := recvFlags(fs)
		if err := parseRecv(fs, o, c.args); err != nil || o.pol.String() != c.want || o.ringConfig().Policy != o.pol {
			t.Errorf("%q: policy %v (%v), want %s", c.args, o.pol, err, c.want)
		}
	}
}

// TestRecvSmallSlotsGetMoreOfThemByDefault: without --slots, small slots come in numbers that outlast a
// descheduled consumer (at most the default ring's memory); --slots and chunk mode keep theirs.
func TestRecvSmallSlotsGetMoreOfThemByDefault(t *testing.T) {
	for _, c := range []struct {
		args []string
		want int
	}{
		{[]string{"9000"}, 128},
		{[]string{"--slot-size", "256K", "9000"}, 128},
		{[]string{"--slot-size", "64K", "9000"}, 512},
		{[]string{"--slot-size", "8K", "9000"}, 4096},
		{[]string{"--slot-size", "1K", "9000"}, 16384},
		{[]string{"--slot-size", "1K", "--slots", "64", "9000"}, 64},
		{[]string{"--chunk-heaps", "8", "--chunk-by", "0x1600", "--chunk-heap-size", "1K", "9000"}, 128},
	} {
		fs := newFlagSet("recv", io.Discard)
		o := recvFlags(fs)
		err := parseRecv(fs, o, append([]string{"--ring", "r"}, c.args...))
		if err != nil || o.slots != c.want || o.ringConfig().SlotCount != c.want {
			t.Errorf("%q: %d slots (%v), want %d", c.args, o.slots, err, c.want)
		}
		if cfg := o.ringConfig(); !o.chunks.Enabled() && cfg.SlotCount*cfg.SlotSize > defaultSlots*defaultSlotSize {
			t.Errorf("%q: %d × %d bytes, more than the default ring's", c.args, cfg.SlotCount, cfg.SlotSize)
		}
	}
}

func TestStatOptionsValidateGivesOneUsageLine(t *testing.T) {
	checkOptions(t, []optionCase{
		{[]string{"r"}, ""},
		{[]string{"r", "--watch", "--interval", "10ms", "--json"}, ""},
		{nil, "usage: ibvbridge stat [--json] [--watch] RING"},
		{[]string{"a", "b"}, "usage: ibvbridge stat"},
		{[]string{"r", "--interval", "0s"}, "--interval 0s: want a positive duration"},
	}, func(fs *flag.FlagSet, args []string) error { return parseStat(fs, statFlags(fs), args) })
}

func TestConsumeOptionsValidateGivesOneUsageLine(t *testing.T) {
	checkOptions(t, []optionCase{
		{[]string{"--ring", "r"}, ""},
		{[]string{"--ring", "r", "--start", "head", "--hold", "2"}, ""},
		{nil, "--ring is required"},
		{[]string{"--ring", "r", "extra"}, `unexpected argument "extra"`},
		{[]string{"--ring", "r", "--timeout-ms", "-1"}, "--timeout-ms -1"},
		{[]string{"--ring", "r", "--hold", "-1"}, "--hold -1"},
		{[]string{"--ring", "r", "--sleep-us", "-1"}, "--sleep-us -1"},
		{[]string{"--ring", "r", "--work-passes", "-1"}, "--work-passes -1"},
		{[]string{"--ring", "r", "--max-latency-us", "-1"}, "--max-latency-us -1"},
		{[]string{"--ring", "r", "--start", "middle"}, `--start "middle": want oldest or head`},
	}, func(fs *flag.FlagSet, args []string) error { return parseConsume(fs, consumeFlags(fs), args) })
}

func TestBenchUDPValidateGivesOneUsageLine(t *testing.T) {
	for _, c := range []struct {
		o        bench.UDPOptions
		baseline string
		want     string
	}{
		{bench.UDPOptions{ChunkHeaps: 8, ChunkAxis: 4}, "", ""},
		{bench.UDPOptions{}, "/usr/bin/ibvbridge", ""},
		{bench.UDPOptions{ChunkHeaps: -1}, "", "--chunk-heaps -1: want a positive count"},
		{bench.UDPOptions{ChunkHeaps: 8}, "/usr/bin/ibvbridge", "not with --baseline"},
		{bench.UDPOptions{ChunkAxis: 4}, "", "--chunk-axis 4: want a positive count, with --chunk-heaps"},
	} {
		err := validateBenchUDP(c.o, c.baseline)
		var ee *exitError
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%+v: %v, want valid", c.o, err)
		case c.want != "" && (!errors.As(err, &ee) || ee.code != 2 || !strings.Contains(err.Error(), c.want)):
			t.Errorf("%+v, baseline %q: %v, want a usage error with %q", c.o, c.baseline, err, c.want)
		}
	}
}
