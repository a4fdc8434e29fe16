package verbs

import (
	"net/netip"
	"strings"
	"testing"
)

func envMap(m map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) { v, ok := m[k]; return v, ok }
}

func TestApplyEnvPrecedence(t *testing.T) {
	all := map[string]string{
		EnvInterface: "10.0.0.1", EnvSpead2Interface: "10.0.0.2",
		EnvCompVector: "3", EnvSpead2CompVector: "5",
	}
	for _, tc := range []struct {
		name   string
		env    map[string]string
		set    FlagsSet
		wantIf string
		wantCV int
	}{
		{"defaults", nil, FlagsSet{}, "192.0.2.1", 0},
		{"spead2 only", map[string]string{EnvSpead2Interface: "10.0.0.2", EnvSpead2CompVector: "-1"}, FlagsSet{}, "10.0.0.2", -1},
		{"ibvbridge beats spead2", all, FlagsSet{}, "10.0.0.1", 3},
		{"flag beats env", all, FlagsSet{Interface: true, CompVector: true}, "192.0.2.1", 0},
		{"empty counts as unset", map[string]string{EnvInterface: " ", EnvSpead2Interface: "10.0.0.2", EnvCompVector: "", EnvSpead2CompVector: "7"}, FlagsSet{}, "10.0.0.2", 7},
	} {
		c := DefaultRecvConfig()
		c.Interface = netip.MustParseAddr("192.0.2.1")
		if err := c.ApplyEnv(envMap(tc.env), tc.set); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if c.Interface.String() != tc.wantIf || c.CompVector != tc.wantCV {
			t.Errorf("%s: got %s/%d, want %s/%d", tc.name, c.Interface, c.CompVector, tc.wantIf, tc.wantCV)
		}
	}
}

func TestApplyEnvBadValues(t *testing.T) {
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{EnvInterface: "eth0"}, `IBVBRIDGE_IBV_INTERFACE="eth0": not an IPv4 address`},
		{map[string]string{EnvSpead2Interface: "::1"}, `SPEAD2_IBV_INTERFACE="::1": not an IPv4 address`},
		{map[string]string{EnvCompVector: "x"}, `IBVBRIDGE_IBV_COMP_VECTOR="x": not an integer`},
		// The winning variable is bad: no silent fall-through to SPEAD2_*.
		{map[string]string{EnvCompVector: "1.5", EnvSpead2CompVector: "2"}, `IBVBRIDGE_IBV_COMP_VECTOR="1.5": not an integer`},
	} {
		c := DefaultRecvConfig()
		err := c.ApplyEnv(envMap(tc.env), FlagsSet{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: err %v, want %q", tc.env, err, tc.want)
		}
	}
	// A bad variable shadowed by a flag is not an error.
	c := DefaultRecvConfig()
	if err := c.ApplyEnv(envMap(map[string]string{EnvCompVector: "x"}), FlagsSet{CompVector: true}); err != nil {
		t.Fatal(err)
	}
}

func TestValidate(t *testing.T) {
	good := DefaultRecvConfig()
	good.Interface = netip.MustParseAddr("10.0.0.1")
	good.Endpoints = []netip.AddrPort{netip.MustParseAddrPort("239.1.2.3:7148")}
	if err := good.Validate(); err != nil {
		t.Fatal(err)
	}
	if good.Slots() != 1823 || good.BusyPoll() {
		t.Fatalf("slots %d busy %v", good.Slots(), good.BusyPoll())
	}
	for _, tc := range []struct {
		mut  func(*RecvConfig)
		want string
	}{
		{func(c *RecvConfig) { c.Interface = netip.Addr{} }, "interface address is not set"},
		{func(c *RecvConfig) { c.Interface = netip.MustParseAddr("fe80::1") }, "interface address fe80::1 is not an IPv4 address"},
		{func(c *RecvConfig) { c.Endpoints = nil }, "no endpoints"},
		{func(c *RecvConfig) { c.Endpoints = []netip.AddrPort{netip.MustParseAddrPort("10.1.1.1:7148")} }, "endpoint 10.1.1.1:7148 is not an IPv4 multicast address"},
		{func(c *RecvConfig) { c.Endpoints = []netip.AddrPort{netip.MustParseAddrPort("[ff02::1]:7148")} }, "endpoint [ff02::1]:7148 is not an IPv4 multicast address"},
		{func(c *RecvConfig) { c.Endpoints = []netip.AddrPort{netip.MustParseAddrPort("239.1.1.1:0")} }, "has no port"},
		{func(c *RecvConfig) { c.MaxSize = 0 }, "max size 0 must be positive"},
		{func(c *RecvConfig) { c.BufferSize = -1 }, "buffer size -1 must be positive"},
		{func(c *RecvConfig) { c.MaxPoll = 0 }, "max_poll 0 must be positive"},
	} {
		c := good
		tc.mut(&c)
		if err := c.Validate(); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("err %v, want %q", err, tc.want)
		}
	}
}

func TestParseEndpoints(t *testing.T) {
	eps, err := ParseEndpoints([]string{"239.1.2.3:7148", " 239.1.2.4:7149"})
	if err != nil || len(eps) != 2 || eps[1].String() != "239.1.2.4:7149" {
		t.Fatal(eps, err)
	}
	if _, err := ParseEndpoints([]string{"239.1.2.3"}); err == nil {
		t.Fatal("missing port accepted")
	}
	if _, err := ParseEndpoints([]string{"10.0.0.1:1"}); err == nil || !strings.Contains(err.Error(), "not an IPv4 multicast address") {
		t.Fatal(err)
	}
}
