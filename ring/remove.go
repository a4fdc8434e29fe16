package ring

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// Remove deletes what is left of ring name in dir (and its data file in hugeDir) once nobody uses it: the
// zero-byte .lock and .cons files a producer and consumer leave behind by design (spec §1), and the
// control and data files of a producer that died. It refuses with ErrInUse or ErrBusy while a producer or
// consumer holds its lock. Tools that make a fresh ring name per run (benchmarks, tests) call it so names
// do not pile up in /dev/shm.
func Remove(dir, hugeDir, name string) error {
	if err := ValidateName(name); err != nil {
		return err
	}
	if dir == "" {
		dir = DefaultDir
	}
	if hugeDir == "" {
		hugeDir = DefaultHugeDir
	}
	base := baseName(name)
	var held []*os.File
	defer func() {
		for _, f := range held {
			f.Close()
		}
	}()
	// Hold both locks while unlinking, so no producer or consumer can start on these inodes meanwhile.
	for _, l := range []struct {
		path string
		busy error
	}{{lockPath(dir, name), ErrInUse}, {filepath.Join(dir, base+".cons"), ErrBusy}} {
		f, err := os.OpenFile(l.path, os.O_RDWR, 0)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return fmt.Errorf("remove ring %s: %w", name, err)
		}
		held = append(held, f)
		taken, err := lockExclusive(f)
		if err != nil {
			return fmt.Errorf("remove ring %s: %w", name, err)
		}
		if taken {
			return fmt.Errorf("remove ring %s: %w", name, l.busy)
		}
	}
	var errs []error
	for _, p := range []string{lockPath(dir, name), filepath.Join(dir, base+".cons"), CtlPath(dir, name),
		filepath.Join(dir, base+".dat"), filepath.Join(hugeDir, base+".dat")} {
		if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// List returns the names of the rings in dir ("" for /dev/shm) that have any file left: a control file
// (a live ring, or a dead producer's), or only the lock files a stopped ring leaves by design. Sorted.
func List(dir string) ([]string, error) {
	if dir == "" {
		dir = DefaultDir
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("list rings in %s: %w", dir, err)
	}
	prefix, suffix := "ibvbridge.", fmt.Sprintf(".v%d", MajorVersion)
	seen := map[string]bool{}
	var names []string
	for _, e := range ents {
		n := e.Name()
		ext := filepath.Ext(n)
		switch ext {
		case ".ctl", ".lock", ".cons", ".dat":
		default:
			continue
		}
		base := strings.TrimSuffix(n, ext)
		if !strings.HasPrefix(base, prefix) || !strings.HasSuffix(base, suffix) {
			continue
		}
		name := strings.TrimSuffix(strings.TrimPrefix(base, prefix), suffix)
		if ValidateName(name) == nil && !seen[name] {
			seen[name] = true
			names = append(names, name)
		}
	}
	sort.Strings(names)
	return names, nil
}
