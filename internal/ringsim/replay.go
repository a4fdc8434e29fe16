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
//	    region to store into. An observer is not replayed (the record says status 0). An independent
//	    consumer with start 0 (x 0, c 0) may begin elsewhere than the model's start (§7.1 lets producers
//	    choose): when any consumer is attached the replayer reclaims first (the model reclaims at once);
//	    a start before the model's is followed by the consumer storing the model's start as its tail at
//	    once; a start after it the stream cannot follow: the replayer skips to the next scenario and
//	    counts it cut (lockstep runs follow such a start).
//	'C' close: c row. The consumer's connection ends: the producer detaches it as it does when the
//	    socket closes; its row then no longer says attached, and its region is the replayer's no more.
//	'P' publish: a 1 for the end-of-stream marker, b the expected Result (0 published, 1 dropped,
//	    2 pending, 3 full). Under drop a heap the producer has no slot for is counted in dropped_heaps
//	    by the replayer, as recv counts it. Under block the replayer never waits: where its producer
//	    would wait the result is pending, and the publish stays pending (one at most).
//	'S' settle: a 1 when a publish is still pending afterwards. A pending publish is tried again without
//	    waiting, as a waiting producer looks (reading every cursor, reclaiming; again at once while a
//	    look detaches someone): it must succeed exactly when a is 0. Then every consumer's cursor is read,
//	    as the heartbeat reads them (no reclaim): after the retry's publish, at the new head, as the model
//	    reads them again.
//	'W' store: a field (0 tail, 1 read, 2 handed, 3 wake_at, 4 consumer_waiting), c row, x value. A
//	    release store into the row's region (offsets 0x000, 0x090, 0x098, 0x088, 0x080; consumer_waiting
//	    is 32 bits). A row the replayer holds no region for (detached) is skipped.
//	'O' check a word of control memory: a width in bytes (4 or 8), c offset, x the expected value.
//	'M' check an assign word: x position, y the expected assign word of the descriptor of slot
//	    x mod slot count (offset 0x38 in the 64-byte descriptor, spec §4).
//	'F' free slots: reclaim (the producer's lock held), then the count of free slots must be x.
//	'E' end of step: c the step's number in the scenario (0 based).
//	'Z' end of the stream: the replayer closes its producer, prints "ok STEPS SCENARIOS CUT" and exits 0.
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
	"os"
	"strconv"
	"strings"
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

// recorder is the model's target (lane 0 of run) writing the replay stream: every call the harness makes
// of it is answered by the model and written with the model's answer.
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
	return &recorder{s: s, w: w, words: make([]uint64, n), known: make([]bool, n), masks: make([]uint64, s.Slots),
		maskQ: make([]uint64, s.Slots), maskK: make([]bool, s.Slots)}
}

func (r *recorder) emit(rec Record) {
	if r.err != nil {
		return
	}
	rec.put(r.buf[:])
	_, r.err = r.w.Write(r.buf[:])
}

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

// settled follows the model's Settle (run calls it).
func (r *recorder) settled() {
	r.emit(Record{Kind: RecSettle, A: uint8(btoi(r.Model.IsPending()))})
}

func (r *recorder) Store(row int, f Field, v uint64) {
	r.Model.Store(row, f, v)
	r.emit(Record{Kind: RecStore, A: uint8(f), C: uint32(row), X: v})
}

