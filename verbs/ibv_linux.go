//go:build linux && cgo

package verbs

/*
#cgo CFLAGS: -O2 -Wall
#cgo LDFLAGS: -ldl
#include <stdlib.h>
#include "ibvb_shim.h"
*/
import "C"

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"github.com/ibvbridge/ibvbridge/internal/rxloop"
)

var (
	loadMu sync.Mutex
	loaded bool
)

// Load dlopen()s libibverbs (IBVBRIDGE_LIBIBVERBS, default libibverbs.so.1)
// and resolves the verbs the package uses. Success is sticky; a failure is
// retried on the next call. The error wraps ErrLibraryNotFound when the
// library is absent.
func Load() error {
	loadMu.Lock()
	defer loadMu.Unlock()
	if loaded {
		return nil
	}
	path := os.Getenv(EnvLibrary)
	if path == "" {
		path = defaultLibraryName
	}
	cpath := C.CString(path)
	defer C.free(unsafe.Pointer(cpath))
	var buf [512]C.char
	switch rc := C.ibvb_load(cpath, &buf[0], C.size_t(len(buf))); rc {
	case 0:
		loaded = true
		return nil
	case -1:
		return fmt.Errorf("%w (%s)", ErrLibraryNotFound, C.GoString(&buf[0]))
	default:
		return fmt.Errorf("libibverbs is too old for ibvbridge (need rdma-core >= 17): %s: %w",
			C.GoString(&buf[0]), errors.ErrUnsupported)
	}
}

// deviceCount is the cheap ErrNoDevices check: it lists without opening.
func deviceCount() (int, error) {
	if err := Load(); err != nil {
		return 0, err
	}
	n := int(C.ibvb_list_devices(nil, 0))
	if n < 0 {
		errno := syscall.Errno(-n)
		if errno == syscall.ENOSYS {
			// libibverbs' answer when the kernel has no uverbs support.
			return 0, fmt.Errorf("%w (kernel has no RDMA support: %v)", ErrNoDevices, errno)
		}
		return 0, fmt.Errorf("ibv_get_device_list: %w", errno)
	}
	if n == 0 {
		return 0, ErrNoDevices
	}
	return n, nil
}

// CheckInterface is the cheap up-front check that addr's interface can use
// ibverbs: libibverbs loads, it lists devices, and the interface has one
// behind it. It opens nothing. The errors wrap ErrLibraryNotFound,
// ErrNoDevices or ErrNoRDMADevice.
func CheckInterface(addr netip.Addr) (netdev, ibdev string, port int, err error) {
	if _, err := deviceCount(); err != nil {
		return "", "", 0, err
	}
	return DeviceForAddr(addr)
}

// Devices opens every RDMA device, queries it and its ports, and probes
// whether a raw packet QP can be created. The error wraps ErrNoDevices when
// there are none.
func Devices() ([]Device, error) {
	n, err := deviceCount()
	if err != nil {
		return nil, err
	}
	// Devices can come and go between the count and the listing.
	n += 4
	infos := make([]C.ibvb_device_info, n)
	got := int(C.ibvb_list_devices(&infos[0], C.int(n)))
	if got < 0 {
		return nil, fmt.Errorf("ibv_get_device_list: %w", syscall.Errno(-got))
	}
	if got == 0 {
		return nil, ErrNoDevices
	}
	devs := make([]Device, 0, min(got, n))
	for i := range min(got, n) {
		devs = append(devs, convertDevice(&infos[i]))
	}
	return devs, nil
}

func errnoOrNil(e C.int) error {
	if e == 0 {
		return nil
	}
	return syscall.Errno(e)
}

