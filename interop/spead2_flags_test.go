package interop

import (
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// TestMigrationGuideNamesOnlyFlagsSpead2RecvHas checks the spead2_recv column of the migration guide's
// flag table against the spead2_recv on this machine: a flag the guide names must be one spead2_recv
// accepts (its --help), so a porter is never sent looking for one that does not exist.
func TestMigrationGuideNamesOnlyFlagsSpead2RecvHas(t *testing.T) {
	bin, err := exec.LookPath("spead2_recv")
	if err != nil {
		t.Skip("spead2_recv is not installed (build it with the spead2 build script the developers' guide names)")
	}
	help, _ := exec.Command(bin, "--help").CombinedOutput()
	if !strings.Contains(string(help), "--") {
		t.Fatalf("%s --help printed no flags: %q", bin, help)
	}
	guide, err := os.ReadFile(filepath.Join("..", "docs", "how-to", "migrate-from-spead2.md"))
	if err != nil {
		t.Fatal(err)
	}
	text := string(guide)
	start := strings.Index(text, "## `spead2_recv` flags")
	if start < 0 {
		t.Fatal("the guide has no spead2_recv flag table")
	}
	section := text[start:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	flag := regexp.MustCompile("`(--[a-z][a-z0-9-]*)")
	checked := 0
	for _, line := range strings.Split(section, "\n") {
		cells := strings.Split(line, "|")
		if len(cells) < 3 || strings.HasPrefix(strings.TrimSpace(cells[1]), "---") {
			continue
		}
		for _, m := range flag.FindAllStringSubmatch(cells[1], -1) {
			checked++
			if !regexp.MustCompile(`(^|[\s,])` + regexp.QuoteMeta(m[1]) + `([\s=,]|$)`).Match(help) {
				t.Errorf("the guide names spead2_recv %s, which %s --help does not list", m[1], bin)
			}
		}
	}
	if checked < 10 {
		t.Fatalf("checked only %d flags: the table's shape changed", checked)
	}
}
