package main

import (
	"flag"
	"net/netip"
	"strconv"
	"strings"

	"github.com/rs/zerolog"

	"github.com/ibvbridge/ibvbridge/transport"
	"github.com/ibvbridge/ibvbridge/transport/xdp"
)

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
