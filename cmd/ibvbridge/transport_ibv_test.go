package main

import (
	"bytes"
	"context"
	"flag"
	"io"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/transport"
	"github.com/ibvbridge/ibvbridge/verbs"
)

var ibvEnvNames = []string{verbs.EnvLibrary, verbs.EnvInterface, verbs.EnvCompVector, verbs.EnvSpead2Interface, verbs.EnvSpead2CompVector}

// runEnv runs the binary with the ibverbs variables cleared and then set from env.
func runEnv(t *testing.T, env map[string]string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, binary(t), args...)
	for _, kv := range os.Environ() {
		keep := true
		for _, n := range ibvEnvNames {
			if strings.HasPrefix(kv, n+"=") {
				keep = false
			}
		}
		if keep {
			cmd.Env = append(cmd.Env, kv)
		}
	}
	for k, v := range env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		t.Fatalf("%v: timed out", args)
	}
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("%v: %v", args, err)
	}
	return out.String(), errb.String(), code
}

// oneLine checks the command failed with exit code want and exactly one line on stderr containing substr.
func oneLine(t *testing.T, stderr string, code, want int, substr string) {
	t.Helper()
	line := strings.TrimSpace(stderr)
	if code != want || strings.Count(line, "\n") != 0 || !strings.Contains(line, substr) {
		t.Errorf("exit %d (want %d), stderr %q (want one line containing %q)", code, want, stderr, substr)
	}
}

// skipWithRDMA skips tests of the no-device behaviour on a machine that has RDMA devices.
func skipWithRDMA(t *testing.T) {
	if ents, err := os.ReadDir("/sys/class/infiniband"); err == nil && len(ents) > 0 {
		t.Skip("this machine has RDMA devices")
	}
}

func ringFiles(t *testing.T, name string) []string {
	var found []string
	for _, dir := range []string{ring.DefaultDir()} {
		m, _ := filepath.Glob(filepath.Join(dir, "*"+name+"*"))
		found = append(found, m...)
	}
	return found
}

// TestIBVWithoutDevice: libibverbs is installed but the kernel has no RDMA support: one clear line, exit 1,
// and recv leaves no ring behind (the device is checked before the ring is created).
func TestIBVWithoutDevice(t *testing.T) {
	skipWithRDMA(t)
	const want = "no RDMA devices found (kernel has no RDMA support"
	name := testRing(t, "ibvnodev")
	_, stderr, code := runEnv(t, nil, "recv", "--ring", name, "--transport", "ibv", "--interface", "192.0.2.2", "239.1.2.3:7148")
	oneLine(t, stderr, code, 1, want)
	if f := ringFiles(t, name); len(f) != 0 {
		t.Errorf("ring files left: %v", f)
	}
	_, stderr, code = runEnv(t, nil, "send", "--transport", "ibv", "--interface", "192.0.2.2", "239.1.2.3:7148", "--heaps", "1")
	oneLine(t, stderr, code, 1, want)
	// spead2's spelling.
	_, stderr, code = runEnv(t, nil, "send", "--ibv", "--interface", "192.0.2.2", "239.1.2.3:7148", "--ibv-vector", "-1")
	oneLine(t, stderr, code, 1, want)
}

// TestIBVWithoutLibrary: a host without rdma-core (simulated by pointing the loader at a missing file).
func TestIBVWithoutLibrary(t *testing.T) {
	env := map[string]string{verbs.EnvLibrary: "/nonexistent/libibverbs.so.1"}
	const want = "libibverbs.so.1 not found: install rdma-core / ibverbs-providers"
	_, stderr, code := runEnv(t, env, "recv", "--ring", testRing(t, "ibvnolib"), "--ibv", "--interface", "192.0.2.2", "239.1.2.3:7148")
	oneLine(t, stderr, code, 1, want)
	_, stderr, code = runEnv(t, env, "send", "--transport", "ibv", "--interface", "192.0.2.2", "239.1.2.3:7148")
	oneLine(t, stderr, code, 1, want)
}

