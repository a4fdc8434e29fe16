package ring

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// RunDir is root's ring directory (spec §1.1): systemd's RuntimeDirectory for the ibvbridge unit.
const RunDir = "/run/ibvbridge"

// EnvDir names the environment variable that overrides the ring directory for producers and consumers.
const EnvDir = "IBVBRIDGE_RING_DIR"

// ShmDirPrefix + the decimal effective uid is the default ring directory of a non-root process without
// XDG_RUNTIME_DIR (spec §1.1).
const ShmDirPrefix = "/dev/shm/ibvbridge-"

// TmpDirPrefix + the decimal effective uid is the next default (spec §1.1, 2.2): where such a process
// makes its ring when a stranger made ShmDirPrefix+uid first (/dev/shm is writable by everyone).
const TmpDirPrefix = "/tmp/ibvbridge-"

// NameMax is the longest ring name, in characters (spec §1.1).
const NameMax = 64

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_-][A-Za-z0-9_.-]{0,` + strconv.Itoa(NameMax-1) + `}$`)

// ValidateName checks a ring name against the spec's rule, so the files it names stay inside their dir.
func ValidateName(name string) error {
	if !nameRE.MatchString(name) {
		return fmt.Errorf("ring name %q: %w: use 1-%d characters from [A-Za-z0-9_.-], not starting with '.'", name, ErrBadName, NameMax)
	}
	return nil
}

// socketSuffix and lockSuffix carry the major version, so two layout versions never meet (spec §1.1).
var (
	socketSuffix = fmt.Sprintf(".v%d.sock", MajorVersion)
	lockSuffix   = fmt.Sprintf(".v%d.lock", MajorVersion)
)

// SocketName is the file name of ring name's socket in its ring directory.
func SocketName(name string) string { return name + socketSuffix }

func lockName(name string) string { return name + lockSuffix }

// DefaultDir is the ring directory a process with this effective uid uses when it is given none (spec
// §1.1, layout 2.1 §B): $IBVBRIDGE_RING_DIR, else /run/ibvbridge for root, else $XDG_RUNTIME_DIR/ibvbridge
// when XDG_RUNTIME_DIR is set and absolute, else /dev/shm/ibvbridge-UID.
func DefaultDir() string {
	if d := os.Getenv(EnvDir); d != "" {
		return d
	}
	uid := os.Geteuid()
	if uid == 0 {
		return RunDir
	}
	if x := os.Getenv("XDG_RUNTIME_DIR"); filepath.IsAbs(x) {
		return filepath.Join(x, "ibvbridge")
	}
	return ShmDirPrefix + strconv.Itoa(uid)
}

// defaultDirs are the ring directories a producer given none tries, in order (spec §1.1): DefaultDir(),
// and, when that is the shared-memory default, the next default under /tmp. One directory when a
// directory was configured ($IBVBRIDGE_RING_DIR) or the default is private (root's, XDG_RUNTIME_DIR's).
func defaultDirs() []string {
	d := DefaultDir()
	if os.Getenv(EnvDir) == "" && strings.HasPrefix(d, ShmDirPrefix) {
		return []string{d, TmpDirPrefix + strings.TrimPrefix(d, ShmDirPrefix)}
	}
	return []string{d}
}

// lookupDirs is where a consumer looks for a ring by name, in order (spec §1.1).
func lookupDirs(dir string) []string {
	if dir != "" {
		return []string{dir}
	}
	if d := os.Getenv(EnvDir); d != "" {
		return []string{d}
	}
	own := defaultDirs()
	if own[0] == RunDir {
		return []string{RunDir}
	}
	return append(own, RunDir)
}

// SocketPath resolves a ring name (or a socket path: anything containing '/') to the socket a consumer
// connects to. A name is looked up in dir, or in the spec's directories when dir is "": the first that
// holds the socket wins, else the first candidate (the caller retries until the producer appears).
func SocketPath(nameOrPath, dir string) (path, name string, err error) {
	if strings.Contains(nameOrPath, "/") {
		base := filepath.Base(nameOrPath)
		if !strings.HasSuffix(base, socketSuffix) {
			if strings.HasSuffix(base, ".ctl") {
				return "", "", fmt.Errorf("%s: %w: this is a layout 1.0 control file; this ibvbridge speaks layout %d.%d (sockets named NAME%s)",
					nameOrPath, ErrVersion, MajorVersion, MinorVersion, socketSuffix)
			}
			return "", "", fmt.Errorf("ring socket %s: %w: the path must end in %s", nameOrPath, ErrBadName, socketSuffix)
		}
		return nameOrPath, strings.TrimSuffix(base, socketSuffix), nil
	}
	if err := ValidateName(nameOrPath); err != nil {
		return "", "", err
	}
	dirs := lookupDirs(dir)
	for _, d := range dirs {
		p := filepath.Join(d, SocketName(nameOrPath))
		if _, err := os.Lstat(p); err == nil {
			return p, nameOrPath, nil
		}
	}
	return filepath.Join(dirs[0], SocketName(nameOrPath)), nameOrPath, nil
}

// ringDir is a ring directory opened and checked by its owner (spec §1.1): every later file operation is
// relative to fd, so no path component can be swapped under the producer.
type ringDir struct {
	path string
	fd   int
}

// ErrUnsafeDir reports a ring directory a producer refuses to use: not a directory, a symlink, owned by
// someone else, or writable by others.
var ErrUnsafeDir = errors.New("unsafe ring directory")

// openRingDir opens ring directory path for a producer, creating what is missing (mode 0755) component by
// component from / without following any symlink (layout 2.1 §B): every existing component is opened
// O_PATH|O_DIRECTORY|O_NOFOLLOW relative to its parent's descriptor and must belong to this process's
// effective uid or root; a missing one is made with mkdirat. The directory itself must be this process's
// and writable by nobody else.
func openRingDir(path string) (*ringDir, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("ring directory %s: %w", path, err)
	}
	fd, err := unix.Open("/", unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("ring directory %s: %w", path, os.NewSyscallError("open", err))
	}
	at := "/"
	for _, comp := range strings.Split(strings.TrimPrefix(abs, "/"), "/") {
		if comp == "" {
			continue
		}
		at = filepath.Join(at, comp)
		next, err := openComponent(fd, comp, at)
		unix.Close(fd)
		if err != nil {
			return nil, err
		}
		fd = next
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("ring directory %s: %w", path, os.NewSyscallError("fstat", err))
	}
	uid := uint32(os.Geteuid())
	switch {
	case st.Uid != uid:
		err = fmt.Errorf("%w: %s is owned by uid %d, not %d (remove it, or give --dir)", ErrUnsafeDir, path, st.Uid, uid)
	case st.Mode&0o022 != 0:
		err = fmt.Errorf("%w: %s is writable by group or others (mode %#o): chmod go-w it, or give --dir", ErrUnsafeDir, path, st.Mode&0o7777)
	}
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &ringDir{path: path, fd: fd}, nil
}

// openComponent opens directory comp inside parent (whose path with comp is at) without following a
// symlink, making it (0755) if it is missing; it must belong to this process's euid or root.
func openComponent(parent int, comp, at string) (int, error) {
	const flags = unix.O_PATH | unix.O_DIRECTORY | unix.O_NOFOLLOW | unix.O_CLOEXEC
	fd, err := unix.Openat(parent, comp, flags, 0)
	if errors.Is(err, unix.ENOENT) {
		if err := unix.Mkdirat(parent, comp, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
			return -1, fmt.Errorf("ring directory %s: %w", at, os.NewSyscallError("mkdirat", err))
		}
		fd, err = unix.Openat(parent, comp, flags, 0)
	}
	if errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) {
		return -1, fmt.Errorf("%w: %s is a symlink or not a directory: refusing to create anything through it", ErrUnsafeDir, at)
	}
	if err != nil {
		return -1, fmt.Errorf("ring directory %s: %w", at, os.NewSyscallError("openat", err))
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("ring directory %s: %w", at, os.NewSyscallError("fstat", err))
	}
	if euid := uint32(os.Geteuid()); st.Uid != 0 && st.Uid != euid {
		unix.Close(fd)
		return -1, fmt.Errorf("%w: %s is owned by uid %d, not %d or root: refusing to create anything through it", ErrUnsafeDir, at, st.Uid, euid)
	}
	return fd, nil
}

// procPath names file inside the directory through /proc/self/fd, for calls that take only a path (bind,
// connect): the kernel resolves it to the directory this descriptor holds, whatever happens to d.path.
func (d *ringDir) procPath(file string) string {
	return "/proc/self/fd/" + strconv.Itoa(d.fd) + "/" + file
}

func (d *ringDir) close() error {
	if d == nil || d.fd < 0 {
		return nil
	}
	err := unix.Close(d.fd)
	d.fd = -1
	return err
}

// lockName takes the producer lock of ring name (spec §1.1): the file is opened without following links
// and locked; if it was replaced while we locked it, try again, so two producers never hold locks on two
// different inodes of one name. held reports a live owner.
func (d *ringDir) lock(name string) (f *os.File, held bool, err error) {
	ln := lockName(name)
	for range 10 {
		fd, err := unix.Openat(d.fd, ln, unix.O_RDWR|unix.O_CREAT|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err != nil {
			return nil, false, fmt.Errorf("lock %s: %w", filepath.Join(d.path, ln), os.NewSyscallError("openat", err))
		}
		f = os.NewFile(uintptr(fd), filepath.Join(d.path, ln))
		held, err = lockExclusive(f)
		if err != nil || held {
			f.Close()
			return nil, held, err
		}
		var a, b unix.Stat_t
		if unix.Fstat(fd, &a) == nil && unix.Fstatat(d.fd, ln, &b, unix.AT_SYMLINK_NOFOLLOW) == nil &&
			a.Dev == b.Dev && a.Ino == b.Ino {
			return f, false, nil
		}
		f.Close() // unlinked or replaced by its previous owner meanwhile: lock the file that is there now
	}
	return nil, false, fmt.Errorf("lock %s: the lock file keeps changing", filepath.Join(d.path, ln))
}

// unlink removes file from the directory (a missing one is fine).
func (d *ringDir) unlink(file string) error {
	if err := unix.Unlinkat(d.fd, file, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("remove %s: %w", filepath.Join(d.path, file), os.NewSyscallError("unlinkat", err))
	}
	return nil
}
