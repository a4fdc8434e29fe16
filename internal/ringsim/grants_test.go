package ringsim

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/ibvbridge/ibvbridge/ring"
)

// helloChild, when RINGSIM_HELLO is set (SOCKET GROUP_ID), says one hello as a member and prints the
// status: the stranger of TestCorpusStrangerRefusedWithGrants, run as another user.
func helloChild() {
	var sock string
	var group uint32
	fmt.Sscan(os.Getenv("RINGSIM_HELLO"), &sock, &group)
	r := &rawRing{sock: sock, cons: map[int]*rawCons{}}
	_, _, _, st, err := r.Attach(group, 2, 1, false)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println("status", st)
	os.Exit(0)
}

// TestCorpusStrangerRefusedWithGrants: with grants (spec §14.1), a stranger (uid 65534, not granted) that
// says hello as a member of the granted group is refused with status 2, and admitted as an independent
// consumer; without grants it joins (and what it releases unread shows in skipped: the corpus).
func TestCorpusStrangerRefusedWithGrants(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root to play a stranger (setpriv to uid 65534)")
	}
	if _, err := exec.LookPath("setpriv"); err != nil {
		t.Skip("setpriv is absent")
	}
	dir, err := os.MkdirTemp("", "ringsim-grants")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(dir)
	if err := os.Chmod(dir, 0o755); err != nil { // a stranger must reach the socket (its mode is the gate)
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(self, 0o755); err != nil {
		t.Fatal(err)
	}
	stranger := func(sock string, group uint32) string {
		cmd := exec.Command("setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", self, "-test.run=^$")
		cmd.Env = append(os.Environ(), fmt.Sprintf("RINGSIM_HELLO=%s %d", sock, group))
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		_ = cmd.Run()
		return strings.TrimSpace(out.String())
	}
	for _, granted := range []bool{false, true} {
		cfg := ring.Config{SlotCount: 8, SlotSize: 64, MaxItems: 1, MetaSize: 4096, HugePages: ring.HugePagesOff,
			Dir: dir + "/r", Group: "nogroup", MaxConsumers: 4}
		if granted {
			cfg.Groups = map[string]ring.GroupGrant{"g": {UIDs: []uint32{1}}}
		}
		p, err := ring.Create("grants", cfg)
		if err != nil {
			t.Fatal(err)
		}
		member, independent := stranger(p.SocketPath(), ring.GroupID("g")), stranger(p.SocketPath(), 0)
		p.Close()
		want := "status 0"
		if granted {
			want = "status 2"
		}
		if member != want || independent != "status 0" {
			t.Fatalf("grants %v: the stranger as a member: %q, want %q; as an independent consumer: %q, want status 0", granted, member, want, independent)
		}
	}
}
