package verbs

import (
	"fmt"
	"io"
	"strings"
	"syscall"
	"text/tabwriter"
)

// Device is one RDMA device as `ibvbridge devices` shows it.
type Device struct {
	Name            string
	NodeGUID        uint64
	FirmwareVersion string
	VendorID        uint32
	VendorPartID    uint32
	NumCompVectors  int // completion vectors (interrupt lines) for CQs
	MaxQPWR         int // max work requests per queue: caps BufferSize/MaxSize
	MaxCQE          int
	Caps            Capabilities
	Ports           []Port
	// OpenErr is set when the device is listed but could not be opened or
	// queried; the other fields beyond Name and NodeGUID are then zero.
	OpenErr error
}

// Capabilities are the device features the receive and send paths care about.
type Capabilities struct {
	// RawPacketQP is nil when a raw packet QP could be created; otherwise
	// why not (EPERM: the process lacks CAP_NET_RAW).
	RawPacketQP error
	// ManagedFlowSteering: IBV_DEVICE_MANAGED_FLOW_STEERING, needed for
	// ibv_create_flow (spead2 depends on it too).
	ManagedFlowSteering bool
	RawIPChecksum       bool // IBV_DEVICE_RAW_IP_CSUM or IBV_RAW_PACKET_CAP_IP_CSUM
	CVLANStripping      bool // IBV_RAW_PACKET_CAP_CVLAN_STRIPPING
	ScatterFCS          bool // IBV_RAW_PACKET_CAP_SCATTER_FCS / IBV_DEVICE_RAW_SCATTER_FCS
	// Packet pacing (per-QP rate limiting for the send side), kbit/s.
	PacingMinKbps, PacingMaxKbps uint32
	PacingRawPacket              bool // pacing supported on raw packet QPs
}

// Port is one physical port.
type Port struct {
	Num        int // 1-based
	State      PortState
	LinkLayer  LinkLayer
	ActiveMTU  int // bytes (IB MTU enum decoded)
	MaxMTU     int
	Width      int     // lanes
	SpeedGbps  float64 // total: lanes × per-lane rate
	QueryError error
}

// PortState is enum ibv_port_state.
type PortState uint32

func (s PortState) String() string {
	switch s {
	case 0:
		return "NOP"
	case 1:
		return "DOWN"
	case 2:
		return "INIT"
	case 3:
		return "ARMED"
	case 4:
		return "ACTIVE"
	case 5:
		return "ACTIVE_DEFER"
	}
	return fmt.Sprintf("PortState(%d)", uint32(s))
}

// LinkLayer is the IBV_LINK_LAYER_* value.
type LinkLayer uint8

const (
	LinkLayerUnspecified LinkLayer = 0
	LinkLayerInfiniBand  LinkLayer = 1
	LinkLayerEthernet    LinkLayer = 2
)

func (l LinkLayer) String() string {
	switch l {
	case LinkLayerInfiniBand:
		return "InfiniBand"
	case LinkLayerEthernet:
		return "Ethernet"
	}
	// Unspecified is what old drivers report for InfiniBand.
	return "unspecified"
}

// ibMTU decodes enum ibv_mtu.
func ibMTU(m uint32) int {
	if m >= 1 && m <= 5 {
		return 128 << m
	}
	return 0
}

// ibWidth decodes active_width (IB_WIDTH_*) to lanes.
func ibWidth(w uint8) int {
	switch w {
	case 1:
		return 1
	case 2:
		return 4
	case 4:
		return 8
	case 8:
		return 12
	case 16:
		return 2
	}
	return 0
}

// ibLaneGbps decodes active_speed (IB_SPEED_*) to the per-lane data rate.
func ibLaneGbps(s uint8) float64 {
	switch s {
	case 1:
		return 2.5 // SDR
	case 2:
		return 5 // DDR
	case 4:
		return 10 // QDR; also 10GbE-class Ethernet
	case 8:
		return 10.3125 // FDR10
	case 16:
		return 14.0625 // FDR
	case 32:
		return 25.78125 // EDR; 25/100GbE
	case 64:
		return 53.125 // HDR; 50/200GbE
	case 128:
		return 106.25 // NDR; 100/400GbE
	case 255:
		return 212.5 // XDR
	}
	return 0
}

// GUIDString formats a node GUID the way ibv_devinfo does.
func GUIDString(g uint64) string {
	return fmt.Sprintf("%04x:%04x:%04x:%04x", g>>48, (g>>32)&0xffff, (g>>16)&0xffff, g&0xffff)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}

func rawQPString(err error) string {
	switch {
	case err == nil:
		return "yes"
	case err == syscall.EPERM || err == syscall.EACCES:
		return "no(CAP_NET_RAW)"
	}
	return "no"
}

// NoDevicesLine is what Format prints when there is nothing to list.
const NoDevicesLine = "no RDMA devices found (no NIC with an ibverbs driver, or its kernel module is not loaded)"

// Format writes devs as the `ibvbridge devices` table: one row per port.
func Format(w io.Writer, devs []Device) error {
	if len(devs) == 0 {
		_, err := fmt.Fprintln(w, NoDevicesLine)
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "DEVICE\tGUID\tPORT\tSTATE\tLINK\tMTU\tSPEED\tRAW_QP\tFLOW_STEER\tRAW_CSUM\tVLAN_STRIP\tSCATTER_FCS\tPACING\tVECTORS")
	for _, d := range devs {
		if d.OpenErr != nil {
			fmt.Fprintf(tw, "%s\t%s\t-\terror: %v\t\t\t\t\t\t\t\t\t\t\n", d.Name, GUIDString(d.NodeGUID), d.OpenErr)
			continue
		}
		pacing := "no"
		if d.Caps.PacingMaxKbps > 0 {
			pacing = fmt.Sprintf("%s-%s", kbps(d.Caps.PacingMinKbps), kbps(d.Caps.PacingMaxKbps))
			if !d.Caps.PacingRawPacket {
				pacing += "(not raw)"
			}
		}
		caps := fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%d",
			rawQPString(d.Caps.RawPacketQP), yesNo(d.Caps.ManagedFlowSteering), yesNo(d.Caps.RawIPChecksum),
			yesNo(d.Caps.CVLANStripping), yesNo(d.Caps.ScatterFCS), pacing, d.NumCompVectors)
		if len(d.Ports) == 0 {
			fmt.Fprintf(tw, "%s\t%s\t-\t\t\t\t\t%s\n", d.Name, GUIDString(d.NodeGUID), caps)
		}
		for _, p := range d.Ports {
			if p.QueryError != nil {
				fmt.Fprintf(tw, "%s\t%s\t%d\terror: %v\t\t\t\t%s\n", d.Name, GUIDString(d.NodeGUID), p.Num, p.QueryError, caps)
				continue
			}
			speed := "-"
			if p.SpeedGbps > 0 {
				speed = strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.1f", p.SpeedGbps), "0"), ".") + " Gb/s"
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%d\t%s\t%s\n", d.Name, GUIDString(d.NodeGUID), p.Num, p.State, p.LinkLayer, p.ActiveMTU, speed, caps)
		}
	}
	return tw.Flush()
}

func kbps(k uint32) string {
	switch {
	case k >= 1000000 && k%1000000 == 0:
		return fmt.Sprintf("%dG", k/1000000)
	case k >= 1000 && k%1000 == 0:
		return fmt.Sprintf("%dM", k/1000)
	}
	return fmt.Sprintf("%dk", k)
}
