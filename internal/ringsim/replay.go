package ringsim

// The replay stream: the fast way to play the simulation against a real producer.
//
// The lockstep run (Run with a real Target) talks to the producer for every call and waits out every
// block publish: a few hundred operations a second. The replay stream instead records, while the model
// plays a scenario, every call the harness makes of a producer together with the model's answer, and a
// replayer in the producer's own language and process plays the calls against its producer and compares
// every answer as it goes. The harness's consumers act on what they read, but what they then write is in
// the stream, so a replayer needs no harness: it makes the calls and checks the words. A replayer that
// finds a difference names the seed and step; `SIM_TARGETS=<target> go test ./internal/ringsim -run
// 'TestSimProducers$' -seed S -steps N` then replays that scenario in lockstep, with the full report.
//
// The stream is a sequence of 32-byte little-endian records:
//
//	offset 0  u8  kind (an ASCII letter, below)
//	offset 1  u8  a
//	offset 2  u16 b
//	offset 4  u32 c
//	offset 8  u64 x
//	offset 16 u64 y
//	offset 24 u64 z
//
// Kinds:
//
//	'N' a new scenario: a policy (0 drop, 1 block), b consumer rows (max_consumers), c slot count,
//	    x the initial position, y the seed. The replayer closes its producer, if any, and creates a new
//	    one: slot size 64, max_items 1, meta_size 4096, no huge pages, 16 observers, no heartbeat
//	    thread sweeping on its own (the stream decides when cursors are read).
//	'A' attach: a observer (0/1), b client minor, c group id, x start (0 oldest, 1 head), y the
//	    expected start position (the region's tail after admission), z = status | row<<16 | gen<<32
//	    (row 0xffff when refused). The replayer admits the consumer through its producer's own admission
//	    code (no socket needed) and compares status, row, generation and tail; it keeps the row's
//	    region to store into. An observer is not replayed (the record says status 0).
//	'C' close: c row. The consumer's connection ends: the producer detaches it as it does when the
//	    socket closes; its row then no longer says attached, and its region is the replayer's no more.
//	'P' publish: a 1 for the end-of-stream marker, b the expected Result (0 published, 1 dropped,
//	    2 pending, 3 full). Under drop a heap the producer has no slot for is counted in dropped_heaps
//	    by the replayer, as recv counts it. Under block the replayer never waits: where its producer
//	    would wait the result is pending, and the publish stays pending (one at most).
//	'S' settle: a 1 when a publish is still pending afterwards. Every consumer's cursor is read, as the
//	    heartbeat reads them (no reclaim); then a pending publish is tried again without waiting (it must
//	    succeed exactly when a is 0). In that order (Model.Settle's): a member's read beyond head that the
//	    retry's publish makes valid is accepted at the next settle, not at this one.
//	'W' store: a field (0 tail, 1 read, 2 handed, 3 wake_at, 4 consumer_waiting), c row, x value. A
//	    release store into the row's region (offsets 0x000, 0x090, 0x098, 0x088, 0x080; consumer_waiting
//	    is 32 bits). A row the replayer holds no region for (detached) is skipped.
//	'O' check a word of control memory: a width in bytes (4 or 8), c offset, x the expected value.
//	'M' check an assign word: x position, y the expected assign word of the descriptor of slot
//	    x mod slot count (offset 0x38 in the 64-byte descriptor, spec §4).
//	'F' free slots: reclaim (the producer's lock held), then the count of free slots must be x.
//	'E' end of step: c the step's number in the scenario (0 based).
//	'Z' end of the stream: the replayer closes its producer, prints "ok STEPS SCENARIOS" and exits 0.
//
// A replayer prints one line on a difference, "seed S step K: WHAT: got G, want W", and exits 1.
//
// The 'O' and 'M' records of a step are the words that changed in the model since the last check, every
// word the lockstep comparison checks once every fullEvery steps: a producer that changes a word it
// should not is found within that many steps. What the lockstep run compares and the stream does not:
// blocked_on (a replayer never waits), group_skipped and skipped (as in lockstep), observers.

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"io"
)

// Replay record kinds.
const (
	RecScenario = 'N'
	RecAttach   = 'A'
	RecClose    = 'C'
	RecPublish  = 'P'
	RecSettle   = 'S'
	RecStore    = 'W'
	RecWord     = 'O'
	RecMask     = 'M'
	RecFree     = 'F'
	RecStep     = 'E'
	RecEnd      = 'Z'
)

// RecordSize is the size of one replay record.
const RecordSize = 32

