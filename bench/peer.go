package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// PeerShape is one stream of `bench udp --peer`: heaps of one size at a fixed rate.
type PeerShape struct {
	HeapSize   int     `json:"heap_size"`
	PacketSize int     `json:"packet_size"` // spead2_send --packet: largest packet, SPEAD header included
	RateGbps   float64 `json:"rate_gbps"`
	Heaps      uint64  `json:"heaps"`
}

// DefaultPeerShapes are the two streams the README's spead2_recv table measures: 1 MiB heaps in 8972-byte packets at 6 Gb/s,
// and 8 KiB heaps in one packet each at 2.5 Gb/s, two seconds of each.
var DefaultPeerShapes = []PeerShape{
	{HeapSize: 1 << 20, PacketSize: 8972, RateGbps: 6, Heaps: 1430},
	{HeapSize: 8 << 10, PacketSize: 8972, RateGbps: 2.5, Heaps: 76293},
}

// PeerBinary is one spead2_recv build to compare with, by label ("spead2 4.4.1", "spead2 main 4b0677e").
type PeerBinary struct {
	Label string `json:"label"`
	Path  string `json:"path"`
}

// DefaultSpead2RecvArgs make spead2_recv lossless at both shapes on a loopback: a ring and a memory pool
// (the settings its own benchmarks use), room for 64 heaps in its ring so its worker never waits for the main thread,
// and only the totals printed.
var DefaultSpead2RecvArgs = []string{"--ring", "--mem-pool", "--ring-heaps", "64", "--quiet"}

// DefaultPeerRecvArgs are recv's flags in a peer comparison, before PeerOptions.RecvArgs (a later flag
// wins): the block policy, because spead2_recv's ring blocks its receive thread when full (the stream
// waits; the socket buffer takes up the slack) where recv's default policy drops the heap. Like for like,
// a 64-heap ring then loses nothing on a busy machine for either.
var DefaultPeerRecvArgs = []string{"--policy", "block"}

// PeerOptions describe `bench udp --peer spead2`.
type PeerOptions struct {
	Shapes []PeerShape
	Runs   int   // runs of each receiver per shape, alternating
	Slots  []int // recv's ring sizes to measure (slots of twice the heap size)
	Spead2 []PeerBinary
	// Spead2RecvArgs are spead2_recv's flags (nil: DefaultSpead2RecvArgs).
	Spead2RecvArgs []string
	// Spead2Send is the sender of every run ("": this ibvbridge's send, when spead2 is absent).
	Spead2Send string
	Buffer     int      // socket receive buffer of every receiver, bytes
	RecvArgs   []string // more flags for recv (e.g. --hugepages off)
	Floor      bool     // also measure the floor receiver
}

// PeerRun is one run of one receiver.
type PeerRun struct {
	CPUSeconds     float64 `json:"cpu_s"`          // the receiving process's user + system CPU over the stream
	ConsCPUSeconds float64 `json:"consumer_cpu_s"` // recv's consumer (C, takes and releases each heap unread)
	SentGbps       float64 `json:"sent_gbps"`
	Lossless       bool    `json:"lossless"`
	Detail         string  `json:"detail"` // the receiver's counters that decided Lossless
}

// PeerRow is one receiver on one shape: its runs and their medians.
type PeerRow struct {
	Receiver  string    `json:"receiver"`
	Kind      string    `json:"kind"` // recv, spead2 or floor
	CPU       float64   `json:"cpu_s"`
	ConsCPU   float64   `json:"consumer_cpu_s"` // recv only
	Lossless  bool      `json:"lossless"`       // every run
	Runs      []PeerRun `json:"runs"`
	SentGbps  float64   `json:"sent_gbps"`
	recvSlots int
	bin       string
}

// PeerResult is one shape: every receiver's row, in the order they ran.
type PeerResult struct {
	Shape PeerShape `json:"shape"`
	Rows  []PeerRow `json:"rows"`
}

