package version

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestOneVersionEverywhere: the Python package (pyproject.toml and ibvbridge.__version__) carries the Go
// tools' version; the C library's Makefile reads it from this package (its pkg-config Version is checked
// by clients/c/tests/install_test.sh).
func TestOneVersionEverywhere(t *testing.T) {
	for path, re := range map[string]string{
		"../../clients/python/pyproject.toml":        `(?m)^version = "([^"]+)"`,
		"../../clients/python/ibvbridge/__init__.py": `(?m)^__version__ = "([^"]+)"`,
		"../../clients/c/Makefile":                   `(?m)^VERSION\s*:= .*(internal/version/version\.go)`,
	} {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(re).FindSubmatch(b)
		switch {
		case m == nil:
			t.Errorf("%s: no version found (%s)", path, re)
		case string(m[1]) != Version && string(m[1]) != "internal/version/version.go":
			t.Errorf("%s says %s, ibvbridge is %s", path, m[1], Version)
		}
	}
	h, err := os.ReadFile("../../clients/c/ibvbridge.h")
	if err != nil {
		t.Fatal(err)
	}
	maj := regexp.MustCompile(`(?m)^#define IBVB_VERSION_MAJOR_LIB (\d+)`).FindSubmatch(h)
	minr := regexp.MustCompile(`(?m)^#define IBVB_VERSION_MINOR_LIB (\d+)`).FindSubmatch(h)
	if maj == nil || minr == nil || !strings.HasPrefix(Version, string(maj[1])+"."+string(minr[1])+".") {
		t.Errorf("ibvbridge.h's IBVB_VERSION_*_LIB %q.%q do not match %s", maj, minr, Version)
	}
	if Producer("ibvbridge recv") != "ibvbridge recv "+Version {
		t.Errorf("Producer: %q", Producer("ibvbridge recv"))
	}
}
