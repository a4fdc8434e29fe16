/* ibvb_shim: the only C in ibvbridge. It loads libibverbs.so.1 at run time
 * (dlopen, never linked) and wraps the few verbs the verbs package uses, so
 * the Go side only ever sees opaque handles and flat structs. */
#ifndef IBVB_SHIM_H
#define IBVB_SHIM_H

#include <stddef.h>
#include <stdint.h>

#define IBVB_MAX_PORTS 8
#define IBVB_NAME_LEN 64

/* ibvb_load dlopen()s path and resolves every symbol. On failure it returns
 * -1 (library not found / not loadable) or -2 (a symbol is missing: the
 * library is too old) and writes the dlerror() text into err. Once it has
 * succeeded it returns 0 without doing anything. */
int ibvb_load(const char *path, char *err, size_t errlen);

typedef struct {
	uint32_t state;
	uint32_t max_mtu;    /* enum ibv_mtu */
	uint32_t active_mtu; /* enum ibv_mtu */
	uint8_t link_layer;
	uint8_t active_width;
	uint8_t active_speed;
	uint8_t phys_state;
	int query_errno;
} ibvb_port_info;

typedef struct {
	char name[IBVB_NAME_LEN];
	char fw_ver[IBVB_NAME_LEN];
	uint64_t node_guid; /* host order */
	uint64_t device_cap_flags; /* orig_attr.device_cap_flags */
	uint64_t device_cap_flags_ex;
	uint32_t raw_packet_caps;
	uint32_t pacing_min_kbps;
	uint32_t pacing_max_kbps;
	uint32_t pacing_qpts;
	uint32_t vendor_id;
	uint32_t vendor_part_id;
	int num_comp_vectors;
	int phys_port_cnt;
	int max_qp_wr;
	int max_cqe;
	int raw_qp_errno; /* 0: a raw packet QP could be created; else errno */
	int open_errno;   /* ibv_open_device / query failure, 0 if fine */
	ibvb_port_info ports[IBVB_MAX_PORTS];
} ibvb_device_info;

/* ibvb_list_devices fills up to max entries and returns the number of
 * devices present (which may exceed max), or -errno if the list could not be
 * read. */
int ibvb_list_devices(ibvb_device_info *out, int max);

/* Same memory layout as the Go Completion struct (checked by a test). */
typedef struct {
	uint64_t id;
	uint32_t len;
	uint32_t status;
} ibvb_completion;

typedef struct ibvb_rx ibvb_rx;

typedef struct {
	const char *dev_name;
	int port;
	void *area;      /* the slots; registered as one MR unless mr_base is set */
	size_t area_len;
	size_t start;    /* offset of slot 0 within area */
	size_t stride;   /* distance between slots */
	uint32_t slot_len; /* bytes the NIC may write per slot */
	uint32_t slots;
	int comp_vector; /* <0: no completion channel (busy poll) */
	int split;       /* nonzero: allow ibvb_rx_post_split (receive WRs of up to 3 SGEs) */
	uint64_t mr_base; /* nonzero: register [mr_base, mr_base+mr_len) instead of the area; it must */
	uint64_t mr_len;  /* contain the area (split WRs point at other memory inside it) */
} ibvb_rx_params;

/* Same memory layout as the Go recvWR struct (checked by a test). */
typedef struct {
	uint64_t id;      /* receive slot (wr_id) */
	uint64_t addr;    /* payload region; with len 0: the slot's own one-SGE work request */
	uint32_t len;     /* payload region bytes */
	uint32_t hdr_len; /* frame bytes into the head of the slot, before the region */
} ibvb_recv_wr;

/* ibvb_rx_open builds device context, PD, MR, channel, CQs and a raw packet
 * QP in INIT. On failure it returns NULL, sets *err_errno and *err_step to a
 * static string naming the verb that failed, and releases what it built. */