func (o *PeerOptions) check() error {
	switch {
	case len(o.Shapes) == 0:
		return fmt.Errorf("%w: no shapes", ErrBadOption)
	case o.Runs < 1:
		return fmt.Errorf("%w: runs must be positive", ErrBadOption)
	case len(o.Slots) == 0:
		return fmt.Errorf("%w: no ring sizes (--slots)", ErrBadOption)
	}
	for _, s := range o.Shapes {
		if s.HeapSize < 1 || s.PacketSize < 64 || s.PacketSize > 65507 || s.RateGbps <= 0 || s.Heaps < 1 {
			return fmt.Errorf("%w: shape %+v", ErrBadOption, s)
		}
	}
	for _, n := range o.Slots {
		if n < 2 || n&(n-1) != 0 {
			return fmt.Errorf("%w: %d slots: want a power of two", ErrBadOption, n)
		}
	}
	if o.Spead2RecvArgs == nil {
		o.Spead2RecvArgs = DefaultSpead2RecvArgs
	}
	return nil
}

// Peer runs every shape through recv (once per ring size, with a C consumer that takes and releases each
// heap without reading it), each spead2_recv build and the floor receiver, on the same sender's traffic,
// alternating run by run so all see the same machine state; each row's figures are medians.
func Peer(ctx context.Context, env Env, o PeerOptions) ([]PeerResult, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	var sender Sender = ibvbridgeSender{env: env}
	if o.Spead2Send != "" {
		sender = spead2Sender{o.Spead2Send}
	}
	var out []PeerResult
	for _, sh := range o.Shapes {
		res := PeerResult{Shape: sh}
		for _, n := range o.Slots {
			res.Rows = append(res.Rows, PeerRow{Receiver: fmt.Sprintf("recv, %d slots", n), Kind: "recv", recvSlots: n})
		}
		for _, b := range o.Spead2 {
			res.Rows = append(res.Rows, PeerRow{Receiver: b.Label, Kind: "spead2", bin: b.Path})
		}
		if o.Floor {
			res.Rows = append(res.Rows, PeerRow{Receiver: "floor", Kind: "floor"})
		}
		for run := range o.Runs {
			for i := range res.Rows {
				row := &res.Rows[i]
				r, err := peerRun(ctx, env, o, sender, sh, row)
				if err != nil {
					return nil, fmt.Errorf("%s, heap %d B: %w", row.Receiver, sh.HeapSize, err)
				}
				env.logf("bench udp --peer: heap %d B at %g Gb/s, run %d, %s: sent %.2f Gb/s, CPU %.3f s, consumer %.3f s, lossless %v (%s)\n",
					sh.HeapSize, sh.RateGbps, run+1, row.Receiver, r.SentGbps, r.CPUSeconds, r.ConsCPUSeconds, r.Lossless, r.Detail)
				row.Runs = append(row.Runs, r)
			}
		}
		for i := range res.Rows {
			res.Rows[i].summarise()
		}
		out = append(out, res)
	}
	return out, nil
}

func (r *PeerRow) summarise() {
	var cpu, cons, sent []float64
	r.Lossless = len(r.Runs) > 0
	for _, x := range r.Runs {
		cpu, cons, sent = append(cpu, x.CPUSeconds), append(cons, x.ConsCPUSeconds), append(sent, x.SentGbps)
		r.Lossless = r.Lossless && x.Lossless
	}
	r.CPU, r.ConsCPU, r.SentGbps = median(cpu), median(cons), median(sent)
}

func peerRun(ctx context.Context, env Env, o PeerOptions, sender Sender, sh PeerShape, row *PeerRow) (PeerRun, error) {
	buffer := []string{}
	if o.Buffer > 0 {
		buffer = []string{"--buffer", strconv.Itoa(o.Buffer)}
	}
	switch row.Kind {
	case "recv":
		path := Loopback
		path.RecvArgs = append(append(append([]string{}, DefaultPeerRecvArgs...), buffer...), o.RecvArgs...)
		uo := UDPOptions{PacketSize: sh.PacketSize, Consumer: "c", ConsumerArgs: []string{"--no-touch"},
			Slots: row.recvSlots, SlotSize: 2 * sh.HeapSize, Sender: sender, Label: "bench udp --peer"}
		r, err := udpRun(ctx, env, path, uo, sh.HeapSize, sh.Heaps, sh.RateGbps)
		if err != nil {
			return PeerRun{}, err
		}
		return PeerRun{CPUSeconds: r.RecvCPUSeconds, ConsCPUSeconds: r.ConsCPUSeconds, SentGbps: r.SentGbps, Lossless: r.Lossless,
			Detail: fmt.Sprintf("heaps %d, consumed %d, dropped %d, incomplete %d, kernel drops %d", r.HeapsRecv, r.HeapsCons,
				r.Dropped, r.Incomplete, r.KernelDrop)}, nil
	case "spead2":
		return processRun(ctx, env, sender, sh, func(ctx context.Context, endpoint string) *exec.Cmd {
			args := append(append(append([]string{}, o.Spead2RecvArgs...), buffer...), endpoint)
			return exec.CommandContext(ctx, row.bin, args...)
		}, spead2Lossless)
	case "floor":
		return processRun(ctx, env, sender, sh, func(ctx context.Context, endpoint string) *exec.Cmd {
			self, _ := env.binary()
			return exec.CommandContext(ctx, self, append([]string{"bench", "floor", endpoint}, buffer...)...)
		}, floorLossless)
	}
	return PeerRun{}, fmt.Errorf("%w: receiver kind %q", ErrBadOption, row.Kind)
}

