/* layout_dump — print every layout offset/size constant as "NAME VALUE" (decimal), for the golden test
 * that compares C, Go and Python (ring/layout.go LayoutTable is the reference). Offsets come from offsetof()
 * on the header's structs, so this also proves the structs (the _Static_asserts in ibvbridge.h pin them to
 * the IBVB_*OFF_* macros).
 *
 * Naming: control-memory fields by their spec name (head, stats, ...); where a header field name is also a
 * size constant (ctl_size, desc_size, item_size, stats_count, max_consumers) the field's offset is
 * "header.NAME". Consumer-table row "row.X", consumer region "region.X", handshake "hello.X" /
 * "welcome.X" (welcome.message: the error record's message), descriptor "desc.X", item "item.X", metadata
 * header "meta.X", metadata record "meta_record.X". Enumerations "state.X", "policy.X",
 * "consumer_state.X", "role.X", "start.X", "status.X", "flag.X", "item_flag.X", "feature.X", "counter.X". */
#include <inttypes.h>
#include <stdio.h>

#include "ibvbridge.h"

#define P(name, v) printf("%s %" PRIu64 "\n", name, (uint64_t)(v))
#define C(f) P(#f, offsetof(struct ibvb_ctl, f))
#define ROW(f) P("row." #f, offsetof(struct ibvb_row, f))
#define REG(f) P("region." #f, offsetof(struct ibvb_region, f))
#define HE(f) P("hello." #f, offsetof(struct ibvb_hello, f))
#define WE(f) P("welcome." #f, offsetof(struct ibvb_welcome, f))
#define D(f) P("desc." #f, offsetof(struct ibvb_desc, f))
#define I(f) P("item." #f, offsetof(struct ibvb_item, f))
#define M(f) P("meta_record." #f, offsetof(struct ibvb_meta_record_header, f))