// TestIBVConfigErrorsBeforeDevice: every configuration mistake is a usage error (exit 2, one line) found
// before libibverbs is even loaded: the library is hidden, and its error never shows.
func TestIBVConfigErrorsBeforeDevice(t *testing.T) {
	hidden := map[string]string{verbs.EnvLibrary: "/nonexistent/libibverbs.so.1"}
	with := func(kv ...string) map[string]string {
		m := map[string]string{verbs.EnvLibrary: hidden[verbs.EnvLibrary]}
		for i := 0; i+1 < len(kv); i += 2 {
			m[kv[i]] = kv[i+1]
		}
		return m
	}
	recv := []string{"recv", "--ring", "cfgerr", "--transport", "ibv"}
	send := []string{"send", "--transport", "ibv"}
	cases := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"recv unicast", hidden, append(recv, "--interface", "192.0.2.2", "10.1.2.3:7148"), "10.1.2.3:7148 is not an IPv4 multicast address"},
		{"recv port only", hidden, append(recv, "--interface", "192.0.2.2", "7148"), "receives multicast only"},
		{"recv ipv6", hidden, append(recv, "--interface", "192.0.2.2", "[ff02::1]:7148"), "not an IPv4 address"},
		{"recv no endpoints", hidden, append(recv, "--interface", "192.0.2.2"), "no endpoints"},
		{"recv no interface", hidden, append(recv, "239.1.2.3:7148"), "needs --interface"},
		{"recv ipv6 interface", hidden, append(recv, "--interface", "fe80::1", "239.1.2.3:7148"), "--interface"},
		{"recv bad env interface", with(verbs.EnvInterface, "eth0"), append(recv, "239.1.2.3:7148"), `IBVBRIDGE_IBV_INTERFACE="eth0": not an IPv4 address`},
		{"recv bad spead2 env", with(verbs.EnvSpead2CompVector, "x"), append(recv, "--interface", "192.0.2.2", "239.1.2.3:7148"), `SPEAD2_IBV_COMP_VECTOR="x": not an integer`},
		{"recv --ibv with udp", hidden, []string{"recv", "--ring", "cfgerr", "--ibv", "--transport", "udp", "239.1.2.3:7148"}, "--ibv means --transport ibv"},
		{"recv pcap", hidden, append(recv, "--interface", "192.0.2.2", "--pcap", "x.pcap", "239.1.2.3:7148"), "--pcap replays a file"},
		{"recv max poll", hidden, append(recv, "--interface", "192.0.2.2", "--ibv-max-poll", "0", "239.1.2.3:7148"), "--ibv-max-poll 0"},
		{"recv max size", hidden, append(recv, "--interface", "192.0.2.2", "--ibv-max-size", "10", "239.1.2.3:7148"), "--ibv-max-size 10"},
		{"recv bad vector flag", hidden, append(recv, "--interface", "192.0.2.2", "--ibv-vector", "x", "239.1.2.3:7148"), "ibv-vector"},
		{"send port only", hidden, append(send, "--interface", "192.0.2.2", "7148"), "give GROUP:PORT"},
		{"send loopback", hidden, append(send, "--interface", "192.0.2.2", "127.0.0.1:7148"), "give GROUP:PORT"},
		{"send no interface", hidden, append(send, "239.1.2.3:7148"), "needs --interface"},
		{"send bad env", with(verbs.EnvCompVector, "1.5"), append(send, "--interface", "192.0.2.2", "239.1.2.3:7148"), `IBVBRIDGE_IBV_COMP_VECTOR="1.5"`},
		{"send small packet", hidden, append(send, "--interface", "192.0.2.2", "--packet-size", "40", "239.1.2.3:7148"), "packet-size"},
		{"send bad transport", hidden, []string{"send", "--transport", "rdma", "239.1.2.3:7148"}, `--transport "rdma"`},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, stderr, code := runEnv(t, c.env, c.args...)
			oneLine(t, stderr, code, 2, c.want)
			if strings.Contains(stderr, "not found: install rdma-core") {
				t.Errorf("libibverbs was loaded before the configuration was checked: %q", stderr)
			}
		})
	}
}