// processRun runs one receiver process that ends by itself at the end of the stream (spead2_recv at the
// stop heap, the floor when the stream goes quiet): its CPU from the sender's start to its exit.
func processRun(ctx context.Context, env Env, sender Sender, sh PeerShape, receiver func(context.Context, string) *exec.Cmd,
	lossless func(stdout []byte, sh PeerShape, sent SendResult) (bool, string)) (PeerRun, error) {
	var run PeerRun
	port, endpoint, err := loopbackEndpoint()
	if err != nil {
		return run, err
	}
	ctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	var out, sendOut bytes.Buffer
	var errOut LockedBuffer
	cmd := receiver(ctx, endpoint)
	rp, err := startReady(cmd, &out, &errOut, 10*time.Second, func() bool { return udpPortBound(port) })
	if err != nil {
		return run, fmt.Errorf("binding %s: %w", endpoint, err)
	}
	defer rp.kill()

	waitSettled(10*time.Second, cmd.Process.Pid) // its start-up (a memory pool filled) is not the stream's, as for recv
	send, err := sender.Command(ctx, nil, endpoint, sh.Heaps, sh.HeapSize, sh.PacketSize, sh.RateGbps)
	if err != nil {
		return run, err
	}
	send.Stdout, send.Stderr = &sendOut, env.Log
	cpu0, _ := cpuTime(cmd.Process.Pid)
	if err := send.Run(); err != nil {
		return run, fmt.Errorf("send: %w", err)
	}
	sr, err := sender.Parse(sendOut.Bytes())
	if err != nil {
		return run, err
	}
	werr := rp.finish(3 * time.Second)
	if werr != nil && cmd.ProcessState == nil {
		return run, fmt.Errorf("%s: %w: %s", cmd.Path, werr, errOut.String())
	}
	st := cmd.ProcessState
	run.CPUSeconds = (st.UserTime() + st.SystemTime() - cpu0).Seconds()
	run.SentGbps = sr.Gbps
	run.Lossless, run.Detail = lossless(out.Bytes(), sh, sr)
	if werr != nil {
		run.Lossless, run.Detail = false, fmt.Sprintf("%v: %s; %s", werr, strings.TrimSpace(errOut.String()), run.Detail)
	}
	return run, nil
}

// spead2Lossless reads spead2_recv's counters ("heaps: N", "incomplete_heaps_evicted: N", ...): every
// heap sent received, none incomplete.
func spead2Lossless(stdout []byte, sh PeerShape, _ SendResult) (bool, string) {
	c := map[string]uint64{}
	sc := bufio.NewScanner(bytes.NewReader(stdout))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ": "); ok {
			if n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64); err == nil {
				c[k] = n
			}
		}
	}
	heaps, ok := c["heaps"]
	detail := fmt.Sprintf("heaps %d, evicted %d, flushed %d, packets %d", heaps, c["incomplete_heaps_evicted"],
		c["incomplete_heaps_flushed"], c["packets"])
	return ok && heaps == sh.Heaps && c["incomplete_heaps_evicted"] == 0 && c["incomplete_heaps_flushed"] == 0, detail
}

// floorLossless: the floor counted every byte the sender says it sent.
func floorLossless(stdout []byte, _ PeerShape, sent SendResult) (bool, string) {
	ok, detail, err := floorCounted(stdout, sent.Bytes)
	if err != nil {
		return false, err.Error()
	}
	return ok, detail
}

