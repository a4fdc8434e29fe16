//go:build linux && cgo

/* Run-time binding to libibverbs. Nothing here references a libibverbs symbol
 * at link time: exported verbs are reached through pointers resolved with
 * dlvsym(), and the fast-path verbs (poll_cq, post_recv, req_notify_cq,
 * create_flow, ...) are verbs.h static inlines that only dereference the
 * context's ops table, so they need no symbol at all. The verbs.h inlines
 * that DO call exported functions (the ibv_query_port and ibv_reg_mr macros,
 * ibv_query_device_ex's legacy path) are re-implemented below on top of the
 * resolved pointers; calling them by mistake fails the link, because the
 * package does not link -libverbs. */

#define _GNU_SOURCE
#include <dlfcn.h>
#include <endian.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <infiniband/verbs.h>

#include "ibvb_shim.h"

/* Function pointer types are taken from the header's own prototypes with
 * __typeof__, so a prototype change in a newer rdma-core is a compile error
 * here rather than a silent ABI mismatch. */
#define IBVB_SYMS(X)                                                   \
	X(ibv_get_device_list, "IBVERBS_1.1")                          \
	X(ibv_free_device_list, "IBVERBS_1.1")                         \
	X(ibv_get_device_name, "IBVERBS_1.1")                          \
	X(ibv_get_device_guid, "IBVERBS_1.1")                          \
	X(ibv_open_device, "IBVERBS_1.1")                              \
	X(ibv_close_device, "IBVERBS_1.1")                             \
	X(ibv_query_device, "IBVERBS_1.1")                             \
	X(ibv_alloc_pd, "IBVERBS_1.1")                                 \
	X(ibv_dealloc_pd, "IBVERBS_1.1")                               \
	X(ibv_dereg_mr, "IBVERBS_1.1")                                 \
	X(ibv_create_comp_channel, "IBVERBS_1.0")                      \
	X(ibv_destroy_comp_channel, "IBVERBS_1.0")                     \
	X(ibv_create_cq, "IBVERBS_1.1")                                \
	X(ibv_destroy_cq, "IBVERBS_1.1")                               \
	X(ibv_create_qp, "IBVERBS_1.1")                                \
	X(ibv_destroy_qp, "IBVERBS_1.1")                               \
	X(ibv_modify_qp, "IBVERBS_1.1")                                \
	X(ibv_get_cq_event, "IBVERBS_1.1")                             \
	X(ibv_ack_cq_events, "IBVERBS_1.1")                            \
	X(ibv_wc_status_str, "IBVERBS_1.1")

#define IBVB_DECL(name, ver) static __typeof__(name) *p_##name;
IBVB_SYMS(IBVB_DECL)

/* ibv_query_port and ibv_reg_mr are macros in verbs.h (wrapping inlines), so
 * __typeof__ cannot name them; spell out the exported prototypes. The
 * exported ibv_query_port takes the old, shorter _compat_ibv_port_attr; the
 * exported ibv_reg_mr takes access as int. */
static int (*p_ibv_query_port)(struct ibv_context *, uint8_t, struct _compat_ibv_port_attr *);
static struct ibv_mr *(*p_ibv_reg_mr)(struct ibv_pd *, void *, size_t, int);

static void *ibvb_handle;

static void *ibvb_sym(void *h, const char *name, const char *ver)
{
	/* Pin the symbol version these prototypes belong to, as a link-time
	 * binding would: plain dlsym() would pick whatever is the default in
	 * the installed library. */
	void *p = dlvsym(h, name, ver);
	if (p == NULL)
		p = dlsym(h, name);
	return p;
}

int ibvb_load(const char *path, char *err, size_t errlen)
{
	void *h;

	if (ibvb_handle != NULL)
		return 0;
	dlerror();
	/* RTLD_NOW: find a missing symbol here, not in the middle of a verb.
	 * RTLD_LOCAL: keep libibverbs' symbols out of the global namespace. */
	h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		const char *e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "dlopen failed");
		return -1;
	}
#define IBVB_RESOLVE(name, ver)                                              \
	p_##name = (__typeof__(name) *)ibvb_sym(h, #name, ver);              \
	if (p_##name == NULL) {                                              \
		snprintf(err, errlen, "%s: symbol %s@%s not found", path, #name, ver); \
		dlclose(h);                                                  \
		return -2;                                                   \
	}
	IBVB_SYMS(IBVB_RESOLVE)
	p_ibv_query_port = ibvb_sym(h, "ibv_query_port", "IBVERBS_1.1");
	p_ibv_reg_mr = ibvb_sym(h, "ibv_reg_mr", "IBVERBS_1.1");
	if (p_ibv_query_port == NULL || p_ibv_reg_mr == NULL) {
		snprintf(err, errlen, "%s: symbol ibv_query_port or ibv_reg_mr not found", path);
		dlclose(h);
		return -2;
	}
	ibvb_handle = h;
	return 0;
}

/* The verbs.h ibv_query_port macro, minus its link-time reference. */
static int ibvb_query_port(struct ibv_context *ctx, uint8_t port, struct ibv_port_attr *attr)
{
	struct verbs_context *vctx = verbs_get_ctx_op(ctx, query_port);

	memset(attr, 0, sizeof(*attr));
	if (vctx == NULL)
		return p_ibv_query_port(ctx, port, (struct _compat_ibv_port_attr *)attr);
	return vctx->query_port(ctx, port, attr, sizeof(*attr));
}

