package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"strings"
)

// PyRateOptions describe `bench python --max-rate`: the highest rate of heaps of one size each receiver
// takes into its ItemGroup loop losing none.
type PyRateOptions struct {
	HeapSize int     `json:"heap_size"`        // bytes per heap (one packet while it fits a jumbo frame)
	From     float64 `json:"from_heaps_per_s"` // the first probe
	Factor   float64 `json:"factor"`           // each probe above the last lossless one while none lost: ×Factor
	Refine   int     `json:"refine"`           // probes between the highest lossless and the lowest lossy rate, halving the gap (geometric)
	Cap      float64 `json:"cap_heaps_per_s"`  // no probe above it
	Seconds  float64 `json:"seconds"`          // of stream per run
}

// DefaultPyRate is the search of the 1 KiB heaps a plain Python loop is slowest on: from 10 k heaps/s up
// by half each probe, three probes between the last lossless and the first lossy rate (a gap of 1.5× ends
// within 5 %), at most 1 M heaps/s.
var DefaultPyRate = PyRateOptions{HeapSize: 1 << 10, From: 10_000, Factor: 1.5, Refine: 3, Cap: 1_000_000, Seconds: 1}

// PyRateProbe is one rate tried on one receiver: every run of it lossless, or not.
type PyRateProbe struct {
	HeapsPerSec float64   `json:"heaps_per_s"`      // asked
	SentPerSec  float64   `json:"sent_heaps_per_s"` // the sender's lowest achieved rate over the probe's runs
	Runs        int       `json:"runs"`
	Lossless    int       `json:"lossless_runs"`
	Detail      string    `json:"detail,omitempty"`     // the last run's: the lossy one, if any (it ends the probe)
	CPUPerHeap  []float64 `json:"cpu_us_per_heap"`      // every receiving process, each run
	LoopPerHeap []float64 `json:"loop_cpu_us_per_heap"` // of which the Python process, each run
}

// PyRateRow is one receiver's search.
type PyRateRow struct {
	Receiver string `json:"receiver"`
	// Highest is the highest rate (heaps/s) at which every run was lossless; 0 when even From lost heaps.
	Highest float64 `json:"highest_lossless_heaps_per_s"`
	// LowestLossy is the lowest rate at which a run lost heaps; 0 when none did up to Cap or the sender's limit.
	LowestLossy float64 `json:"lowest_lossy_heaps_per_s"`
	// SenderBehindAt is the rate (heaps/s) of the probe the sender could not keep (within 3 %), where the
	// search stopped; 0 when it kept every rate. Without a lossy rate below it, Highest is a lower bound set
	// by the sender, not by the receiver.
	SenderBehindAt float64       `json:"sender_behind_at_heaps_per_s"`
	Probes         []PyRateProbe `json:"probes"`
}

// PyRateResult is the search on every receiver, with ibvbridge's highest rate over spead2's.
type PyRateResult struct {
	Options PyRateOptions `json:"options"`
	Runs    int           `json:"runs_per_probe"`
	Rows    []PyRateRow   `json:"rows"`
	Ratio   float64       `json:"highest_ratio_to_spead2,omitempty"`
}

// rateSearch is one receiver's search: next gives the rate to probe, record takes the probe's outcome
// (its runs lossless or not, and the rate the sender achieved). It goes up by Factor from From while probes
// are lossless, then halves the gap between the highest lossless and the lowest lossy rate Refine times.
// It stops early at Cap, or at a probe the sender could not keep up.
type rateSearch struct {
	o    PyRateOptions
	row  PyRateRow
	left int // refining probes left
	done bool
}

func newRateSearch(receiver string, o PyRateOptions) *rateSearch {
	return &rateSearch{o: o, row: PyRateRow{Receiver: receiver}, left: o.Refine}
}

// next is the rate of the next probe, or false when the search is over.
func (s *rateSearch) next() (float64, bool) {
	if s.done {
		return 0, false
	}
	lo, hi := s.row.Highest, s.row.LowestLossy
	var r float64
	switch {
	case hi == 0 && lo == 0:
		r = s.o.From
	case hi == 0:
		r = min(lo*s.o.Factor, s.o.Cap)
		if r <= lo { // lo is the cap already
			s.done = true
			return 0, false
		}
	case lo == 0 || s.left <= 0:
		s.done = true // lossy from the first probe, or refined enough
		return 0, false
	default:
		s.left--
		r = math.Sqrt(lo * hi)
	}
	return math.Round(r), true
}

// record takes a probe's outcome.
func (s *rateSearch) record(p PyRateProbe) {
	s.row.Probes = append(s.row.Probes, p)
	lossless := p.Runs > 0 && p.Lossless == p.Runs
	if p.SentPerSec < 0.97*p.HeapsPerSec {
		// The sender fell behind: the receiver had an easier stream than asked, whatever it did with it.
		s.row.SenderBehindAt, s.done = p.HeapsPerSec, true
		return
	}
	if lossless {
		s.row.Highest = max(s.row.Highest, p.HeapsPerSec)
	} else if s.row.LowestLossy == 0 || p.HeapsPerSec < s.row.LowestLossy {
		s.row.LowestLossy = p.HeapsPerSec
	}
}

