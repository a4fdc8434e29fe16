package interop_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// producerCmd is the produce tool of a language, publishing pattern heaps into ring name in dir.
func producerCmd(t *testing.T, kind, dir, name string, args ...string) *exec.Cmd {
	args = append([]string{"--ring", name, "--dir", dir}, args...)
	switch kind {
	case "c":
		tool := filepath.Join(repoRoot, "clients/c/build/ibvb-produce")
		if _, err := os.Stat(tool); err != nil {
			if os.Getenv("IBVBRIDGE_REQUIRE_CLIENTS") != "" {
				t.Fatalf("C producer %s missing: %v", tool, err)
			}
			t.Skipf("C producer not built: %v", err)
		}
		return exec.Command(tool, args...)
	case "python":
		cmd := exec.Command("/usr/bin/python3", append([]string{"-m", "ibvbridge.produce"}, args...)...)
		cmd.Env = append(os.Environ(), "PYTHONPATH="+filepath.Join(repoRoot, "clients/python"), "PYENV_VERSION=system")
		return cmd
	}
	t.Fatalf("no %s producer", kind)
	return nil
}

// TestProducersInEveryLanguage: the C and Python producers' rings are read, byte for byte, by the Go, C
// and Python consumers — under block (nothing lost) and drop (every loss counted).
func TestProducersInEveryLanguage(t *testing.T) {
	for _, prod := range []string{"c", "python"} {
		for _, cons := range consumers(t) {
			for _, policy := range []string{"block", "drop"} {
				t.Run(prod+"-to-"+cons+"-"+policy, func(t *testing.T) {
					dir, err := os.MkdirTemp("", "ibvb-prod")
					if err != nil {
						t.Fatal(err)
					}
					defer os.RemoveAll(dir)
					const heaps = 2000
					p := producerCmd(t, prod, dir, "p", "--heaps", "2000", "--heap-size", "3000", "--slots", "64",
						"--policy", policy, "--wait-consumers", "1", "--pattern")
					var pout, perr bytes.Buffer
					p.Stdout, p.Stderr = &pout, &perr
					if err := p.Start(); err != nil {
						t.Fatal(err)
					}
					defer p.Process.Kill()
					var waitFlag []string
					if cons == "c" { // 2.1: a ring not there yet is "not found" at once unless asked to wait
						waitFlag = []string{"--wait"}
					}
					wait := startConsumer(t, cons, filepath.Join(dir, "p.v2.sock"), waitFlag...)
					r := wait()
					if err := p.Wait(); err != nil {
						t.Fatalf("%s producer: %v: %s", prod, err, perr.String())
					}
					var pr struct {
						Heaps, Bytes, Checksum, Dropped uint64
					}
					if err := json.Unmarshal(bytes.TrimSpace(pout.Bytes()), &pr); err != nil {
						t.Fatalf("%s producer printed %q: %v", prod, pout.String(), err)
					}
					if r.Result != "eos" || r.VerifyErrors != 0 || r.OutOfOrder != 0 || r.Heaps+pr.Dropped != heaps ||
						r.Counters["dropped_heaps"] != pr.Dropped {
						t.Fatalf("%s consumer %+v; producer %+v", cons, r, pr)
					}
					if policy == "block" && (pr.Dropped != 0 || r.Checksum != pr.Checksum || r.Bytes != pr.Bytes) {
						t.Fatalf("block: consumer %+v, producer %+v", r, pr)
					}
				})
			}
		}
	}
}