/* The verbs.h ibv_query_device_ex inline, minus its link-time reference. */
static int ibvb_query_device_ex(struct ibv_context *ctx, struct ibv_device_attr_ex *attr)
{
	struct verbs_context *vctx = verbs_get_ctx_op(ctx, query_device_ex);
	int ret;

	memset(attr, 0, sizeof(*attr));
	if (vctx != NULL) {
		ret = vctx->query_device_ex(ctx, NULL, attr, sizeof(*attr));
		if (ret != EOPNOTSUPP && ret != ENOSYS)
			return ret;
	}
	memset(attr, 0, sizeof(*attr));
	return p_ibv_query_device(ctx, &attr->orig_attr);
}

/* Creating a raw packet QP is the only reliable test for it: there is no
 * capability bit, and the usual failure is EPERM (no CAP_NET_RAW). */
static int ibvb_probe_raw_qp(struct ibv_context *ctx)
{
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_qp_init_attr qa;
	int ret = 0;

	errno = 0;
	pd = p_ibv_alloc_pd(ctx);
	if (pd == NULL)
		return errno ? errno : EIO;
	cq = p_ibv_create_cq(ctx, 1, NULL, NULL, 0);
	if (cq == NULL) {
		ret = errno ? errno : EIO;
		p_ibv_dealloc_pd(pd);
		return ret;
	}
	memset(&qa, 0, sizeof(qa));
	qa.send_cq = cq;
	qa.recv_cq = cq;
	qa.qp_type = IBV_QPT_RAW_PACKET;
	qa.cap.max_send_wr = 1;
	qa.cap.max_recv_wr = 1;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	errno = 0;
	qp = p_ibv_create_qp(pd, &qa);
	if (qp == NULL)
		ret = errno ? errno : EOPNOTSUPP;
	else
		p_ibv_destroy_qp(qp);
	p_ibv_destroy_cq(cq);
	p_ibv_dealloc_pd(pd);
	return ret;
}

static void ibvb_fill_device(struct ibv_device *dev, ibvb_device_info *out)
{
	struct ibv_context *ctx;
	struct ibv_device_attr_ex attr;
	const char *name;
	int i, ret;

	memset(out, 0, sizeof(*out));
	name = p_ibv_get_device_name(dev);
	if (name != NULL)
		snprintf(out->name, sizeof(out->name), "%s", name);
	/* ibv_get_device_guid returns the GUID in network order (__be64). */
	out->node_guid = be64toh(p_ibv_get_device_guid(dev));

	errno = 0;
	ctx = p_ibv_open_device(dev);
	if (ctx == NULL) {
		out->open_errno = errno ? errno : ENODEV;
		return;
	}
	ret = ibvb_query_device_ex(ctx, &attr);
	if (ret != 0) {
		out->open_errno = ret;
		p_ibv_close_device(ctx);
		return;
	}
	snprintf(out->fw_ver, sizeof(out->fw_ver), "%s", attr.orig_attr.fw_ver);
	out->device_cap_flags = attr.orig_attr.device_cap_flags;
	out->device_cap_flags_ex = attr.device_cap_flags_ex;
	out->raw_packet_caps = attr.raw_packet_caps;
	out->pacing_min_kbps = attr.packet_pacing_caps.qp_rate_limit_min;
	out->pacing_max_kbps = attr.packet_pacing_caps.qp_rate_limit_max;
	out->pacing_qpts = attr.packet_pacing_caps.supported_qpts;
	out->vendor_id = attr.orig_attr.vendor_id;
	out->vendor_part_id = attr.orig_attr.vendor_part_id;
	out->num_comp_vectors = ctx->num_comp_vectors;
	out->phys_port_cnt = attr.orig_attr.phys_port_cnt;
	out->max_qp_wr = attr.orig_attr.max_qp_wr;
	out->max_cqe = attr.orig_attr.max_cqe;
	for (i = 0; i < out->phys_port_cnt && i < IBVB_MAX_PORTS; i++) {
		struct ibv_port_attr pa;
		ibvb_port_info *pi = &out->ports[i];

		ret = ibvb_query_port(ctx, (uint8_t)(i + 1), &pa);
		if (ret != 0) {
			pi->query_errno = ret;
			continue;
		}
		pi->state = pa.state;
		pi->max_mtu = pa.max_mtu;
		pi->active_mtu = pa.active_mtu;
		pi->link_layer = pa.link_layer;
		pi->active_width = pa.active_width;
		pi->active_speed = pa.active_speed;
		pi->phys_state = pa.phys_state;
	}
	out->raw_qp_errno = ibvb_probe_raw_qp(ctx);
	p_ibv_close_device(ctx);
}

int ibvb_list_devices(ibvb_device_info *out, int max)
{
	struct ibv_device **list;
	int n = 0, i;

	errno = 0;
	list = p_ibv_get_device_list(&n);
	if (list == NULL)
		return -(errno ? errno : ENODEV);
	for (i = 0; i < n && i < max; i++)
		ibvb_fill_device(list[i], &out[i]);
	p_ibv_free_device_list(list);
	return n;
}