int main(void)
{
	/* sizes and constants */
	P("magic_value", IBVB_MAGIC);
	P("major_value", IBVB_MAJOR);
	P("minor_value", IBVB_MINOR);
	P("desc_size", sizeof(struct ibvb_desc));
	P("item_size", sizeof(struct ibvb_item));
	P("stats_slots", IBVB_STATS_SLOTS);
	P("stats_count", IBVB_STATS_COUNT);
	P("region_align", IBVB_REGION_ALIGN);
	P("max_slot_count", IBVB_MAX_SLOT_COUNT);
	P("max_items_limit", IBVB_MAX_ITEMS);
	P("meta_header_size", sizeof(struct ibvb_meta_header));
	P("meta_record_header_size", sizeof(struct ibvb_meta_record_header));
	P("meta_ndim_unknown", IBVB_META_NDIM_UNKNOWN);
	P("row_size", sizeof(struct ibvb_row));
	P("region_size", sizeof(struct ibvb_region));
	P("max_consumers_limit", IBVB_MAX_CONSUMERS_LIMIT);
	P("default_max_consumers", IBVB_DEFAULT_MAX_CONSUMERS);
	P("hello_size", sizeof(struct ibvb_hello));
	P("welcome_size", sizeof(struct ibvb_welcome));
	P("error_record_max", sizeof(struct ibvb_error_record));
	P("no_consumer_index", IBVB_NO_CONSUMER_INDEX);

	/* control memory (§2) */
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
	C(data_size);
	C(desc_offset);
	C(items_offset);
	C(meta_offset);
	C(meta_size);
	C(payload_offset);
	C(packet_offset);
	C(packet_size);
	C(features);
	P("header.stats_count", offsetof(struct ibvb_ctl, stats_count));
	P("header.max_consumers", offsetof(struct ibvb_ctl, max_consumers));
	C(chunk_heaps);
	C(chunk_axis);
	C(chunk_heap_size);
	C(chunk_step);
	C(chunk_time_item);
	C(chunk_axis_item);
	C(producer_version);
	P("producer_version_max", IBVB_PRODUCER_VERSION_MAX);
	P("name_max", IBVB_NAME_MAX);
	P("group_name_max", IBVB_GROUP_NAME_MAX);
	C(head);
	C(producer_waiting);
	C(heartbeat_ns);
	C(oldest);
	C(blocked_on);
	C(blocked_since_ns);
	C(stats);
	P("consumer_table", sizeof(struct ibvb_ctl));

	/* consumer table row (§2.2) */
	ROW(state);
	ROW(generation);
	ROW(pid);
	ROW(uid);
	ROW(attach_ns);
	ROW(released);
	ROW(wakes);
	ROW(lost_heaps);
	ROW(assigned);
	ROW(group_id);
	ROW(client_minor);
	ROW(read);
	ROW(queued);
	ROW(skipped);

	/* consumer region (§3) */
	REG(tail);
	REG(consumer_waiting);
	REG(consumer_futex);
	REG(wake_at);
	REG(read);
	REG(handed);
	REG(release_futex);
	REG(spin_budget_ns);

	/* handshake (§1.2) */
	HE(magic);
	HE(major);
	HE(minor);
	HE(role);
	HE(start);
	HE(group_id);
	WE(magic);
	WE(major);
	WE(minor);
	WE(status);
	WE(consumer_index);
	WE(generation);
	WE(session_id);
	WE(ctl_size);
	WE(data_size);
	WE(region_size);
	P("welcome.message", offsetof(struct ibvb_error_record, message));

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
	D(assign);

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
	P("consumer_state.free", IBVB_CONSUMER_FREE);
	P("consumer_state.attached", IBVB_CONSUMER_ATTACHED);
	P("consumer_state.overrun", IBVB_CONSUMER_OVERRUN);
	P("consumer_state.bad_cursor", IBVB_CONSUMER_BAD_CURSOR);
	P("consumer_state.gone", IBVB_CONSUMER_GONE);
	P("role.consumer", IBVB_ROLE_CONSUMER);
	P("role.observer", IBVB_ROLE_OBSERVER);
	P("start.oldest", IBVB_START_OLDEST);
	P("start.head", IBVB_START_HEAD);
	P("status.ok", IBVB_STATUS_OK);
	P("status.version", IBVB_STATUS_VERSION);
	P("status.not_permitted", IBVB_STATUS_NOT_PERMITTED);
	P("status.busy", IBVB_STATUS_BUSY);
	P("status.closing", IBVB_STATUS_CLOSING);
	P("status.protocol", IBVB_STATUS_PROTOCOL);
	P("flag.complete", IBVB_FLAG_COMPLETE);
	P("flag.incomplete", IBVB_FLAG_INCOMPLETE);
	P("flag.truncated", IBVB_FLAG_TRUNCATED);
	P("flag.end_of_stream", IBVB_FLAG_END_OF_STREAM);
	P("flag.has_descriptors", IBVB_FLAG_HAS_DESCRIPTORS);
	P("flag.items_overflow", IBVB_FLAG_ITEMS_OVERFLOW);
	P("flag.no_heap_size", IBVB_FLAG_NO_HEAP_SIZE);
	P("flag.items_cut", IBVB_FLAG_ITEMS_CUT);
	P("flag.chunk", IBVB_FLAG_CHUNK);
	P("flag.stream_end", IBVB_FLAG_STREAM_END);
	P("item_flag.immediate", IBVB_ITEM_IMMEDIATE);
	P("item_flag.cut", IBVB_ITEM_CUT);
	P("feature.replay_timestamps", IBVB_FEATURE_REPLAY_TIMESTAMPS);
	P("feature.chunks", IBVB_FEATURE_CHUNKS);
	for (unsigned i = 0; i < IBVB_CTR_COUNT; i++)
		printf("counter.%s %u\n", ibvb_counter_name(i), i);
	return 0;
}
