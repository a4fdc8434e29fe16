package main

import (
	"bytes"
	"github.com/ibvbridge/ibvbridge/internal/testenv"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// buildBinary builds ibvbridge once per test binary run.
var builtBinary string

// TestMain removes the binary built for the tests (a directory in $TMPDIR): tests leave nothing behind.
func TestMain(m *testing.M) {
	code := testenv.Main(m) // a ring directory of its own: nothing lands in /run/ibvbridge
	if builtBinary != "" {
		os.RemoveAll(filepath.Dir(builtBinary))
	}
	os.Exit(code)
}

func binary(t testing.TB) string {
	t.Helper()
	if builtBinary != "" {
		return builtBinary
	}
	dir, err := os.MkdirTemp("", "ibvbridge-bin")
	if err != nil {
		t.Fatal(err)
	}
	out := filepath.Join(dir, "ibvbridge")
	if b, err := exec.Command("go", "build", "-o", out, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, b)
	}
	builtBinary = out
	return out
}

func TestDevicesWithoutHardware(t *testing.T) {
	cmd := exec.Command(binary(t), "devices")
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	// Machines here have libibverbs but no RDMA device (and no kernel support): a clear line, exit 0.
	if err != nil || !strings.Contains(out.String(), "no RDMA devices found") {
		t.Fatalf("devices: %v, stdout %q, stderr %q", err, out.String(), errb.String())
	}
}

func TestDevicesWithoutLibibverbs(t *testing.T) {
	cmd := exec.Command(binary(t), "devices")
	cmd.Env = append(os.Environ(), "IBVBRIDGE_LIBIBVERBS=/nonexistent/libibverbs.so.1")
	var errb bytes.Buffer
	cmd.Stderr = &errb
	err := cmd.Run()
	want := "libibverbs.so.1 not found: install rdma-core / ibverbs-providers"
	if err == nil || !strings.Contains(errb.String(), want) || strings.Count(strings.TrimSpace(errb.String()), "\n") != 0 {
		t.Fatalf("devices without libibverbs: %v, stderr %q", err, errb.String())
	}
}

func TestBinaryDoesNotLinkLibibverbs(t *testing.T) {
	out, err := exec.Command("ldd", binary(t)).CombinedOutput()
	if err != nil {
		t.Skipf("ldd unavailable: %v", err)
	}
	if strings.Contains(string(out), "libibverbs") {
		t.Fatalf("ibvbridge links libibverbs at build time:\n%s", out)
	}
}

func TestUnknownCommandAndFlag(t *testing.T) {
	for _, args := range [][]string{{"frobnicate"}, {"stat", "--bogus"}, {"bench", "ring", "--heap-size", "0"}} {
		cmd := exec.Command(binary(t), args...)
		var errb bytes.Buffer
		cmd.Stderr = &errb
		err := cmd.Run()
		ee, ok := err.(*exec.ExitError)
		if !ok || ee.ExitCode() != 2 || strings.Count(strings.TrimSpace(errb.String()), "\n") != 0 || errb.Len() == 0 {
			t.Errorf("%v: %v, stderr %q (want one line, exit 2)", args, err, errb.String())
		}
	}
}