// fullEvery is how often (in steps) a replay stream checks every word, changed or not.
const fullEvery = 64

// Record is one replay record.
type Record struct {
	Kind    byte
	A       uint8
	B       uint16
	C       uint32
	X, Y, Z uint64
}

func (r Record) put(b []byte) {
	b[0], b[1] = r.Kind, r.A
	binary.LittleEndian.PutUint16(b[2:], r.B)
	binary.LittleEndian.PutUint32(b[4:], r.C)
	binary.LittleEndian.PutUint64(b[8:], r.X)
	binary.LittleEndian.PutUint64(b[16:], r.Y)
	binary.LittleEndian.PutUint64(b[24:], r.Z)
}

// ReadRecord decodes one record.
func ReadRecord(b []byte) Record {
	le := binary.LittleEndian
	return Record{Kind: b[0], A: b[1], B: le.Uint16(b[2:]), C: le.Uint32(b[4:]), X: le.Uint64(b[8:]),
		Y: le.Uint64(b[16:]), Z: le.Uint64(b[24:])}
}

// Region field offsets a 'W' record stores at (spec §7.4, §14.2), by Field.
var regionOffset = [...]int{FTail: regTail, FRead: regRead, FHanded: regHanded, FWakeAt: regWakeAt, FWaiting: regWaiting}

// Control-memory offsets of a row's words (spec §2.2).
const (
	rowOffState    = 0x00
	rowOffGen      = 0x04
	rowOffReleased = 0x20
	rowOffWakes    = 0x28
	rowOffLost     = 0x30
	rowOffAssigned = 0x38
	rowOffGroup    = 0x40
	rowOffRead     = 0x48
	rowOffQueued   = 0x50
)

// recorder is a Target that writes the replay stream: a shadow model (fed every call the harness makes
// of a target, so it stays in step with the harness's own model) answers, and each call is written with
// its answer.
type recorder struct {
	modelTarget
	s     Scenario
	w     *bufio.Writer
	buf   [RecordSize]byte
	step  uint32
	err   error
	words []uint64 // by ctl offset / 4: the value last checked, with known
	known []bool
	masks []uint64 // by slot: the assign word last checked, for position maskQ
	maskQ []uint64
	maskK []bool
}

func newRecorder(w *bufio.Writer, s Scenario) *recorder {
	n := (ctlTable + rowSize*s.Rows) / 4
	return &recorder{modelTarget: modelTarget{NewModel(s.Slots, s.Rows, s.Policy, s.P0, MutNone)}, s: s, w: w,
		words: make([]uint64, n), known: make([]bool, n), masks: make([]uint64, s.Slots), maskQ: make([]uint64, s.Slots),
		maskK: make([]bool, s.Slots)}
}

func (r *recorder) emit(rec Record) {
	if r.err != nil {
		return
	}
	rec.put(r.buf[:])
	_, r.err = r.w.Write(r.buf[:])
}

func (r *recorder) Name() string { return "replay" }

func (r *recorder) Attach(group uint32, minor uint16, start uint32, observer bool) (int, uint32, uint64, int, error) {
	row, gen, tail, st, err := r.modelTarget.Attach(group, minor, start, observer)
	enc := uint64(uint16(row)) << 16
	if row < 0 {
		enc = 0xffff << 16
	}
	r.emit(Record{Kind: RecAttach, A: uint8(btoi(observer)), B: minor, C: group, X: uint64(start), Y: tail,
		Z: uint64(st) | enc | uint64(gen)<<32})
	return row, gen, tail, st, err
}

func (r *recorder) Close(row int, gen uint32) error {
	r.emit(Record{Kind: RecClose, C: uint32(row)})
	return r.modelTarget.Close(row, gen)
}

func (r *recorder) Publish(eos bool, want Result) (Result, error) {
	res, err := r.modelTarget.Publish(eos, want)
	r.emit(Record{Kind: RecPublish, A: uint8(btoi(eos)), B: uint16(res)})
	return res, err
}

func (r *recorder) Settle(want Outcome) error {
	err := r.modelTarget.Settle(want)
	r.emit(Record{Kind: RecSettle, A: uint8(btoi(r.Model.IsPending()))})
	return err
}

func (r *recorder) Store(row int, f Field, v uint64) {
	r.Model.Store(row, f, v)
	r.emit(Record{Kind: RecStore, A: uint8(f), C: uint32(row), X: v})
}