// endStep ends the step whose outcome is o: the words that changed (all of them every fullEvery steps),
// the free slots when the producers count them, then the step's end.
func (r *recorder) endStep(o Outcome) {
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
		if _, err := run(s, steps, MutNone, rec); err != nil {
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

// ReplayProducer is a producer a replay stream is played against in the replayer's own process (the Go
// producer's is in package ring's tests; the C and Python producers have replayer programs).
type ReplayProducer interface {
	// Create closes the previous producer, if any, and creates one of s's shape (see 'N').
	Create(s Scenario) error
	// Attach admits a consumer through the producer's admission code, without a socket; region is the
	// consumer's region (valid until Gone).
	Attach(group uint32, minor uint16, start uint32) (row int, gen uint32, status int, region []byte)
	// Gone detaches row as the producer does when the consumer's connection ends.
	Gone(row int)
	// Publish publishes a heap (counting dropped_heaps when drop finds no slot) or the end-of-stream
	// marker; it never waits: where the producer would, the result is Pending and the publish is kept.
	Publish(eos bool) Result
	// Retry tries the kept publish once more: Pending, or what it came to.
	Retry() Result
	// ReadCursors reads every consumer's cursor, as the heartbeat does (no reclaim).
	ReadCursors()
	// Free reclaims, then counts the free slots.
	Free() int
	Ctl() []byte
	// Assign is the assign word of position q's descriptor.
	Assign(q uint64) uint64
	Close()
}

// ReplayError is a difference a replayer found: which scenario, which step, what.
type ReplayError struct {
	Seed  uint64
	Step  uint32
	What  string
	Trail []string // the records played last
}

func (e *ReplayError) Error() string {
	s := fmt.Sprintf("seed %d step %d: %s", e.Seed, e.Step, e.What)
	if len(e.Trail) > 0 {
		s += "\nlast records:\n  " + strings.Join(e.Trail, "\n  ")
	}
	return s
}

func (r Record) String() string {
	return fmt.Sprintf("%c a=%d b=%d c=%d x=%d y=%d z=%#x", r.Kind, r.A, r.B, r.C, r.X, r.Y, r.Z)
}

// PlayReplay plays the stream in r against p, comparing every answer with the model's, until its end or
// (maxSteps > 0) the scenario in which maxSteps steps have been played ends. It returns the steps and
// scenarios played, how many scenarios were cut short (an oldest start the stream cannot follow, see
// 'A'), and the first difference as a *ReplayError.
func PlayReplay(r io.Reader, p ReplayProducer, maxSteps int) (steps, scenarios, cut int, err error) {
	br := bufio.NewReaderSize(r, 1<<16)
	var buf [RecordSize]byte
	var seed uint64
	var step uint32
	var slots uint64
	var rows int
	pending, skip := false, false
	regions := map[int][]byte{}
	defer p.Close()
	var trail [16]Record // the last records played, for the difference's report
	nrec := 0
	fail := func(f string, a ...any) error {
		e := &ReplayError{Seed: seed, Step: step, What: fmt.Sprintf(f, a...)}
		for i := max(0, nrec-len(trail)); i < nrec; i++ {
			e.Trail = append(e.Trail, trail[i%len(trail)].String())
		}
		return e
	}
	for {
		if _, err := io.ReadFull(br, buf[:]); err != nil {
			return steps, scenarios, cut, fmt.Errorf("replay stream ends without its end record: %w", err)
		}
		rec := ReadRecord(buf[:])
		if skip && rec.Kind != RecScenario && rec.Kind != RecEnd {
			continue
		}
		trail[nrec%len(trail)] = rec
		nrec++
		switch rec.Kind {
		case RecScenario:
			if maxSteps > 0 && steps >= maxSteps {
				return steps, scenarios, cut, nil
			}
			seed, step, slots, pending, skip, rows = rec.Y, 0, uint64(rec.C), false, false, int(rec.B)
			clear(regions)
			if err := p.Create(Scenario{Seed: seed, Slots: slots, Rows: int(rec.B), Policy: Policy(rec.A), P0: rec.X}); err != nil {
				return steps, scenarios, cut, fmt.Errorf("seed %d: create: %w", seed, err)
			}
			scenarios++
		case RecAttach:
			if rec.A == 1 {
				continue // observers are not replayed
			}
			if rec.C == 0 && rec.X == 0 && anyAttached(p.Ctl(), rows) {
				// where an independent consumer starts at the oldest heap, the model has reclaimed what
				// everyone attached released (it reclaims at once; a producer may later, §7.1): so does p
				p.Free()
			}
			row, gen, st, region := p.Attach(rec.C, rec.B, uint32(rec.X))
			wantSt, wantRow, wantGen := int(rec.Z&0xffff), int(rec.Z>>16&0xffff), uint32(rec.Z>>32)
			if st != wantSt {
				return steps, scenarios, cut, fail("attach: status %d, want %d", st, wantSt)
			}
			if st != StatusOK {
				continue
			}
			tail := u64(region, regTail).Load()
			if rec.C == 0 && rec.X == 0 && row == wantRow && gen == wantGen && before(tail, rec.Y) {
				// §7.1 lets producers choose an oldest start differently; one that starts earlier than
				// the model is followed by a consumer releasing up to the model's start at once
				u64(region, regTail).Store(rec.Y)
				tail = rec.Y
			}
			if rec.C == 0 && rec.X == 0 && row == wantRow && gen == wantGen && before(rec.Y, tail) {
				// ... one that starts later the stream cannot follow: the rest of the scenario is cut
				cut++
				skip = true
				continue
			}
			if row != wantRow || gen != wantGen || tail != rec.Y {
				return steps, scenarios, cut, fail("attach: row %d gen %d start %d, want row %d gen %d start %d", row, gen, tail, wantRow, wantGen, rec.Y)
			}
			regions[row] = region
		case RecClose:
			if _, ok := regions[int(rec.C)]; ok {
				delete(regions, int(rec.C))
				p.Gone(int(rec.C))
			}
		case RecPublish:
			if pending {
				return steps, scenarios, cut, fail("publish while one is pending")
			}
			res := p.Publish(rec.A == 1)
			if res != Result(rec.B) {
				return steps, scenarios, cut, fail("publish (eos %d): %v, want %v", rec.A, res, Result(rec.B))
			}
			pending = res == Pending
		case RecSettle:
			if pending {
				res := p.Retry()
				if res != Pending && res != Published {
					return steps, scenarios, cut, fail("the pending publish came to %v", res)
				}
				pending = res == Pending
			}
			if pending != (rec.A == 1) {
				return steps, scenarios, cut, fail("pending %v, want %v", pending, rec.A == 1)
			}
			p.ReadCursors()
		case RecStore:
			if reg, ok := regions[int(rec.C)]; ok && int(rec.A) < len(regionOffset) {
				off := regionOffset[rec.A]
				if Field(rec.A) == FWaiting {
					u32(reg, off).Store(uint32(rec.X))
				} else {
					u64(reg, off).Store(rec.X)
				}
			}
		case RecWord:
			ctl := p.Ctl()
			var v uint64
			if rec.A == 4 {
				v = uint64(u32(ctl, int(rec.C)).Load())
			} else {
				v = u64(ctl, int(rec.C)).Load()
			}
			if v != rec.X {
				return steps, scenarios, cut, fail("%s: got %d, want %d", ctlWordName(int(rec.C)), v, rec.X)
			}
		case RecMask:
			if v := p.Assign(rec.X); v != rec.Y {
				return steps, scenarios, cut, fail("assign word of position %d: got %#x, want %#x", rec.X, v, rec.Y)
			}
		case RecFree:
			if n := p.Free(); uint64(n) != rec.X {
				return steps, scenarios, cut, fail("free slots after a reclaim: got %d, want %d", n, rec.X)
			}
		case RecStep:
			step = rec.C + 1
			steps++
		case RecEnd:
			return steps, scenarios, cut, nil
		default:
			return steps, scenarios, cut, fmt.Errorf("replay stream: record kind %q", rec.Kind)
		}
	}
}

// anyAttached reports whether a row of the consumer table says attached (spec §2.2).
func anyAttached(ctl []byte, rows int) bool {
	for i := range rows {
		if u32(ctl, ctlTable+rowSize*i).Load() == RowAttached {
			return true
		}
	}
	return false
}

// ctlWordName names a control-memory word for a difference's message.
func ctlWordName(off int) string {
	switch {
	case off == ctlHead:
		return "head"
	case off >= ctlStats && off < ctlStats+8*32:
		return fmt.Sprintf("counter %d", (off-ctlStats)/8)
	case off >= ctlTable:
		names := map[int]string{rowOffState: "state", rowOffGen: "generation", rowOffReleased: "released",
			rowOffWakes: "wakes", rowOffLost: "lost_heaps", rowOffAssigned: "assigned", rowOffGroup: "group",
			rowOffRead: "read", rowOffQueued: "queued"}
		return fmt.Sprintf("row %d %s", (off-ctlTable)/rowSize, names[(off-ctlTable)%rowSize])
	}
	return fmt.Sprintf("control word %#x", off)
}

// ReplaySteps is how many simulation steps a replay test plays against a producer: SIM_REPLAY_STEPS (make
// test: 10⁷), else 2×10⁵ (go test ./... runs under the race detector).
func ReplaySteps() int {
	if v, err := strconv.Atoi(os.Getenv("SIM_REPLAY_STEPS")); err == nil && v > 0 {
		return v
	}
	return 200_000
}
