package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/bench"
	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead/pattern"
)

// selfCPU is this process's CPU time (user + system) in seconds: the producer's, in the benchmark.
func selfCPU() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

// BenchmarkGroupProcesses (spec §14; a benchmark, not a timed test): a stream of 20000 heaps of 8 KiB
// whose per-heap work is CPU-bound (`consume --work-passes 40` or 200: 41 or 201 checksums of the payload) read by one
// `consume` process, then shared by a group of four, alternating; it reports each's heaps/s (from the
// first publish to the last consumer's exit) and the ratio group/one. Run:
// go test -run X -bench GroupProcesses -benchtime 3x ./cmd/ibvbridge/
func BenchmarkGroupProcesses(b *testing.B) {
	bin := binary(b)
	const heaps = 20000
	run := func(members int, passes string) float64 {
		dir := b.TempDir()
		p, err := ring.Create("gbench", ring.Config{Dir: dir, HugePages: ring.HugePagesOff, SlotCount: 256, SlotSize: 8192, Policy: ring.PolicyBlock})
		if err != nil {
			b.Fatal(err)
		}
		defer p.Close()
		var cmds []*exec.Cmd
		var outs []*bytes.Buffer
		for range members {
			c := exec.Command(bin, "consume", "--ring", "gbench", "--dir", dir, "--group-name", "g", "--work-passes", passes, "--timeout-ms", "30000")
			outs = append(outs, &bytes.Buffer{})
			c.Stdout = outs[len(outs)-1]
			if err := c.Start(); err != nil {
				b.Fatal(err)
			}
			cmds = append(cmds, c)
		}
		for deadline := time.Now().Add(20 * time.Second); p.Consumers() < members && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
		start, self0 := time.Now(), selfCPU()
		pb := pattern.Publisher{P: p, Size: 8192, Fill: true}
		for cnt := uint64(1); cnt <= heaps; cnt++ {
			if _, err := pb.Publish(cnt, 0); err != nil {
				b.Fatal(err)
			}
		}
		if err := p.PublishEndOfStream(0, 30*time.Second); err != nil {
			b.Fatal(err)
		}
		for _, c := range cmds {
			if err := c.Wait(); err != nil {
				b.Fatalf("consume: %v", err)
			}
		}
		rate := heaps / time.Since(start).Seconds()
		var read, sum uint64
		var cpu float64
		prodCPU := selfCPU() - self0
		defer func() {
			fmt.Printf("  %d members: %.0f heaps/s, consumers' CPU %.2f s, producer's %.2f s\n", members, rate, cpu, prodCPU)
		}()
		for _, o := range outs {
			var r bench.ConsumeResult
			if err := json.Unmarshal(o.Bytes(), &r); err != nil {
				b.Fatalf("consume output %q: %v", o.String(), err)
			}
			read, sum, cpu = read+r.Heaps, sum+r.HeapCntSum, cpu+r.CPUSeconds
		}
		if read != heaps || sum != heaps*(heaps+1)/2 {
			b.Fatalf("%d members read %d heaps (cnt sum %d), want each of %d once", members, read, sum, heaps)
		}
		return rate
	}
	for _, passes := range []string{"40", "200"} {
		b.Run("work-passes="+passes, func(b *testing.B) {
			var one, four float64
			for range b.N {
				one += run(1, passes)
				four += run(4, passes)
			}
			one, four = one/float64(b.N), four/float64(b.N)
			b.ReportMetric(one, "heaps/s-1")
			b.ReportMetric(four, "heaps/s-4")
			b.ReportMetric(four/one, "ratio")
			fmt.Printf("--work-passes %s: one consumer %.0f heaps/s, group of 4 %.0f heaps/s, ratio %.2f\n", passes, one, four, four/one)
		})
	}
}

// TestBenchGroupPythonEveryChunkOnce runs `bench group` once, tiny: one Python consumer, then a group of
// four, each reading a chunk ring with --work; each run's chunks add up to the stream, every chunk once
// (the benchmark checks counts, id sums and checksums), and the figures are real.
func TestBenchGroupPythonEveryChunkOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("short")
	}
	stdout, stderr, code := runCmd(t, 120*time.Second, "bench", "group", "--chunks", "40", "--chunk-heaps", "8",
		"--heap-size", "1K", "--slots", "8", "--rounds", "1", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, stderr)
	}
	var res bench.GroupResult
	if err := json.Unmarshal(bench.LastLine([]byte(stdout)), &res); err != nil {
		t.Fatalf("output %q: %v", stdout, err)
	}
	for _, r := range []bench.GroupRun{res.One, res.Group} {
		var sum uint64
		for _, s := range r.Shares {
			sum += s
		}
		if sum != 40 || r.ChunksPerS <= 0 || r.ConsumerCPU <= 0 || r.ProducerCPU < 0 {
			t.Errorf("%d consumers: %+v", r.Members, r)
		}
	}
	if len(res.One.Shares) != 1 || len(res.Group.Shares) != 4 || res.Ratio <= 0 || res.Ceiling <= 0 || len(res.Ratios) != 1 {
		t.Errorf("result %+v", res)
	}
	if _, stderr, code := runCmd(t, 10*time.Second, "bench", "group", "--members", "1"); code != 2 {
		t.Errorf("--members 1: exit %d, want a usage error (2): %s", code, stderr)
	}
}
