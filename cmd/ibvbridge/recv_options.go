package main

import (
	"flag"
	"fmt"
	"net/netip"
	"time"

	"github.com/ibvbridge/ibvbridge/bridge"
	"github.com/ibvbridge/ibvbridge/internal/version"
	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/transport"
	"github.com/ibvbridge/ibvbridge/transport/udp"
)

// Defaults of recv. The slot holds one heap: 2 MiB takes spead2's common 1 MiB heaps (send's default) with
// their first heap's descriptors; 128 of them (256 MiB) take a quarter of the 512 × 2 MiB hugepages
// scripts/setup.sh reserves, so a second default ring and the demo's still fit on hugepages.
const (
	defaultSlots    = 128
	defaultSlotSize = 2 << 20
	minSlotSize     = 1 << 10
)

// Small heaps come many a second: 128 slots of 1 KiB last 0.6 ms at 200 000 heaps/s, less than a
// descheduled consumer (a Python loop, a garbage collection) may be away. Without --slots, a slot size
// under smallHeapRing / defaultSlots gets as many slots as smallHeapRing of payload holds, up to
// maxAutoSlots: 4096 of 8 KiB (0.27 s at 1 Gb/s), 16384 of 1 KiB (82 ms at 200 000 heaps/s), never more
// memory than the default ring's.
const (
	smallHeapRing = 32 << 20
	maxAutoSlots  = 16384
)

// autoSlots is the slot count recv uses for slotSize without --slots.
func autoSlots(slotSize int) int {
	n := defaultSlots
	for n < maxAutoSlots && slotSize > 0 && 2*n*slotSize <= smallHeapRing {
		n *= 2
	}
	return n
}

const recvUsage = "usage: ibvbridge recv --ring NAME [flags] ENDPOINT... (host:port or port)\n       ibvbridge recv --ring NAME --pcap FILE [flags] [ENDPOINT...]"

// recvOptions are recv's flags and positionals; validate checks them and fills in the derived fields.
type recvOptions struct {
	name, policy, pcapFile, iface, cpus, hugepages, ringDir, group string
	transport, logFormat, cpuProfile, metricsAddr                  string
	chunkBy, chunkAxis, chunkPlace, chunkPlaceItems, chunkPlaceArg string
	slots, slotSize, maxItems, maxHeaps, buffer, maxPacket         int
	threads, maxConsumers, maxObservers, chunkWindow, chunkHeapSz  int
	chunkHeaps                                                     uint
	incomplete, paced, gro, keepGoing                              bool
	statsEvery, waitConsumer, lossSummary                          time.Duration
	coalesce                                                       udp.Coalescing
	grants                                                         map[string]ring.GroupGrant
	xdp                                                            *xdpOptions
	ibv                                                            *ibvFlags
	set                                                            map[string]bool // flags given on the command line
	endpoints                                                      []string        // the positionals

	// Derived by validate.
	eps        []transport.Endpoint
	chunks     ring.ChunkGeometry
	placeItems []uint64
	hugePages  ring.HugePages
	pol        ring.Policy
	ifAddr     netip.Addr
	cpuList    []int
}

