package verbs

import (
	"errors"
	"fmt"
	"net/netip"
)

var (
	// ErrLibraryNotFound means libibverbs.so.1 could not be loaded. Its text is
	// what an operator needs to read; Load appends the dlerror detail.
	ErrLibraryNotFound = errors.New("libibverbs.so.1 not found: install rdma-core / ibverbs-providers")

	// ErrNoDevices means libibverbs loaded but reports no RDMA devices.
	ErrNoDevices = errors.New("no RDMA devices found")

	// ErrNoRDMADevice means a network interface exists but has no RDMA device
	// behind it (a plain NIC, a bridge, loopback). Match it with errors.Is; the
	// concrete error is a *NoDeviceError naming the interface.
	ErrNoRDMADevice = errors.New("no RDMA device")

	// ErrUnsupported is returned by the device entry points when the package
	// was built without cgo or for a non-Linux system.
	ErrUnsupported = fmt.Errorf("ibverbs support not compiled in (needs linux and cgo): %w", errors.ErrUnsupported)
)

// NoDeviceError says which interface lacks an RDMA device. It matches
// ErrNoRDMADevice under errors.Is.
type NoDeviceError struct {
	Netdev string
	Addr   netip.Addr // zero if the lookup started from the interface name
	Err    error      // optional detail (what sysfs said)
}

func (e *NoDeviceError) Error() string {
	s := "interface " + e.Netdev
	if e.Addr.IsValid() {
		s += " (" + e.Addr.String() + ")"
	}
	s += " has no RDMA device"
	if e.Err != nil {
		s += ": " + e.Err.Error()
	}
	return s
}

func (e *NoDeviceError) Is(target error) bool { return target == ErrNoRDMADevice }

func (e *NoDeviceError) Unwrap() error { return e.Err }
