package conformance_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

var (
	repoRoot string
	goTool   string // ./cmd/ibvbridge built for this run: the Go consumer tool and recv
)

func TestMain(m *testing.M) {
	if os.Getenv(goProducerEnv) != "" {
		os.Exit(goProducerMain(os.Args[1:]))
	}
	_, file, _, _ := runtime.Caller(0)
	repoRoot = filepath.Dir(filepath.Dir(filepath.Dir(file)))
	dir, err := os.MkdirTemp("", "ibvb-conf")
	if err != nil {
		panic(err)
	}
	goTool = filepath.Join(dir, "ibvbridge")
	go buildC() // beside the Go build: the machine's other core
	build := exec.Command("go", "build", "-o", goTool, "./cmd/ibvbridge")
	build.Dir = repoRoot
	if out, err := build.CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "build ibvbridge: %v\n%s", err, out)
		cleanupBuilds()
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	cleanupBuilds()
	os.RemoveAll(dir)
	os.Exit(code)
}
