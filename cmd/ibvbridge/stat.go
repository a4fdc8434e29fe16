package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ibvbridge/ibvbridge/ring"
)

// statOptions are stat's flags and its one positional, the ring.
type statOptions struct {
	json, watch bool
	dir, name   string
	interval    time.Duration
}

func statFlags(fs *flag.FlagSet) *statOptions {
	o := &statOptions{}
	fs.BoolVar(&o.json, "json", false, "print one JSON object (with --watch: one per refresh)")
	fs.StringVar(&o.dir, "dir", "", "ring directory (default: $IBVBRIDGE_RING_DIR, /run/ibvbridge for root, /dev/shm/ibvbridge-UID)")
	fs.BoolVar(&o.watch, "watch", false, "refresh until the ring closes or Ctrl-C: rates, fill, lag, drops, heartbeat")
	fs.DurationVar(&o.interval, "interval", time.Second, "with --watch: refresh this often")
	return o
}

// parseStat parses `stat NAME --json` as well as `stat --json NAME` into validated options.
func parseStat(fs *flag.FlagSet, o *statOptions, args []string) error {
	pos, err := parseInterspersed(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageError("usage: ibvbridge stat [--json] [--watch] RING")
	}
	o.name = pos[0]
	return o.validate()
}

func (o *statOptions) validate() error {
	if o.interval <= 0 {
		return usageError("--interval %v: want a positive duration", o.interval)
	}
	return nil
}

