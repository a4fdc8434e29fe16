package ring

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"
)

// Listed is a ring found in a ring directory: its socket, its lock file, or both.
type Listed struct {
	Name   string `json:"name"`
	Dir    string `json:"dir"`
	Socket bool   `json:"socket"`
	Lock   bool   `json:"lock"`
}

// Path is the ring's socket path, which every tool accepts in place of a name.
func (l Listed) Path() string { return filepath.Join(l.Dir, SocketName(l.Name)) }

// ListDirs is where List and the tools look when given no directory: the lookup directories of spec §1.1.
func ListDirs(dir string) []string { return lookupDirs(dir) }

// List returns the rings in dir ("": every directory a consumer would look in) that have a socket or a
// lock file, sorted by directory then name. Whether a ring is live is for Inspect to say.
func List(dir string) ([]Listed, error) {
	var out []Listed
	for _, d := range lookupDirs(dir) {
		ents, err := os.ReadDir(d)
		if errors.Is(err, os.ErrNotExist) && dir == "" {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("list rings in %s: %w", d, err)
		}
		byName := map[string]*Listed{}
		var names []string
		for _, e := range ents {
			n := e.Name()
			var name string
			var sock bool
			switch {
			case strings.HasSuffix(n, socketSuffix):
				name, sock = strings.TrimSuffix(n, socketSuffix), true
			case strings.HasSuffix(n, lockSuffix):
				name = strings.TrimSuffix(n, lockSuffix)
			default:
				continue
			}
			if ValidateName(name) != nil {
				continue
			}
			l := byName[name]
			if l == nil {
				l = &Listed{Name: name, Dir: d}
				byName[name] = l
				names = append(names, name)
			}
			if sock {
				l.Socket = true
			} else {
				l.Lock = true
			}
		}
		sort.Strings(names)
		for _, n := range names {
			out = append(out, *byName[n])
		}
	}
	return out, nil
}

// Remove deletes what a dead producer left of ring name in dir: its socket and its lock file (spec §1.1).
// It refuses with ErrInUse while a producer holds the lock or answers on the socket. Neither file holds
// data: the ring's memory went with its last process.
func Remove(dir, name string) error {
	if err := ValidateName(name); err != nil {
		return err
	}
	if dir == "" {
		dir = DefaultDir()
	}
	dfd, err := unix.Open(dir, unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC|unix.O_RDONLY, 0)
	if err != nil {
		return fmt.Errorf("remove ring %s: %w", name, os.NewSyscallError("open "+dir, err))
	}
	d := &ringDir{path: dir, fd: dfd}
	defer d.close()
	// Hold the lock while unlinking, so no producer can start on these names meanwhile.
	lfd, err := unix.Openat(dfd, lockName(name), unix.O_RDWR|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	switch {
	case err == nil:
		f := os.NewFile(uintptr(lfd), filepath.Join(dir, lockName(name)))
		defer f.Close()
		held, err := lockExclusive(f)
		if err != nil {
			return fmt.Errorf("remove ring %s: %w", name, err)
		}
		if held {
			return fmt.Errorf("remove ring %s: %w", name, ErrInUse)
		}
	case errors.Is(err, unix.ENOENT):
		// No lock file: a socket alone is stale unless something answers on it.
		if fd, cerr := connectSeqpacket(filepath.Join(dir, SocketName(name))); cerr == nil {
			unix.Close(fd)
			return fmt.Errorf("remove ring %s: %w", name, ErrInUse)
		}
	default:
		return fmt.Errorf("remove ring %s: %w", name, os.NewSyscallError("openat", err))
	}
	return errors.Join(d.unlink(SocketName(name)), d.unlink(lockName(name)))
}
