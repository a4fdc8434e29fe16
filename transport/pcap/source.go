// Package pcap owns capture-file replay: a transport.Source that reads pcap and pcapng files (Ethernet,
// Linux cooked SLL/SLL2 and raw-IP link types), keeps the IPv4/UDP datagrams addressed to the stream's
// endpoints and hands their payloads to the sink, as fast as possible or paced by the capture timestamps.
// Replay is how the receive path is tested against real spead2 traffic without a network.
package pcap

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"sync/atomic"
	"time"

	"github.com/gopacket/gopacket"
	"github.com/gopacket/gopacket/layers"
	"github.com/gopacket/gopacket/pcapgo"
	"github.com/rs/zerolog"

	"github.com/ibvbridge/ibvbridge/frame"
	"github.com/ibvbridge/ibvbridge/transport"
)

// Config describes a replay.
type Config struct {
	Path string
	// Endpoints filter the datagrams by destination port (and address, when the endpoint has one); none
	// keeps every UDP datagram.
	Endpoints []transport.Endpoint
	// Paced replays at the capture's own rate (timestamps relative to the first packet).
	Paced bool
	// Log receives the warning for a capture that ends inside a record; nil: silent (it is counted).
	Log *zerolog.Logger
}

// Stats are the replay's counters: frames read, datagrams delivered, and frames skipped by reason.
type Stats struct {
	Frames    uint64 `json:"frames"`
	Packets   uint64 `json:"packets"`
	Bytes     uint64 `json:"bytes"`
	Filtered  uint64 `json:"filtered"` // UDP, but not to an endpoint of the stream
	LinkTypes uint64 `json:"bad_link"` // frames of an unsupported link type
	// Truncated is 1 when the file ends inside a record: cut off mid-write, or a record or block length
	// that runs past the end. What follows the last whole record is not replayed.
	Truncated uint64                   `json:"truncated_records"`
	Skipped   [frame.NumReasons]uint64 `json:"-"`          // by frame.Reason
	SkippedBy map[string]uint64        `json:"skipped_by"` // Skipped, by reason name (non-zero only)
}

// Map returns the counters for a JSON object (reasons as "skipped_<reason>").
func (s Stats) Map() map[string]uint64 {
	m := map[string]uint64{"frames": s.Frames, "packets": s.Packets, "bytes": s.Bytes,
		"filtered": s.Filtered, "bad_link": s.LinkTypes, "truncated_records": s.Truncated}
	for r, n := range s.Skipped {
		if n > 0 {
			m["skipped_"+frame.Reason(r).String()] = n
		}
	}
	return m
}

// packetReader is what pcapgo's two readers have in common.
type packetReader interface {
	ZeroCopyReadPacketData() ([]byte, gopacket.CaptureInfo, error)
}

// Source replays one capture file.
type Source struct {
	cfg      Config
	f        *os.File
	r        packetReader
	ng       *pcapgo.NgReader
	linkType layers.LinkType

	scratch  []byte // raw IP and SLL2 frames get a synthetic Ethernet header here
	stopping atomic.Bool

	frames, packets, bytes, filtered, badLink, truncated atomic.Uint64
	skipped                                              [frame.NumReasons]atomic.Uint64
}

var _ transport.Source = (*Source)(nil)

// Link types handled (values from the tcpdump registry; gopacket names some of them).
const (
	linkEthernet = layers.LinkTypeEthernet
	linkSLL      = layers.LinkTypeLinuxSLL
	linkSLL2     = layers.LinkType(276)
	linkRaw      = layers.LinkTypeRaw
	linkRawBSD   = layers.LinkType(12)
	linkIPv4     = layers.LinkTypeIPv4
)

// Open opens the file and reads its header, detecting pcap or pcapng by the magic number.
func Open(cfg Config) (*Source, error) {
	f, err := os.Open(cfg.Path)
	if err != nil {
		return nil, fmt.Errorf("pcap: %w", err)
	}
	s := &Source{cfg: cfg, f: f, scratch: make([]byte, frame.EthernetHeaderLen+0x10000)}
	br := bufio.NewReaderSize(f, 1<<20)
	magic, err := br.Peek(4)
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("pcap: %s: too short for a capture file: %w", cfg.Path, err)
	}
	if binary.LittleEndian.Uint32(magic) == 0x0A0D0D0A { // pcapng section header block
		ng, err := pcapgo.NewNgReader(br, pcapgo.DefaultNgReaderOptions)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("pcap: %s: %w", cfg.Path, err)
		}
		s.r, s.ng, s.linkType = ng, ng, ng.LinkType()
	} else {
		r, err := pcapgo.NewReader(br)
		if err != nil {
			f.Close()
			return nil, fmt.Errorf("pcap: %s: not a pcap or pcapng file: %w", cfg.Path, err)
		}
		s.r, s.linkType = r, r.LinkType()
	}
	if !supported(s.linkType) {
		f.Close()
		return nil, fmt.Errorf("pcap: %s: link type %v is not supported (want Ethernet, Linux SLL/SLL2 or raw IP)", cfg.Path, s.linkType)
	}
	return s, nil
}

