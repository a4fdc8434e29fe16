//go:build linux && cgo

package verbs

import (
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/ibvbridge/ibvbridge/internal/rxloop"
)

const helperEnv = "IBVBRIDGE_VERBS_TEST_HELPER"

// TestMain lets a test re-run this binary as a fresh process (dlopen cannot
// be undone, so "library absent" is tested before any Load in its process).
func TestMain(m *testing.M) {
	if os.Getenv(helperEnv) == "load" {
		if err := Load(); err != nil {
			fmt.Println("ERR", errors.Is(err, ErrLibraryNotFound), err)
		} else {
			fmt.Println("OK")
		}
		c := DefaultRecvConfig()
		c.Interface = netip.MustParseAddr("127.0.0.1")
		c.Endpoints = []netip.AddrPort{netip.MustParseAddrPort("239.1.2.3:7148")}
		_, err := OpenReceiver(c, make([]byte, 32<<20))
		fmt.Println("OPEN", errors.Is(err, ErrLibraryNotFound), err)
		_, err = Devices()
		fmt.Println("DEVICES", errors.Is(err, ErrLibraryNotFound))
		os.Exit(0)
	}
	os.Exit(m.Run())
}

func TestLoadLibraryMissing(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=load", EnvLibrary+"=/nonexistent/libibverbs.so.1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	s := string(out)
	want := "ERR true libibverbs.so.1 not found: install rdma-core / ibverbs-providers (/nonexistent/libibverbs.so.1: cannot open shared object file: No such file or directory)"
	if !strings.Contains(s, want) {
		t.Errorf("got:\n%s\nwant line: %s", s, want)
	}
	if !strings.Contains(s, "OPEN true ") || !strings.Contains(s, "DEVICES true") {
		t.Errorf("OpenReceiver/Devices do not report the missing library:\n%s", s)
	}
}

func TestLoadNotALibrary(t *testing.T) {
	bogus := t.TempDir() + "/libibverbs.so.1"
	os.WriteFile(bogus, []byte("not ELF"), 0o644)
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), helperEnv+"=load", EnvLibrary+"="+bogus)
	out, _ := cmd.CombinedOutput()
	if !strings.Contains(string(out), "ERR true libibverbs.so.1 not found") {
		t.Fatalf("got:\n%s", out)
	}
}

// haveLibibverbs skips when the run-time library is truly absent.
func haveLibibverbs(t *testing.T) {
	t.Helper()
	if err := Load(); err != nil {
		if errors.Is(err, ErrLibraryNotFound) {
			t.Skipf("libibverbs not installed (apt-get install libibverbs1 ibverbs-providers): %v", err)
		}
		t.Fatal(err)
	}
}

// TestNoDevicesHere: the CI hosts have libibverbs but no RDMA hardware.
func TestNoDevicesHere(t *testing.T) {
	haveLibibverbs(t)
	devs, err := Devices()
	if err == nil {
		t.Skipf("this host has %d RDMA device(s); the no-device path is not testable here", len(devs))
	}
	if !errors.Is(err, ErrNoDevices) {
		t.Fatalf("Devices() = %v, want ErrNoDevices", err)
	}
	t.Logf("Devices(): %v", err)
	c := DefaultRecvConfig()
	c.Interface = netip.MustParseAddr("127.0.0.1")
	c.Endpoints = []netip.AddrPort{netip.MustParseAddrPort("239.1.2.3:7148")}
	_, err = OpenReceiver(c, make([]byte, 32<<20))
	if !errors.Is(err, ErrNoDevices) || !strings.Contains(err.Error(), "ibverbs receiver on 127.0.0.1: no RDMA devices found") {
		t.Fatalf("OpenReceiver = %v", err)
	}
}

// TestOpenReceiverChecksBeforeDevice: configuration and area errors come
// first, so they are reported the same with or without hardware.
func TestOpenReceiverChecksBeforeDevice(t *testing.T) {
	c := DefaultRecvConfig()
	c.Interface = netip.MustParseAddr("127.0.0.1")
	c.Endpoints = []netip.AddrPort{netip.MustParseAddrPort("10.0.0.1:7148")}
	if _, err := OpenReceiver(c, make([]byte, 32<<20)); err == nil || !strings.Contains(err.Error(), "is not an IPv4 multicast address") {
		t.Fatal(err)
	}
	c.Endpoints = []netip.AddrPort{netip.MustParseAddrPort("239.1.2.3:7148")}
	if _, err := OpenReceiver(c, make([]byte, 4<<20)); err == nil || !strings.Contains(err.Error(), "holds 455 packets of 9200 bytes; buffer size 16 MiB needs 1823") {
		t.Fatal(err)
	}
}

// TestNoLinkTimeLibibverbs: the test binary, like ibvbridge, must start on a
// host without rdma-core, so libibverbs must not be a DT_NEEDED dependency.
func TestNoLinkTimeLibibverbs(t *testing.T) {
	ldd, err := exec.LookPath("ldd")
	if err != nil {
		t.Skip("ldd not available")
	}
	out, err := exec.Command(ldd, os.Args[0]).CombinedOutput()
	if err != nil {
		t.Fatalf("ldd: %v\n%s", err, out)
	}
	if bytes.Contains(out, []byte("libibverbs")) {
		t.Fatalf("test binary links libibverbs:\n%s", out)
	}
	t.Logf("\n%s", out)
}

func TestStatusString(t *testing.T) {
	haveLibibverbs(t)
	if s := StatusString(rxloop.StatusSuccess); s != "success" {
		t.Fatalf("%q", s)
	}
	if s := StatusString(rxloop.Status(4)); s == "" {
		t.Fatal("empty")
	}
}
