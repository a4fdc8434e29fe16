package verbs

import (
	"strings"

	"github.com/ibvbridge/ibvbridge/frame"
)

// Counters is the receiver's counters by name, for recv's final counters:
// the loop's (frames, errors, polls, ...), the frames dropped in total and
// per reason ("dropped_vlan_tagged", ...; only reasons seen), and the
// packets handed to the sink.
func (r *Receiver) Counters() map[string]uint64 {
	st := &r.Stats
	frames, dropped := st.Frames.Load(), r.Dropped.Load()
	m := map[string]uint64{
		"frames":          frames,
		"packets":         frames - min(frames, dropped),
		"dropped":         dropped,
		"completion_errs": st.Errors.Load(),
		"polls":           st.Polls.Load(),
		"empty_polls":     st.Empty.Load(),
		"arms":            st.Arms.Load(),
		"waits":           st.Waits.Load(),
		"reposts":         st.Reposts.Load(),
	}
	for i := range r.DroppedBy {
		if n := r.DroppedBy[i].Load(); n > 0 {
			m["dropped_"+strings.ReplaceAll(frame.Reason(i).String(), " ", "_")] = n
		}
	}
	return m
}
