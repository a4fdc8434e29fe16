package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
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
	State         string    `json:"state"` // ready, closed, init, or stale: only leftover files
	ProducerPID   uint64    `json:"producer_pid"`
	ProducerAlive bool      `json:"producer_alive"`
	ConsumerPID   uint64    `json:"consumer_pid"`
	Slots         uint64    `json:"slots"`
	Unread        uint64    `json:"unread"`
	Rates         ringRates `json:"rates"`
	Error         string    `json:"error,omitempty"`
}

func runLs(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("ls", stderr)
	dir := fs.String("dir", ring.DefaultDir, "directory of ring control files")
	interval := fs.Duration("interval", 250*time.Millisecond, "measure rates over this long (0: no rates)")
	asJSON := fs.Bool("json", false, "print a JSON array")
	if err := parseNoArgs(fs, args); err != nil {
		return err
	}
	names, err := ring.List(*dir)
	if err != nil {
		return err
	}
	first := make([]ring.Info, len(names))
	for i, n := range names {
		first[i], _ = ring.Inspect(n, *dir)
	}
	if *interval > 0 && len(names) > 0 {
		time.Sleep(*interval)
	}
	entries := make([]lsEntry, 0, len(names))
	for i, n := range names {
		e := lsEntry{Name: n}
		info, err := ring.Inspect(n, *dir)
		switch {
		case errors.Is(err, ring.ErrNotFound):
			e.State = "stale" // lock files only: `ibvbridge rm --stale` removes them
		case err != nil:
			e.State, e.Error = "unreadable", err.Error()
		default:
			e.State, e.ProducerPID, e.ProducerAlive, e.ConsumerPID = info.State, info.ProducerPID, info.ProducerAlive, info.ConsumerPID
			e.Slots, e.Unread = info.Geometry.SlotCount, info.Head-info.Tail
			if !info.ProducerAlive && info.State != "closed" {
				e.State = "dead"
			}
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
	fmt.Fprintln(w, "RING\tSTATE\tPRODUCER\tCONSUMER\tFILL\tHEAPS/S\tGB/S\tDROPS/S")
	for _, e := range entries {
		prod, cons, fill := "-", "-", "-"
		if e.ProducerPID != 0 {
			prod = fmt.Sprintf("%d (%s)", e.ProducerPID, map[bool]string{true: "alive", false: "gone"}[e.ProducerAlive])
		}
		if e.ConsumerPID != 0 {
			cons = fmt.Sprint(e.ConsumerPID)
		}
		if e.Slots > 0 {
			fill = fmt.Sprintf("%d/%d", e.Unread, e.Slots)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%.0f\t%.3f\t%.0f\n", e.Name, e.State, prod, cons, fill, e.Rates.HeapsPerS, e.Rates.Gbps, e.Rates.DropsPerS)
	}
	return w.Flush()
}

func runRm(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("rm", stderr)
	dir := fs.String("dir", ring.DefaultDir, "directory of ring control files")
	stale := fs.Bool("stale", false, "remove every ring no live producer or consumer holds")
	names, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if *stale == (len(names) > 0) {
		return usageError("usage: ibvbridge rm NAME... | ibvbridge rm --stale")
	}
	present, err := ring.List(*dir)
	if err != nil {
		return err
	}
	if *stale {
		names = present
	}
	var failed error
	for _, n := range names {
		if err := ring.ValidateName(n); err != nil {
			return usageError("%v", err)
		}
		if !slices.Contains(present, n) {
			failed = fmt.Errorf("no ring %s in %s", n, *dir)
			fmt.Fprintln(stderr, "ibvbridge rm:", failed)
			continue
		}
		info, ierr := ring.Inspect(n, *dir)
		if *stale && ierr == nil && info.ProducerAlive {
			continue // live: not stale
		}
		err := ring.Remove(*dir, "", n)
		switch {
		case err == nil:
			fmt.Fprintf(stdout, "removed %s\n", n)
		case errors.Is(err, ring.ErrInUse) && !*stale:
			failed = fmt.Errorf("ring %s is live (producer pid %d): stop its recv first", n, info.ProducerPID)
			fmt.Fprintln(stderr, "ibvbridge rm:", failed)
		case errors.Is(err, ring.ErrBusy):
			fmt.Fprintf(stderr, "ibvbridge rm: kept %s: a consumer (pid %d) still holds it\n", n, info.ConsumerPID)
			if !*stale {
				failed = err
			}
		case errors.Is(err, ring.ErrInUse):
			// Started between the look and the removal: live after all.
		default:
			failed = err
			fmt.Fprintln(stderr, "ibvbridge rm:", err)
		}
	}
	if failed != nil {
		return &exitError{code: 1}
	}
	return nil
}