// recvFlags registers recv's flags on fs, into a new recvOptions.
func recvFlags(fs *flag.FlagSet) *recvOptions {
	o := &recvOptions{slotSize: defaultSlotSize, buffer: udp.DefaultBufferSize, maxPacket: udp.DefaultMaxPacketSize, grants: map[string]ring.GroupGrant{}, coalesce: udp.DefaultCoalescing}
	fs.StringVar(&o.name, "ring", "", "ring name (required)")
	fs.IntVar(&o.slots, "slots", defaultSlots, "ring slots, a power of two (without it, a --slot-size under 256K gets as many as 32 MiB of payload hold, up to 16384: small heaps come fast, and a ring must outlast a descheduled consumer)")
	fs.Var((*byteSize)(&o.slotSize), "slot-size", "payload bytes per slot (the largest heap kept whole; suffixes K, M, G)")
	fs.IntVar(&o.maxItems, "max-items", 64, "item-table entries per slot")
	fs.IntVar(&o.maxHeaps, "max-heaps", 4, "heaps under assembly at once (spead2's max_heaps)")
	fs.BoolVar(&o.incomplete, "incomplete", false, "publish incomplete heaps (flagged) instead of discarding them")
	fs.StringVar(&o.policy, "policy", "", "full ring: drop (default) or block (default with --pcap)")
	fs.StringVar(&o.pcapFile, "pcap", "", "replay this pcap/pcapng file instead of receiving from sockets")
	fs.BoolVar(&o.paced, "pcap-paced", false, "replay at the capture's own rate")
	fs.StringVar(&o.iface, "interface", "", "local IPv4 address of the interface that joins multicast groups (xdp: its name or address)")
	fs.Var((*byteSize)(&o.buffer), "buffer", "socket receive buffer bytes")
	fs.Var((*byteSize)(&o.maxPacket), "max-packet", "largest datagram; bigger ones are counted as truncated")
	fs.IntVar(&o.threads, "threads", 1, "udp: receive threads (spead2_recv's flag); each owns a share of the endpoints, all feed one ring")
	fs.StringVar(&o.cpus, "cpus", "", "udp: pin receive thread k to the k-th CPU of this comma-separated list")
	fs.Var(&o.coalesce, "coalesce", "udp: after a read that empties the socket, sleep so the next read finds many bursts (interrupt moderation in software). heap (default): each sleep ends before the heap in assembly is expected to be complete and none is taken between heaps, so no heap completes later for it (up to 1ms). A duration (at most 1ms): sleep up to that long, fewer wakes for up to that much latency per heap. 0: read each burst as it comes. Each sleep is shortened to what the socket buffer and the ring's free slots hold")
	fs.BoolVar(&o.gro, "gro", true, "udp: let the kernel hand over runs of datagrams as one message (UDP GRO); --gro=false: one datagram per message")
	fs.StringVar(&o.hugepages, "hugepages", "auto", "ring data on hugepages: auto, require or off")
	fs.StringVar(&o.ringDir, "dir", "", "ring directory for the socket and lock (default: $IBVBRIDGE_RING_DIR, else /run/ibvbridge for root, else /dev/shm/ibvbridge-UID)")
	fs.StringVar(&o.group, "group", "", "let members of this group attach as consumers (default: only this user and root)")
	fs.Func("consumer-group", "NAME=UID|@GID[,...]: only these consumer groups may be joined, each by these users and groups (and root); repeatable (default: every group open)", o.addGrant)
	fs.IntVar(&o.maxConsumers, "max-consumers", ring.DefaultMaxConsumer, "consumers that may attach at once")
	fs.IntVar(&o.maxObservers, "max-observers", ring.DefaultMaxObservers, "observers (stat, ls) that may be connected at once")
	fs.StringVar(&o.transport, "transport", "", "udp, pcap, xdp or ibv (default udp, or pcap with --pcap)")
	o.xdp = addXDPFlags(fs)
	o.ibv = addIBVFlags(fs, false) // ibv: --ibv, --ibv-* flags (transport_ibv.go)
	fs.StringVar(&o.logFormat, "log-format", "console", "console or json (json: final counters as one JSON object on stdout)")
	fs.DurationVar(&o.statsEvery, "stats-interval", 0, "log the counters this often (0: off)")
	fs.StringVar(&o.cpuProfile, "cpuprofile", "", "write a CPU profile of the run to this file (go tool pprof)")
	fs.DurationVar(&o.waitConsumer, "wait-consumer", 0, "wait up to this long for a consumer to attach before receiving (file replay into a reader)")
	fs.StringVar(&o.metricsAddr, "metrics", "", "serve Prometheus metrics at http://ADDR/metrics, and the probes /healthz and /readyz (e.g. :9100 or 127.0.0.1:9100)")
	fs.UintVar(&o.chunkHeaps, "chunk-heaps", 0, "chunk mode: heaps per chunk along the time axis (0: off; docs/ring-layout.md §13)")
	fs.StringVar(&o.chunkBy, "chunk-by", "", "chunk mode: ITEM[:STEP], the immediate item whose value / STEP is a heap's time index (e.g. 0x1600:4096)")
	fs.StringVar(&o.chunkAxis, "chunk-axis", "", "chunk mode: ITEM:COUNT, an immediate item giving a second index below COUNT (e.g. 0x4101:64)")
	fs.IntVar(&o.chunkWindow, "chunk-window", 2, "chunk mode: chunks open at once; a heap for a later chunk publishes the oldest")
	fs.Var((*byteSize)(&o.chunkHeapSz), "chunk-heap-size", "chunk mode: bytes per heap position (larger heaps are rejected); the slot size follows")
	fs.StringVar(&o.chunkPlace, "chunk-place", "", "chunk mode: LIB.so:FUNCTION, a C function that places each heap instead of --chunk-by (clients/c/ibvbridge_chunk_place.h); trusted code, loaded into recv")
	fs.StringVar(&o.chunkPlaceItems, "chunk-place-items", "", "with --chunk-place: ID,ID,... the immediate items whose values the function gets, in order")
	fs.BoolVar(&o.keepGoing, "keep-going", false, "a stream stop ends that stream, not recv: consumers see a STREAM_END marker and read on; the ring's END_OF_STREAM comes when recv stops (the systemd unit's default; spead2's stop_on_stop_item=False)")
	fs.DurationVar(&o.lossSummary, "loss-summary", bridge.DefaultLossSummary, "least time between two summary lines of losses that go on (the first loss of each kind is logged within 200ms)")
	fs.StringVar(&o.chunkPlaceArg, "chunk-place-arg", "", "with --chunk-place: a string the function gets (its user_data)")
	return o
}

// addGrant takes one --consumer-group NAME=UID|@GID[,...].
func (o *recvOptions) addGrant(v string) error {
	name, g, err := ring.ParseGroupGrant(v)
	if err != nil {
		return err
	}
	if _, dup := o.grants[name]; dup {
		return fmt.Errorf("consumer group %s given twice", name)
	}
	o.grants[name] = g
	return nil
}

