package main

import (
	"errors"
	"flag"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/rs/zerolog"

	"github.com/ibvbridge/ibvbridge/bridge"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/transport"
	"github.com/ibvbridge/ibvbridge/transport/xdp"
	"github.com/ibvbridge/ibvbridge/verbs"
)

var xdpTransport = transportKind{name: "xdp", send: sendXDP, recvCheck: checkXDPRecv, recv: openXDPRecv}

func checkXDPRecv(o *recvOptions) error {
	_, err := o.xdp.config(o.iface, o.eps, nil)
	return err
}

// openXDPRecv sets recv's AF_XDP source, which receives into the ring's packet area.
func openXDPRecv(o *recvOptions, cfg *bridge.Config) error {
	xc, err := o.xdp.config(o.iface, o.eps, cfg.Log)
	if err == nil {
		cfg.AreaSource = xdp.AreaSource{Config: xc}
	}
	return err
}

// sendXDP is send's AF_XDP path: frames built straight into AF_XDP UMEM frames.
func sendXDP(o *sendOptions, e transport.Endpoint, enc *spead.Encoder) (transport.HeapSender, error) {
	if len(o.eps) > 1 {
		return nil, usageError("--transport xdp sends to one destination (one AF_XDP socket per TX queue)")
	}
	return openXDPHeapSender(o.iface, e, o.ttl, o.rate, o.batch, enc)
}

// xdpOptions are recv's AF_XDP flags.
type xdpOptions struct {
	queues   string
	mode     string
	zeroCopy bool
	copy     bool
	frames   int
	maxPoll  int
	busyPoll bool

	singleBuffer bool
	needWakeup   bool
	sockBusy     xdp.BusyPoll
}

func addXDPFlags(fs *flag.FlagSet) *xdpOptions {
	o := &xdpOptions{}
	fs.StringVar(&o.queues, "queue", "0", "xdp: receive queue(s) to bind, comma-separated")
	fs.StringVar(&o.mode, "xdp-mode", "auto", "xdp: attach mode auto, native or generic")
	fs.BoolVar(&o.zeroCopy, "zero-copy", false, "xdp: demand zero-copy (fail if the driver refuses)")
	fs.BoolVar(&o.copy, "copy", false, "xdp: force copy mode")
	fs.IntVar(&o.frames, "xdp-frames", 0, "xdp: UMEM frames per queue, a power of two (default 4096)")
	fs.IntVar(&o.maxPoll, "max-poll", 10, "xdp: polls before sleeping (spead2's max_poll)")
	fs.BoolVar(&o.busyPoll, "busy-poll", false, "xdp: spin instead of sleeping when idle (a core at 100%)")
	fs.BoolVar(&o.singleBuffer, "xdp-single-buffer", false, "xdp: no multi-buffer (XDP_USE_SG): frames larger than a UMEM frame are dropped")
	fs.BoolVar(&o.needWakeup, "xdp-need-wakeup", true, "xdp: bind with XDP_USE_NEED_WAKEUP (false: the kernel polls the fill ring itself)")
	fs.BoolVar(&o.sockBusy.Prefer, "xdp-prefer-busy-poll", false, "xdp: SO_PREFER_BUSY_POLL: the receive loop runs the driver's NAPI poll")
	fs.IntVar(&o.sockBusy.Usecs, "xdp-busy-poll-usecs", 0, "xdp: SO_BUSY_POLL, µs a busy poll may spin (0: the kernel's default)")
	fs.IntVar(&o.sockBusy.Budget, "xdp-busy-poll-budget", 0, "xdp: SO_BUSY_POLL_BUDGET, packets per busy poll (0: the kernel's default)")
	return o
}

