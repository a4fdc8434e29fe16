package main

import (
	"errors"
	"flag"
	"io"
	"strings"
	"testing"
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
