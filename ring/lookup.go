package ring

import (
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// This file is the client's half of spec §1.1 and §9 steps 1–2 (layout 2.1 §B): which directories a name
// is looked up in, which of them a client trusts, and connecting to the ring a name means — never to a
// socket a stranger could have put in its way.

// lookupTimeout is the attach timeout when none is given: how long a stale socket is retried (its
// producer may be restarting) and how long the welcome may take.
const lookupTimeout = 5 * time.Second

// dirOwner checks that path is a directory a client may connect in (layout 2.1 §B): not a symlink, not
// writable by group or others, owned by the caller's euid or root — or created where only root could
// create it (its parent is root's and writable by nobody else: systemd's RuntimeDirectory). It returns
// the directory's owner, or why it is not trusted. A missing directory is os.ErrNotExist.
func dirOwner(path string) (uint32, error) {
	fd, err := unix.Open(path, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return 0, os.ErrNotExist
	}
	if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
		return 0, &untrustedDirError{path, "a symlink or not a directory"}
	}
	if err != nil {
		return 0, fmt.Errorf("%s: %w", path, os.NewSyscallError("open", err))
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, fmt.Errorf("%s: %w", path, os.NewSyscallError("fstat", err))
	}
	euid := uint32(os.Geteuid())
	if st.Mode&0o022 != 0 {
		return 0, &untrustedDirError{path, fmt.Sprintf("writable by group or others (mode %#o)", st.Mode&0o7777)}
	}
	if st.Uid == 0 || st.Uid == euid {
		return st.Uid, nil
	}
	var pst unix.Stat_t
	if unix.Lstat(filepath.Dir(path), &pst) == nil && pst.Mode&unix.S_IFMT == unix.S_IFDIR && pst.Uid == 0 && pst.Mode&0o022 == 0 {
		return st.Uid, nil // only root could have made it (and given it to its owner)
	}
	return 0, &untrustedDirError{path, fmt.Sprintf("owned by uid %d, not %d or root", st.Uid, euid)}
}

// untrustedDirError is a lookup directory a client will not connect in, and why; errors.Is(err,
// ErrUnsafeDir) is true.
type untrustedDirError struct{ path, why string }

func (e *untrustedDirError) Error() string {
	return fmt.Sprintf("%v: not connecting in %s: %s", ErrUnsafeDir, e.path, e.why)
}
func (e *untrustedDirError) Is(target error) bool { return target == ErrUnsafeDir }

// candidate is a socket in a trusted directory and that directory's owner (a producer the client trusts).
type candidate struct {
	path  string
	owner uint32
}

// finder resolves a name or socket path to the sockets to try, warning once per directory it skips.
type finder struct {
	nameOrPath, dir string
	warn            io.Writer
	warned          map[string]bool
	name            string
	looked          []string
}

// candidates lists the existing sockets nameOrPath may mean, in lookup order. An explicitly given
// directory or socket path that is not trusted is an error; an untrusted directory of the default list is
// skipped with one warning line.
func (f *finder) candidates() ([]candidate, error) {
	if strings.Contains(f.nameOrPath, "/") {
		path, name, err := SocketPath(f.nameOrPath, "")
		if err != nil {
			return nil, err
		}
		f.name, f.looked = name, []string{filepath.Dir(path)}
		owner, err := dirOwner(filepath.Dir(path))
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		if err != nil {
			return nil, fmt.Errorf("ring socket %s: %w", path, err)
		}
		return existing(nil, path, owner), nil
	}
	if err := ValidateName(f.nameOrPath); err != nil {
		return nil, err
	}
	f.name = f.nameOrPath
	explicit := f.dir != "" || os.Getenv(EnvDir) != ""
	f.looked = lookupDirs(f.dir)
	var out []candidate
	for _, d := range f.looked {
		owner, err := dirOwner(d)
		switch {
		case errors.Is(err, os.ErrNotExist):
			continue
		case err != nil && explicit:
			return nil, fmt.Errorf("ring %s: %w", f.name, err)
		case err != nil:
			var ue *untrustedDirError
			if errors.As(err, &ue) && !f.warned[d] && f.warn != nil {
				f.warned[d] = true
				fmt.Fprintf(f.warn, "ibvbridge: skipping %s: %s\n", d, ue.why)
			}
			continue
		}
		out = existing(out, filepath.Join(d, SocketName(f.name)), owner)
	}
	return out, nil
}

// existing appends path to cs if something is there.
func existing(cs []candidate, path string, owner uint32) []candidate {
	if _, err := os.Lstat(path); err == nil {
		cs = append(cs, candidate{path, owner})
	}
	return cs
}

// notFoundError is a name no trusted directory serves; errors.Is(err, ErrNotFound) is true.
type notFoundError struct{ msg string }

func (e *notFoundError) Error() string        { return e.msg }
func (e *notFoundError) Is(target error) bool { return target == ErrNotFound }

// dialOptions are the parts of AttachOptions the lookup uses.
type dialOptions struct {
	dir     string
	timeout time.Duration // 0: lookupTimeout; <0: one try (the handshake still gets lookupTimeout)
	wait    bool          // retry a missing name every 10 ms until the timeout
	warn    io.Writer     // where skipped directories are reported (nil: nowhere)
}

// dial finds the ring's socket, connects, checks who serves it and runs the handshake (spec §9 steps 1–3,
// layout 2.1 §B). A name nothing serves fails at once unless o.wait; a socket that refuses (stale, or a
// producer restarting) is retried until the timeout. On success the descriptors are the caller's.
func dial(nameOrPath string, o dialOptions, h hello) (*attachment, error) {
	timeout := o.timeout
	if timeout == 0 {
		timeout = lookupTimeout
	}
	deadline := time.Now().Add(timeout)
	f := &finder{nameOrPath: nameOrPath, dir: o.dir, warn: o.warn, warned: map[string]bool{}}
	stale := ""
	for {
		cands, err := f.candidates()
		if err != nil {
			return nil, err
		}
		for _, c := range cands {
			sock, err := connectSeqpacket(c.path)
			if errors.Is(err, unix.ECONNREFUSED) {
				if stale == "" {
					stale = c.path
				}
				continue
			}
			if errors.Is(err, unix.ENOENT) {
				continue // removed since we looked
			}
			if err != nil {
				return nil, fmt.Errorf("attach %s: connect %s: %w", f.name, c.path, err)
			}
			return handshakeOn(f.name, sock, c, h, time.Until(deadline))
		}
		if timeout < 0 || time.Now().After(deadline) || (len(cands) == 0 && !o.wait) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if stale != "" {
		// The advice names the socket's directory: pasted as printed it removes this socket, whatever
		// --dir or $IBVBRIDGE_RING_DIR found it.
		return nil, &notFoundError{fmt.Sprintf("ring %s: stale socket %s (no producer; `ibvbridge rm --stale --dir %s` removes it)", f.name, stale, filepath.Dir(stale))}
	}
	return nil, &notFoundError{fmt.Sprintf("ring %s not found (looked in %s)", f.name, strings.Join(f.looked, ", "))}
}

// handshakeOn checks the server's credentials and runs the handshake on a connected socket.
func handshakeOn(name string, sock int, c candidate, h hello, left time.Duration) (*attachment, error) {
	if left < time.Second {
		left = lookupTimeout
	}
	a := &attachment{name: name, path: c.path, sock: sock}
	if err := a.handshake(c, h, left); err != nil {
		a.closeFDs()
		unix.Close(sock)
		return nil, fmt.Errorf("attach %s: %w", name, err)
	}
	return a, nil
}
