//go:build linux && cgo

package chunkplace_test

import (
	"bytes"
	"errors"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/internal/chunkplace"
	"github.com/ibvbridge/ibvbridge/internal/testutil"
	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/ring/ringtest"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/spead/assemble"
	"github.com/ibvbridge/ibvbridge/spead/pattern"
)

// The geometry of these tests: 4 time positions × 3 antennas of 2048 bytes, the timestamp stepping by 100.
const (
	tsItem, antItem       = 0x1600, 0x4101
	heaps, axis, heapSize = 4, 3, 2048
	step                  = 100
	missing               = assemble.ChunkPlaceMissing
)

var geometry = ring.ChunkGeometry{Heaps: heaps, Axis: axis, HeapSize: heapSize, Step: step, TimeItem: tsItem, AxisItem: antItem}

func openExample(t testing.TB, symbol string, arg *string) (*chunkplace.Plugin, error) {
	t.Helper()
	spec := chunkplace.Spec{Path: testutil.ChunkPlaceExample(t), Symbol: symbol, Items: []uint64{tsItem, antItem}, Geometry: geometry}
	if arg != nil {
		spec.Arg, spec.HasArg = *arg, true
	}
	p, err := chunkplace.Open(spec)
	if err == nil {
		t.Cleanup(p.Close)
	}
	return p, err
}

// The example plug-in answers what --chunk-by 0x1600:100 --chunk-axis 0x4101:3 compute: chunk t / heaps,
// position (t mod heaps) × axis + antenna for t = timestamp / step (the step from --chunk-place-arg), and
// rejects a heap without either item or with an antenna outside the axis.
func TestExamplePlacesByTimestampAndAntenna(t *testing.T) {
	arg := "100"
	p, err := openExample(t, "place", &arg)
	if err != nil {
		t.Fatal(err)
	}
	for ts := uint64(0); ts < 40*step; ts += 37 {
		for ant := uint64(0); ant < axis+2; ant++ {
			chunk, pos, off, ok := p.Place(ts+1, heapSize, []uint64{ts, ant})
			tt := ts / step
			wantOK := ant < axis
			if ok != wantOK || ok && (chunk != tt/heaps || pos != tt%heaps*axis+ant || off != 0) {
				t.Fatalf("ts %d antenna %d: chunk %d pos %d off %d ok %v", ts, ant, chunk, pos, off, ok)
			}
		}
	}
	for _, items := range [][]uint64{{missing, 0}, {500, missing}, {missing, missing}} {
		if _, _, _, ok := p.Place(1, missing, items); ok {
			t.Errorf("items %x placed; a missing item must reject the heap", items)
		}
	}
}

// Without --chunk-place-arg the function gets NULL (the example's step is then 1).
func TestExampleWithoutArgGetsNull(t *testing.T) {
	p, err := openExample(t, "place", nil)
	if err != nil {
		t.Fatal(err)
	}
	if chunk, pos, _, ok := p.Place(1, 1, []uint64{9, 2}); !ok || chunk != 2 || pos != 1*axis+2 {
		t.Fatalf("timestamp 9 step 1: chunk %d pos %d ok %v, want chunk 2 position 5", chunk, pos, ok)
	}
}

// A missing library, a file that is not a shared object and a missing function are refused, each with
// dlopen's or dlsym's reason; a spec without a colon, an empty function or path, a function name that is
// not C are refused by ParseSpec.
func TestOpenRefusals(t *testing.T) {
	dir := t.TempDir()
	notELF := filepath.Join(dir, "not.so")
	if err := os.WriteFile(notELF, []byte("not ELF"), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		spec chunkplace.Spec
		want error
		text string
	}{
		{chunkplace.Spec{Path: filepath.Join(dir, "missing.so"), Symbol: "place"}, chunkplace.ErrLoad, "No such file"},
		{chunkplace.Spec{Path: notELF, Symbol: "place"}, chunkplace.ErrLoad, "not.so"},
		{chunkplace.Spec{Path: testutil.ChunkPlaceExample(t), Symbol: "no_such_function"}, chunkplace.ErrNoSymbol, "no_such_function"},
	} {
		if _, err := chunkplace.Open(tc.spec); !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.text) {
			t.Errorf("Open(%+v) = %v, want %v mentioning %q", tc.spec, err, tc.want, tc.text)
		}
	}
	for _, s := range []string{"place.so", "place.so:", ":place", "place.so:1place", "place.so:pl-ace"} {
		if _, _, err := chunkplace.ParseSpec(s); err == nil {
			t.Errorf("ParseSpec(%q) accepted", s)
		}
	}
	path, sym, err := chunkplace.ParseSpec("lib/a:b.so:place_2")
	if wd, _ := os.Getwd(); err != nil || path != filepath.Join(wd, "lib/a:b.so") || sym != "place_2" {
		t.Errorf("ParseSpec: %q %q %v", path, sym, err)
	}
}