// Observe ends the step: the words that changed (all of them every fullEvery steps), the free slots
// when the producers count them, then the step's end.
func (r *recorder) Observe() Outcome {
	o := r.Model.Observe()
	full := r.step%fullEvery == 0
	word := func(off int, width uint8, v uint64) {
		i := off / 4
		if full || !r.known[i] || r.words[i] != v {
			r.emit(Record{Kind: RecWord, A: width, C: uint32(off), X: v})
			r.words[i], r.known[i] = v, true
		}
	}
	forget := func(off int) { r.known[off/4] = false }
	word(ctlHead, 8, o.Head)
	stats := [...]struct {
		i int
		v uint64
	}{{statDropped, o.Stats.Dropped}, {statOverruns, o.Stats.Overruns}, {statErrors, o.Stats.Errors},
		{statGroupLost, o.Stats.GroupLost}, {statEOS, o.Stats.EOS}}
	for _, s := range stats {
		if !ignore[statName(s.i)] {
			word(ctlStats+8*s.i, 8, s.v)
		}
	}
	for i, row := range o.Rows {
		base := ctlTable + rowSize*i
		word(base+rowOffState, 4, uint64(row.State))
		word(base+rowOffGen, 4, uint64(row.Gen))
		cmp := func(off int, on bool, v uint64) {
			if on {
				word(base+off, 8, v)
			} else {
				forget(base + off)
			}
		}
		live := row.State != RowFree
		att := row.State == RowAttached
		if live {
			word(base+rowOffGroup, 4, uint64(row.Group))
		} else {
			forget(base + rowOffGroup)
		}
		cmp(rowOffReleased, live, row.Released)
		cmp(rowOffLost, (row.State == RowOverrun || row.State == RowBadCursor) && !ignore["lost"], row.Lost)
		cmp(rowOffWakes, att && !ignore["wakes"], row.Wakes)
		grp := att && row.Group != 0
		cmp(rowOffAssigned, grp && !ignore["assigned"], row.Assigned)
		cmp(rowOffQueued, grp && !ignore["progress"], row.Queued)
		cmp(rowOffRead, grp && !ignore["progress"], row.Read)
	}
	// the assign words a reader of the real ring sees (rawRing.masks), when the model describes the same
	rawFrom := r.s.P0
	if o.Head-r.s.P0 > r.s.Slots {
		rawFrom = o.Head - r.s.Slots
	}
	if o.MaskFrom == rawFrom {
		for k, m := range o.Masks {
			q := o.MaskFrom + uint64(k)
			i := q & (r.s.Slots - 1)
			if full || !r.maskK[i] || r.maskQ[i] != q || r.masks[i] != m {
				r.emit(Record{Kind: RecMask, X: q, Y: m})
				r.masks[i], r.maskQ[i], r.maskK[i] = m, q, true
			}
		}
	}
	if o.Free >= 0 && !o.Pending {
		r.emit(Record{Kind: RecFree, X: uint64(o.Free)})
	}
	r.emit(Record{Kind: RecStep, C: r.step})
	r.step++
	return o
}

// statName is the SIM_IGNORE name of a counter the stream checks ("" when it has none).
func statName(i int) string {
	if i == statEOS {
		return "eos"
	}
	return ""
}

// WriteReplay writes the replay stream of scenarios seeds[0], seeds[1], … (steps each) to w, the model
// checking every invariant as it plays them. It stops at the first failure of the model.
func WriteReplay(w io.Writer, seeds func(yield func(uint64) bool), steps int) (scenarios, total int, err error) {
	bw := bufio.NewWriterSize(w, 1<<16)
	for seed := range seeds {
		s := ScenarioFor(seed)
		rec := newRecorder(bw, s)
		rec.emit(Record{Kind: RecScenario, A: uint8(s.Policy), B: uint16(s.Rows), C: uint32(s.Slots), X: s.P0, Y: seed})
		if _, err := Run(s, steps, MutNone, rec); err != nil {
			return scenarios, total, err
		}
		if rec.err != nil {
			return scenarios, total, fmt.Errorf("replay stream: %w", rec.err)
		}
		scenarios++
		total += int(rec.step)
	}
	var end [RecordSize]byte
	Record{Kind: RecEnd}.put(end[:])
	if _, err := bw.Write(end[:]); err != nil {
		return scenarios, total, fmt.Errorf("replay stream: %w", err)
	}
	if err := bw.Flush(); err != nil {
		return scenarios, total, fmt.Errorf("replay stream: %w", err)
	}
	return scenarios, total, nil
}