// parseRecv parses recv's command line into validated options.
func parseRecv(fs *flag.FlagSet, o *recvOptions, args []string) error {
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	o.endpoints, o.set = pos, givenFlags(fs)
	return o.validate()
}

// validate checks the options before anything is opened, so that a typo never leaves anything behind.
func (o *recvOptions) validate() error {
	if _, err := newLogger(o.logFormat, nil); err != nil {
		return err
	}
	if err := o.validateRing(); err != nil {
		return err
	}
	var err error
	if o.placeItems, err = parseChunkPlaceItems(o.chunkPlace, o.chunkPlaceItems, o.set); err != nil {
		return err
	}
	if o.chunks, err = chunkGeometry(o.set, o.chunkHeaps, o.chunkBy, o.chunkAxis, o.chunkHeapSz, o.chunkWindow, o.slots, o.placeItems); err != nil {
		return err
	}
	if o.transport, err = o.ibv.transport(o.transport); err != nil { // --ibv (spead2_recv's flag) means --transport ibv
		return err
	}
	switch {
	case o.transport == "" && o.pcapFile != "":
		o.transport = "pcap"
	case o.transport == "":
		o.transport = "udp"
	}
	if o.hugePages, err = parseHugePages(o.hugepages); err != nil {
		return err
	}
	o.pol = ring.PolicyDrop
	if o.transport == "pcap" {
		o.pol = ring.PolicyBlock // replay: nothing need be lost, the file waits for the consumer
	}
	if o.policy != "" {
		if o.pol, err = ring.ParsePolicy(o.policy); err != nil {
			return usageError("--policy %q: want drop or block", o.policy)
		}
	}
	for _, a := range o.endpoints {
		ep, err := transport.ParseEndpoint(a)
		if err != nil {
			return usageError("%v", err)
		}
		o.eps = append(o.eps, ep)
	}
	if o.iface != "" && o.transport != "xdp" { // AF_XDP also takes an interface name
		if o.ifAddr, err = netip.ParseAddr(o.iface); err != nil || !o.ifAddr.Is4() {
			return usageError("--interface %q: want the interface's local IPv4 address", o.iface)
		}
	}
	tr, err := lookupTransport(o.transport, "udp", func(t transportKind) bool { return t.recv != nil })
	if err != nil {
		return err
	}
	return tr.recvCheck(o)
}

// validateRing checks the ring's name and geometry.
func (o *recvOptions) validateRing() error {
	if !o.set["slots"] && o.chunkHeaps == 0 {
		o.slots = autoSlots(o.slotSize)
	}
	switch {
	case o.name == "":
		return usageError("--ring is required")
	case ring.ValidateName(o.name) != nil:
		return usageError("--ring %q: %v", o.name, ring.ValidateName(o.name))
	case o.slots < 1 || o.slots > ring.MaxSlotCount || o.slots&(o.slots-1) != 0:
		return usageError("--slots %d: want a power of two in 1..%d", o.slots, ring.MaxSlotCount)
	case o.slotSize < minSlotSize:
		return usageError("--slot-size %d: want at least %d bytes (a slot holds a whole heap)", o.slotSize, minSlotSize)
	case o.maxItems < 1 || o.maxItems > ring.MaxItems:
		return usageError("--max-items %d: want 1..%d", o.maxItems, ring.MaxItems)
	case o.maxObservers < 1:
		return usageError("--max-observers %d: want at least 1", o.maxObservers)
	case o.maxConsumers < 1 || o.maxConsumers > ring.MaxConsumersLimit:
		return usageError("--max-consumers %d: want 1..%d", o.maxConsumers, ring.MaxConsumersLimit)
	case o.maxHeaps < 1 || o.maxHeaps > o.slots && o.chunkHeaps == 0 || o.maxHeaps > 4096:
		return usageError("--max-heaps %d: want 1..%d (every heap under assembly holds a slot; with --chunk-heaps up to 4096)", o.maxHeaps, min(o.slots, 4096))
	case o.maxPacket < 64 || o.maxPacket > 65535:
		return usageError("--max-packet %d: want 64..65535", o.maxPacket)
	case o.buffer < 0:
		return usageError("--buffer %d: want a size in bytes", o.buffer)
	}
	return nil
}

// ringConfig is the ring recv creates.
func (o *recvOptions) ringConfig() ring.Config {
	slotSize := o.slotSize
	if o.chunks.Enabled() {
		slotSize = 0 // derived from the chunk (--slot-size does not go with --chunk-heaps)
	}
	return ring.Config{SlotCount: o.slots, SlotSize: slotSize, MaxItems: o.maxItems, Policy: o.pol, HugePages: o.hugePages,
		Dir: o.ringDir, Group: o.group, MaxConsumers: o.maxConsumers, MaxObservers: o.maxObservers, ReplayTimestamps: o.transport == "pcap",
		Chunks: o.chunks, Groups: o.grants, Version: version.Producer("ibvbridge recv")}
}
