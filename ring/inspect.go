package ring

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// Info is a read-only look at a ring, as `ibvbridge stat` shows it. Taking it neither attaches as the
// consumer nor disturbs the producer.
type Info struct {
	Name           string            `json:"name"`
	Major          uint16            `json:"major"`
	Minor          uint16            `json:"minor"`
	State          string            `json:"state"`
	Policy         string            `json:"policy"`
	SessionID      uint64            `json:"session_id"`
	ProducerPID    uint64            `json:"producer_pid"`
	ProducerAlive  bool              `json:"producer_alive"`
	HeartbeatAgeNs int64             `json:"heartbeat_age_ns"`
	ConsumerPID    uint64            `json:"consumer_pid"`
	DataPath       string            `json:"data_path"`
	Geometry       Geometry          `json:"geometry"`
	Head           uint64            `json:"head"`
	Tail           uint64            `json:"tail"`
	Counters       map[string]uint64 `json:"counters"`
}

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

// Inspect reads ring nameOrPath's header, cursors and counters without attaching. A name is looked up in
// dir ("" for /dev/shm).
func Inspect(nameOrPath, dir string) (Info, error) {
	if dir == "" {
		dir = DefaultDir
	}
	path := nameOrPath
	if !strings.Contains(nameOrPath, "/") {
		if err := ValidateName(nameOrPath); err != nil {
			return Info{}, err
		}
		path = CtlPath(dir, nameOrPath)
	}
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return Info{}, fmt.Errorf("stat %s: %w: %s", nameOrPath, ErrNotFound, path)
	}
	if err != nil {
		return Info{}, fmt.Errorf("stat %s: %w", nameOrPath, err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return Info{}, err
	}
	if st.Size() < CtlSize {
		return Info{}, fmt.Errorf("stat %s: %w: control file is %d bytes", nameOrPath, ErrCorrupt, st.Size())
	}
	ctl, err := mmapFile(f, CtlSize, unix.PROT_READ, 0)
	if err != nil {
		return Info{}, err
	}
	defer unix.Munmap(ctl)
	h, err := parseHeader(ctl)
	if err != nil {
		return Info{}, fmt.Errorf("stat %s: %w", nameOrPath, err)
	}
	alive, _ := lockHeld(f)
	stats := readStats((*[StatsSlots]uint64)(unsafePointer(ctl, offStats)), h.StatsCount)
	return Info{
		Name: nameOrPath, Major: h.Major, Minor: h.Minor,
		State:          State(atomic.LoadUint32(u32at(ctl, offState))).String(),
		Policy:         h.Policy.String(),
		SessionID:      h.SessionID,
		ProducerPID:    h.ProducerPID,
		ProducerAlive:  alive,
		HeartbeatAgeNs: int64(realtimeNanos() - atomic.LoadUint64(u64at(ctl, offHeartbeat))),
		ConsumerPID:    atomic.LoadUint64(u64at(ctl, offConsumerPID)),
		DataPath:       h.DataPath,
		Geometry:       h.Geometry,
		Head:           atomic.LoadUint64(u64at(ctl, offHead)),
		Tail:           atomic.LoadUint64(u64at(ctl, offTail)),
		Counters:       stats.Map(),
	}, nil
}