// TestIBVEnvPrecedence: flag > IBVBRIDGE_IBV_* > SPEAD2_IBV_*, seen through the command line. With no
// RDMA device the command fails at the device check, naming the interface address it was going to use;
// a bad value in the variable that wins is a usage error naming that variable (no silent fall-through),
// and a variable a flag overrides is not read at all.
func TestIBVEnvPrecedence(t *testing.T) {
	skipWithRDMA(t)
	const (
		ibvb   = verbs.EnvInterface
		spead2 = verbs.EnvSpead2Interface
		vecB   = verbs.EnvCompVector
		vecS   = verbs.EnvSpead2CompVector
	)
	for _, cmd := range []string{"recv", "send"} {
		base := []string{cmd, "--transport", "ibv", "239.1.2.3:7148"}
		what := "ibverbs receiver on "
		if cmd == "recv" {
			base = append(base, "--ring", "envprec")
		} else {
			what = "ibverbs sender on "
		}
		cases := []struct {
			name  string
			env   map[string]string
			flags []string
			code  int
			want  string
		}{
			{"flag wins", map[string]string{ibvb: "192.0.2.5", spead2: "192.0.2.6"}, []string{"--interface", "192.0.2.7"}, 1, what + "192.0.2.7:"},
			{"IBVBRIDGE over SPEAD2", map[string]string{ibvb: "192.0.2.5", spead2: "192.0.2.6"}, nil, 1, what + "192.0.2.5:"},
			{"SPEAD2 alone", map[string]string{spead2: "192.0.2.6"}, nil, 1, what + "192.0.2.6:"},
			{"empty IBVBRIDGE is unset", map[string]string{ibvb: " ", spead2: "192.0.2.6"}, nil, 1, what + "192.0.2.6:"},
			{"bad IBVBRIDGE does not fall through", map[string]string{ibvb: "bogus", spead2: "192.0.2.6"}, nil, 2, ibvb + `="bogus"`},
			{"flag hides a bad variable", map[string]string{ibvb: "bogus"}, []string{"--interface", "192.0.2.7"}, 1, what + "192.0.2.7:"},
			{"vector flag hides a bad variable", map[string]string{ibvb: "192.0.2.5", vecB: "x"}, []string{"--ibv-comp-vector", "-1"}, 1, what + "192.0.2.5:"},
			{"spead2 vector flag hides it too", map[string]string{ibvb: "192.0.2.5", vecB: "x"}, []string{"--ibv-vector", "2"}, 1, what + "192.0.2.5:"},
			{"IBVBRIDGE vector shadows SPEAD2", map[string]string{ibvb: "192.0.2.5", vecB: "3", vecS: "x"}, nil, 1, what + "192.0.2.5:"},
			{"bad SPEAD2 vector is read when it wins", map[string]string{ibvb: "192.0.2.5", vecS: "x"}, nil, 2, vecS + `="x"`},
		}
		for _, c := range cases {
			t.Run(cmd+"/"+c.name, func(t *testing.T) {
				_, stderr, code := runEnv(t, c.env, append(append([]string{}, base...), c.flags...)...)
				oneLine(t, stderr, code, c.code, c.want)
			})
		}
	}
}

// TestIBVPacketAreaSizing: the ring's packet area sized from the flags holds the receive buffer's work
// requests wherever the data file maps it.
func TestIBVPacketAreaSizing(t *testing.T) {
	for _, n := range ibvEnvNames {
		t.Setenv(n, "") // empty counts as unset
	}
	for _, c := range []struct {
		flags         []string
		maxSize, want int
	}{
		{nil, 9200, 16 << 20 / 9200},
		{[]string{"--ibv-buffer", "64M", "--ibv-max-size", "1514"}, 1514, 64 << 20 / 1514},
		{[]string{"--ibv-buffer", "1K", "--ibv-max-size", "9000"}, 9000, 1},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		fs.SetOutput(io.Discard)
		fs.String("interface", "", "")
		f := addIBVFlags(fs, false)
		if err := fs.Parse(append(c.flags, "--interface", "192.0.2.2")); err != nil {
			t.Fatal(err)
		}
		eps := []transport.Endpoint{{Addr: mustAddr(t, "239.1.2.3"), Port: 7148}}
		cfg, err := f.recvConfig([]string{"239.1.2.3:7148"}, eps, "192.0.2.2")
		if err != nil {
			t.Fatal(err)
		}
		size := verbs.AreaSize(cfg.MaxSize, cfg.BufferSize) // ibv.Source's AreaSize
		dir := t.TempDir()
		p, err := ring.Create("area", ring.Config{Dir: dir, SlotCount: 4, SlotSize: 4096, PacketArea: size, HugePages: ring.HugePagesOff})
		if err != nil {
			t.Fatal(err)
		}
		area := p.PacketArea()
		l, err := verbs.PlanArea(area, cfg.MaxSize, cfg.BufferSize)
		if err != nil || l.Slots != c.want || cfg.MaxSize != c.maxSize || len(area) < size {
			t.Errorf("%v: area %d bytes (asked %d), layout %+v, err %v; want %d slots", c.flags, len(area), size, l, err, c.want)
		}
		// Any misalignment of the area's start still fits.
		for skew := range verbs.SlotAlign {
			if _, err := verbs.PlanRegion(uintptr(0x1000+skew), size, cfg.MaxSize, cfg.BufferSize); err != nil {
				t.Errorf("%v skew %d: %v", c.flags, skew, err)
			}
		}
		p.Close()
	}
}

func mustAddr(t *testing.T, s string) netip.Addr {
	t.Helper()
	a, err := netip.ParseAddr(s)
	if err != nil {
		t.Fatal(err)
	}
	return a
}