// config checks the flags before anything is opened.
func (o *xdpOptions) config(iface string, eps []transport.Endpoint, log *zerolog.Logger) (xdp.Config, error) {
	cfg := xdp.Config{Interface: iface, Mode: o.mode, ZeroCopy: o.zeroCopy, Copy: o.copy, Frames: o.frames,
		MaxPoll: o.maxPoll, BusyPoll: o.busyPoll, Log: log, SingleBuffer: o.singleBuffer, NoNeedWakeup: !o.needWakeup,
		SocketBusyPoll: o.sockBusy}
	if iface == "" {
		return cfg, usageError("--transport xdp needs --interface NAME|ADDR")
	}
	if o.zeroCopy && o.copy {
		return cfg, usageError("--zero-copy and --copy exclude each other")
	}
	if o.sockBusy.Usecs < 0 || o.sockBusy.Budget < 0 || o.sockBusy.Budget > 0xffff {
		return cfg, usageError("--xdp-busy-poll-usecs %d / --xdp-busy-poll-budget %d: want 0 or more (budget at most 65535)",
			o.sockBusy.Usecs, o.sockBusy.Budget)
	}
	switch o.mode {
	case xdp.ModeAuto, xdp.ModeNative, xdp.ModeGeneric:
	default:
		return cfg, usageError("--xdp-mode %q: want auto, native or generic", o.mode)
	}
	for _, q := range strings.Split(o.queues, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(q))
		if err != nil || n < 0 {
			return cfg, usageError("--queue %q: want queue numbers like 0 or 0,1", o.queues)
		}
		cfg.Queues = append(cfg.Queues, n)
	}
	if len(eps) == 0 {
		return cfg, usageError("no endpoints: give host:port or port")
	}
	for _, e := range eps {
		cfg.Endpoints = append(cfg.Endpoints, netip.AddrPortFrom(e.Addr, e.Port))
	}
	if xdp.RequiredUMEM(cfg) == 0 {
		return cfg, usageError("--xdp-frames %d: want a power of two", o.frames)
	}
	return cfg, nil
}

// openXDPHeapSender opens `send --transport xdp`: an AF_XDP socket on queue 0 of iface (a name or an IPv4
// address), its frames addressed to the destination's Ethernet address (xdpDestMAC).
func openXDPHeapSender(iface string, e transport.Endpoint, ttl int, gbps float64, batch int, enc *spead.Encoder) (transport.HeapSender, error) {
	if iface == "" {
		return nil, usageError("--transport xdp needs --interface NAME|ADDR (the interface the frames leave by)")
	}
	if !e.Addr.IsValid() || e.Addr.IsUnspecified() {
		return nil, usageError("--transport xdp needs a destination address, not just a port")
	}
	name, _, err := xdp.ResolveInterface(iface)
	if err != nil {
		return nil, err
	}
	mac, err := xdpDestMAC(e.Addr, name)
	if err != nil {
		return nil, err
	}
	return xdp.OpenHeapSender(xdp.SendConfig{Interface: name, Dest: netip.AddrPortFrom(e.Addr, e.Port), DstMAC: mac, TTL: ttl,
		Rate: gbps * 1e9, Batch: batch}, enc)
}

// xdpDestMAC is the Ethernet destination of frames to dst leaving by netdev: the group's MAC for
// multicast, else the kernel's neighbour entry (verbs.DestinationMAC). AF_XDP bypasses the kernel's
// resolution, so a missing entry is resolved the way the kernel would for a socket: one empty UDP datagram
// to dst's discard port (9) makes it ARP, and the table is read again for up to a second. The
// destination must be on netdev's link.
func xdpDestMAC(dst netip.Addr, netdev string) ([6]byte, error) {
	mac, err := verbs.DestinationMAC(dst, netdev, verbs.DefaultARPTable)
	if err == nil || !errors.Is(err, verbs.ErrNoNeighbour) {
		return mac, err
	}
	if c, derr := net.DialUDP("udp4", nil, net.UDPAddrFromAddrPort(netip.AddrPortFrom(dst, 9))); derr == nil {
		_, _ = c.Write(nil)
		c.Close()
	}
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
		if mac, err = verbs.DestinationMAC(dst, netdev, verbs.DefaultARPTable); err == nil {
			return mac, nil
		}
	}
	return mac, fmt.Errorf("xdp send: no Ethernet address for %s on %s after asking the kernel to resolve it (is it on that link?): %w",
		dst, netdev, verbs.ErrNoNeighbour)
}