const char *ibvb_wc_status_str(uint32_t status)
{
	if (p_ibv_wc_status_str == NULL)
		return "unknown";
	return p_ibv_wc_status_str((enum ibv_wc_status)status);
}

/* ---- receive side ---- */

struct ibvb_rx {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	struct ibv_comp_channel *chan;
	struct ibv_cq *recv_cq;
	struct ibv_cq *send_cq;
	struct ibv_qp *qp;
	struct ibv_flow **flows;
	int nflows, flows_cap;
	struct ibv_recv_wr *wrs;
	struct ibv_sge *sges;
	struct ibv_wc *wc;
	uint32_t slots;
	uint32_t slot_len;
	struct ibv_recv_wr *split_wrs; /* split: a second work request per slot ... */
	struct ibv_sge *split_sges;    /* ... with 3 SGEs each (ibvb_rx_post_split) */
	uint64_t mr_lo, mr_hi;         /* the registered memory */
};

static struct ibv_context *ibvb_open_by_name(const char *name, int *err)
{
	struct ibv_device **list;
	struct ibv_context *ctx = NULL;
	int n = 0, i;

	errno = 0;
	list = p_ibv_get_device_list(&n);
	if (list == NULL) {
		*err = errno ? errno : ENODEV;
		return NULL;
	}
	*err = ENODEV;
	for (i = 0; i < n; i++) {
		const char *dn = p_ibv_get_device_name(list[i]);
		if (dn != NULL && strcmp(dn, name) == 0) {
			errno = 0;
			ctx = p_ibv_open_device(list[i]);
			*err = ctx ? 0 : (errno ? errno : ENODEV);
			break;
		}
	}
	p_ibv_free_device_list(list);
	return ctx;
}

ibvb_rx *ibvb_rx_open(const ibvb_rx_params *p, int *err_errno, const char **err_step)
{
	ibvb_rx *rx;
	struct ibv_qp_init_attr qa;
	struct ibv_qp_attr mod;
	uint32_t i;
	int e;

#define IBVB_FAIL(step, code)                                                \
	do {                                                                 \
		*err_step = (step);                                          \
		*err_errno = (code) ? (code) : EIO;                          \
		ibvb_rx_close(rx);                                           \
		return NULL;                                                 \
	} while (0)

	rx = calloc(1, sizeof(*rx));
	if (rx == NULL) {
		*err_step = "calloc";
		*err_errno = ENOMEM;
		return NULL;
	}
	rx->slots = p->slots;
	rx->ctx = ibvb_open_by_name(p->dev_name, &e);
	if (rx->ctx == NULL)
		IBVB_FAIL("ibv_open_device", e);
	errno = 0;
	rx->pd = p_ibv_alloc_pd(rx->ctx);
	if (rx->pd == NULL)
		IBVB_FAIL("ibv_alloc_pd", errno);
	errno = 0;
	if (p->mr_base != 0) {
		if ((uintptr_t)p->area < p->mr_base || (uintptr_t)p->area + p->area_len > p->mr_base + p->mr_len)
			IBVB_FAIL("ibv_reg_mr", EINVAL);
		rx->mr = p_ibv_reg_mr(rx->pd, (void *)(uintptr_t)p->mr_base, (size_t)p->mr_len, IBV_ACCESS_LOCAL_WRITE);
	} else {
		rx->mr = p_ibv_reg_mr(rx->pd, p->area, p->area_len, IBV_ACCESS_LOCAL_WRITE);
	}
	if (rx->mr == NULL)
		IBVB_FAIL("ibv_reg_mr", errno);
	rx->mr_lo = (uintptr_t)rx->mr->addr;
	rx->mr_hi = rx->mr_lo + rx->mr->length;
	if (p->comp_vector >= 0) {
		errno = 0;
		rx->chan = p_ibv_create_comp_channel(rx->ctx);
		if (rx->chan == NULL)
			IBVB_FAIL("ibv_create_comp_channel", errno);
	}
	errno = 0;
	rx->recv_cq = p_ibv_create_cq(rx->ctx, (int)p->slots, NULL, rx->chan,
				      (p->comp_vector >= 0 && rx->ctx->num_comp_vectors > 0)
					      ? p->comp_vector % rx->ctx->num_comp_vectors : 0);
	if (rx->recv_cq == NULL)
		IBVB_FAIL("ibv_create_cq", errno);
	/* A QP needs a send CQ even if it never sends. */
	errno = 0;
	rx->send_cq = p_ibv_create_cq(rx->ctx, 1, NULL, NULL, 0);
	if (rx->send_cq == NULL)
		IBVB_FAIL("ibv_create_cq (send)", errno);
	memset(&qa, 0, sizeof(qa));
	qa.send_cq = rx->send_cq;
	qa.recv_cq = rx->recv_cq;
	qa.qp_type = IBV_QPT_RAW_PACKET;
	qa.cap.max_send_wr = 1;
	qa.cap.max_recv_wr = p->slots;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = p->split ? 3 : 1;
	errno = 0;
	rx->qp = p_ibv_create_qp(rx->pd, &qa);
	if (rx->qp == NULL)
		IBVB_FAIL("ibv_create_qp", errno);
	memset(&mod, 0, sizeof(mod));
	mod.qp_state = IBV_QPS_INIT;
	mod.port_num = (uint8_t)p->port;
	e = p_ibv_modify_qp(rx->qp, &mod, IBV_QP_STATE | IBV_QP_PORT);
	if (e != 0)
		IBVB_FAIL("ibv_modify_qp (INIT)", e);

	rx->wrs = calloc(p->slots, sizeof(*rx->wrs));
	rx->sges = calloc(p->slots, sizeof(*rx->sges));
	rx->wc = calloc(p->slots, sizeof(*rx->wc));
	if (rx->wrs == NULL || rx->sges == NULL || rx->wc == NULL)
		IBVB_FAIL("calloc", ENOMEM);
	rx->slot_len = p->slot_len;
	if (p->split) {
		rx->split_wrs = calloc(p->slots, sizeof(*rx->split_wrs));
		rx->split_sges = calloc((size_t)p->slots * 3, sizeof(*rx->split_sges));
		if (rx->split_wrs == NULL || rx->split_sges == NULL)
			IBVB_FAIL("calloc", ENOMEM);
	}
	for (i = 0; i < p->slots; i++) {
		rx->sges[i].addr = (uintptr_t)p->area + p->start + (uint64_t)i * p->stride;
		rx->sges[i].length = p->slot_len;
		rx->sges[i].lkey = rx->mr->lkey;
		rx->wrs[i].wr_id = i;
		rx->wrs[i].sg_list = &rx->sges[i];
		rx->wrs[i].num_sge = 1;
		if (p->split) {
			rx->split_wrs[i].wr_id = i;
			rx->split_wrs[i].sg_list = &rx->split_sges[3 * (size_t)i];
		}
	}
	return rx;
#undef IBVB_FAIL
}