// PythonMaxRate searches, for each receiver of o (ibvbridge, the variants, spead2 with --peer), the highest
// rate of ro.HeapSize heaps its ItemGroup loop takes losing none: each probe is o.Runs runs, lossless only
// if every run is. The receivers' searches take turns probe by probe, so the machine's moods fall on all.
func PythonMaxRate(ctx context.Context, env Env, o PyOptions, ro PyRateOptions, progress func(receiver string, p PyRateProbe)) (PyRateResult, error) {
	if ro.HeapSize < 1 || ro.From <= 0 || ro.Factor <= 1 || ro.Cap < ro.From || ro.Seconds <= 0 || ro.Refine < 0 {
		return PyRateResult{}, fmt.Errorf("%w: rate search %+v: want a heap size, 0 < from ≤ cap, factor > 1, seconds > 0", ErrBadOption, ro)
	}
	b, err := newPyBench(env, o)
	if err != nil {
		return PyRateResult{}, err
	}
	defer b.close()
	res := PyRateResult{Options: ro, Runs: b.o.Runs}
	searches := make([]*rateSearch, len(b.receivers))
	for i, r := range b.receivers {
		searches[i] = newRateSearch(r, ro)
	}
	for step := 0; ; step++ {
		active := 0
		for i := range searches {
			s := searches[(i+step)%len(searches)]
			rate, ok := s.next()
			if !ok {
				continue
			}
			active++
			sh := PyShape{HeapSize: ro.HeapSize, PacketSize: 8972, RateGbps: rate * float64(ro.HeapSize) * 8 / 1e9, Seconds: ro.Seconds,
				Bursts: true}
			p := PyRateProbe{HeapsPerSec: rate, SentPerSec: math.Inf(1)}
			for range b.o.Runs {
				r, err := b.run(ctx, s.row.Receiver, sh)
				if err != nil {
					return res, err
				}
				p.Runs++
				p.SentPerSec = min(p.SentPerSec, r.SentGbps*1e9/8/float64(ro.HeapSize))
				p.CPUPerHeap = append(p.CPUPerHeap, r.CPUSeconds/float64(max(r.Heaps, 1))*1e6)
				p.LoopPerHeap = append(p.LoopPerHeap, r.LoopCPU/float64(max(r.Heaps, 1))*1e6)
				if r.Lossless {
					p.Lossless++
				}
				p.Detail = r.Detail
				if !r.Lossless {
					break // one lossy run decides the probe
				}
			}
			s.record(p)
			if progress != nil {
				progress(s.row.Receiver, p)
			}
		}
		if active == 0 {
			break
		}
	}
	for _, s := range searches {
		res.Rows = append(res.Rows, s.row)
	}
	if last := res.Rows[len(res.Rows)-1]; last.Receiver == "spead2" && last.Highest > 0 {
		res.Ratio = res.Rows[0].Highest / last.Highest
	}
	return res, nil
}

// PrintPythonMaxRate writes each receiver's highest lossless rate, what bounds it, and its probes.
func PrintPythonMaxRate(w io.Writer, res PyRateResult) {
	fmt.Fprintf(w, "%s heaps into the ItemGroup loop: the highest rate with every run lossless (%d runs a probe, %g s each):\n",
		sizeName(res.Options.HeapSize), res.Runs, res.Options.Seconds)
	for _, r := range res.Rows {
		var bound string
		switch {
		case r.LowestLossy > 0:
			bound = fmt.Sprintf("lost heaps at %.0f", r.LowestLossy)
		case r.SenderBehindAt > 0:
			bound = "at least"
		default:
			bound = fmt.Sprintf("at least: none lost up to the cap, %.0f", res.Options.Cap)
		}
		if r.SenderBehindAt > 0 {
			bound += fmt.Sprintf("; the sender could not keep %.0f", r.SenderBehindAt)
		}
		fmt.Fprintf(w, "  %-9s %9.0f heaps/s (%s)\n", r.Receiver, r.Highest, bound)
		var ps []string
		for _, p := range r.Probes {
			mark := "lossless"
			if p.Lossless < p.Runs {
				mark = "LOSSY"
			}
			ps = append(ps, fmt.Sprintf("%.0f %s", p.HeapsPerSec, mark))
		}
		fmt.Fprintf(w, "            probes: %s\n", strings.Join(ps, ", "))
	}
	if res.Ratio > 0 {
		fmt.Fprintf(w, "  %s/spead2: %.2f×\n", res.Rows[0].Receiver, res.Ratio)
	}
}
