package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"testing"

	"github.com/ibvbridge/ibvbridge/ring"
)

// Every command that takes --json prints JSON on stdout with it, wherever the flag stands.
func TestJSONFlagAnywhere(t *testing.T) {
	dir := t.TempDir()
	name := fmt.Sprintf("json-%d", os.Getpid())
	p, err := ring.Create(name, ring.Config{Dir: dir, SlotCount: 4, SlotSize: 4096, HugePages: ring.HugePagesOff})
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	for _, args := range [][]string{
		{"stat", "--dir", dir, name, "--json"},
		{"stat", "--json", "--dir", dir, name},
		{"devices", "--json"}, // no RDMA devices here: an empty list, the reason on stderr
	} {
		cmd := exec.Command(binary(t), args...)
		var out, errb bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &errb
		if err := cmd.Run(); err != nil {
			t.Errorf("%v: %v: %s", args, err, errb.String())
			continue
		}
		var v any
		if err := json.Unmarshal(out.Bytes(), &v); err != nil {
			t.Errorf("%v: stdout is not JSON (%v): %q", args, err, out.String())
		}
	}
}