// The C plug-in in an Assembler places exactly as --chunk-by/--chunk-axis do: one stream of heaps
// shuffled within the window, with gaps, duplicates and late heaps and some antennas out of range, fed to
// a ring placed by the items and to one placed by the plug-in, gives the same chunks (ids, every byte of
// the slots, every presence byte) and the same counters.
func TestExampleInAssemblerPlacesAsTheFlags(t *testing.T) {
	arg := "100"
	plug, err := openExample(t, "place", &arg)
	if err != nil {
		t.Fatal(err)
	}
	packets := shuffledStream(t, 7)
	type result struct {
		chunks [][]byte
		ids    []uint64
		stats  map[string]uint64
	}
	run := func(cfg assemble.AssemblerConfig) result {
		p, c := ringtest.Pair(t, "cp", ring.Config{SlotCount: 64, Chunks: geometry, HugePages: ring.HugePagesOff},
			ring.AttachOptions{Timeout: time.Second})
		cfg.ChunkWindow = 2
		a, err := assemble.NewAssembler(p, cfg)
		if err != nil {
			t.Fatal(err)
		}
		for _, b := range packets {
			a.Packet(b, 1)
		}
		a.Flush()
		var r result
		for {
			h, ok, err := c.TryNext()
			if err != nil {
				t.Fatal(err)
			}
			if !ok {
				break
			}
			r.ids = append(r.ids, h.HeapCnt)
			r.chunks = append(r.chunks, bytes.Clone(h.Payload[:geometry.Bytes()+geometry.Positions()]))
			c.Release(h)
		}
		r.stats = p.Stats().Map()
		return r
	}
	byFlags := run(assemble.AssemblerConfig{})
	byPlugin := run(assemble.AssemblerConfig{Placement: plug})
	if len(byFlags.ids) < 10 || byFlags.stats["rejected_heaps"] == 0 || byFlags.stats["too_old_heaps"] == 0 ||
		byFlags.stats["incomplete_chunks"] == 0 {
		t.Fatalf("the stream does not exercise the placement: %d chunks, counters %v", len(byFlags.ids), byFlags.stats)
	}
	t.Logf("%d chunks, counters %v", len(byFlags.ids), byFlags.stats)
	if !slicesEqual(byFlags.ids, byPlugin.ids) {
		t.Fatalf("chunk ids %v by the flags, %v by the plug-in", byFlags.ids, byPlugin.ids)
	}
	for i := range byFlags.chunks {
		if !bytes.Equal(byFlags.chunks[i], byPlugin.chunks[i]) {
			t.Fatalf("chunk %d: bytes or presence map differ", byFlags.ids[i])
		}
	}
	for k, v := range byFlags.stats {
		if byPlugin.stats[k] != v {
			t.Errorf("counter %s: %d by the flags, %d by the plug-in", k, v, byPlugin.stats[k])
		}
	}
}

func slicesEqual(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// shuffledStream is 16 chunks of heaps for 4 antennas (the ring takes 3: the fourth is rejected), each
// with the test pattern, shuffled within blocks of 20 heaps, about one in 10 left out, one in 10 sent
// twice, and one in 25 held back 40 heaps (too old by then, or still in the window).
func shuffledStream(t testing.TB, seed uint64) [][]byte {
	g, err := pattern.NewHeapGenOptions(spead.Flavour64_40, 2000, 1, pattern.Options{Pattern: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := g.SetChunkItems(pattern.ChunkItems{TimeItem: tsItem, Step: step, AxisItem: antItem, AxisCount: axis + 1}); err != nil {
		t.Fatal(err)
	}
	enc, err := spead.NewEncoder(spead.Flavour64_40, 1500)
	if err != nil {
		t.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(seed, 2))
	n := uint64(16 * heaps * (axis + 1))
	var order []uint64
	var late []uint64
	for cnt := uint64(1); cnt <= n; cnt++ {
		switch r := rng.IntN(100); {
		case r < 10:
			continue
		case r < 20:
			order = append(order, cnt, cnt)
		case r < 24:
			late = append(late, cnt)
			continue
		default:
			order = append(order, cnt)
		}
		if len(late) > 0 && len(order) > 40 && rng.IntN(8) == 0 {
			order, late = append(order, late[0]), late[1:]
		}
	}
	for i := 0; i+20 <= len(order); i += 20 {
		rng.Shuffle(20, func(a, b int) { order[i+a], order[i+b] = order[i+b], order[i+a] })
	}
	var packets [][]byte
	for _, cnt := range order {
		if err := enc.Reset(g.Heap(cnt)); err != nil {
			t.Fatal(err)
		}
		for enc.More() {
			b := make([]byte, 1500)
			k, err := enc.Next(b)
			if err != nil {
				t.Fatal(err)
			}
			packets = append(packets, b[:k])
		}
	}
	return packets
}

// BenchmarkPlace is the cost of one heap's placement through the C plug-in (one cgo call) beside the same
// placement as a Go function: the difference is the cgo call's.
func BenchmarkPlace(b *testing.B) {
	arg := "100"
	p, err := openExample(b, "place", &arg)
	if err != nil {
		b.Fatal(err)
	}
	goPlace := func(_, _ uint64, items []uint64) (chunk, pos, off uint64, ok bool) {
		if items[0] == missing || items[1] == missing || items[1] >= axis {
			return 0, 0, 0, false
		}
		tt := items[0] / step
		return tt / heaps, tt%heaps*axis + items[1], 0, true
	}
	for _, bc := range []struct {
		name string
		f    assemble.ChunkPlaceFunc
	}{{"plugin", p.Place}, {"go", goPlace}} {
		b.Run(bc.name, func(b *testing.B) {
			items := []uint64{0, 0}
			var sum uint64
			b.ReportAllocs()
			for i := range b.N {
				items[0], items[1] = uint64(i)*step/axis, uint64(i)%axis
				if _, pos, _, ok := bc.f(uint64(i), heapSize, items); ok {
					sum += pos + 1
				}
			}
			if sum == 0 {
				b.Fatal("nothing placed")
			}
		})
	}
}
