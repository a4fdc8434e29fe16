package main

// The ibverbs transport of recv and send (--transport ibv). recv.go and send.go only reach it through the
// transport table (transports.go); the command-line side (flags, environment, validation) is in this file, the transport
// itself in package transport/ibv.

import (
	"flag"
	"net/netip"
	"os"
	"strconv"

	"github.com/ibvbridge/ibvbridge/bridge"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/transport"
	"github.com/ibvbridge/ibvbridge/transport/ibv"
	"github.com/ibvbridge/ibvbridge/verbs"
)

var ibvTransport = transportKind{name: "ibv", send: sendIBV, recvCheck: checkIBVRecv, recv: openIBVRecv}

func checkIBVRecv(o *recvOptions) error {
	if o.pcapFile != "" {
		return usageError("--pcap replays a file: it does not go with --transport ibv")
	}
	_, err := o.ibv.recvConfig(o.endpoints, o.eps, o.iface)
	return err
}

// openIBVRecv checks that libibverbs loads and has the device (newIBVSource) and sets the source.
func openIBVRecv(o *recvOptions, cfg *bridge.Config) (err error) {
	cfg.AreaSource, err = newIBVSource(o.ibv, o.endpoints, o.eps, o.iface, o.pcapFile)
	return err
}

// sendIBV is send's ibverbs path: frames built straight into the NIC's registered buffers.
func sendIBV(o *sendOptions, e transport.Endpoint, enc *spead.Encoder) (transport.HeapSender, error) {
	if len(o.eps) > 1 {
		return nil, usageError("--transport ibv sends to one destination")
	}
	cfg, err := o.ibv.sendConfig(o.dests[0], e, o.iface, o.ttl, o.packetSize, o.rate)
	if err != nil {
		return nil, err
	}
	return newIBVHeapSender(cfg, enc)
}

// intFlag is an int flag that may be given under several names (spead2's and ours).
type intFlag struct{ v int }

func (f *intFlag) String() string     { return strconv.Itoa(f.v) }
func (f *intFlag) Set(s string) error { n, err := strconv.Atoi(s); f.v = n; return err }

// ibvFlags are the ibverbs flags of recv and send, with spead2_recv/spead2_send's spellings as aliases:
// --ibv (= --transport ibv), --ibv-vector (= --ibv-comp-vector), --ibv-max-poll.
type ibvFlags struct {
	fs         *flag.FlagSet
	use        *bool
	buffer     *int
	maxSize    *int  // recv only
	place      *bool // recv only
	compVector intFlag
	maxPoll    *int
	noHWRate   *bool // send only
}

func addIBVFlags(fs *flag.FlagSet, send bool) *ibvFlags {
	f := &ibvFlags{fs: fs, compVector: intFlag{verbs.DefaultCompVector}}
	f.use = fs.Bool("ibv", false, "use ibverbs: same as --transport ibv (spead2's flag)")
	if send {
		f.buffer = sizeFlag(fs, "ibv-buffer", verbs.DefaultSendBufferSize, "ibverbs: registered send buffer bytes (frames = bytes / (packet size + 42))")
		f.noHWRate = fs.Bool("ibv-no-hw-rate", false, "ibverbs: pace --rate in software even if the NIC can pace")
	} else {
		f.maxSize = sizeFlag(fs, "ibv-max-size", verbs.DefaultMaxSize, "ibverbs: largest Ethernet frame received")
		f.buffer = sizeFlag(fs, "ibv-buffer", verbs.DefaultBufferSize, "ibverbs: receive buffer bytes in the ring's packet area (work requests = bytes / max size)")
		f.place = fs.Bool("ibv-place", false, "ibverbs: receive payloads straight into ring slots (two-SGE work requests; never run on RDMA hardware; pays only with heaps longer than the receive queue)")
	}
	usage := "ibverbs: completion vector for interrupts; < 0 busy-polls a core (env " + verbs.EnvCompVector + ", " + verbs.EnvSpead2CompVector + ")"
	fs.Var(&f.compVector, "ibv-comp-vector", usage)
	fs.Var(&f.compVector, "ibv-vector", "same as --ibv-comp-vector (spead2's flag)")
	f.maxPoll = fs.Int("ibv-max-poll", verbs.DefaultMaxPoll, "ibverbs: polls before sleeping on the completion channel")
	return f
}

// transport resolves --transport with --ibv: --ibv alone means ibv; with another transport it is a mistake.
func (f *ibvFlags) transport(tr string) (string, error) {
	if !*f.use {
		return tr, nil
	}
	if tr != "" && tr != "ibv" {
		return "", usageError("--ibv means --transport ibv: it does not go with --transport %s", tr)
	}
	return "ibv", nil
}

// set reports which env-overridable settings were given on the command line.
func (f *ibvFlags) set() verbs.FlagsSet {
	var s verbs.FlagsSet
	f.fs.Visit(func(fl *flag.Flag) {
		switch fl.Name {
		case "interface":
			s.Interface = true
		case "ibv-comp-vector", "ibv-vector":
			s.CompVector = true
		}
	})
	return s
}

