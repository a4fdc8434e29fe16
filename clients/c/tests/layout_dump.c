/* layout_dump — print every layout offset/size constant as "NAME VALUE" (decimal), for the golden test
 * that compares C, Go and Python. Offsets come from offsetof() on the header's structs, so this also
 * proves the structs (the _Static_asserts in ibvbridge.h pin them to the IBVB_OFF_* macros).
 *
 * Naming: control-file fields by their spec name (head, tail, stats, ...); descriptor fields "desc.X",
 * item fields "item.X", metadata header "meta.X", metadata record "meta_record.X". Where a header field
 * name is also a size constant (ctl_size, desc_size, item_size) the bare name is the constant's value and
 * the field's offset is "header.NAME". Flags, states, policies and counters are "flag.X", "item_flag.X",
 * "state.X", "policy.X", "counter.X". */
#include <inttypes.h>
#include <stdio.h>

#include "ibvbridge.h"

#define P(name, v) printf("%s %" PRIu64 "\n", name, (uint64_t)(v))
#define C(f) P(#f, offsetof(struct ibvb_ctl, f))
#define D(f) P("desc." #f, offsetof(struct ibvb_desc, f))
#define I(f) P("item." #f, offsetof(struct ibvb_item, f))
#define M(f) P("meta_record." #f, offsetof(struct ibvb_meta_record_header, f))

int main(void)
{
	/* sizes and constants */
	P("magic_value", IBVB_MAGIC);
	P("major_value", IBVB_MAJOR);
	P("minor_value", IBVB_MINOR);
	P("ctl_size", IBVB_CTL_SIZE);
	P("desc_size", sizeof(struct ibvb_desc));
	P("item_size", sizeof(struct ibvb_item));
	P("data_path_max", IBVB_DATA_PATH_MAX);
	P("stats_slots", IBVB_STATS_SLOTS);
	P("stats_count", IBVB_STATS_COUNT);
	P("region_align", IBVB_REGION_ALIGN);
	P("max_slot_count", IBVB_MAX_SLOT_COUNT);
	P("max_items_limit", IBVB_MAX_ITEMS);
	P("meta_header_size", sizeof(struct ibvb_meta_header));
	P("meta_record_header_size", sizeof(struct ibvb_meta_record_header));
	P("meta_ndim_unknown", IBVB_META_NDIM_UNKNOWN);

	/* control file (§2) */
	C(magic);
	C(major);
	C(minor);
	P("header.ctl_size", offsetof(struct ibvb_ctl, ctl_size));
	C(state);
	C(policy);
	C(session_id);
	C(producer_pid);
	C(producer_start_ns);
	C(slot_count);
	C(slot_size);
	C(max_items);
	P("header.desc_size", offsetof(struct ibvb_ctl, desc_size));
	P("header.item_size", offsetof(struct ibvb_ctl, item_size));
	C(page_size);
	C(data_file_size);
	C(desc_offset);
	C(items_offset);
	C(meta_offset);
	C(meta_size);
	C(payload_offset);
	C(packet_offset);
	C(packet_size);
	C(features);
	P("header.stats_count", offsetof(struct ibvb_ctl, stats_count));
	C(data_path);
	C(head);
	C(consumer_waiting);
	C(consumer_futex);
	C(tail);
	C(producer_waiting);
	C(producer_futex);
	C(consumer_pid);
	C(consumer_attach_ns);
	C(heartbeat_ns);
	C(stats);
	P("ctl_reserved", offsetof(struct ibvb_ctl, reserved));

	/* descriptor (§4) */
	D(seq);
	D(heap_cnt);
	D(heap_size);
	D(received);
	D(timestamp_ns);
	D(slot);
	D(flags);
	D(item_count);
	D(packets);
	D(reserved);

	/* item (§5) */
	I(id);
	I(value);
	I(length);
	I(flags);
	I(reserved);

	/* metadata (§6) */
	P("meta.seq", offsetof(struct ibvb_meta_header, seq));
	P("meta.length", offsetof(struct ibvb_meta_header, length));
	P("meta.records", sizeof(struct ibvb_meta_header));
	M(record_size);
	M(ndim);
	M(id);
	M(name_len);
	M(description_len);
	M(format_len);
	M(dtype_len);
	P("meta_record.shape", sizeof(struct ibvb_meta_record_header));

	/* enumerations */
	P("state.init", IBVB_STATE_INIT);
	P("state.ready", IBVB_STATE_READY);
	P("state.closed", IBVB_STATE_CLOSED);
	P("policy.drop", IBVB_POLICY_DROP);
	P("policy.block", IBVB_POLICY_BLOCK);
	P("flag.complete", IBVB_FLAG_COMPLETE);
	P("flag.incomplete", IBVB_FLAG_INCOMPLETE);
	P("flag.truncated", IBVB_FLAG_TRUNCATED);
	P("flag.end_of_stream", IBVB_FLAG_END_OF_STREAM);
	P("flag.has_descriptors", IBVB_FLAG_HAS_DESCRIPTORS);
	P("flag.items_overflow", IBVB_FLAG_ITEMS_OVERFLOW);
	P("flag.no_heap_size", IBVB_FLAG_NO_HEAP_SIZE);
	P("item_flag.immediate", IBVB_ITEM_IMMEDIATE);
	for (unsigned i = 0; i < IBVB_CTR_COUNT; i++) {
		static const char *n[] = {"packets",          "bytes",           "heaps",
					  "incomplete_heaps", "dropped_heaps",   "malformed_packets",
					  "duplicate_packets", "truncated_heaps", "discarded_incomplete_heaps",
					  "end_of_stream"};
		printf("counter.%s %u\n", n[i], i);
	}
	return 0;
}