func convertDevice(in *C.ibvb_device_info) Device {
	d := Device{
		Name:     C.GoString(&in.name[0]),
		NodeGUID: uint64(in.node_guid),
		OpenErr:  errnoOrNil(in.open_errno),
	}
	if d.OpenErr != nil {
		return d
	}
	capFlags := uint64(in.device_cap_flags)
	capEx := uint64(in.device_cap_flags_ex)
	raw := uint32(in.raw_packet_caps)
	d.FirmwareVersion = C.GoString(&in.fw_ver[0])
	d.VendorID = uint32(in.vendor_id)
	d.VendorPartID = uint32(in.vendor_part_id)
	d.NumCompVectors = int(in.num_comp_vectors)
	d.MaxQPWR = int(in.max_qp_wr)
	d.MaxCQE = int(in.max_cqe)
	d.Caps = Capabilities{
		RawPacketQP:         errnoOrNil(in.raw_qp_errno),
		ManagedFlowSteering: capFlags&capManagedFlowSteering != 0,
		RawIPChecksum:       capFlags&capRawIPCsum != 0 || raw&rawCapIPCsum != 0,
		CVLANStripping:      raw&rawCapCVLANStripping != 0,
		ScatterFCS:          raw&rawCapScatterFCS != 0 || capEx&capRawScatterFCS != 0,
		PacingMinKbps:       uint32(in.pacing_min_kbps),
		PacingMaxKbps:       uint32(in.pacing_max_kbps),
		PacingRawPacket:     uint32(in.pacing_qpts)&(1<<qptRawPacket) != 0,
	}
	for i := 0; i < int(in.phys_port_cnt) && i < C.IBVB_MAX_PORTS; i++ {
		p := &in.ports[i]
		port := Port{Num: i + 1, QueryError: errnoOrNil(p.query_errno)}
		if port.QueryError == nil {
			port.State = PortState(p.state)
			port.LinkLayer = LinkLayer(p.link_layer)
			port.ActiveMTU = ibMTU(uint32(p.active_mtu))
			port.MaxMTU = ibMTU(uint32(p.max_mtu))
			port.Width = ibWidth(uint8(p.active_width))
			port.SpeedGbps = float64(port.Width) * ibLaneGbps(uint8(p.active_speed))
		}
		d.Ports = append(d.Ports, port)
	}
	return d
}

// Receiver receives the configured multicast streams with a raw packet QP
// into the caller's packet area. It is the device rxloop.Queue:
// transport/ibv's Source runs rxloop.Run over it. Poll, Repost, Arm and Wait
// are for one goroutine.
type Receiver struct {
	rx       *C.ibvb_rx
	cfg      RecvConfig
	area     []byte
	layout   RegionLayout
	Netdev   string // interface the address belongs to
	IBDev    string // RDMA device behind it
	Port     int    // 1-based port
	chanFile *os.File
	chanRaw  syscall.RawConn
	joinFD   int
	flows    []*Flow
	closed   atomic.Bool
	// Placement (RecvConfig.Place): the registered memory, and PostSplit's C-layout batch.
	mrLo, mrHi uintptr
	cwrs       []recvWR
}

// recvWR is one entry of PostSplit's batch; its layout matches the C shim's ibvb_recv_wr.
type recvWR struct {
	ID     uint64
	Addr   uint64
	Len    uint32
	HdrLen uint32
}

// Flow is a flow steering rule attached to a Receiver's QP.
type Flow struct {
	r    *Receiver
	h    unsafe.Pointer
	Rule *FlowRule
}

