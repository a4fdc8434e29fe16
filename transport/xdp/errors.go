//go:build linux

package xdp

import "errors"

// Errors returned (wrapped, with context) by Open and Run; test for them with errors.Is. Where a system
// call failed, the errno is wrapped too, so errors.Is(err, unix.EPERM) also works.
var (
	// ErrPermission: the process may not create AF_XDP sockets, BPF maps or programs, or attach XDP.
	ErrPermission = errors.New("AF_XDP needs CAP_NET_ADMIN and CAP_BPF (or root)")
	// ErrNotSupported: the kernel has no AF_XDP sockets or no XDP (EAFNOSUPPORT, or BPF disabled).
	ErrNotSupported = errors.New("kernel does not support AF_XDP/XDP")
	// ErrInterfaceNotFound: no interface has the configured name or IPv4 address.
	ErrInterfaceNotFound = errors.New("interface not found")
	// ErrQueueOutOfRange: a configured queue is not one of the interface's receive queues.
	ErrQueueOutOfRange = errors.New("receive queue out of range")
	// ErrZeroCopyUnsupported: zero-copy was demanded (Config.ZeroCopy) and the driver refused it.
	ErrZeroCopyUnsupported = errors.New("driver refused AF_XDP zero-copy")
	// ErrModeUnsupported: the XDP attach mode was demanded (native) and the driver refused it.
	ErrModeUnsupported = errors.New("driver refused the XDP attach mode")
	// ErrForeignProgram: the interface already runs an XDP program that is not ibvbridge's.
	ErrForeignProgram = errors.New("interface already has another XDP program attached")
	// ErrInUse: another live ibvbridge process holds the interface's XDP hook (through a bpf_link).
	ErrInUse = errors.New("interface XDP hook is held by another running ibvbridge")
	// ErrBadConfig: the Config is inconsistent (no endpoints, bad frame size, ...).
	ErrBadConfig = errors.New("bad AF_XDP configuration")
	// ErrBusyPoll: a busy-polling socket option (Config.BusyPollOptions) was refused or not kept.
	ErrBusyPoll = errors.New("busy-polling socket option refused")
	// ErrClosed: Run was called on, or interrupted by, Close.
	ErrClosed = errors.New("AF_XDP source closed")
)
