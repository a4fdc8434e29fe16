package ring

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Seals (spec §1): what the producer puts on memory consumers only read, and on a consumer's region.
const (
	sealsReadOnly = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_FUTURE_WRITE | unix.F_SEAL_SEAL
	sealsRegion   = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_SEAL
	// What a consumer requires before it maps (F_SEAL_SEAL is the producer's business).
	needReadOnly = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW | unix.F_SEAL_FUTURE_WRITE
	needRegion   = unix.F_SEAL_SHRINK | unix.F_SEAL_GROW
)

// shm is a memfd and the producer's read-write mapping of it.
type shm struct {
	fd  int
	mem []byte
}

func (s *shm) close() error {
	var errs []error
	if s.mem != nil {
		errs = append(errs, unix.Munmap(s.mem))
		s.mem = nil
	}
	if s.fd >= 0 {
		errs = append(errs, unix.Close(s.fd))
		s.fd = -1
	}
	return errors.Join(errs...)
}

// newHugeMemfd makes an empty hugetlb memfd and returns it with its page size (the pool's default
// hugepage size), so the caller can lay out the memory before sizing it.
func newHugeMemfd(name string) (fd int, pageSize uint32, err error) {
	fd, err = unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING|unix.MFD_HUGETLB)
	if err != nil {
		return -1, 0, os.NewSyscallError("memfd_create(MFD_HUGETLB)", err)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, 0, os.NewSyscallError("fstat", err)
	}
	return fd, uint32(st.Blksize), nil
}

// smallShm is the size up to which a memfd is fallocated without first asking what memory is available.
const smallShm = 1 << 20

// sizeAndMap gives a memfd its size and maps it read-write, reserving every page first so that no later
// touch can fault for want of memory (spec §1: no SIGBUS path). huge memfds reserve their pages at mmap;
// shmem ones are fallocated.
func sizeAndMap(fd int, size uint64, huge bool) ([]byte, error) {
	if err := unix.Ftruncate(fd, int64(size)); err != nil {
		return nil, os.NewSyscallError("ftruncate", err)
	}
	if !huge {
		// An unlimited shmem (memfd) fills memory page by page: past what the system has, fallocate would
		// meet the OOM killer rather than fail. Refuse up front instead — for rings: a consumer's region
		// (a page) is no more than any allocation, and reading three files per attach cost more than the
		// rest of admission.
		if size > smallShm {
			if avail := shmAvailable(); avail > 0 && size > avail {
				return nil, fmt.Errorf("%w: the ring needs %d MiB of shared memory and %d MiB are available: use fewer or smaller slots",
					ErrNoSpace, size>>20, avail>>20)
			}
		}
		if err := unix.Fallocate(fd, 0, 0, int64(size)); err != nil {
			if errors.Is(err, unix.ENOSPC) || errors.Is(err, unix.ENOMEM) {
				return nil, fmt.Errorf("%w: the ring needs %d MiB of shared memory and the system has %d MiB available: use fewer or smaller slots",
					ErrNoSpace, size>>20, shmAvailable()>>20)
			}
			return nil, os.NewSyscallError("fallocate", err)
		}
	}
	flags := unix.MAP_SHARED
	if huge {
		flags |= unix.MAP_POPULATE
	}
	b, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, flags)
	if err != nil {
		if huge && errors.Is(err, unix.ENOMEM) {
			return nil, fmt.Errorf("%w: the ring needs %d MiB of hugepages and %d MiB are free (see README: echo N > /proc/sys/vm/nr_hugepages)",
				ErrNoHugePages, size>>20, hugeFree()>>20)
		}
		return nil, os.NewSyscallError("mmap", err)
	}
	return b, nil
}

// newShm makes a plain shared-memory memfd of size bytes, reserved and mapped read-write.
func newShm(name string, size uint64) (*shm, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return nil, os.NewSyscallError("memfd_create", err)
	}
	b, err := sizeAndMap(fd, size, false)
	if err != nil {
		unix.Close(fd)
		return nil, err
	}
	return &shm{fd: fd, mem: b}, nil
}

func seal(fd int, seals int) error {
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, seals); err != nil {
		return os.NewSyscallError("fcntl(F_ADD_SEALS)", err)
	}
	return nil
}

// checkSealed verifies that a received memfd carries the seals the spec requires and has the size the
// producer announced, before anything maps it (spec §9 step 4).
func checkSealed(fd int, what string, need int, size uint64) error {
	got, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return fmt.Errorf("%w: %s memory is not a sealable memfd: %v", ErrCorrupt, what, os.NewSyscallError("fcntl(F_GET_SEALS)", err))
	}
	if got&need != need {
		return fmt.Errorf("%w: %s memory has seals %#x, want at least %#x (it could be resized under us)", ErrCorrupt, what, got, need)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return os.NewSyscallError("fstat", err)
	}
	if uint64(st.Size) != size {
		return fmt.Errorf("%w: %s memory is %d bytes, the producer announced %d", ErrCorrupt, what, st.Size, size)
	}
	return nil
}

// meminfo reads one "Name: N kB" (or a bare count) line of /proc/meminfo; 0 if absent.
func meminfo(key string) uint64 {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		k, v, ok := strings.Cut(s.Text(), ":")
		if !ok || k != key {
			continue
		}
		fields := strings.Fields(v)
		if len(fields) == 0 {
			return 0
		}
		n, _ := strconv.ParseUint(fields[0], 10, 64)
		if len(fields) > 1 && fields[1] == "kB" {
			n <<= 10
		}
		return n
	}
	return 0
}

// hugeFree is the free memory in the default hugepage pool, for messages.
func hugeFree() uint64 { return meminfo("HugePages_Free") * meminfo("Hugepagesize") }

// shmAvailable is the memory a new shared mapping may take: MemAvailable, or less when this process's
// cgroup (v2) has a memory limit; 0 if unknown.
func shmAvailable() uint64 {
	avail := meminfo("MemAvailable")
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return avail
	}
	for _, line := range strings.Split(string(b), "\n") {
		path, ok := strings.CutPrefix(line, "0::")
		if !ok {
			continue
		}
		dir := "/sys/fs/cgroup" + path
		limit, err1 := os.ReadFile(dir + "/memory.max")
		used, err2 := os.ReadFile(dir + "/memory.current")
		l, e1 := strconv.ParseUint(strings.TrimSpace(string(limit)), 10, 64)
		u, e2 := strconv.ParseUint(strings.TrimSpace(string(used)), 10, 64)
		if err1 == nil && err2 == nil && e1 == nil && e2 == nil && u < l && (avail == 0 || l-u < avail) {
			avail = l - u
		}
	}
	return avail
}