// OpenReceiver sets up spead2's receive path on the device behind
// cfg.Interface: PD, the packet area registered as one MR, a completion
// channel (CompVector >= 0), CQ, raw packet QP in INIT, one flow per
// endpoint, every slot posted, IGMP joins, QP in RTR.
//
// packetArea must not be Go-managed memory: the NIC writes into it until
// Close. It is the ring's packet area, mmap()ed from the data file. With
// cfg.Place the MR is the whole mapping around it instead (the ring's data
// memory, slots included), so that split work requests (PostSplit) can put
// payloads into ring slots; the QP then takes receive work requests of up to
// three SGEs.
func OpenReceiver(cfg RecvConfig, packetArea []byte) (*Receiver, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	layout, err := PlanArea(packetArea, cfg.MaxSize, cfg.BufferSize)
	if err != nil {
		return nil, err
	}
	if _, err := deviceCount(); err != nil {
		return nil, fmt.Errorf("ibverbs receiver on %s: %w", cfg.Interface, err)
	}
	netdev, ibdev, port, err := DeviceForAddr(cfg.Interface)
	if err != nil {
		return nil, fmt.Errorf("ibverbs receiver: %w", err)
	}
	r := &Receiver{cfg: cfg, area: packetArea, layout: layout, Netdev: netdev, IBDev: ibdev, Port: port, joinFD: -1}

	cname := C.CString(ibdev)
	defer C.free(unsafe.Pointer(cname))
	p := C.ibvb_rx_params{
		dev_name:    cname,
		port:        C.int(port),
		area:        unsafe.Pointer(unsafe.SliceData(packetArea)),
		area_len:    C.size_t(len(packetArea)),
		start:       C.size_t(layout.Start),
		stride:      C.size_t(layout.Stride),
		slot_len:    C.uint32_t(layout.SlotSize),
		slots:       C.uint32_t(layout.Slots),
		comp_vector: C.int(cfg.CompVector),
	}
	if cfg.Place {
		lo, hi, err := mappingAround(packetArea)
		if err != nil {
			return nil, err
		}
		r.mrLo, r.mrHi, r.cwrs = lo, hi, make([]recvWR, layout.Slots)
		p.split, p.mr_base, p.mr_len = 1, C.uint64_t(lo), C.uint64_t(hi-lo)
	}
	var cerr C.int
	var step *C.char
	r.rx = C.ibvb_rx_open(&p, &cerr, &step)
	if r.rx == nil {
		return nil, openError("receiver", C.GoString(step), syscall.Errno(cerr), ibdev, port, layout.Slots)
	}
	if err := r.setup(); err != nil {
		r.Close()
		return nil, err
	}
	return r, nil
}

func openError(what, step string, errno syscall.Errno, ibdev string, port, slots int) error {
	hint := ""
	switch {
	case step == "ibv_create_qp" && (errno == syscall.EINVAL || errno == syscall.EPERM):
		hint = " (could be a permission problem - do you have CAP_NET_RAW?)"
	case (step == "ibv_create_cq" || step == "ibv_create_qp") && errno == syscall.EINVAL:
		hint = fmt.Sprintf(" (%d work requests may exceed the device's max_cqe/max_qp_wr; lower the buffer size)", slots)
	case step == "ibv_reg_mr" && errno == syscall.ENOMEM:
		hint = " (locked memory limit? raise RLIMIT_MEMLOCK / LimitMEMLOCK)"
	}
	return fmt.Errorf("ibverbs %s on %s port %d: %s failed%s: %w", what, ibdev, port, step, hint, errno)
}

func (r *Receiver) setup() error {
	rules, err := FlowRulesForEndpoints(r.cfg.Endpoints, r.Port)
	if err != nil {
		return err
	}
	for _, rule := range rules {
		if _, err := r.AddFlow(rule); err != nil {
			return err
		}
	}
	if e := C.ibvb_rx_post_all(r.rx); e != 0 {
		return fmt.Errorf("ibverbs: post %d receive slots: %w", r.layout.Slots, syscall.Errno(e))
	}
	if r.cfg.CompVector >= 0 {
		if err := r.openChannel(); err != nil {
			return err
		}
	}
	if err := r.join(); err != nil {
		return err
	}
	if e := C.ibvb_rx_ready(r.rx); e != 0 {
		return fmt.Errorf("ibverbs: ibv_modify_qp (RTR): %w", syscall.Errno(e))
	}
	return nil
}

// openChannel hands a dup of the completion channel fd to Go's netpoller, so
// Wait sleeps in epoll and cancels through a deadline, with no thread parked
// in read(2). The dup shares the open file description: O_NONBLOCK set here
// also makes ibv_get_cq_event return EAGAIN instead of blocking.
func (r *Receiver) openChannel() (err error) {
	r.chanFile, r.chanRaw, err = channelFile(int(C.ibvb_rx_channel_fd(r.rx)))
	return err
}

// channelFile dups a completion channel fd into a non-blocking *os.File for the netpoller.
func channelFile(fd int) (*os.File, syscall.RawConn, error) {
	dup, err := syscall.Dup(fd)
	if err != nil {
		return nil, nil, fmt.Errorf("ibverbs: dup completion channel: %w", err)
	}
	syscall.CloseOnExec(dup)
	if err := syscall.SetNonblock(dup, true); err != nil {
		syscall.Close(dup)
		return nil, nil, fmt.Errorf("ibverbs: completion channel non-blocking: %w", err)
	}
	f := os.NewFile(uintptr(dup), "ibv_comp_channel")
	raw, err := f.SyscallConn()
	if err != nil {
		f.Close()
		return nil, nil, fmt.Errorf("ibverbs: completion channel: %w", err)
	}
	return f, raw, nil
}

