package main

import (
	"flag"
	"math"
	"net/netip"
	"strings"
	"time"

	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/spead/pattern"
	"github.com/ibvbridge/ibvbridge/transport"
)

// Defaults of send that fit recv's (recv_options.go): 1 MiB heaps fit a default 2 MiB slot, and 1 Gb/s is a pace
// a default recv (8 MiB socket buffer) takes on loopback without loss, where an unpaced send of 1000 heaps
// lost 41 % of them (measured on a loaded 2-core machine; 2 Gb/s still lost none there).
const defaultSendRate = 1.0

const sendUsage = "usage: ibvbridge send HOST:PORT [HOST:PORT...] [flags]   (heap k to destination (k-1) mod N, as spead2_send)\n       ibvbridge send --ring NAME HOST:PORT [flags]   (transmit a ring's heaps)"

// sendOptions are send's flags and positionals; validate checks them and fills in the derived fields.
type sendOptions struct {
	heapSize, packetSize                  int
	heaps, tsStep                         uint64
	rate                                  float64
	flavourName, iface, transport, tsItem string
	axis, ring, waitRing, waitDir         string
	items, ttl, batch, threads            int
	waitConsumers                         int
	waitTimeout                           time.Duration
	descriptors, pattern, timestamp, gso  bool
	noStop, json, incomplete              bool
	ibv                                   *ibvFlags
	set                                   map[string]bool // flags given on the command line
	dests                                 []string        // the positional HOST:PORTs

	// Derived by validate.
	eps        []transport.Endpoint
	flavour    spead.Flavour
	chunkItems *pattern.ChunkItems
	ifAddr     netip.Addr
}

// sendFlags registers send's flags on fs, into a new sendOptions.
func sendFlags(fs *flag.FlagSet) *sendOptions {
	o := &sendOptions{heapSize: 1 << 20, packetSize: 1472}
	fs.Var((*byteSize)(&o.heapSize), "heap-size", "payload bytes per heap (suffixes K, M, G); the default fits recv's default --slot-size (2M)")
	fs.Uint64Var(&o.heaps, "heaps", 1000, "data heaps to send, heap cnts 1..N, then a stream-stop heap")
	fs.Float64Var(&o.rate, "rate", defaultSendRate, "send rate in Gb/s of UDP payload (0: as fast as possible); the default is a pace recv's default socket buffer takes on loopback; with --ring the default is 0 (the ring's own pace)")
	fs.StringVar(&o.flavourName, "flavour", "64-40", "SPEAD flavour: 64-40 or 64-48")
	fs.Var((*byteSize)(&o.packetSize), "packet-size", "largest UDP payload (spead2_send's --packet)")
	fs.IntVar(&o.items, "items", 1, "split each heap's payload into N items, ids 0x1000+i")
	fs.BoolVar(&o.descriptors, "descriptors", false, "put item descriptors in the first heap, as spead2_send does")
	fs.IntVar(&o.ttl, "ttl", 0, "IP TTL (multicast TTL for a group; 0: kernel default)")
	fs.StringVar(&o.iface, "interface", "", "local IPv4 address of the interface multicast leaves by (xdp: the interface's name or address)")
	fs.BoolVar(&o.pattern, "pattern", false, "payload = the ring test pattern, plus immediate item 0x1001 \"heap_cnt\" = heap cnt (for consume --verify)")
	fs.BoolVar(&o.timestamp, "timestamp", false, "add immediate item 0x1600 \"timestamp\" = (heap cnt - 1) x heap size, a sample counter (docs/how-to/migrate-from-spead2.md)")
	fs.IntVar(&o.batch, "batch", 64, "packets per sendmmsg call (xdp: per TX-ring publish and kick)")
	fs.BoolVar(&o.gso, "gso", true, "udp: send runs of full-size packets as one message the kernel segments (UDP GSO); --gso=false: a syscall slot per packet")
	fs.BoolVar(&o.noStop, "no-stop", false, "leave the stream open: no stream-stop heap at the end (tests)")
	fs.BoolVar(&o.json, "json", false, "print the summary as one JSON object")
	fs.StringVar(&o.transport, "transport", "", "udp (sockets, the default), xdp (raw frames through AF_XDP: --interface NAME|ADDR) or ibv (raw frames through an RDMA NIC)")
	o.ibv = addIBVFlags(fs, true) // ibv: --ibv, --ibv-* flags (transport_ibv.go)
	fs.StringVar(&o.ring, "ring", "", "transmit the heaps of this ring, as its consumer, instead of a generated stream; the stream stops when the ring ends")
	fs.BoolVar(&o.incomplete, "incomplete", false, "with --ring: also send heaps the ring holds incomplete or truncated (default: skip and count them)")
	fs.IntVar(&o.threads, "threads", 1, "udp: sending threads, each with its own sockets and a share of the destinations (at most one per destination; name a destination twice to give it two)")
	fs.Uint64Var(&o.tsStep, "timestamp-step", 0, "give heap k (from 1) the immediate --timestamp-item = (k-1)/COUNT × STEP (COUNT of --axis, else 1): traffic for recv --chunk-by (0: none)")
	fs.StringVar(&o.tsItem, "timestamp-item", "0x1600", "the timestamp item's id, with --timestamp-step")
	fs.StringVar(&o.axis, "axis", "", "ITEM:COUNT: with --timestamp-step, give heap k the immediate ITEM = (k-1) mod COUNT (recv --chunk-axis)")
	fs.StringVar(&o.waitRing, "wait-ring", "", "before sending, wait until this ring is served and has --wait-consumers consumers attached (a receiver and its consumers started just before)")
	fs.IntVar(&o.waitConsumers, "wait-consumers", 1, "with --wait-ring: consumers that must be attached")
	fs.DurationVar(&o.waitTimeout, "wait-timeout", time.Minute, "with --wait-ring: how long to wait")
	fs.StringVar(&o.waitDir, "wait-dir", "", "with --wait-ring: the ring directory to look the name up in (default: the usual lookup)")
	return o
}

