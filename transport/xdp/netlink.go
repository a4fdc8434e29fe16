//go:build linux

package xdp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A minimal rtnetlink client: the XDP state of a link (RTM_GETLINK → IFLA_XDP) and legacy, non-link XDP
// attach/detach (RTM_SETLINK with IFLA_XDP_FD), which is how a program left behind by another tool (or by
// `ip link set dev X xdp ...`) is found and removed. ibvbridge itself attaches through a bpf_link
// (link.AttachXDP), which the kernel detaches when the process dies. Sockets are created on the calling
// thread, so the link is looked up in the calling thread's network namespace.

// linkXDP is what RTM_GETLINK says about a link.
type linkXDP struct {
	Attached    uint8  // XDP_ATTACHED_NONE/DRV/SKB/HW/MULTI
	DrvProgID   uint32 // native (driver) program; 0: none
	SKBProgID   uint32 // generic program
	HWProgID    uint32 // offloaded program
	NumRxQueues uint32 // IFLA_NUM_RX_QUEUES (allocated queues)
}

// XDP_ATTACHED_* values of IFLA_XDP_ATTACHED.
const (
	xdpAttachedNone = 0
	xdpAttachedDrv  = 1
	xdpAttachedSKB  = 2
	xdpAttachedHW   = 3
	xdpAttachedMult = 4
)

const (
	iflaNumRxQueues = 32 // IFLA_NUM_RX_QUEUES
	nlaFNested      = 1 << 15
	nlaTypeMask     = ^uint16(nlaFNested | 1<<14)
	nlmsgerrAttrMsg = 1 // NLMSGERR_ATTR_MSG
)

func rtnlRequest(typ uint16, flags uint16, ifindex int, attrs []byte) ([][]byte, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_ROUTE)
	if err != nil {
		return nil, fmt.Errorf("netlink socket: %w", err)
	}
	defer unix.Close(fd)
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_EXT_ACK, 1)
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("netlink bind: %w", err)
	}
	msg := make([]byte, unix.SizeofNlMsghdr+unix.SizeofIfInfomsg, unix.SizeofNlMsghdr+unix.SizeofIfInfomsg+len(attrs))
	msg = append(msg, attrs...)
	hdr := (*unix.NlMsghdr)(unsafe.Pointer(&msg[0]))
	hdr.Len = uint32(len(msg))
	hdr.Type = typ
	hdr.Flags = unix.NLM_F_REQUEST | flags
	hdr.Seq = 1
	ifi := (*unix.IfInfomsg)(unsafe.Pointer(&msg[unix.SizeofNlMsghdr]))
	ifi.Family = unix.AF_UNSPEC
	ifi.Index = int32(ifindex)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		return nil, fmt.Errorf("netlink send: %w", err)
	}
	buf := make([]byte, 1<<16)
	var out [][]byte
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("netlink receive: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			return nil, fmt.Errorf("netlink parse: %w", err)
		}
		for _, m := range msgs {
			if m.Header.Seq != 1 {
				continue
			}
			switch m.Header.Type {
			case unix.NLMSG_ERROR:
				if len(m.Data) < 4 {
					return nil, errors.New("netlink: short error message")
				}
				if code := int32(binary.NativeEndian.Uint32(m.Data[:4])); code != 0 {
					errno := unix.Errno(-code)
					if text := extackMsg(m); text != "" {
						return nil, fmt.Errorf("%s: %w", text, errno)
					}
					return nil, errno
				}
				return out, nil // ACK
			case unix.NLMSG_DONE:
				return out, nil
			default:
				out = append(out, append([]byte(nil), m.Data...))
				if m.Header.Flags&unix.NLM_F_MULTI == 0 && flags&unix.NLM_F_ACK == 0 {
					return out, nil
				}
			}
		}
	}
}