// join makes the IGMP memberships with an unbound UDP socket, as spead2 does:
// the switch then forwards the groups, while the kernel stack, having no
// socket bound to the ports, drops its copies early.
func (r *Receiver) join() error {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_DGRAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("ibverbs: IGMP socket: %w", err)
	}
	r.joinFD = fd
	iface := r.cfg.Interface.As4()
	for _, ep := range r.cfg.Endpoints {
		mreq := &syscall.IPMreq{Multiaddr: ep.Addr().As4(), Interface: iface}
		if err := syscall.SetsockoptIPMreq(fd, syscall.IPPROTO_IP, syscall.IP_ADD_MEMBERSHIP, mreq); err != nil {
			return fmt.Errorf("ibverbs: join %s on %s: %w", ep.Addr(), r.cfg.Interface, err)
		}
	}
	return nil
}

// AddFlow attaches rule to the QP (ibv_create_flow).
func (r *Receiver) AddFlow(rule *FlowRule) (*Flow, error) {
	b, err := rule.MarshalBinary()
	if err != nil {
		return nil, err
	}
	var h unsafe.Pointer
	if e := C.ibvb_rx_attach_flow(r.rx, unsafe.Pointer(&b[0]), C.size_t(len(b)), &h); e != 0 {
		hint := ""
		if syscall.Errno(e) == syscall.EOPNOTSUPP || syscall.Errno(e) == syscall.ENOSYS {
			hint = " (device lacks managed flow steering?)"
		}
		return nil, fmt.Errorf("ibverbs: ibv_create_flow %s%s: %w", rule, hint, syscall.Errno(e))
	}
	f := &Flow{r: r, h: h, Rule: rule}
	r.flows = append(r.flows, f)
	return f, nil
}

// Destroy detaches the flow (ibv_destroy_flow).
func (f *Flow) Destroy() error {
	if f.h == nil {
		return nil
	}
	e := C.ibvb_rx_destroy_flow(f.r.rx, f.h)
	f.h = nil
	if e != 0 {
		return fmt.Errorf("ibverbs: ibv_destroy_flow %s: %w", f.Rule, syscall.Errno(e))
	}
	return nil
}

// Layout is how the packet area was divided.
func (r *Receiver) Layout() RegionLayout { return r.layout }

// Poll implements rxloop.Queue.
func (r *Receiver) Poll(out []rxloop.Completion) (int, error) {
	if len(out) == 0 {
		return 0, nil
	}
	n := C.ibvb_rx_poll(r.rx, (*C.ibvb_completion)(unsafe.Pointer(&out[0])), C.int(len(out)))
	if n < 0 {
		return 0, fmt.Errorf("ibv_poll_cq: %d", int(n))
	}
	return int(n), nil
}

// Repost implements rxloop.Queue.
func (r *Receiver) Repost(ids []uint64) error {
	if len(ids) == 0 {
		return nil
	}
	if e := C.ibvb_rx_repost(r.rx, (*C.uint64_t)(unsafe.Pointer(&ids[0])), C.int(len(ids))); e != 0 {
		return fmt.Errorf("ibv_post_recv: %w", syscall.Errno(e))
	}
	return nil
}

// Slots implements SplitQueue.
func (r *Receiver) Slots() int { return r.layout.Slots }

// PostSplit implements SplitQueue; the receiver must have been opened with RecvConfig.Place.
func (r *Receiver) PostSplit(wrs []SplitWR) error {
	if len(wrs) == 0 {
		return nil
	}
	if r.cwrs == nil {
		return errors.New("ibverbs: split receive work requests need RecvConfig.Place")
	}
	if len(wrs) > len(r.cwrs) {
		return fmt.Errorf("ibverbs: %d receive work requests in one post; the queue has %d", len(wrs), len(r.cwrs))
	}
	c := r.cwrs[:len(wrs)]
	for i, w := range wrs {
		c[i] = recvWR{ID: w.ID}
		if len(w.Region) > 0 {
			c[i].Addr = uint64(uintptr(unsafe.Pointer(unsafe.SliceData(w.Region))))
			c[i].Len, c[i].HdrLen = uint32(len(w.Region)), uint32(w.HdrLen)
		}
	}
	if e := C.ibvb_rx_post_split(r.rx, (*C.ibvb_recv_wr)(unsafe.Pointer(&c[0])), C.int(len(c))); e != 0 {
		return fmt.Errorf("ibv_post_recv (split): %w", syscall.Errno(e))
	}
	return nil
}