// parseSend parses send's command line into validated options.
func parseSend(fs *flag.FlagSet, o *sendOptions, args []string) error {
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	o.dests, o.set = pos, givenFlags(fs)
	return o.validate()
}

// validate checks the options without opening anything; a mistake is one usage line.
func (o *sendOptions) validate() error {
	if err := o.validateModes(); err != nil {
		return err
	}
	if err := o.validateDests(); err != nil {
		return err
	}
	switch strings.TrimPrefix(strings.ToUpper(o.flavourName), "SPEAD-") {
	case "64-40":
		o.flavour = spead.Flavour64_40
	case "64-48":
		o.flavour = spead.Flavour64_48
	default:
		return usageError("--flavour %q: want 64-40 or 64-48", o.flavourName)
	}
	switch {
	case o.heapSize < 1:
		return usageError("--heap-size must be positive")
	case o.heaps < 1:
		return usageError("--heaps must be positive")
	case !(o.rate >= 0) || math.IsInf(o.rate, 0): // NaN fails the first test
		return usageError("--rate %g: want Gb/s >= 0", o.rate)
	case o.items < 1 || o.items > o.heapSize:
		return usageError("--items %d: want 1..heap size", o.items)
	case o.packetSize > 65507:
		return usageError("--packet-size %d: a UDP payload is at most 65507 bytes", o.packetSize)
	case o.batch < 1 || o.batch > 1024:
		return usageError("--batch %d: want 1..1024", o.batch)
	case o.ttl < 0 || o.ttl > 255:
		return usageError("--ttl %d: want 0..255", o.ttl)
	}
	var err error
	if o.iface != "" && o.transport != "xdp" { // AF_XDP also takes an interface name
		if o.ifAddr, err = netip.ParseAddr(o.iface); err != nil || !o.ifAddr.Is4() {
			return usageError("--interface %q: want the interface's local IPv4 address", o.iface)
		}
	}
	if _, err = spead.NewEncoder(o.flavour, o.packetSize); err != nil {
		return usageError("--packet-size %d: %v", o.packetSize, err)
	}
	if o.transport, err = o.ibv.transport(o.transport); err != nil { // --ibv (spead2_send's flag) means --transport ibv
		return err
	}
	_, err = lookupTransport(o.transport, "udp", func(t transportKind) bool { return t.send != nil })
	return err
}

// validateModes checks the flags that go together: chunk items, --ring and --wait-ring.
func (o *sendOptions) validateModes() error {
	var err error
	if o.tsStep > 0 {
		ci := pattern.ChunkItems{Step: o.tsStep}
		if ci.TimeItem, _, err = parseItemValue("timestamp-item", o.tsItem, 1); err != nil {
			return err
		}
		if o.axis != "" {
			if ci.AxisItem, ci.AxisCount, err = parseItemValue("axis", o.axis, 0); err != nil {
				return err
			}
		}
		o.chunkItems = &ci
	} else if o.axis != "" {
		return usageError("--axis goes with --timestamp-step")
	}
	if o.ring != "" { // the generator's flags describe a stream --ring does not generate
		if !o.set["rate"] {
			o.rate = 0 // a relay sends at the pace its ring fills
		}
		for _, n := range []string{"heap-size", "heaps", "items", "descriptors", "pattern", "timestamp", "timestamp-step", "axis"} {
			if o.set[n] {
				return usageError("--%s describes a generated stream: it does not go with --ring", n)
			}
		}
	} else if o.incomplete {
		return usageError("--incomplete goes with --ring")
	}
	if o.waitRing == "" && (o.waitDir != "" || o.waitConsumers != 1) {
		return usageError("--wait-dir and --wait-consumers go with --wait-ring")
	}
	if o.waitConsumers < 0 || o.waitTimeout <= 0 {
		return usageError("--wait-consumers must be ≥ 0 and --wait-timeout positive")
	}
	return nil
}

// validateDests parses the destinations (a bare port is 127.0.0.1's) and checks --threads against them.
func (o *sendOptions) validateDests() error {
	if len(o.dests) == 0 || (o.ring != "" && len(o.dests) != 1) {
		return usageError("want exactly one destination HOST:PORT with --ring, one or more without, got %d (see -h)", len(o.dests))
	}
	o.eps = make([]transport.Endpoint, len(o.dests))
	for i, a := range o.dests {
		var err error
		if o.eps[i], err = transport.ParseEndpoint(a); err != nil {
			return usageError("%v", err)
		}
		if !o.eps[i].Addr.IsValid() {
			o.eps[i].Addr = netip.AddrFrom4([4]byte{127, 0, 0, 1})
		}
	}
	if o.threads < 1 || o.threads > len(o.eps) {
		return usageError("--threads %d: want 1..%d, at most one per destination (name a destination twice to give it two)", o.threads, len(o.eps))
	}
	return nil
}

// givenFlags returns the names of the flags given on fs's command line.
func givenFlags(fs *flag.FlagSet) map[string]bool {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	return set
}