int ibvb_rx_num_comp_vectors(ibvb_rx *rx)
{
	return rx->ctx->num_comp_vectors;
}

int ibvb_rx_attach_flow(ibvb_rx *rx, const void *attr, size_t len, void **out)
{
	/* Copy into aligned memory: the Go bytes carry no alignment promise. */
	uint64_t buf[128];
	struct ibv_flow *flow;

	if (len > sizeof(buf) || len < sizeof(struct ibv_flow_attr))
		return EINVAL;
	if (rx->nflows == rx->flows_cap) {
		int cap = rx->flows_cap ? rx->flows_cap * 2 : 8;
		struct ibv_flow **f = realloc(rx->flows, cap * sizeof(*f));
		if (f == NULL)
			return ENOMEM;
		rx->flows = f;
		rx->flows_cap = cap;
	}
	memcpy(buf, attr, len);
	errno = 0;
	flow = ibv_create_flow(rx->qp, (struct ibv_flow_attr *)buf);
	if (flow == NULL)
		return errno ? errno : EOPNOTSUPP;
	rx->flows[rx->nflows++] = flow;
	*out = flow;
	return 0;
}

int ibvb_rx_destroy_flow(ibvb_rx *rx, void *flow)
{
	int i;

	for (i = 0; i < rx->nflows; i++) {
		if (rx->flows[i] == flow) {
			rx->flows[i] = rx->flows[--rx->nflows];
			return ibv_destroy_flow((struct ibv_flow *)flow);
		}
	}
	return ENOENT;
}

int ibvb_rx_post_all(ibvb_rx *rx)
{
	struct ibv_recv_wr *bad;
	uint32_t i;

	if (rx->slots == 0)
		return 0;
	for (i = 0; i + 1 < rx->slots; i++)
		rx->wrs[i].next = &rx->wrs[i + 1];
	rx->wrs[rx->slots - 1].next = NULL;
	return ibv_post_recv(rx->qp, &rx->wrs[0], &bad);
}

int ibvb_rx_ready(ibvb_rx *rx)
{
	struct ibv_qp_attr mod;

	memset(&mod, 0, sizeof(mod));
	mod.qp_state = IBV_QPS_RTR;
	return p_ibv_modify_qp(rx->qp, &mod, IBV_QP_STATE);
}

int ibvb_rx_poll(ibvb_rx *rx, ibvb_completion *out, int max)
{
	int n, i;

	if (max > (int)rx->slots)
		max = (int)rx->slots;
	n = ibv_poll_cq(rx->recv_cq, max, rx->wc);
	for (i = 0; i < n; i++) {
		out[i].id = rx->wc[i].wr_id;
		out[i].len = rx->wc[i].byte_len;
		out[i].status = rx->wc[i].status;
	}
	return n;
}

int ibvb_rx_repost(ibvb_rx *rx, const uint64_t *ids, int n)
{
	struct ibv_recv_wr *bad;
	int i;

	if (n <= 0)
		return 0;
	for (i = 0; i < n; i++) {
		if (ids[i] >= rx->slots)
			return EINVAL;
		rx->wrs[ids[i]].next = (i + 1 < n) ? &rx->wrs[ids[i + 1]] : NULL;
	}
	return ibv_post_recv(rx->qp, &rx->wrs[ids[0]], &bad);
}