// Covers implements SplitQueue: whether region lies in the memory registered with RecvConfig.Place.
func (r *Receiver) Covers(region []byte) bool {
	if len(region) == 0 || r.cwrs == nil {
		return false
	}
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(region)))
	return lo >= r.mrLo && lo+uintptr(len(region)) <= r.mrHi
}

// Flush implements SplitQueue: the QP goes to the error state.
func (r *Receiver) Flush() error {
	if e := C.ibvb_rx_flush(r.rx); e != 0 {
		return fmt.Errorf("ibv_modify_qp (ERR): %w", syscall.Errno(e))
	}
	return nil
}

// Arm implements rxloop.Queue.
func (r *Receiver) Arm() error {
	if r.chanFile == nil {
		return errors.New("busy-poll receiver has no completion channel")
	}
	if e := C.ibvb_rx_arm(r.rx); e != 0 {
		return fmt.Errorf("ibv_req_notify_cq: %w", syscall.Errno(e))
	}
	return nil
}

// Wait implements rxloop.Queue: it sleeps until the armed CQ raises an event,
// reads it and acks it.
func (r *Receiver) Wait(ctx context.Context) error {
	if r.chanFile == nil {
		return errors.New("busy-poll receiver has no completion channel")
	}
	return waitChannelEvent(ctx, r.chanFile, r.chanRaw, func() syscall.Errno { return syscall.Errno(C.ibvb_rx_get_event(r.rx)) })
}

// waitChannelEvent sleeps in Go's netpoller until the completion channel fd is readable, then takes the
// event with getEvent (which reads and acks it; EAGAIN: not yet). Cancelling ctx ends the wait.
func waitChannelEvent(ctx context.Context, f *os.File, raw syscall.RawConn, getEvent func() syscall.Errno) error {
	if err := f.SetReadDeadline(time.Time{}); err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { _ = f.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	var gerr syscall.Errno
	err := raw.Read(func(uintptr) bool {
		e := getEvent()
		if e == syscall.EAGAIN {
			return false
		}
		gerr = e
		return true
	})
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return err
	}
	if gerr != 0 {
		return fmt.Errorf("ibv_get_cq_event: %w", gerr)
	}
	return nil
}

// Slot implements rxloop.Queue.
func (r *Receiver) Slot(id uint64) []byte { return r.layout.Slot(r.area, int(id)) }

// Close leaves the groups and releases flows, QP, CQs, channel, MR, PD and
// device. Call it after rxloop.Run has returned. Safe to call twice.
func (r *Receiver) Close() error {
	if r.closed.Swap(true) {
		return nil
	}
	if r.joinFD >= 0 {
		syscall.Close(r.joinFD) // the kernel sends the IGMP leaves
		r.joinFD = -1
	}
	if r.chanFile != nil {
		r.chanFile.Close()
	}
	if r.rx != nil {
		C.ibvb_rx_close(r.rx)
		r.rx = nil
	}
	return nil
}

// StatusString names a completion status (ibv_wc_status_str).
func StatusString(s rxloop.Status) string {
	if Load() != nil {
		return fmt.Sprintf("status %d", uint32(s))
	}
	return C.GoString(C.ibvb_wc_status_str(C.uint32_t(s)))
}

// cABITable returns sizeof/offsetof values compiled from the installed
// verbs.h; the layout test compares the pure-Go flow encoding against it.
func cABITable() map[string]uint64 {
	var n C.int
	t := C.ibvb_abi_table(&n)
	entries := unsafe.Slice(t, int(n))
	m := make(map[string]uint64, len(entries))
	for _, e := range entries {
		m[C.GoString(e.name)] = uint64(e.value)
	}
	return m
}

var _ SplitQueue = (*Receiver)(nil)
