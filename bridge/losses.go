package bridge

import (
	"fmt"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/ibvbridge/ibvbridge/ring"
)

// A loss kind recv speaks up about: where its count comes from and what to change.
type lossKind struct {
	name   string
	ring   ring.Counter // a ring counter, or
	tr     string       // a transport counter ("" for a ring counter)
	advice func(l *lossWatch) string
}

// lossKinds are the losses recv logs at once: a heap dropped for a full ring, a consumer overrun, a heap
// cut to its slot, datagrams the kernel dropped (socket buffer full), a chunk-mode heap too old or
// rejected. Each names what to change.
var lossKinds = []lossKind{
	{name: "dropped_heaps", ring: ring.CounterDroppedHeaps, advice: func(l *lossWatch) string {
		return fmt.Sprintf("the ring was full: raise --slots (now %d) or speed up the slowest consumer%s%s", l.slots, l.slowest(), l.chunkAdvice())
	}},
	{name: "consumer_overruns", ring: ring.CounterConsumerOverruns, advice: func(l *lossWatch) string {
		return fmt.Sprintf("a consumer fell a whole ring behind and was detached%s: raise --slots (now %d) or speed it up%s", l.overrun(), l.slots, l.chunkAdvice())
	}},
	{name: "truncated_heaps", ring: ring.CounterTruncatedHeaps, advice: func(l *lossWatch) string {
		return fmt.Sprintf("heaps longer than a slot are cut: --slot-size %d holds the largest seen (now %d)", l.truncNeed.Load(), l.slotSize)
	}},
	{name: "kernel_drops", tr: "kernel_drops", advice: func(l *lossWatch) string {
		return "the socket buffer overflowed: raise --buffer (and net.core.rmem_max), or --threads"
	}},
	{name: "too_old_heaps", ring: ring.CounterTooOldHeaps, advice: func(l *lossWatch) string {
		return "heaps came for chunks already published: raise --chunk-window"
	}},
	{name: "rejected_heaps", ring: ring.CounterRejectedHeaps, advice: func(l *lossWatch) string {
		return "heaps no chunk position could take: check --chunk-by/--chunk-axis and --chunk-heap-size"
	}},
}

// lossWatch polls the counters of lossKinds: the first loss of a kind is logged at the next poll (within
// lossPoll), later ones in summaries at most every Every with the counts since the last line.
type lossWatch struct {
	p         *ring.Producer
	tr        func() map[string]uint64
	log       *zerolog.Logger
	every     time.Duration
	slots     uint64
	slotSize  uint64
	truncNeed atomic.Uint64 // the largest heap cut to its slot (set from the assembler's goroutine)

	seen     []uint64 // count at the last line, per kind
	pending  []uint64 // count now, per kind, not yet in a line
	spoke    []bool   // a first line was logged for the kind
	lastLine time.Time

	chunked  bool      // the ring is in chunk mode
	heaps    uint64    // the heaps counter at the last poll
	heapsAt  time.Time // when it was read
	heapRate float64   // the highest heaps per second between two polls since the last line
}

// chunkAdviceRate is the heap rate from which a loss in heap mode also suggests chunk mode: a consumer
// that takes heaps one at a time pays per heap (a Python loop, microseconds each), a chunk consumer per
// chunk of many heaps.
const chunkAdviceRate = 50_000

// lossPoll is how often the counters are read: the first loss of a kind is logged within it.
const lossPoll = 200 * time.Millisecond

// DefaultLossSummary is the least time between two summary lines of losses that go on.
const DefaultLossSummary = 10 * time.Second

func newLossWatch(p *ring.Producer, tr func() map[string]uint64, log *zerolog.Logger, every time.Duration) *lossWatch {
	if every <= 0 {
		every = DefaultLossSummary
	}
	g := p.Geometry()
	n := len(lossKinds)
	return &lossWatch{p: p, tr: tr, log: log, every: every, slots: g.SlotCount, slotSize: g.SlotSize,
		seen: make([]uint64, n), pending: make([]uint64, n), spoke: make([]bool, n), chunked: p.Chunks().Enabled()}
}