int ibvb_rx_post_split(ibvb_rx *rx, const ibvb_recv_wr *wrs, int n)
{
	struct ibv_recv_wr *head = NULL, **link = &head, *bad;
	int i;

	for (i = 0; i < n; i++) {
		const ibvb_recv_wr *w = &wrs[i];
		struct ibv_recv_wr *wr;
		struct ibv_sge *sg;
		uint64_t slot;
		uint32_t rest;

		if (w->id >= rx->slots)
			return EINVAL;
		if (w->len == 0) {
			wr = &rx->wrs[w->id];
		} else {
			if (rx->split_wrs == NULL || w->hdr_len == 0 ||
			    (uint64_t)w->hdr_len + w->len > rx->slot_len || w->addr < rx->mr_lo ||
			    w->addr + w->len < w->addr || w->addr + w->len > rx->mr_hi)
				return EINVAL;
			wr = &rx->split_wrs[w->id];
			sg = wr->sg_list;
			slot = rx->sges[w->id].addr;
			rest = rx->slot_len - w->hdr_len - w->len;
			sg[0].addr = slot;
			sg[0].length = w->hdr_len;
			sg[0].lkey = rx->mr->lkey;
			sg[1].addr = w->addr;
			sg[1].length = w->len;
			sg[1].lkey = rx->mr->lkey;
			sg[2].addr = slot + w->hdr_len;
			sg[2].length = rest;
			sg[2].lkey = rx->mr->lkey;
			wr->num_sge = rest ? 3 : 2;
		}
		*link = wr;
		link = &wr->next;
	}
	*link = NULL;
	if (head == NULL)
		return 0;
	return ibv_post_recv(rx->qp, head, &bad);
}

int ibvb_rx_flush(ibvb_rx *rx)
{
	struct ibv_qp_attr mod;

	memset(&mod, 0, sizeof(mod));
	mod.qp_state = IBV_QPS_ERR;
	return p_ibv_modify_qp(rx->qp, &mod, IBV_QP_STATE);
}

int ibvb_rx_arm(ibvb_rx *rx)
{
	return ibv_req_notify_cq(rx->recv_cq, 0);
}

int ibvb_rx_channel_fd(ibvb_rx *rx)
{
	return rx->chan ? rx->chan->fd : -1;
}

int ibvb_rx_get_event(ibvb_rx *rx)
{
	struct ibv_cq *cq;
	void *cq_ctx;

	errno = 0;
	if (p_ibv_get_cq_event(rx->chan, &cq, &cq_ctx) != 0)
		return errno ? errno : EIO;
	/* Ack at once: ibv_destroy_cq waits for every event it handed out to
	 * be acked, so an event kept unacked would hang Close. */
	p_ibv_ack_cq_events(cq, 1);
	return 0;
}

void ibvb_rx_close(ibvb_rx *rx)
{
	int i;

	if (rx == NULL)
		return;
	for (i = rx->nflows - 1; i >= 0; i--)
		ibv_destroy_flow(rx->flows[i]);
	free(rx->flows);
	if (rx->qp)
		p_ibv_destroy_qp(rx->qp);
	if (rx->send_cq)
		p_ibv_destroy_cq(rx->send_cq);
	if (rx->recv_cq)
		p_ibv_destroy_cq(rx->recv_cq);
	if (rx->chan)
		p_ibv_destroy_comp_channel(rx->chan);
	if (rx->mr)
		p_ibv_dereg_mr(rx->mr);
	if (rx->pd)
		p_ibv_dealloc_pd(rx->pd);
	if (rx->ctx)
		p_ibv_close_device(rx->ctx);
	free(rx->wrs);
	free(rx->sges);
	free(rx->split_wrs);
	free(rx->split_sges);
	free(rx->wc);
	free(rx);
}

/* ---- send side ---- */

struct ibvb_tx {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	struct ibv_comp_channel *chan;
	struct ibv_cq *send_cq;
	struct ibv_cq *recv_cq;
	struct ibv_qp *qp;
	struct ibv_send_wr *wrs;
	struct ibv_sge *sges;
	struct ibv_wc *wc;
	uint32_t slots;
};

