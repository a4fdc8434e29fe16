package main

import (
	"encoding/json"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	"github.com/ibvbridge/ibvbridge/ring"
)

func runStat(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("stat", stderr)
	asJSON := fs.Bool("json", false, "print one JSON object")
	dir := fs.String("dir", ring.DefaultDir, "directory of ring control files")
	pos, err := parseInterspersed(fs, args) // `stat NAME --json` as well as `stat --json NAME`
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageError("usage: ibvbridge stat [--json] RING")
	}
	info, err := ring.Inspect(pos[0], *dir)
	if err != nil {
		return err
	}
	if *asJSON {
		return json.NewEncoder(stdout).Encode(info)
	}
	w := tabwriter.NewWriter(stdout, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "ring\t%s\n", info.Name)
	fmt.Fprintf(w, "layout\tv%d.%d\n", info.Major, info.Minor)
	fmt.Fprintf(w, "state\t%s\n", info.State)
	fmt.Fprintf(w, "producer\tpid %d, alive %v, session %#x, heartbeat %s ago\n", info.ProducerPID, info.ProducerAlive,
		info.SessionID, time.Duration(info.HeartbeatAgeNs).Round(time.Millisecond))
	fmt.Fprintf(w, "consumer\tpid %d\n", info.ConsumerPID)
	fmt.Fprintf(w, "policy\t%s\n", info.Policy)
	fmt.Fprintf(w, "slots\t%d x %d bytes, %d items each\n", info.Geometry.SlotCount, info.Geometry.SlotSize, info.Geometry.MaxItems)
	fmt.Fprintf(w, "data\t%s (%d bytes, page %d)\n", info.DataPath, info.Geometry.DataFileSize, info.Geometry.PageSize)
	fmt.Fprintf(w, "cursors\thead %d, tail %d, unreleased %d\n", info.Head, info.Tail, info.Head-info.Tail)
	for _, c := range ring.Counters() {
		fmt.Fprintf(w, "%s\t%d\n", c, info.Counters[c.String()])
	}
	return w.Flush()
}
