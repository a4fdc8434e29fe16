package udp

import (
	"bytes"
	"strconv"
)

// parseDrops reads /proc/net/udp text: after a header line, one line per socket whose fields are
// "sl local rem st tx:rx tr:when retrnsmt uid timeout inode ref pointer drops". It returns the sum of drops
// over the sockets with the given inodes.
func parseDrops(b []byte, inodes []uint64) uint64 {
	var sum uint64
	for i, line := range bytes.Split(b, []byte("\n")) {
		if i == 0 {
			continue
		}
		f := bytes.Fields(line)
		if len(f) < 13 {
			continue
		}
		ino, err := strconv.ParseUint(string(f[9]), 10, 64)
		if err != nil {
			continue
		}
		for _, want := range inodes {
			if ino == want && want != 0 {
				d, _ := strconv.ParseUint(string(f[12]), 10, 64)
				sum += d
			}
		}
	}
	return sum
}