ibvb_tx *ibvb_tx_open(const ibvb_tx_params *p, ibvb_tx_info *info, int *err_errno, const char **err_step)
{
	ibvb_tx *tx;
	struct ibv_qp_init_attr qa;
	struct ibv_qp_attr mod;
	struct ibv_device_attr_ex attr;
	uint32_t i;
	int e;

#define IBVB_TX_FAIL(step, code)                                             \
	do {                                                                 \
		*err_step = (step);                                          \
		*err_errno = (code) ? (code) : EIO;                          \
		ibvb_tx_close(tx);                                           \
		return NULL;                                                 \
	} while (0)

	memset(info, 0, sizeof(*info));
	tx = calloc(1, sizeof(*tx));
	if (tx == NULL) {
		*err_step = "calloc";
		*err_errno = ENOMEM;
		return NULL;
	}
	tx->slots = p->slots;
	tx->ctx = ibvb_open_by_name(p->dev_name, &e);
	if (tx->ctx == NULL)
		IBVB_TX_FAIL("ibv_open_device", e);
	e = ibvb_query_device_ex(tx->ctx, &attr);
	if (e != 0)
		IBVB_TX_FAIL("ibv_query_device", e);
	info->device_cap_flags = attr.orig_attr.device_cap_flags;
	info->raw_packet_caps = attr.raw_packet_caps;
	info->pacing_min_kbps = attr.packet_pacing_caps.qp_rate_limit_min;
	info->pacing_max_kbps = attr.packet_pacing_caps.qp_rate_limit_max;
	info->pacing_qpts = attr.packet_pacing_caps.supported_qpts;
	info->num_comp_vectors = tx->ctx->num_comp_vectors;
	errno = 0;
	tx->pd = p_ibv_alloc_pd(tx->ctx);
	if (tx->pd == NULL)
		IBVB_TX_FAIL("ibv_alloc_pd", errno);
	errno = 0;
	tx->mr = p_ibv_reg_mr(tx->pd, p->area, p->area_len, IBV_ACCESS_LOCAL_WRITE);
	if (tx->mr == NULL)
		IBVB_TX_FAIL("ibv_reg_mr", errno);
	if (p->comp_vector >= 0) {
		errno = 0;
		tx->chan = p_ibv_create_comp_channel(tx->ctx);
		if (tx->chan == NULL)
			IBVB_TX_FAIL("ibv_create_comp_channel", errno);
	}
	errno = 0;
	tx->send_cq = p_ibv_create_cq(tx->ctx, (int)p->slots, NULL, tx->chan,
				      (p->comp_vector >= 0 && tx->ctx->num_comp_vectors > 0)
					      ? p->comp_vector % tx->ctx->num_comp_vectors : 0);
	if (tx->send_cq == NULL)
		IBVB_TX_FAIL("ibv_create_cq", errno);
	/* A QP needs a receive CQ even if it never receives. */
	errno = 0;
	tx->recv_cq = p_ibv_create_cq(tx->ctx, 1, NULL, NULL, 0);
	if (tx->recv_cq == NULL)
		IBVB_TX_FAIL("ibv_create_cq (recv)", errno);
	memset(&qa, 0, sizeof(qa));
	qa.send_cq = tx->send_cq;
	qa.recv_cq = tx->recv_cq;
	qa.qp_type = IBV_QPT_RAW_PACKET;
	qa.cap.max_send_wr = p->slots;
	qa.cap.max_recv_wr = 1;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	qa.sq_sig_all = 0; /* only IBV_SEND_SIGNALED work requests complete */
	errno = 0;
	tx->qp = p_ibv_create_qp(tx->pd, &qa);
	if (tx->qp == NULL)
		IBVB_TX_FAIL("ibv_create_qp", errno);
	memset(&mod, 0, sizeof(mod));
	mod.qp_state = IBV_QPS_INIT;
	mod.port_num = (uint8_t)p->port;
	e = p_ibv_modify_qp(tx->qp, &mod, IBV_QP_STATE | IBV_QP_PORT);
	if (e != 0)
		IBVB_TX_FAIL("ibv_modify_qp (INIT)", e);
	memset(&mod, 0, sizeof(mod));
	mod.qp_state = IBV_QPS_RTR;
	e = p_ibv_modify_qp(tx->qp, &mod, IBV_QP_STATE);
	if (e != 0)
		IBVB_TX_FAIL("ibv_modify_qp (RTR)", e);
	memset(&mod, 0, sizeof(mod));
	mod.qp_state = IBV_QPS_RTS;
	e = p_ibv_modify_qp(tx->qp, &mod, IBV_QP_STATE);
	if (e != 0)
		IBVB_TX_FAIL("ibv_modify_qp (RTS)", e);

	tx->wrs = calloc(p->slots, sizeof(*tx->wrs));
	tx->sges = calloc(p->slots, sizeof(*tx->sges));
	tx->wc = calloc(p->slots, sizeof(*tx->wc));
	if (tx->wrs == NULL || tx->sges == NULL || tx->wc == NULL)
		IBVB_TX_FAIL("calloc", ENOMEM);
	for (i = 0; i < p->slots; i++) {
		tx->sges[i].addr = (uintptr_t)p->area + (uint64_t)i * p->stride;
		tx->sges[i].lkey = tx->mr->lkey;
		tx->wrs[i].sg_list = &tx->sges[i];
		tx->wrs[i].num_sge = 1;
		tx->wrs[i].opcode = IBV_WR_SEND;
	}
	return tx;
#undef IBVB_TX_FAIL
}

int ibvb_tx_set_rate(ibvb_tx *tx, uint32_t kbps, uint16_t typical_pkt_sz, uint32_t max_burst)
{
	struct ibv_qp_rate_limit_attr rl;
	struct ibv_qp_attr mod;
	int e;

	memset(&rl, 0, sizeof(rl));
	rl.rate_limit = kbps;
	rl.typical_pkt_sz = typical_pkt_sz;
	rl.max_burst_sz = max_burst;
	/* A verbs.h inline over the provider's ops: no symbol needed. */
	e = ibv_modify_qp_rate_limit(tx->qp, &rl);
	if (e != EOPNOTSUPP && e != ENOSYS)
		return e;
	memset(&mod, 0, sizeof(mod));
	mod.qp_state = IBV_QPS_RTS;
	mod.rate_limit = kbps;
	return p_ibv_modify_qp(tx->qp, &mod, IBV_QP_STATE | IBV_QP_RATE_LIMIT);
}

