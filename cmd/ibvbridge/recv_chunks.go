package main

// recv's chunk-mode options: the chunk geometry and the --chunk-place function.

import (
	"math"
	"strconv"
	"strings"

	"github.com/ibvbridge/ibvbridge/internal/chunkplace"
	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/spead/assemble"
)

// chunkGeometry checks recv's chunk flags and returns the ring's chunk geometry (the zero value: chunk
// mode off, and then no other chunk flag may be given). With --chunk-place (placeItems: its items) the
// function places the heaps: --chunk-by is optional and, like --chunk-axis's item, only labels the header's
// time item (default: the first --chunk-place-items item, else the heap cnt 0x1).
func chunkGeometry(set map[string]bool, heaps uint, by, axis string, heapSize, window, slots int, placeItems []uint64) (ring.ChunkGeometry, error) {
	place := set["chunk-place"]
	if heaps == 0 {
		for _, n := range []string{"chunk-by", "chunk-axis", "chunk-window", "chunk-heap-size", "chunk-place"} {
			if set[n] {
				return ring.ChunkGeometry{}, usageError("--%s goes with --chunk-heaps N", n)
			}
		}
		return ring.ChunkGeometry{}, nil
	}
	if set["slot-size"] {
		return ring.ChunkGeometry{}, usageError("--slot-size does not go with --chunk-heaps: a slot holds one chunk, its size follows from the chunk")
	}
	if heaps > math.MaxUint32 {
		return ring.ChunkGeometry{}, usageError("--chunk-heaps %d: want 1..%d", heaps, uint32(math.MaxUint32))
	}
	if by == "" && !place {
		return ring.ChunkGeometry{}, usageError("--chunk-heaps needs --chunk-by ITEM[:STEP] (the item that gives a heap's time) or --chunk-place LIB.so:FUNCTION")
	}
	if heapSize < 1 {
		return ring.ChunkGeometry{}, usageError("--chunk-heaps needs --chunk-heap-size SIZE (the bytes of one heap position)")
	}
	if window < 1 || window > slots/2 {
		return ring.ChunkGeometry{}, usageError("--chunk-window %d: want 1..%d (half the --slots %d: each open chunk holds a slot, consumers hold the rest)", window, max(slots/2, 1), slots)
	}
	g := ring.ChunkGeometry{Heaps: uint32(heaps), Axis: 1, HeapSize: uint64(heapSize)}
	var err error
	switch {
	case by != "":
		if g.TimeItem, g.Step, err = parseItemValue("chunk-by", by, 1); err != nil {
			return g, err
		}
	case len(placeItems) > 0:
		g.TimeItem, g.Step = placeItems[0], 1
	default:
		g.TimeItem, g.Step = spead.HeapCntID, 1
	}
	if axis != "" {
		var count uint64
		if g.AxisItem, count, err = parseItemValue("chunk-axis", axis, 0); err != nil {
			return g, err
		}
		if count > math.MaxUint32 || g.AxisItem == g.TimeItem {
			return g, usageError("--chunk-axis %q: want another item than --chunk-by's, and COUNT at most %d", axis, uint32(math.MaxUint32))
		}
		g.Axis = uint32(count)
	}
	if _, ok := g.SlotBytes(); !ok {
		return g, usageError("a chunk of %d × %d heaps of %d bytes is too large", g.Heaps, g.Axis, g.HeapSize)
	}
	return g, nil
}

// parseChunkPlaceItems checks that --chunk-place-items and --chunk-place-arg come with --chunk-place and
// returns the items: ID,ID,... (at most assemble.MaxChunkPlaceItems).
func parseChunkPlaceItems(place, items string, set map[string]bool) ([]uint64, error) {
	if place == "" {
		for _, n := range []string{"chunk-place-items", "chunk-place-arg"} {
			if set[n] {
				return nil, usageError("--%s goes with --chunk-place LIB.so:FUNCTION", n)
			}
		}
		if set["chunk-place"] {
			return nil, usageError("--chunk-place \"\": want LIB.so:FUNCTION")
		}
		return nil, nil
	}
	if items == "" {
		return nil, nil
	}
	var ids []uint64
	for _, f := range strings.Split(items, ",") {
		id, err := strconv.ParseUint(strings.TrimSpace(f), 0, 64)
		if err != nil || id == 0 {
			return nil, usageError("--chunk-place-items %q: want item ids such as 0x1600,0x4101", items)
		}
		ids = append(ids, id)
	}
	if len(ids) > assemble.MaxChunkPlaceItems {
		return nil, usageError("--chunk-place-items: %d items, at most %d", len(ids), assemble.MaxChunkPlaceItems)
	}
	return ids, nil
}

// loadChunkPlace loads --chunk-place's function; a spec, library or function that is wrong is a usage error.
func loadChunkPlace(spec, arg string, set map[string]bool, items []uint64, g ring.ChunkGeometry) (*chunkplace.Plugin, error) {
	path, sym, err := chunkplace.ParseSpec(spec)
	if err != nil {
		return nil, usageError("--chunk-place %v", err)
	}
	plug, err := chunkplace.Open(chunkplace.Spec{Path: path, Symbol: sym, Arg: arg, HasArg: set["chunk-place-arg"], Items: items, Geometry: g})
	if err != nil {
		return nil, usageError("--chunk-place %s: %v", spec, err)
	}
	return plug, nil
}