func supported(lt layers.LinkType) bool {
	switch lt {
	case linkEthernet, linkSLL, linkSLL2, linkRaw, linkRawBSD, linkIPv4:
		return true
	}
	return false
}

// Run replays the file into sink; it returns nil at the end of the file and ctx.Err() when cancelled.
// recvNanos is each packet's capture timestamp, so heap timestamps reflect the original traffic.
func (s *Source) Run(ctx context.Context, sink transport.Sink) error {
	stop := context.AfterFunc(ctx, func() { s.stopping.Store(true) })
	defer stop()
	var first int64
	var start time.Time
	for {
		if s.stopping.Load() {
			return ctx.Err()
		}
		data, ci, err := s.r.ZeroCopyReadPacketData()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if errors.Is(err, io.ErrUnexpectedEOF) {
			// A capture cut off mid-record (tcpdump killed), or a corrupt record or block length, ends where
			// the last whole record does: replay what was whole, but say so and count it.
			s.truncated.Store(1)
			if s.cfg.Log != nil {
				s.cfg.Log.Warn().Str("file", s.cfg.Path).Uint64("frames", s.frames.Load()).
					Msg("pcap: the capture ends inside a record (cut off, or a corrupt length): the rest is not replayed")
			}
			return nil
		}
		if err != nil {
			return fmt.Errorf("pcap: %s frame %d: %w", s.cfg.Path, s.frames.Load()+1, err)
		}
		s.frames.Add(1)
		ts := ci.Timestamp.UnixNano()
		if s.cfg.Paced {
			if start.IsZero() {
				first, start = ts, time.Now()
			} else if wait := time.Duration(ts-first) - time.Since(start); wait > 0 {
				if !sleepCtx(ctx, wait) {
					return ctx.Err()
				}
			}
		}
		lt := s.linkType
		if s.ng != nil {
			if ifc, err := s.ng.Interface(ci.InterfaceIndex); err == nil {
				lt = ifc.LinkType
			}
		}
		eth, ok := s.ethernet(lt, data)
		if !ok {
			s.badLink.Add(1)
			continue
		}
		u, err := frame.Parse(eth)
		if err != nil {
			s.skipped[frame.ReasonOf(err)].Add(1)
			continue
		}
		if !s.wanted(&u) {
			s.filtered.Add(1)
			continue
		}
		s.packets.Add(1)
		s.bytes.Add(uint64(len(u.Payload)))
		sink.Packet(u.Payload, ts)
	}
}

// ethernet presents a frame of any supported link type as an Ethernet II frame for frame.Parse.
func (s *Source) ethernet(lt layers.LinkType, data []byte) ([]byte, bool) {
	switch lt {
	case linkEthernet:
		return data, true
	case linkSLL:
		// SLL's 16-byte header ends with the protocol type; its last 14 bytes read as an Ethernet header
		// whose EtherType is that protocol (the "MAC addresses" are SLL's address fields, unused).
		if len(data) < 16 {
			return data, true // frame.Parse counts it truncated
		}
		return data[2:], true
	case linkSLL2:
		if len(data) < 20 {
			return data[:0], true
		}
		return s.synth(binary.BigEndian.Uint16(data[0:2]), data[20:]), true
	case linkRaw, linkRawBSD, linkIPv4:
		et := uint16(frame.EtherTypeIPv4)
		if len(data) > 0 && data[0]>>4 == 6 {
			et = frame.EtherTypeIPv6
		}
		return s.synth(et, data), true
	}
	return nil, false
}

// synth copies a network-layer packet behind a synthetic Ethernet header; rare link types pay a copy.
func (s *Source) synth(etherType uint16, l3 []byte) []byte {
	n := copy(s.scratch[frame.EthernetHeaderLen:], l3)
	clear(s.scratch[:12])
	binary.BigEndian.PutUint16(s.scratch[12:14], etherType)
	return s.scratch[:frame.EthernetHeaderLen+n]
}

func (s *Source) wanted(u *frame.UDP) bool {
	if len(s.cfg.Endpoints) == 0 {
		return true
	}
	for _, ep := range s.cfg.Endpoints {
		if ep.Matches(u.DstIP, u.DstPort) {
			return true
		}
	}
	return false
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// Stats reads the counters; safe from any goroutine.
func (s *Source) Stats() Stats {
	st := Stats{Frames: s.frames.Load(), Packets: s.packets.Load(), Bytes: s.bytes.Load(),
		Filtered: s.filtered.Load(), LinkTypes: s.badLink.Load(), Truncated: s.truncated.Load(),
		SkippedBy: map[string]uint64{}}
	for r := range st.Skipped {
		st.Skipped[r] = s.skipped[r].Load()
		if st.Skipped[r] > 0 {
			st.SkippedBy[frame.Reason(r).String()] = st.Skipped[r]
		}
	}
	return st
}

// Close closes the file; safe to call more than once.
func (s *Source) Close() error {
	if s.f == nil {
		return nil
	}
	err := s.f.Close()
	s.f = nil
	return err
}

// Counters implements transport.Counted.
func (s *Source) Counters() map[string]uint64 { return s.Stats().Map() }
