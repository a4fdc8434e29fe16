package ring

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Info is a read-only look at a ring, as `ibvbridge stat` shows it: taken as an observer (spec §1.2), it
// neither attaches as a consumer nor disturbs the producer.
type Info struct {
	Name           string `json:"name"`
	Socket         string `json:"socket"`
	Major          uint16 `json:"major"`
	Minor          uint16 `json:"minor"`
	State          string `json:"state"`
	Policy         string `json:"policy"`
	SessionID      uint64 `json:"session_id"`
	ProducerPID    uint64 `json:"producer_pid"`
	ProducerAlive  bool   `json:"producer_alive"`
	HeartbeatAgeNs int64  `json:"heartbeat_age_ns"`
	Features       uint64 `json:"features"`
	// ProducerVersion is what the producer says it runs (2.2 header producer_version; "" if it does not).
	ProducerVersion string   `json:"producer_version"`
	MaxConsumers    uint32   `json:"max_consumers"`
	Geometry        Geometry `json:"geometry"`
	// Chunks is the chunk geometry of a chunk-mode ring (spec §13), nil otherwise.
	Chunks *ChunkGeometry `json:"chunks,omitempty"`
	Head   uint64         `json:"head"`
	Oldest uint64         `json:"oldest"`
	// Unread is head − the slowest attached consumer's released position (0 with none attached): heaps a
	// consumer has still to read. Head − Oldest also counts heaps kept for a later consumer.
	Unread uint64 `json:"unread"`
	// BlockedOn is the row + 1 of the consumer a block producer waits for (0: none), BlockedSinceNs when
	// that wait began (spec §14.6).
	BlockedOn      int               `json:"blocked_on"`
	BlockedSinceNs uint64            `json:"blocked_since_ns"`
	Consumers      []ConsumerInfo    `json:"consumers"`
	Counters       map[string]uint64 `json:"counters"`
}

// ConsumerInfo is one non-free row of the consumer table (spec §2.2).
type ConsumerInfo struct {
	Index     int    `json:"index"`
	State     string `json:"state"`
	PID       uint64 `json:"pid"`
	UID       uint64 `json:"uid"`
	AttachNs  uint64 `json:"attach_ns"`
	Position  uint64 `json:"position"` // released: what the producer last accepted from it
	Lag       uint64 `json:"lag"`      // head − position
	Wakes     uint64 `json:"wakes"`
	LostHeaps uint64 `json:"lost_heaps"`
	// GroupID is the consumer group it is a member of (spec §14), 0 for an independent consumer;
	// Assigned the positions assigned to it as a member.
	GroupID  uint32 `json:"group_id"`
	Assigned uint64 `json:"assigned"`
	// ClientMinor is the minor of its hello; Read, Queued and Skipped a member's read position, positions
	// queued for it and positions it released unread, as the producer last accepted them (spec §14.2, §14.7).
	ClientMinor uint32 `json:"client_minor"`
	Read        uint64 `json:"read"`
	Queued      uint64 `json:"queued"`
	Skipped     uint64 `json:"skipped"`
}

// Attached reports whether this row is an attached consumer (not a detached one's record).
func (c ConsumerInfo) Attached() bool { return c.State == ConsumerAttached.String() }

// String is the state's name as stat and ls print it.
func (s State) String() string {
	switch s {
	case StateInit:
		return "init"
	case StateReady:
		return "ready"
	case StateClosed:
		return "closed"
	}
	return fmt.Sprintf("state(%d)", uint32(s))
}

// String is the policy's name as the --policy flag spells it.
func (p Policy) String() string {
	switch p {
	case PolicyDrop:
		return "drop"
	case PolicyBlock:
		return "block"
	}
	return fmt.Sprintf("policy(%d)", uint32(p))
}

// ParsePolicy reads "drop" or "block".
func ParsePolicy(s string) (Policy, error) {
	switch s {
	case "drop":
		return PolicyDrop, nil
	case "block":
		return PolicyBlock, nil
	}
	return 0, fmt.Errorf("%w: policy %q: want drop or block", ErrBadConfig, s)
}

