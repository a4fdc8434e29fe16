package verbs

import (
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"

	"github.com/ibvbridge/ibvbridge/internal/rxloop"
)

// Defaults follow spead2's udp_ibv_config so a configuration tuned for spead2
// behaves the same here.
const (
	DefaultMaxSize    = 9200                  // spead2 udp_ibv default max_size
	DefaultBufferSize = 16 * 1024 * 1024      // spead2 udp_ibv default buffer_size
	DefaultMaxPoll    = rxloop.DefaultMaxPoll // spead2 udp_ibv default max_poll
	DefaultCompVector = 0
)

// Environment variable names. The IBVBRIDGE_ ones win over the SPEAD2_ ones so
// a host-wide spead2 setting can be overridden for ibvbridge alone.
const (
	EnvLibrary          = "IBVBRIDGE_LIBIBVERBS"
	EnvInterface        = "IBVBRIDGE_IBV_INTERFACE"
	EnvCompVector       = "IBVBRIDGE_IBV_COMP_VECTOR"
	EnvSpead2Interface  = "SPEAD2_IBV_INTERFACE"
	EnvSpead2CompVector = "SPEAD2_IBV_COMP_VECTOR"
	defaultLibraryName  = "libibverbs.so.1"
)

// RecvConfig describes one ibverbs receiver, with spead2's parameters.
type RecvConfig struct {
	// Interface is the IPv4 address of the interface to receive on; it selects
	// the RDMA device and port and is where the IGMP joins are made.
	Interface netip.Addr
	// Endpoints are the IPv4 multicast group:port pairs to steer to the QP.
	Endpoints []netip.AddrPort
	// MaxSize is the largest Ethernet frame (headers included) a receive slot
	// holds; bigger frames complete with an error and are dropped.
	MaxSize int
	// BufferSize is the receive buffer in bytes: BufferSize/MaxSize receive
	// work requests are kept posted.
	BufferSize int
	// CompVector >= 0 waits for interrupts on that completion vector (modulo
	// the device's count); < 0 busy-polls a whole core.
	CompVector int
	// MaxPoll is how many times the CQ is polled after a wakeup before the
	// loop re-arms and sleeps.
	MaxPoll int
	// Place opens the receiver for direct placement (transport/ibv): the
	// whole memory mapping around the packet area (the ring's data memory)
	// is registered, and work requests may be split (SplitQueue.PostSplit),
	// headers into the packet area and payloads into ring slots. Never run on
	// RDMA hardware; off by default.
	Place bool
}

// DefaultRecvConfig returns spead2's defaults with no interface or endpoints.
func DefaultRecvConfig() RecvConfig {
	return RecvConfig{
		MaxSize:    DefaultMaxSize,
		BufferSize: DefaultBufferSize,
		CompVector: DefaultCompVector,
		MaxPoll:    DefaultMaxPoll,
	}
}

// BusyPoll reports whether the configuration asks for busy polling.
func (c *RecvConfig) BusyPoll() bool { return c.CompVector < 0 }

// Slots is the number of receive work requests: BufferSize/MaxSize, at least 1.
func (c *RecvConfig) Slots() int {
	if c.MaxSize <= 0 {
		return 0
	}
	return max(1, c.BufferSize/c.MaxSize)
}

// Validate checks the configuration the way spead2's udp_ibv_config does.
func (c *RecvConfig) Validate() error {
	if !c.Interface.IsValid() {
		return errors.New("ibverbs: interface address is not set")
	}
	if !c.Interface.Is4() {
		return fmt.Errorf("ibverbs: interface address %s is not an IPv4 address", c.Interface)
	}
	if len(c.Endpoints) == 0 {
		return errors.New("ibverbs: no endpoints")
	}
	for _, ep := range c.Endpoints {
		if err := ValidateEndpoint(ep); err != nil {
			return err
		}
	}
	if c.MaxSize <= 0 {
		return fmt.Errorf("ibverbs: max size %d must be positive", c.MaxSize)
	}
	if c.BufferSize <= 0 {
		return fmt.Errorf("ibverbs: buffer size %d must be positive", c.BufferSize)
	}
	if c.MaxPoll <= 0 {
		return fmt.Errorf("ibverbs: max_poll %d must be positive", c.MaxPoll)
	}
	return nil
}

// ValidateEndpoint accepts only IPv4 multicast group:port pairs: the flow
// rules match a multicast destination MAC derived from the group.
func ValidateEndpoint(ep netip.AddrPort) error {
	a := ep.Addr()
	if !a.Is4() || !a.IsMulticast() {
		return fmt.Errorf("ibverbs: endpoint %s is not an IPv4 multicast address", ep)
	}
	if ep.Port() == 0 {
		return fmt.Errorf("ibverbs: endpoint %s has no port", ep)
	}
	return nil
}

// ParseEndpoints parses "group:port" strings and validates each.
func ParseEndpoints(ss []string) ([]netip.AddrPort, error) {
	out := make([]netip.AddrPort, 0, len(ss))
	for _, s := range ss {
		ep, err := netip.ParseAddrPort(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("ibverbs: endpoint %q: %w", s, err)
		}
		ep = netip.AddrPortFrom(ep.Addr().Unmap(), ep.Port())
		if err := ValidateEndpoint(ep); err != nil {
			return nil, err
		}
		out = append(out, ep)
	}
	return out, nil
}

// FlagsSet says which RecvConfig fields were given explicitly on the command
// line, so ApplyEnv leaves them alone.
type FlagsSet struct {
	Interface  bool
	CompVector bool
}

// ApplyEnv fills Interface and CompVector from the environment unless set by
// a flag. Precedence: flag > IBVBRIDGE_IBV_* > SPEAD2_IBV_* > current value.
// lookup is os.LookupEnv in production; an empty value counts as unset. A bad
// value in the variable that wins is an error naming it (a lower-precedence
// variable is not consulted, so a typo cannot silently fall through).
func (c *RecvConfig) ApplyEnv(lookup func(string) (string, bool), set FlagsSet) error {
	return applyEnv(lookup, set, &c.Interface, &c.CompVector)
}

func applyEnv(lookup func(string) (string, bool), set FlagsSet, iface *netip.Addr, compVector *int) error {
	if !set.Interface {
		if name, v, ok := firstEnv(lookup, EnvInterface, EnvSpead2Interface); ok {
			a, err := netip.ParseAddr(v)
			if err != nil || !a.Is4() {
				return fmt.Errorf("ibverbs: %s=%q: not an IPv4 address", name, v)
			}
			*iface = a
		}
	}
	if !set.CompVector {
		if name, v, ok := firstEnv(lookup, EnvCompVector, EnvSpead2CompVector); ok {
			n, err := strconv.Atoi(v)
			if err != nil {
				return fmt.Errorf("ibverbs: %s=%q: not an integer", name, v)
			}
			*compVector = n
		}
	}
	return nil
}

func firstEnv(lookup func(string) (string, bool), names ...string) (name, value string, ok bool) {
	for _, n := range names {
		if v, found := lookup(n); found {
			if v = strings.TrimSpace(v); v != "" {
				return n, v, true
			}
		}
	}
	return "", "", false
}