// chunkAdvice is, for a ring in heap mode receiving at least chunkAdviceRate heaps a second, the hint that
// chunk mode takes such rates: "; at N heaps/s …"; "" otherwise.
func (l *lossWatch) chunkAdvice() string {
	if l.chunked || l.heapRate < chunkAdviceRate {
		return ""
	}
	return fmt.Sprintf("; at %.0f heaps/s a consumer that takes heaps one at a time (a Python loop costs microseconds a heap) may not keep up: chunk mode (--chunk-heaps N) hands it many heaps per call", l.heapRate)
}

// noteTruncated records a heap cut to its slot that needed need bytes (AssemblerConfig.OnTruncated).
func (l *lossWatch) noteTruncated(need uint64) {
	for {
		old := l.truncNeed.Load()
		if need <= old || l.truncNeed.CompareAndSwap(old, need) {
			return
		}
	}
}

// poll reads the counters and logs: a first line for each kind that lost anything for the first time, and,
// for kinds that go on losing, one summary line once every has passed since the last line.
func (l *lossWatch) poll(now time.Time) {
	st := l.p.Stats()
	if h := st.Get(ring.CounterHeaps); l.heapsAt.IsZero() {
		l.heaps, l.heapsAt = h, now
	} else if now.After(l.heapsAt) {
		l.heapRate = max(l.heapRate, float64(h-l.heaps)/now.Sub(l.heapsAt).Seconds())
		l.heaps, l.heapsAt = h, now
	}
	var tc map[string]uint64
	for i, k := range lossKinds {
		var v uint64
		if k.tr != "" {
			if tc == nil {
				tc = l.tr()
			}
			v = tc[k.tr]
		} else {
			v = st.Get(k.ring)
		}
		l.pending[i] = v
		if v > l.seen[i] && !l.spoke[i] {
			l.spoke[i] = true
			l.log.Warn().Str("loss", k.name).Uint64("count", v-l.seen[i]).Str("fix", k.advice(l)).
				Msg("losing data: " + k.name)
			l.seen[i] = v
			l.lastLine = now
		}
	}
	if l.lastLine == now {
		l.heapRate = 0 // the rate of the next line is measured afresh
	}
	if now.Sub(l.lastLine) < l.every {
		return
	}
	ev := l.log.Warn()
	var kinds, fixes []string
	for i, k := range lossKinds {
		if d := l.pending[i] - l.seen[i]; d > 0 {
			ev = ev.Uint64(k.name, d)
			kinds = append(kinds, k.name)
			fixes = append(fixes, k.advice(l))
			l.seen[i] = l.pending[i]
		}
	}
	if len(kinds) == 0 {
		return
	}
	l.lastLine, l.heapRate = now, 0
	ev.Str("since", l.every.String()).Strs("fix", fixes).Msg("still losing data: " + strings.Join(kinds, ", "))
}

// slowest names the attached consumer furthest behind: ", consumer pid P (row R) is N heaps behind".
func (l *lossWatch) slowest() string {
	rows := l.p.ConsumerRows()
	var worst *ring.ConsumerInfo
	for i := range rows {
		if rows[i].Attached() && (worst == nil || rows[i].Lag > worst.Lag) {
			worst = &rows[i]
		}
	}
	if worst == nil {
		return ""
	}
	return fmt.Sprintf(" (consumer pid %d, row %d, is %d heaps behind)", worst.PID, worst.Index, worst.Lag)
}

// overrun names the consumers detached for an overrun: " (pid P row R, ...)".
func (l *lossWatch) overrun() string {
	var who []string
	for _, r := range l.p.ConsumerRows() {
		if r.State == ring.ConsumerOverrun.String() {
			who = append(who, fmt.Sprintf("pid %d row %d lost %d heaps", r.PID, r.Index, r.LostHeaps))
		}
	}
	if len(who) == 0 {
		return ""
	}
	sort.Strings(who)
	return " (" + strings.Join(who, "; ") + ")"
}
