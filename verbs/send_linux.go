//go:build linux && cgo

package verbs

/*
#include <stdlib.h>
#include "ibvb_shim.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"syscall"
	"unsafe"

	"github.com/ibvbridge/ibvbridge/frame"
	"github.com/ibvbridge/ibvbridge/internal/rxloop"
)

// txQueue is the device SendQueue: a raw packet QP in RTS with its frame
// buffers registered as one MR.
type txQueue struct {
	tx       *C.ibvb_tx
	area     []byte // mmap()ed, not Go memory: the NIC reads it
	stride   int
	frameLen int
	chanFile *os.File
	chanRaw  syscall.RawConn
}

// OpenSender sets up spead2's ibverbs send path on the device behind
// cfg.Interface: frame buffers registered with the NIC, a send CQ (with a
// completion channel when CompVector >= 0), a raw packet QP in RTS, and
// hardware packet pacing when the device can pace cfg.Rate. The
// configuration is checked before any device is touched.
func OpenSender(cfg SendConfig) (*Sender, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if _, err := deviceCount(); err != nil {
		return nil, fmt.Errorf("ibverbs sender on %s: %w", cfg.Interface, err)
	}
	netdev, ibdev, port, err := DeviceForAddr(cfg.Interface)
	if err != nil {
		return nil, fmt.Errorf("ibverbs sender: %w", err)
	}
	macs := make([][6]byte, len(cfg.Endpoints))
	for i, ep := range cfg.Endpoints {
		if macs[i], err = DestinationMAC(ep.Addr(), netdev, DefaultARPTable); err != nil {
			return nil, err
		}
	}
	ifi, err := net.InterfaceByName(netdev)
	if err != nil {
		return nil, fmt.Errorf("ibverbs sender: %w", err)
	}
	var src frame.Header
	if len(ifi.HardwareAddr) != 6 {
		return nil, fmt.Errorf("ibverbs sender: interface %s has no Ethernet address", netdev)
	}
	copy(src.SrcMAC[:], ifi.HardwareAddr)
	src.SrcIP = cfg.Interface

	// A bound UDP socket reserves the source port the frames claim, as
	// spead2 does, so the kernel hands it to nobody else.
	sock, err := net.ListenUDP("udp4", net.UDPAddrFromAddrPort(netip.AddrPortFrom(cfg.Interface, 0)))
	if err != nil {
		return nil, fmt.Errorf("ibverbs sender: reserve a source port on %s: %w", cfg.Interface, err)
	}
	src.SrcPort = uint16(sock.LocalAddr().(*net.UDPAddr).Port)

	q := &txQueue{stride: alignUp(cfg.FrameSize(), SlotAlign), frameLen: cfg.FrameSize()}
	slots := cfg.Slots()
	q.area, err = syscall.Mmap(-1, 0, slots*q.stride, syscall.PROT_READ|syscall.PROT_WRITE,
		syscall.MAP_PRIVATE|syscall.MAP_ANONYMOUS|syscall.MAP_POPULATE)
	if err != nil {
		sock.Close()
		return nil, fmt.Errorf("ibverbs sender: map %s of frame buffers: %w", formatBytes(slots*q.stride), err)
	}
	release := func() error {
		if q.chanFile != nil {
			q.chanFile.Close()
		}
		if q.tx != nil {
			C.ibvb_tx_close(q.tx)
			q.tx = nil
		}
		syscall.Munmap(q.area)
		return sock.Close()
	}

	cname := C.CString(ibdev)
	defer C.free(unsafe.Pointer(cname))
	p := C.ibvb_tx_params{
		dev_name:    cname,
		port:        C.int(port),
		area:        unsafe.Pointer(unsafe.SliceData(q.area)),
		area_len:    C.size_t(len(q.area)),
		stride:      C.size_t(q.stride),
		slots:       C.uint32_t(slots),
		comp_vector: C.int(cfg.CompVector),
	}
	var info C.ibvb_tx_info
	var cerr C.int
	var step *C.char
	q.tx = C.ibvb_tx_open(&p, &info, &cerr, &step)
	if q.tx == nil {
		release()
		return nil, openError("sender", C.GoString(step), syscall.Errno(cerr), ibdev, port, slots)
	}
	if cfg.CompVector >= 0 {
		if err := q.openChannel(); err != nil {
			release()
			return nil, err
		}
	}

	ipCsum := uint64(info.device_cap_flags)&capRawIPCsum != 0 || uint32(info.raw_packet_caps)&rawCapIPCsum != 0
	caps := HWRate{MinKbps: uint32(info.pacing_min_kbps), MaxKbps: uint32(info.pacing_max_kbps),
		RawPacket: uint32(info.pacing_qpts)&(1<<qptRawPacket) != 0}
	pacing, swRate, kbps := "none", 0.0, uint32(0)
	if cfg.Rate > 0 {
		pacing, swRate = "software", cfg.Rate
		k, ok, why := hwRateKbps(cfg.Rate, cfg.MaxPacketSize, caps)
		switch {
		case cfg.NoHWRate:
			pacing += " (hardware pacing disabled)"
		case !ok:
			pacing += " (" + why + ")"
		default:
			// Bursts of one frame: ConnectX-5 keeps the rate with them.
			fs := cfg.FrameSize()
			if e := C.ibvb_tx_set_rate(q.tx, C.uint32_t(k), C.uint16_t(min(fs, 0xFFFF)), C.uint32_t(fs)); e != 0 {
				pacing += fmt.Sprintf(" (ibv_modify_qp_rate_limit: %v)", syscall.Errno(e))
			} else {
				pacing, swRate, kbps = "hardware", 0, k
			}
		}
	}

	s, err := NewSender(q, cfg, SendLoopConfig{Rate: swRate}, src, macs, ipCsum)
	if err != nil {
		release()
		return nil, err
	}
	s.Info.Netdev, s.Info.IBDev, s.Info.Port = netdev, ibdev, port
	s.Info.SrcMAC, s.Info.SrcPort = src.SrcMAC, src.SrcPort
	s.Info.HWRate, s.Info.HWRateKbps, s.Info.Pacing = kbps != 0, kbps, pacing
	s.closer = release
	return s, nil
}

func (q *txQueue) openChannel() (err error) {
	q.chanFile, q.chanRaw, err = channelFile(int(C.ibvb_tx_channel_fd(q.tx)))
	return err
}

// Post implements SendQueue.
func (q *txQueue) Post(wrs []SendWR) error {
	if len(wrs) == 0 {
		return nil
	}
	if e := C.ibvb_tx_post(q.tx, (*C.ibvb_send_wr)(unsafe.Pointer(&wrs[0])), C.int(len(wrs))); e != 0 {
		return fmt.Errorf("ibv_post_send: %w", syscall.Errno(e))
	}
	return nil
}

// Poll implements SendQueue.
func (q *txQueue) Poll(out []rxloop.Completion) (int, error) {
	if len(out) == 0 {
		return 0, nil
	}
	n := C.ibvb_tx_poll(q.tx, (*C.ibvb_completion)(unsafe.Pointer(&out[0])), C.int(len(out)))
	if n < 0 {
		return 0, fmt.Errorf("ibv_poll_cq: %d", int(n))
	}
	return int(n), nil
}

// Arm implements SendQueue.
func (q *txQueue) Arm() error {
	if q.chanFile == nil {
		return errors.New("busy-poll sender has no completion channel")
	}
	if e := C.ibvb_tx_arm(q.tx); e != 0 {
		return fmt.Errorf("ibv_req_notify_cq: %w", syscall.Errno(e))
	}
	return nil
}

// Wait implements SendQueue, as Receiver.Wait.
func (q *txQueue) Wait(ctx context.Context) error {
	if q.chanFile == nil {
		return errors.New("busy-poll sender has no completion channel")
	}
	return waitChannelEvent(ctx, q.chanFile, q.chanRaw, func() syscall.Errno { return syscall.Errno(C.ibvb_tx_get_event(q.tx)) })
}

// Slot implements SendQueue.
func (q *txQueue) Slot(i uint32) []byte {
	off := int(i) * q.stride
	return q.area[off : off+q.frameLen : off+q.frameLen]
}

var _ SendQueue = (*txQueue)(nil)
