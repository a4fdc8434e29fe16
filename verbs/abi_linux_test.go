//go:build linux && cgo

package verbs

import (
	"testing"
	"unsafe"

	"github.com/ibvbridge/ibvbridge/internal/rxloop"
)

// TestFlowLayoutMatchesC proves the pure-Go flow encoding against sizeof and
// offsetof compiled from the installed <infiniband/verbs.h>.
func TestFlowLayoutMatchesC(t *testing.T) {
	c := cABITable()
	check := func(name string, goVal uint64) {
		t.Helper()
		v, ok := c[name]
		if !ok {
			t.Errorf("%s: missing from C table", name)
			return
		}
		if v != goVal {
			t.Errorf("%s: C %d, Go %d", name, v, goVal)
		}
	}
	check("sizeof(struct ibv_flow_attr)", attrSize)
	check("offsetof(struct ibv_flow_attr.comp_mask)", 0)
	check("offsetof(struct ibv_flow_attr.type)", attrOffType)
	check("offsetof(struct ibv_flow_attr.size)", attrOffSize)
	check("offsetof(struct ibv_flow_attr.priority)", attrOffPriority)
	check("offsetof(struct ibv_flow_attr.num_of_specs)", attrOffNumSpecs)
	check("offsetof(struct ibv_flow_attr.port)", attrOffPort)
	check("offsetof(struct ibv_flow_attr.flags)", attrOffFlags)

	for _, s := range []string{"eth", "ipv4", "ipv4_ext", "tcp_udp"} {
		check("offsetof(struct ibv_flow_spec_"+s+".type)", 0)
		check("offsetof(struct ibv_flow_spec_"+s+".size)", specOffSize)
	}
	check("sizeof(struct ibv_flow_spec_eth)", ethSize)
	check("offsetof(struct ibv_flow_spec_eth.val.dst_mac)", ethOffVal)
	check("offsetof(struct ibv_flow_spec_eth.val.src_mac)", ethOffVal+6)
	check("offsetof(struct ibv_flow_spec_eth.val.ether_type)", ethOffVal+12)
	check("offsetof(struct ibv_flow_spec_eth.val.vlan_tag)", ethOffVal+14)
	check("offsetof(struct ibv_flow_spec_eth.mask.dst_mac)", ethOffMask)
	check("offsetof(struct ibv_flow_spec_eth.mask.src_mac)", ethOffMask+6)
	check("offsetof(struct ibv_flow_spec_eth.mask.ether_type)", ethOffMask+12)
	check("offsetof(struct ibv_flow_spec_eth.mask.vlan_tag)", ethOffMask+14)

	check("sizeof(struct ibv_flow_spec_ipv4)", ipv4Size)
	check("offsetof(struct ibv_flow_spec_ipv4.val.src_ip)", ipv4OffVal)
	check("offsetof(struct ibv_flow_spec_ipv4.val.dst_ip)", ipv4OffVal+4)
	check("offsetof(struct ibv_flow_spec_ipv4.mask.src_ip)", ipv4OffMask)
	check("offsetof(struct ibv_flow_spec_ipv4.mask.dst_ip)", ipv4OffMask+4)

	check("sizeof(struct ibv_flow_spec_ipv4_ext)", ipv4ExtSize)
	for i, f := range []string{"src_ip", "dst_ip", "proto", "tos", "ttl", "flags"} {
		off := []uint64{0, 4, 8, 9, 10, 11}[i]
		check("offsetof(struct ibv_flow_spec_ipv4_ext.val."+f+")", ipv4ExtOffVal+off)
		check("offsetof(struct ibv_flow_spec_ipv4_ext.mask."+f+")", ipv4ExtOffMask+off)
	}

	check("sizeof(struct ibv_flow_spec_tcp_udp)", tcpUDPSize)
	check("offsetof(struct ibv_flow_spec_tcp_udp.val.dst_port)", tcpUDPOffVal)
	check("offsetof(struct ibv_flow_spec_tcp_udp.val.src_port)", tcpUDPOffVal+2)
	check("offsetof(struct ibv_flow_spec_tcp_udp.mask.dst_port)", tcpUDPOffMask)
	check("offsetof(struct ibv_flow_spec_tcp_udp.mask.src_port)", tcpUDPOffMask+2)

	check("IBV_FLOW_SPEC_ETH", specEth)
	check("IBV_FLOW_SPEC_IPV4", specIPv4)
	check("IBV_FLOW_SPEC_IPV4_EXT", specIPv4Ext)
	check("IBV_FLOW_SPEC_TCP", specTCP)
	check("IBV_FLOW_SPEC_UDP", specUDP)
	check("IBV_FLOW_ATTR_NORMAL", uint64(FlowNormal))
	check("IBV_FLOW_ATTR_ALL_DEFAULT", uint64(FlowAllDefault))
	check("IBV_FLOW_ATTR_MC_DEFAULT", uint64(FlowMCDefault))
	check("IBV_FLOW_ATTR_SNIFFER", uint64(FlowSniffer))

	check("IBV_DEVICE_MANAGED_FLOW_STEERING", capManagedFlowSteering)
	check("IBV_DEVICE_RAW_IP_CSUM", capRawIPCsum)
	check("IBV_DEVICE_RAW_SCATTER_FCS", capRawScatterFCS)
	check("IBV_RAW_PACKET_CAP_CVLAN_STRIPPING", rawCapCVLANStripping)
	check("IBV_RAW_PACKET_CAP_SCATTER_FCS", rawCapScatterFCS)
	check("IBV_RAW_PACKET_CAP_IP_CSUM", rawCapIPCsum)
	check("IBV_QPT_RAW_PACKET", qptRawPacket)
	check("IBV_LINK_LAYER_INFINIBAND", uint64(LinkLayerInfiniBand))
	check("IBV_LINK_LAYER_ETHERNET", uint64(LinkLayerEthernet))
	check("IBV_WC_SUCCESS", uint64(rxloop.StatusSuccess))
	check("IBV_WC_LOC_LEN_ERR", uint64(rxloop.StatusLocalLength))
	check("IBV_WC_WR_FLUSH_ERR", uint64(rxloop.StatusFlushed))

	// Receiver.Poll hands &out[0] straight to C.
	var comp rxloop.Completion
	check("sizeof(ibvb_completion)", uint64(unsafe.Sizeof(comp)))
	check("offsetof(ibvb_completion.len)", uint64(unsafe.Offsetof(comp.Len)))
	check("offsetof(ibvb_completion.status)", uint64(unsafe.Offsetof(comp.Status)))

	// PostSplit hands &cwrs[0] straight to C.
	var rwr recvWR
	check("sizeof(ibvb_recv_wr)", uint64(unsafe.Sizeof(rwr)))
	check("offsetof(ibvb_recv_wr.addr)", uint64(unsafe.Offsetof(rwr.Addr)))
	check("offsetof(ibvb_recv_wr.len)", uint64(unsafe.Offsetof(rwr.Len)))
	check("offsetof(ibvb_recv_wr.hdr_len)", uint64(unsafe.Offsetof(rwr.HdrLen)))

	// The send queue posts &wrs[0] straight to C.
	var wr SendWR
	check("sizeof(ibvb_send_wr)", uint64(unsafe.Sizeof(wr)))
	check("offsetof(ibvb_send_wr.slot)", uint64(unsafe.Offsetof(wr.Slot)))
	check("offsetof(ibvb_send_wr.len)", uint64(unsafe.Offsetof(wr.Len)))
	check("offsetof(ibvb_send_wr.flags)", uint64(unsafe.Offsetof(wr.Flags)))
	check("IBV_SEND_SIGNALED", uint64(SendSignaled))
	check("IBV_SEND_IP_CSUM", uint64(SendIPChecksum))
}
