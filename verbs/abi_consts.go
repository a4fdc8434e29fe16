package verbs

// Values from verbs.h that the pure-Go code needs. The layout test checks each
// against the C header.
const (
	capManagedFlowSteering = 1 << 29 // IBV_DEVICE_MANAGED_FLOW_STEERING
	capRawIPCsum           = 1 << 26 // IBV_DEVICE_RAW_IP_CSUM
	capRawScatterFCS       = 1 << 34 // IBV_DEVICE_RAW_SCATTER_FCS (device_cap_flags_ex)
	rawCapCVLANStripping   = 1 << 0  // IBV_RAW_PACKET_CAP_CVLAN_STRIPPING
	rawCapScatterFCS       = 1 << 1  // IBV_RAW_PACKET_CAP_SCATTER_FCS
	rawCapIPCsum           = 1 << 2  // IBV_RAW_PACKET_CAP_IP_CSUM
	qptRawPacket           = 8       // IBV_QPT_RAW_PACKET
)