// Inspect reads ring nameOrPath's header, cursors, consumer table and counters as an observer. A name
// is looked up in dir ("": the spec's directories). A ring nobody serves is ErrNotFound, at once.
func Inspect(nameOrPath, dir string) (Info, error) {
	a, err := dial(nameOrPath, dialOptions{dir: dir, timeout: -1, warn: os.Stderr}, hello{Major: MajorVersion, Minor: MinorVersion, Role: RoleObserver})
	if err != nil {
		return Info{}, err // dial names the ring and what went wrong
	}
	defer unix.Close(a.sock)
	defer a.closeFDs()
	ctl, h, err := mapControl(a)
	if err != nil {
		return Info{}, fmt.Errorf("stat %s: %w", a.name, err)
	}
	defer unix.Munmap(ctl)
	path := a.path
	head := u64at(ctl, offHead).Load()
	info := Info{
		Name: a.name, Socket: path, Major: h.Major, Minor: h.Minor,
		State:          State(u32at(ctl, offState).Load()).String(),
		Policy:         h.Policy.String(),
		SessionID:      h.SessionID,
		ProducerPID:    h.ProducerPID,
		ProducerAlive:  true, // it answered
		HeartbeatAgeNs: int64(realtimeNanos() - u64at(ctl, offHeartbeat).Load()),
		Features:       h.Features,
		MaxConsumers:   h.MaxConsumers,
		Geometry:       h.Geometry,
		Head:           head,
		Oldest:         u64at(ctl, offOldest).Load(),
		BlockedOn:      int(u32at(ctl, offBlockedOn).Load()),
		BlockedSinceNs: u64at(ctl, offBlockedSince).Load(),
		Consumers:      []ConsumerInfo{},
		Counters:       readStats((*[StatsSlots]atomic.Uint64)(unsafePointer(ctl, offStats)), h.StatsCount).Map(),
	}
	if h.Chunks.Enabled() {
		info.Chunks = &h.Chunks
	}
	info.ProducerVersion = producerVersion(ctl)
	info.Consumers = consumerRows(ctl, int(h.MaxConsumers), head)
	for _, c := range info.Consumers {
		if c.Attached() && c.Lag <= h.SlotCount+1 { // a row being reused mid-read is skipped
			info.Unread = max(info.Unread, c.Lag)
		}
	}
	return info, nil
}

// consumerRows reads the consumer table's non-free rows (spec §2.2) of control memory ctl.
func consumerRows(ctl []byte, maxConsumers int, head uint64) []ConsumerInfo {
	rows := []ConsumerInfo{}
	for i := range maxConsumers {
		row := ctl[offTable+TableRowSize*i:]
		st := ConsumerState(u32at(row, rowState).Load())
		if st == ConsumerFree {
			continue
		}
		pos := u64at(row, rowReleased).Load()
		rows = append(rows, ConsumerInfo{Index: i, State: st.String(),
			PID: u64at(row, rowPID).Load(), UID: u64at(row, rowUID).Load(),
			AttachNs: u64at(row, rowAttachNs).Load(), Position: pos, Lag: head - pos,
			Wakes: u64at(row, rowWakes).Load(), LostHeaps: u64at(row, rowLostHeaps).Load(),
			GroupID: u32at(row, rowGroupID).Load(), Assigned: u64at(row, rowAssigned).Load(),
			ClientMinor: u32at(row, rowClientMinor).Load(), Read: u64at(row, rowRead).Load(),
			Queued: u64at(row, rowQueued).Load(), Skipped: u64at(row, rowSkipped).Load()})
	}
	return rows
}

// producerVersion reads the header's producer_version (2.2, spec §2): up to the first NUL, as UTF-8 with
// bad bytes replaced ("" from a producer that does not write it).
func producerVersion(ctl []byte) string {
	b := ctl[offProducerVersion : offProducerVersion+ProducerVersionMax]
	if i := bytes.IndexByte(b, 0); i >= 0 {
		b = b[:i]
	}
	return strings.ToValidUTF8(string(b), "\uFFFD")
}

// Attached counts the consumers attached now (rows of detached ones are history).
func (i Info) Attached() int {
	n := 0
	for _, c := range i.Consumers {
		if c.Attached() {
			n++
		}
	}
	return n
}