func runStat(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("stat", stderr)
	o := statFlags(fs)
	if err := parseStat(fs, o, args); err != nil {
		return err
	}
	info, err := ring.Inspect(o.name, o.dir)
	if err != nil {
		return statError(o.name, o.dir, err)
	}
	if !o.watch {
		if o.json {
			return json.NewEncoder(stdout).Encode(statJSON{Info: info, Geometry: snakeGeometry(info.Geometry)})
		}
		return printInfo(stdout, info, nil)
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	clear := !o.json && isTerminal(stdout)
	prev, prevAt := info, time.Now()
	t := time.NewTicker(o.interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		cur, err := ring.Inspect(o.name, o.dir)
		if errors.Is(err, ring.ErrNotFound) || errors.Is(err, ring.ErrProducerGone) || errors.Is(err, ring.ErrClosing) {
			fmt.Fprintf(stderr, "ibvbridge stat: ring %s is gone: its producer stopped\n", o.name)
			return nil // a stopped recv removes its ring: the watch is over, not failed
		}
		if err != nil {
			return statError(o.name, o.dir, err)
		}
		now := time.Now()
		r := rates(prev, cur, now.Sub(prevAt))
		prev, prevAt = cur, now
		if o.json {
			if err := json.NewEncoder(stdout).Encode(struct {
				statJSON
				Rates ringRates `json:"rates"`
			}{statJSON{cur, snakeGeometry(cur.Geometry)}, r}); err != nil {
				return err
			}
		} else {
			if clear {
				fmt.Fprint(stdout, "\033[H\033[2J")
			} else {
				fmt.Fprintln(stdout)
			}
			if err := printInfo(stdout, cur, &r); err != nil {
				return err
			}
		}
		if cur.State == "closed" || !cur.ProducerAlive {
			return nil
		}
	}
}

// statJSON is ring.Info as `stat --json` prints it: the geometry's keys in snake_case like every other
// key (ring.Geometry has no JSON names; its Go field names came out as SlotCount, ...).
type statJSON struct {
	ring.Info
	Geometry geometryJSON `json:"geometry"` // shadows Info.Geometry
}

type geometryJSON struct {
	SlotCount     uint64 `json:"slot_count"`
	SlotSize      uint64 `json:"slot_size"`
	MaxItems      uint32 `json:"max_items"`
	PageSize      uint32 `json:"page_size"`
	DataSize      uint64 `json:"data_size"`
	DescOffset    uint64 `json:"desc_offset"`
	ItemsOffset   uint64 `json:"items_offset"`
	MetaOffset    uint64 `json:"meta_offset"`
	MetaSize      uint64 `json:"meta_size"`
	PayloadOffset uint64 `json:"payload_offset"`
	PacketOffset  uint64 `json:"packet_offset"`
	PacketSize    uint64 `json:"packet_size"`
}

func snakeGeometry(g ring.Geometry) geometryJSON { return geometryJSON(g) }

// statErr is an error of ring.Inspect as stat reports it, with a hint when the ring's files outlived its
// producer.
type statErr struct {
	msg string
	err error
}

func (e *statErr) Error() string { return e.msg }
func (e *statErr) Unwrap() error { return e.err }

func statError(name, dir string, err error) error {
	msg := err.Error()
	if errors.Is(err, ring.ErrNotFound) && !strings.Contains(msg, "rm --stale") {
		if rings, lerr := ring.List(dir); lerr == nil {
			for _, l := range rings {
				if l.Name == name || l.Path() == name {
					rm := "ibvbridge rm --stale"
					if dir != "" {
						rm += " --dir " + dir
					}
					msg += " (its socket or lock file is left from a producer that is gone: `" + rm + "` removes it)"
					break
				}
			}
		}
	}
	return &statErr{msg: msg, err: err}
}

func printInfo(stdout io.Writer, info ring.Info, r *ringRates) error {
	w := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "ring\t%s\n", info.Name)
	fmt.Fprintf(w, "layout\tv%d.%d\n", info.Major, info.Minor)
	fmt.Fprintf(w, "state\t%s\n", info.State)
	fmt.Fprintf(w, "producer\tpid %d, alive %v, session %#x, heartbeat %s ago\n", info.ProducerPID, info.ProducerAlive,
		info.SessionID, time.Duration(info.HeartbeatAgeNs).Round(time.Millisecond))
	if info.ProducerVersion != "" {
		fmt.Fprintf(w, "runs\t%s\n", info.ProducerVersion)
	}
	fmt.Fprintf(w, "socket\t%s\n", info.Socket)
	fmt.Fprintf(w, "policy\t%s\n", info.Policy)
	fmt.Fprintf(w, "slots\t%d x %d bytes, %d items each\n", info.Geometry.SlotCount, info.Geometry.SlotSize, info.Geometry.MaxItems)
	fmt.Fprintf(w, "data\t%d bytes, page %d\n", info.Geometry.DataSize, info.Geometry.PageSize)
	if g := info.Chunks; g != nil {
		fmt.Fprintf(w, "chunks\t%d heaps x %d axis x %d bytes per chunk; time item %#x step %d", g.Heaps, g.Axis, g.HeapSize, g.TimeItem, g.Step)
		if g.AxisItem != 0 {
			fmt.Fprintf(w, ", axis item %#x", g.AxisItem)
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintf(w, "cursors\thead %d, oldest held %d, held %d, unread %d\n", info.Head, info.Oldest, info.Head-info.Oldest, info.Unread)
	if r != nil {
		fill := 0.0
		if info.Geometry.SlotCount > 0 {
			fill = 100 * float64(info.Unread) / float64(info.Geometry.SlotCount) // the slowest consumer's lag
		}
		fmt.Fprintf(w, "rates\t%.0f heaps/s, %.0f packets/s, %.3f Gb/s, %.0f dropped heaps/s\n", r.HeapsPerS, r.PacketsPerS, r.Gbps, r.DropsPerS)
		fmt.Fprintf(w, "fill\t%.1f %%\n", fill)
	}
	fmt.Fprintf(w, "consumers\t%d attached (at most %d)\n", info.Attached(), info.MaxConsumers)
	for _, c := range info.Consumers {
		fmt.Fprintf(w, "  [%d]\tpid %d, uid %d, %s, position %d, lag %d, wakes %d", c.Index, c.PID, c.UID, c.State, c.Position, c.Lag, c.Wakes)
		if c.LostHeaps > 0 {
			fmt.Fprintf(w, ", lost %d heaps", c.LostHeaps)
		}
		if c.GroupID != 0 {
			fmt.Fprintf(w, ", group %#08x: assigned %d (%.1f %% of the group's), read %d, queued %d, skipped %d, minor %d",
				c.GroupID, c.Assigned, groupShare(info.Consumers, c), c.Read, c.Queued, c.Skipped, c.ClientMinor)
		}
		fmt.Fprintln(w)
	}
	if info.BlockedOn > 0 {
		// spec §14.6: the row a block producer waits for, and since when
		since := time.Duration(time.Now().UnixNano() - int64(info.BlockedSinceNs)).Round(time.Millisecond)
		who := fmt.Sprintf("row %d", info.BlockedOn-1)
		for _, c := range info.Consumers {
			if c.Index == info.BlockedOn-1 {
				who += fmt.Sprintf(" (pid %d", c.PID)
				if c.GroupID != 0 {
					who += fmt.Sprintf(", group %#08x", c.GroupID)
				}
				who += ")"
			}
		}
		fmt.Fprintf(w, "blocked on\t%s for %s\n", who, since)
	}
	for _, c := range ring.Counters() {
		fmt.Fprintf(w, "%s\t%d\n", c, info.Counters[c.String()])
	}
	return w.Flush()
}

// groupShare is the percentage of its group's assigned positions a member's row holds (spec §14), over
// the group's attached members.
func groupShare(rows []ring.ConsumerInfo, c ring.ConsumerInfo) float64 {
	var total uint64
	for _, r := range rows {
		if r.GroupID == c.GroupID && r.Attached() {
			total += r.Assigned
		}
	}
	if total == 0 {
		return 0
	}
	return 100 * float64(c.Assigned) / float64(total)
}

// isTerminal reports whether w is a terminal (the watch view then redraws in place).
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