int ibvb_tx_post(ibvb_tx *tx, const ibvb_send_wr *wrs, int n)
{
	struct ibv_send_wr *bad;
	struct ibv_send_wr *w;
	int i;

	if (n <= 0)
		return 0;
	for (i = 0; i < n; i++) {
		if (wrs[i].slot >= tx->slots)
			return EINVAL;
		w = &tx->wrs[wrs[i].slot];
		w->wr_id = wrs[i].id;
		w->send_flags = wrs[i].flags;
		w->sg_list->length = wrs[i].len;
		w->next = (i + 1 < n) ? &tx->wrs[wrs[i + 1].slot] : NULL;
	}
	return ibv_post_send(tx->qp, &tx->wrs[wrs[0].slot], &bad);
}

int ibvb_tx_poll(ibvb_tx *tx, ibvb_completion *out, int max)
{
	int n, i;

	if (max > (int)tx->slots)
		max = (int)tx->slots;
	n = ibv_poll_cq(tx->send_cq, max, tx->wc);
	for (i = 0; i < n; i++) {
		out[i].id = tx->wc[i].wr_id;
		out[i].len = tx->wc[i].byte_len;
		out[i].status = tx->wc[i].status;
	}
	return n;
}

int ibvb_tx_arm(ibvb_tx *tx)
{
	return ibv_req_notify_cq(tx->send_cq, 0);
}

int ibvb_tx_channel_fd(ibvb_tx *tx)
{
	return tx->chan ? tx->chan->fd : -1;
}

int ibvb_tx_get_event(ibvb_tx *tx)
{
	struct ibv_cq *cq;
	void *cq_ctx;

	errno = 0;
	if (p_ibv_get_cq_event(tx->chan, &cq, &cq_ctx) != 0)
		return errno ? errno : EIO;
	p_ibv_ack_cq_events(cq, 1);
	return 0;
}

void ibvb_tx_close(ibvb_tx *tx)
{
	if (tx == NULL)
		return;
	if (tx->qp)
		p_ibv_destroy_qp(tx->qp);
	if (tx->recv_cq)
		p_ibv_destroy_cq(tx->recv_cq);
	if (tx->send_cq)
		p_ibv_destroy_cq(tx->send_cq);
	if (tx->chan)
		p_ibv_destroy_comp_channel(tx->chan);
	if (tx->mr)
		p_ibv_dereg_mr(tx->mr);
	if (tx->pd)
		p_ibv_dealloc_pd(tx->pd);
	if (tx->ctx)
		p_ibv_close_device(tx->ctx);
	free(tx->wrs);
	free(tx->sges);
	free(tx->wc);
	free(tx);
}

/* ---- ABI table for tests ---- */

#define IBVB_SZ(t) { "sizeof(" #t ")", sizeof(t) }
#define IBVB_OFF(t, f) { "offsetof(" #t "." #f ")", offsetof(t, f) }