// interfaceAndEnv applies flag > IBVBRIDGE_IBV_* > SPEAD2_IBV_* to the interface and completion vector.
func (f *ibvFlags) interfaceAndEnv(iface string, addr *netip.Addr, compVector *int) error {
	if iface != "" {
		a, err := netip.ParseAddr(iface)
		if err != nil || !a.Is4() {
			return usageError("--interface %q: want the interface's local IPv4 address", iface)
		}
		*addr = a
	}
	*compVector = f.compVector.v
	c := verbs.SendConfig{Interface: *addr, CompVector: *compVector}
	if err := c.ApplyEnv(os.LookupEnv, f.set()); err != nil {
		return usageError("%v", err)
	}
	*addr, *compVector = c.Interface, c.CompVector
	if !addr.IsValid() {
		return usageError("--transport ibv needs --interface ADDR, the local IPv4 address of the RDMA NIC's interface (or %s / %s)",
			verbs.EnvInterface, verbs.EnvSpead2Interface)
	}
	if *f.maxPoll < 1 {
		return usageError("--ibv-max-poll %d: want at least 1", *f.maxPoll)
	}
	if *f.buffer < 1 {
		return usageError("--ibv-buffer %d: want a positive byte count", *f.buffer)
	}
	return nil
}

// recvConfig builds and checks the receive configuration, with no device access: multicast IPv4 endpoints
// only, as spead2's udp_ibv reader.
func (f *ibvFlags) recvConfig(pos []string, eps []transport.Endpoint, iface string) (verbs.RecvConfig, error) {
	cfg := verbs.DefaultRecvConfig()
	if len(eps) == 0 {
		return cfg, usageError("no endpoints: give the multicast groups as GROUP:PORT")
	}
	for i, ep := range eps {
		if !ep.Addr.IsValid() {
			return cfg, usageError("endpoint %q: the ibverbs transport receives multicast only: give GROUP:PORT", pos[i])
		}
		ap := netip.AddrPortFrom(ep.Addr, ep.Port)
		if err := verbs.ValidateEndpoint(ap); err != nil {
			return cfg, usageError("%v (the ibverbs transport receives multicast only)", err)
		}
		cfg.Endpoints = append(cfg.Endpoints, ap)
	}
	if err := f.interfaceAndEnv(iface, &cfg.Interface, &cfg.CompVector); err != nil {
		return cfg, err
	}
	if *f.maxSize < 64 || *f.maxSize > 65535 {
		return cfg, usageError("--ibv-max-size %d: want 64..65535", *f.maxSize)
	}
	cfg.MaxSize, cfg.BufferSize, cfg.MaxPoll, cfg.Place = *f.maxSize, *f.buffer, *f.maxPoll, *f.place
	if err := cfg.Validate(); err != nil {
		return cfg, usageError("%v", err)
	}
	return cfg, nil
}

// newIBVSource checks everything that can be checked without opening the device: configuration errors
// first (usage errors), then that libibverbs loads, has devices and one behind the interface. The source
// opens on the ring's packet area once the ring exists.
func newIBVSource(f *ibvFlags, pos []string, eps []transport.Endpoint, iface, pcapFile string) (transport.AreaSource, error) {
	if pcapFile != "" {
		return nil, usageError("--pcap replays a file: it does not go with --transport ibv")
	}
	cfg, err := f.recvConfig(pos, eps, iface)
	if err != nil {
		return nil, err
	}
	return ibv.NewSource(cfg)
}

// sendConfig builds and checks the send configuration, with no device access. dest is send's positional
// HOST:PORT: it must name the destination (multicast group, or a unicast neighbour).
func (f *ibvFlags) sendConfig(dest string, ep transport.Endpoint, iface string, ttl, packetSize int, gbps float64) (verbs.SendConfig, error) {
	cfg := verbs.DefaultSendConfig()
	// send.go fills in 127.0.0.1 for a bare port; a NIC cannot send there.
	if given, err := transport.ParseEndpoint(dest); err == nil && !given.Addr.IsValid() || ep.Addr.IsLoopback() {
		return cfg, usageError("destination %q: the ibverbs transport sends through a NIC: give GROUP:PORT (or a unicast HOST:PORT on the local link)", dest)
	}
	cfg.Endpoints = []netip.AddrPort{netip.AddrPortFrom(ep.Addr, ep.Port)}
	if err := f.interfaceAndEnv(iface, &cfg.Interface, &cfg.CompVector); err != nil {
		return cfg, err
	}
	if ttl > 0 {
		cfg.TTL = ttl
	}
	cfg.MaxPacketSize, cfg.BufferSize, cfg.MaxPoll = packetSize, *f.buffer, *f.maxPoll
	cfg.Rate = gbps * 1e9 / 8
	cfg.NoHWRate = *f.noHWRate
	if err := cfg.Validate(); err != nil {
		return cfg, usageError("%v", err)
	}
	return cfg, nil
}

// newIBVHeapSender is send's ibverbs path: the heaps send.go generates are packetized straight into the
// sender's registered frame buffers.
func newIBVHeapSender(cfg verbs.SendConfig, enc *spead.Encoder) (transport.HeapSender, error) {
	return ibv.OpenHeapSender(cfg, enc)
}