// floorCounted reads the floor's output (its last line, a FloorResult): whether it counted every one of
// sent bytes, and what it counted.
func floorCounted(stdout []byte, sent uint64) (ok bool, detail string, err error) {
	var f FloorResult
	if err := json.Unmarshal(LastLine(stdout), &f); err != nil {
		return false, "", fmt.Errorf("floor output %q: %w", stdout, err)
	}
	return f.Bytes == sent, fmt.Sprintf("bytes %d of %d, %d messages in %d calls", f.Bytes, sent, f.Messages, f.Calls), nil
}

// spead2Sender is spead2_send: the traffic spead2_recv is built for. Its Bytes are UDP payload bytes.
type spead2Sender struct{ path string }

func (s spead2Sender) Command(ctx context.Context, wrap []string, endpoint string, heaps uint64, heapSize, packetSize int, rate float64) (*exec.Cmd, error) {
	return wrapped(ctx, wrap, s.path, "--heap-size", strconv.Itoa(heapSize), "--packet", strconv.Itoa(packetSize),
		"--rate", strconv.FormatFloat(rate, 'f', -1, 64), "--heaps", strconv.FormatUint(heaps, 10), endpoint), nil
}

var spead2SentLine = regexp.MustCompile(`Sent (\d+) bytes in ([0-9.e+-]+) seconds, ([0-9.e+-]+) Gb/s`)

func (spead2Sender) Parse(stdout []byte) (SendResult, error) {
	m := spead2SentLine.FindSubmatch(stdout)
	if m == nil {
		return SendResult{}, fmt.Errorf("spead2_send output %q: no \"Sent N bytes\" line", stdout)
	}
	b, _ := strconv.ParseUint(string(m[1]), 10, 64)
	s, _ := strconv.ParseFloat(string(m[2]), 64)
	g, _ := strconv.ParseFloat(string(m[3]), 64)
	return SendResult{Bytes: b, Seconds: s, Gbps: g}, nil
}

// PrintPeer writes `bench udp --peer`'s tables: per shape, each receiver's median CPU, recv's consumer,
// and the ratios to each spead2_recv build and to the floor (recv's alone and with its consumer).
func PrintPeer(w io.Writer, results []PeerResult, runs int) {
	for _, res := range results {
		sh := res.Shape
		fmt.Fprintf(w, "%s heaps, %d B packets, %g Gb/s, %d heaps: median of %d runs each, alternating; CPU = user+sys s of the receiving process\n",
			sizeName(sh.HeapSize), sh.PacketSize, sh.RateGbps, sh.Heaps, runs)
		var refs []PeerRow
		for _, r := range res.Rows {
			if r.Kind != "recv" {
				refs = append(refs, r)
			}
		}
		fmt.Fprintf(w, "  %-22s %7s %9s %8s %8s", "receiver", "CPU s", "consumer", "+cons", "lossless")
		for _, ref := range refs {
			fmt.Fprintf(w, "  %-22s", "÷ "+ref.Receiver+" (+cons)")
		}
		fmt.Fprintln(w)
		for _, r := range res.Rows {
			cons, with := "-", "-"
			if r.Kind == "recv" {
				cons, with = fmt.Sprintf("%.3f", r.ConsCPU), fmt.Sprintf("%.3f", r.CPU+r.ConsCPU)
			}
			fmt.Fprintf(w, "  %-22s %7.3f %9s %8s %8v", r.Receiver, r.CPU, cons, with, r.Lossless)
			for _, ref := range refs {
				cell := "-"
				if ref.CPU > 0 && r.Receiver != ref.Receiver {
					cell = fmt.Sprintf("%.2f×", r.CPU/ref.CPU)
					if r.Kind == "recv" {
						cell += fmt.Sprintf(" (%.2f×)", (r.CPU+r.ConsCPU)/ref.CPU)
					}
				}
				fmt.Fprintf(w, "  %-22s", cell)
			}
			fmt.Fprintln(w)
		}
	}
}

// sizeName writes a byte count as the flags take it: 1M, 8K or bytes.
func sizeName(n int) string {
	switch {
	case n%(1<<20) == 0:
		return strconv.Itoa(n>>20) + " MiB"
	case n%(1<<10) == 0:
		return strconv.Itoa(n>>10) + " KiB"
	}
	return strconv.Itoa(n) + " B"
}
