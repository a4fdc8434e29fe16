// Command simlog writes the ring simulation's replay stream (internal/ringsim/replay.go) to stdout: the
// scenarios of seeds -from … -from+-seeds−1, -steps steps each, as the model plays them. Replayers of the
// C and Python producers read it on stdin:
//
//	go run ./internal/ringsim/simlog -seeds 100 -nowrap | clients/c/build/sim_replay
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/ibvbridge/ibvbridge/internal/ringsim"
)

func main() {
	from := flag.Uint64("from", 1, "first seed")
	n := flag.Uint64("seeds", 10, "how many scenarios")
	steps := flag.Int("steps", 2000, "steps per scenario")
	noWrap := flag.Bool("nowrap", false, "start every scenario at position 0 (the C producer starts there)")
	flag.Parse()
	ringsim.NoWrap = *noWrap
	seeds := func(yield func(uint64) bool) {
		for s := *from; s < *from+*n; s++ {
			if !yield(s) {
				return
			}
		}
	}
	sc, total, err := ringsim.WriteReplay(os.Stdout, seeds, *steps)
	if err != nil {
		fmt.Fprintf(os.Stderr, "simlog: %v\n", err)
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "simlog: %d scenarios, %d steps\n", sc, total)
}
