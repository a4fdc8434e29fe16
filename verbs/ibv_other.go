//go:build !linux || !cgo

package verbs

import (
	"context"
	"net/netip"
	"strconv"

	"github.com/ibvbridge/ibvbridge/internal/rxloop"
)

// Load reports ErrUnsupported: this build has no cgo (or is not Linux).
func Load() error { return ErrUnsupported }

// CheckInterface reports ErrUnsupported in this build.
func CheckInterface(netip.Addr) (netdev, ibdev string, port int, err error) {
	return "", "", 0, ErrUnsupported
}

// Devices reports ErrUnsupported in this build.
func Devices() ([]Device, error) { return nil, ErrUnsupported }

// Receiver is unavailable in this build; OpenReceiver always fails.
type Receiver struct {
	Netdev, IBDev string
	Port          int
}

// Flow is unavailable in this build.
type Flow struct{ Rule *FlowRule }

// OpenReceiver validates cfg and the packet area, then reports ErrUnsupported.
func OpenReceiver(cfg RecvConfig, packetArea []byte) (*Receiver, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if _, err := PlanArea(packetArea, cfg.MaxSize, cfg.BufferSize); err != nil {
		return nil, err
	}
	return nil, ErrUnsupported
}

func (r *Receiver) AddFlow(*FlowRule) (*Flow, error)      { return nil, ErrUnsupported }
func (f *Flow) Destroy() error                            { return ErrUnsupported }
func (r *Receiver) Layout() RegionLayout                  { return RegionLayout{} }
func (r *Receiver) Poll([]rxloop.Completion) (int, error) { return 0, ErrUnsupported }
func (r *Receiver) Repost([]uint64) error                 { return ErrUnsupported }
func (r *Receiver) Arm() error                            { return ErrUnsupported }
func (r *Receiver) Wait(context.Context) error            { return ErrUnsupported }
func (r *Receiver) Slot(uint64) []byte                    { return nil }
func (r *Receiver) Close() error                          { return nil }
func (r *Receiver) Slots() int                            { return 0 }
func (r *Receiver) PostSplit([]SplitWR) error             { return ErrUnsupported }
func (r *Receiver) Covers([]byte) bool                    { return false }
func (r *Receiver) Flush() error                          { return ErrUnsupported }

// StatusString names a completion status.
func StatusString(s rxloop.Status) string { return "status " + strconv.FormatUint(uint64(s), 10) }

var _ SplitQueue = (*Receiver)(nil)

// OpenSender validates cfg, then reports ErrUnsupported.
func OpenSender(cfg SendConfig) (*Sender, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return nil, ErrUnsupported
}
