package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
)

// ringRates are a ring's rates between two looks.
type ringRates struct {
	HeapsPerS   float64 `json:"heaps_per_s"`
	PacketsPerS float64 `json:"packets_per_s"`
	Gbps        float64 `json:"gbps"`
	DropsPerS   float64 `json:"dropped_heaps_per_s"`
}

func rates(prev, cur ring.Info, dt time.Duration) ringRates {
	s := dt.Seconds()
	if s <= 0 || prev.SessionID != cur.SessionID {
		return ringRates{}
	}
	d := func(k string) float64 { return float64(cur.Counters[k]-prev.Counters[k]) / s }
	return ringRates{HeapsPerS: d("heaps"), PacketsPerS: d("packets"), Gbps: d("bytes") * 8 / 1e9, DropsPerS: d("dropped_heaps")}
}

// lsEntry is one ring of `ls`.
type lsEntry struct {
	Name          string    `json:"name"`
	Socket        string    `json:"socket"`
	State         string    `json:"state"` // ready, closed, or stale: a socket or lock nobody serves
	ProducerPID   uint64    `json:"producer_pid"`
	ProducerAlive bool      `json:"producer_alive"`
	Consumers     int       `json:"consumers"`
	Slots         uint64    `json:"slots"`
	Held          uint64    `json:"held"` // heaps still holding slots: what the slowest consumer has not released
	Rates         ringRates `json:"rates"`
	Error         string    `json:"error,omitempty"`
}

const dirUsage = "ring directory (default: $IBVBRIDGE_RING_DIR, else /run/ibvbridge for root, else /dev/shm/ibvbridge-UID; ls and rm also look in /run/ibvbridge)"

func runLs(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("ls", stderr)
	dir := fs.String("dir", "", dirUsage)
	interval := fs.Duration("interval", 250*time.Millisecond, "measure rates over this long (0: no rates)")
	asJSON := fs.Bool("json", false, "print a JSON array")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	rings, err := ring.List(*dir)
	if err != nil {
		return err
	}
	first := make([]ring.Info, len(rings))
	for i, l := range rings {
		first[i], _ = ring.Inspect(l.Path(), "")
	}
	if *interval > 0 && len(rings) > 0 {
		time.Sleep(*interval)
	}
	entries := make([]lsEntry, 0, len(rings))
	for i, l := range rings {
		e := lsEntry{Name: l.Name, Socket: l.Path()}
		info, err := ring.Inspect(l.Path(), "")
		switch {
		case errors.Is(err, ring.ErrNotFound):
			e.State = "stale" // what kill -9 leaves: `ibvbridge rm --stale` removes it
		case err != nil:
			e.State, e.Error = "unreadable", err.Error()
		default:
			e.State, e.ProducerPID, e.ProducerAlive, e.Consumers = info.State, info.ProducerPID, info.ProducerAlive, info.Attached()
			e.Slots, e.Held = info.Geometry.SlotCount, info.Head-info.Oldest
			if *interval > 0 {
				e.Rates = rates(first[i], info, *interval)
			}
		}
		entries = append(entries, e)
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(entries)
	}
	w := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintln(w, "RING\tSTATE\tPRODUCER\tCONSUMERS\tFILL\tHEAPS/S\tGB/S\tDROPS/S")
	for _, e := range entries {
		prod, fill := "-", "-"
		if e.ProducerPID != 0 {
			prod = fmt.Sprint(e.ProducerPID)
		}
		if e.Slots > 0 {
			fill = fmt.Sprintf("%d/%d", e.Held, e.Slots)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%d\t%s\t%.0f\t%.3f\t%.0f\n", e.Name, e.State, prod, e.Consumers, fill, e.Rates.HeapsPerS, e.Rates.Gbps, e.Rates.DropsPerS)
	}
	return w.Flush()
}

func runRm(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("rm", stderr)
	dir := fs.String("dir", "", dirUsage)
	stale := fs.Bool("stale", false, "remove every ring no live producer serves")
	names, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if *stale == (len(names) > 0) {
		return usageError("usage: ibvbridge rm NAME... | ibvbridge rm --stale")
	}
	for _, n := range names {
		if err := ring.ValidateName(n); err != nil {
			return usageError("%v", err)
		}
	}
	present, err := ring.List(*dir)
	if err != nil {
		return err
	}
	var targets []ring.Listed
	if *stale {
		targets = present
	}
	for _, n := range names {
		i := slices.IndexFunc(present, func(l ring.Listed) bool { return l.Name == n })
		if i < 0 {
			fmt.Fprintf(stderr, "ibvbridge rm: no ring %s in %s\n", n, strings.Join(ring.ListDirs(*dir), " or "))
			err = &exitError{code: 1}
			continue
		}
		targets = append(targets, present[i])
	}
	for _, l := range targets {
		info, ierr := ring.Inspect(l.Path(), "")
		if ierr == nil { // something answers: live
			if !*stale {
				fmt.Fprintf(stderr, "ibvbridge rm: ring %s is live (producer pid %d): stop its recv first\n", l.Name, info.ProducerPID)
				err = &exitError{code: 1}
			}
			continue
		}
		switch rerr := ring.Remove(l.Dir, l.Name); {
		case rerr == nil:
			fmt.Fprintf(stdout, "removed %s\n", l.Name)
		case errors.Is(rerr, ring.ErrInUse):
			if !*stale { // started between the look and the removal: live after all
				fmt.Fprintf(stderr, "ibvbridge rm: ring %s is live: stop its recv first\n", l.Name)
				err = &exitError{code: 1}
			}
		default:
			fmt.Fprintln(stderr, "ibvbridge rm:", rerr)
			err = &exitError{code: 1}
		}
	}
	return err
}