static const ibvb_abi_entry ibvb_abi[] = {
	IBVB_SZ(struct ibv_flow_attr),
	IBVB_OFF(struct ibv_flow_attr, comp_mask),
	IBVB_OFF(struct ibv_flow_attr, type),
	IBVB_OFF(struct ibv_flow_attr, size),
	IBVB_OFF(struct ibv_flow_attr, priority),
	IBVB_OFF(struct ibv_flow_attr, num_of_specs),
	IBVB_OFF(struct ibv_flow_attr, port),
	IBVB_OFF(struct ibv_flow_attr, flags),
	IBVB_SZ(struct ibv_flow_spec_eth),
	IBVB_OFF(struct ibv_flow_spec_eth, type),
	IBVB_OFF(struct ibv_flow_spec_eth, size),
	IBVB_OFF(struct ibv_flow_spec_eth, val.dst_mac),
	IBVB_OFF(struct ibv_flow_spec_eth, val.src_mac),
	IBVB_OFF(struct ibv_flow_spec_eth, val.ether_type),
	IBVB_OFF(struct ibv_flow_spec_eth, val.vlan_tag),
	IBVB_OFF(struct ibv_flow_spec_eth, mask.dst_mac),
	IBVB_OFF(struct ibv_flow_spec_eth, mask.src_mac),
	IBVB_OFF(struct ibv_flow_spec_eth, mask.ether_type),
	IBVB_OFF(struct ibv_flow_spec_eth, mask.vlan_tag),
	IBVB_SZ(struct ibv_flow_spec_ipv4),
	IBVB_OFF(struct ibv_flow_spec_ipv4, type),
	IBVB_OFF(struct ibv_flow_spec_ipv4, size),
	IBVB_OFF(struct ibv_flow_spec_ipv4, val.src_ip),
	IBVB_OFF(struct ibv_flow_spec_ipv4, val.dst_ip),
	IBVB_OFF(struct ibv_flow_spec_ipv4, mask.src_ip),
	IBVB_OFF(struct ibv_flow_spec_ipv4, mask.dst_ip),
	IBVB_SZ(struct ibv_flow_spec_ipv4_ext),
	IBVB_OFF(struct ibv_flow_spec_ipv4_ext, type),
	IBVB_OFF(struct ibv_flow_spec_ipv4_ext, size),
	IBVB_OFF(struct ibv_flow_spec_ipv4_ext, val.src_ip),
	IBVB_OFF(struct ibv_flow_spec_ipv4_ext, val.dst_ip),
	IBVB_OFF(struct ibv_flow_spec_ipv4_ext, val.proto),
	IBVB_OFF(struct ibv_flow_spec_ipv4_ext, val.tos),
	IBVB_OFF(struct ibv_flow_spec_ipv4_ext, val.ttl),
	IBVB_OFF(struct ibv_flow_spec_ipv4_ext, val.flags),
	IBVB_OFF(struct ibv_flow_spec_ipv4_ext, mask.src_ip),
	IBVB_OFF(struct ibv_flow_spec_ipv4_ext, mask.dst_ip),
	IBVB_OFF(struct ibv_flow_spec_ipv4_ext, mask.proto),
	IBVB_OFF(struct ibv_flow_spec_ipv4_ext, mask.tos),
	IBVB_OFF(struct ibv_flow_spec_ipv4_ext, mask.ttl),
	IBVB_OFF(struct ibv_flow_spec_ipv4_ext, mask.flags),
	IBVB_SZ(struct ibv_flow_spec_tcp_udp),
	IBVB_OFF(struct ibv_flow_spec_tcp_udp, type),
	IBVB_OFF(struct ibv_flow_spec_tcp_udp, size),
	IBVB_OFF(struct ibv_flow_spec_tcp_udp, val.dst_port),
	IBVB_OFF(struct ibv_flow_spec_tcp_udp, val.src_port),
	IBVB_OFF(struct ibv_flow_spec_tcp_udp, mask.dst_port),
	IBVB_OFF(struct ibv_flow_spec_tcp_udp, mask.src_port),
	{ "IBV_FLOW_SPEC_ETH", IBV_FLOW_SPEC_ETH },
	{ "IBV_FLOW_SPEC_IPV4", IBV_FLOW_SPEC_IPV4 },
	{ "IBV_FLOW_SPEC_IPV4_EXT", IBV_FLOW_SPEC_IPV4_EXT },
	{ "IBV_FLOW_SPEC_TCP", IBV_FLOW_SPEC_TCP },
	{ "IBV_FLOW_SPEC_UDP", IBV_FLOW_SPEC_UDP },
	{ "IBV_FLOW_ATTR_NORMAL", IBV_FLOW_ATTR_NORMAL },
	{ "IBV_FLOW_ATTR_ALL_DEFAULT", IBV_FLOW_ATTR_ALL_DEFAULT },
	{ "IBV_FLOW_ATTR_MC_DEFAULT", IBV_FLOW_ATTR_MC_DEFAULT },
	{ "IBV_FLOW_ATTR_SNIFFER", IBV_FLOW_ATTR_SNIFFER },
	{ "IBV_DEVICE_MANAGED_FLOW_STEERING", IBV_DEVICE_MANAGED_FLOW_STEERING },
	{ "IBV_DEVICE_RAW_IP_CSUM", IBV_DEVICE_RAW_IP_CSUM },
	{ "IBV_DEVICE_RAW_SCATTER_FCS", IBV_DEVICE_RAW_SCATTER_FCS },
	{ "IBV_RAW_PACKET_CAP_CVLAN_STRIPPING", IBV_RAW_PACKET_CAP_CVLAN_STRIPPING },
	{ "IBV_RAW_PACKET_CAP_SCATTER_FCS", IBV_RAW_PACKET_CAP_SCATTER_FCS },
	{ "IBV_RAW_PACKET_CAP_IP_CSUM", IBV_RAW_PACKET_CAP_IP_CSUM },
	{ "IBV_QPT_RAW_PACKET", IBV_QPT_RAW_PACKET },
	{ "IBV_LINK_LAYER_INFINIBAND", IBV_LINK_LAYER_INFINIBAND },
	{ "IBV_LINK_LAYER_ETHERNET", IBV_LINK_LAYER_ETHERNET },
	{ "IBV_WC_SUCCESS", IBV_WC_SUCCESS },
	{ "IBV_SEND_SIGNALED", IBV_SEND_SIGNALED },
	{ "IBV_SEND_IP_CSUM", IBV_SEND_IP_CSUM },
	{ "sizeof(ibvb_send_wr)", sizeof(ibvb_send_wr) },
	{ "offsetof(ibvb_send_wr.slot)", offsetof(ibvb_send_wr, slot) },
	{ "offsetof(ibvb_send_wr.len)", offsetof(ibvb_send_wr, len) },
	{ "offsetof(ibvb_send_wr.flags)", offsetof(ibvb_send_wr, flags) },
	{ "sizeof(ibvb_recv_wr)", sizeof(ibvb_recv_wr) },
	{ "offsetof(ibvb_recv_wr.addr)", offsetof(ibvb_recv_wr, addr) },
	{ "offsetof(ibvb_recv_wr.len)", offsetof(ibvb_recv_wr, len) },
	{ "offsetof(ibvb_recv_wr.hdr_len)", offsetof(ibvb_recv_wr, hdr_len) },
	{ "IBV_WC_LOC_LEN_ERR", IBV_WC_LOC_LEN_ERR },
	{ "IBV_WC_WR_FLUSH_ERR", IBV_WC_WR_FLUSH_ERR },
	{ "sizeof(ibvb_completion)", sizeof(ibvb_completion) },
	{ "offsetof(ibvb_completion.len)", offsetof(ibvb_completion, len) },
	{ "offsetof(ibvb_completion.status)", offsetof(ibvb_completion, status) },
};

const ibvb_abi_entry *ibvb_abi_table(int *n)
{
	*n = (int)(sizeof(ibvb_abi) / sizeof(ibvb_abi[0]));
	return ibvb_abi;
}