ibvb_rx *ibvb_rx_open(const ibvb_rx_params *p, int *err_errno, const char **err_step);
int ibvb_rx_num_comp_vectors(ibvb_rx *rx);
int ibvb_rx_attach_flow(ibvb_rx *rx, const void *attr, size_t len, void **out);
int ibvb_rx_destroy_flow(ibvb_rx *rx, void *flow);
int ibvb_rx_post_all(ibvb_rx *rx);
int ibvb_rx_ready(ibvb_rx *rx); /* modify QP to RTR */
int ibvb_rx_poll(ibvb_rx *rx, ibvb_completion *out, int max);
int ibvb_rx_repost(ibvb_rx *rx, const uint64_t *ids, int n);
/* ibvb_rx_post_split posts wrs[0..n) as one chain, in order (one ibv_post_recv). An entry with len 0 is
 * the slot's own work request, as ibvb_rx_repost posts it. Any other is a split work request of the slot
 * (it needs p->split at open), whose scatter list is
 *   SGE 0: slot[0, hdr_len)                 the frame's headers (Ethernet, IPv4, UDP, SPEAD);
 *   SGE 1: [addr, addr+len)                 its payload, straight into memory outside the packet area;
 *   SGE 2: slot[hdr_len, slot_len-len)      whatever is longer, left out when empty (a zero-length SGE
 *                                           means 2 GiB to some HCAs);
 * so it takes every frame a plain work request takes (up to slot_len bytes), only cut in pieces. The
 * caller guarantees that a region is not given to two posted work requests at once and that nothing else
 * writes it until its work request completes. Checks: id < slots, hdr_len > 0, hdr_len + len <= slot_len,
 * the region inside the registered memory; a failed check posts nothing and returns EINVAL. Returns 0 or
 * ibv_post_recv's errno. */
int ibvb_rx_post_split(ibvb_rx *rx, const ibvb_recv_wr *wrs, int n);
/* ibvb_rx_flush moves the QP to the error state (ibv_modify_qp IBV_QPS_ERR): every posted receive work
 * request completes with IBV_WC_WR_FLUSH_ERR, the NIC writes nothing more into any of them, and later
 * posts complete at once the same way. There is no way back short of ibvb_rx_close. 0 or errno. */
int ibvb_rx_flush(ibvb_rx *rx);
int ibvb_rx_arm(ibvb_rx *rx);
int ibvb_rx_channel_fd(ibvb_rx *rx);
int ibvb_rx_get_event(ibvb_rx *rx); /* 0: got and acked one event; else errno */
void ibvb_rx_close(ibvb_rx *rx);
const char *ibvb_wc_status_str(uint32_t status);

/* ---- send side ---- */

/* Same memory layout as the Go SendWR struct (checked by a test). */
typedef struct {
	uint64_t id;    /* wr_id: the frame's position */
	uint32_t slot;  /* frame buffer index */
	uint32_t len;   /* frame bytes */
	uint32_t flags; /* IBV_SEND_* */
	uint32_t pad;
} ibvb_send_wr;

typedef struct ibvb_tx ibvb_tx;

typedef struct {
	const char *dev_name;
	int port;
	void *area;       /* frame buffers, registered as one MR */
	size_t area_len;
	size_t stride;    /* distance between frame buffers */
	uint32_t slots;
	int comp_vector;  /* <0: no completion channel (busy poll) */
} ibvb_tx_params;

typedef struct {
	uint64_t device_cap_flags;
	uint32_t raw_packet_caps;
	uint32_t pacing_min_kbps;
	uint32_t pacing_max_kbps;
	uint32_t pacing_qpts;
	int num_comp_vectors;
} ibvb_tx_info;

/* ibvb_tx_open builds device context, PD, MR, channel, CQs and a raw packet
 * QP taken to RTS, and reports the device's checksum and pacing caps. On
 * failure it returns NULL with *err_errno and *err_step set. */
ibvb_tx *ibvb_tx_open(const ibvb_tx_params *p, ibvb_tx_info *info, int *err_errno, const char **err_step);
/* ibvb_tx_set_rate sets the QP's packet pacing (ibv_modify_qp_rate_limit,
 * falling back to ibv_modify_qp with IBV_QP_RATE_LIMIT). 0 or errno. */
int ibvb_tx_set_rate(ibvb_tx *tx, uint32_t kbps, uint16_t typical_pkt_sz, uint32_t max_burst);
int ibvb_tx_post(ibvb_tx *tx, const ibvb_send_wr *wrs, int n);
int ibvb_tx_poll(ibvb_tx *tx, ibvb_completion *out, int max);
int ibvb_tx_arm(ibvb_tx *tx);
int ibvb_tx_channel_fd(ibvb_tx *tx);
int ibvb_tx_get_event(ibvb_tx *tx);
void ibvb_tx_close(ibvb_tx *tx);

/* ABI table for the layout test: sizeof/offsetof from the real verbs.h. */
typedef struct {
	const char *name;
	size_t value;
} ibvb_abi_entry;
const ibvb_abi_entry *ibvb_abi_table(int *n);

#endif