// extackMsg returns the kernel's extended-ack text of an NLMSG_ERROR, if any (NETLINK_CAP_ACK: only the
// request's header is echoed before the attributes).
func extackMsg(m syscall.NetlinkMessage) string {
	if m.Header.Flags&unix.NLM_F_ACK_TLVS == 0 || len(m.Data) < 4+unix.SizeofNlMsghdr {
		return ""
	}
	for _, a := range parseAttrs(m.Data[4+unix.SizeofNlMsghdr:]) {
		if a.typ == nlmsgerrAttrMsg {
			b := a.val
			for len(b) > 0 && b[len(b)-1] == 0 {
				b = b[:len(b)-1]
			}
			return string(b)
		}
	}
	return ""
}

type attr struct {
	typ uint16
	val []byte
}

func parseAttrs(b []byte) []attr {
	var out []attr
	for len(b) >= 4 {
		l := int(binary.NativeEndian.Uint16(b[0:2]))
		if l < 4 || l > len(b) {
			break
		}
		out = append(out, attr{typ: binary.NativeEndian.Uint16(b[2:4]) & nlaTypeMask, val: b[4:l]})
		l = (l + 3) &^ 3
		if l > len(b) {
			break
		}
		b = b[l:]
	}
	return out
}

func appendAttr(b []byte, typ uint16, val []byte) []byte {
	l := 4 + len(val)
	b = binary.NativeEndian.AppendUint16(b, uint16(l))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = append(b, val...)
	for ; l%4 != 0; l++ {
		b = append(b, 0)
	}
	return b
}

// queryXDP returns the XDP state of link ifindex.
func queryXDP(ifindex int) (linkXDP, error) {
	var st linkXDP
	msgs, err := rtnlRequest(unix.RTM_GETLINK, 0, ifindex, nil)
	if err != nil {
		return st, fmt.Errorf("get link %d: %w", ifindex, err)
	}
	for _, m := range msgs {
		if len(m) < unix.SizeofIfInfomsg {
			continue
		}
		for _, a := range parseAttrs(m[unix.SizeofIfInfomsg:]) {
			switch a.typ {
			case iflaNumRxQueues:
				if len(a.val) >= 4 {
					st.NumRxQueues = binary.NativeEndian.Uint32(a.val)
				}
			case unix.IFLA_XDP:
				for _, x := range parseAttrs(a.val) {
					switch {
					case x.typ == unix.IFLA_XDP_ATTACHED && len(x.val) >= 1:
						st.Attached = x.val[0]
					case x.typ == unix.IFLA_XDP_DRV_PROG_ID && len(x.val) >= 4:
						st.DrvProgID = binary.NativeEndian.Uint32(x.val)
					case x.typ == unix.IFLA_XDP_SKB_PROG_ID && len(x.val) >= 4:
						st.SKBProgID = binary.NativeEndian.Uint32(x.val)
					case x.typ == unix.IFLA_XDP_HW_PROG_ID && len(x.val) >= 4:
						st.HWProgID = binary.NativeEndian.Uint32(x.val)
					}
				}
			}
		}
	}
	return st, nil
}

// setXDPFD attaches program fd to link ifindex the legacy (netlink, non-bpf_link) way, or detaches with
// fd -1. flags are XDP_FLAGS_*.
func setXDPFD(ifindex, fd int, flags uint32) error {
	var nested []byte
	nested = appendAttr(nested, unix.IFLA_XDP_FD, binary.NativeEndian.AppendUint32(nil, uint32(int32(fd))))
	if flags != 0 {
		nested = appendAttr(nested, unix.IFLA_XDP_FLAGS, binary.NativeEndian.AppendUint32(nil, flags))
	}
	attrs := appendAttr(nil, unix.IFLA_XDP|nlaFNested, nested)
	if _, err := rtnlRequest(unix.RTM_SETLINK, unix.NLM_F_ACK, ifindex, attrs); err != nil {
		return os.NewSyscallError("rtnetlink set xdp", err)
	}
	return nil
}
