package main

import (
	"flag"
	"fmt"
	"strconv"
	"strings"
)

// parseInterspersed parses flags that may come before, between or after positional arguments
// (`send HOST:PORT --heaps 10`), returning the positionals in order.
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := parseFlags(fs, args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		// flag stops at "--" (consumed, everything after is positional) or at the first non-flag.
		if len(args) > len(rest) && args[len(args)-len(rest)-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}

// byteSize is a flag holding a byte count written as 4096, 64K, 4M, 1G (binary multiples) or 4MiB.
type byteSize int

func (b *byteSize) String() string { return strconv.Itoa(int(*b)) }

func (b *byteSize) Set(s string) error {
	n, err := parseByteSize(s)
	if err != nil {
		return err
	}
	*b = byteSize(n)
	return nil
}

func parseByteSize(s string) (int, error) {
	t := strings.TrimSuffix(strings.TrimSuffix(strings.ToUpper(strings.TrimSpace(s)), "IB"), "B")
	mult := 1
	if t != "" {
		switch t[len(t)-1] {
		case 'K':
			mult = 1 << 10
		case 'M':
			mult = 1 << 20
		case 'G':
			mult = 1 << 30
		}
		if mult > 1 {
			t = t[:len(t)-1]
		}
	}
	n, err := strconv.ParseInt(t, 10, 64)
	if err != nil || n < 0 || n > (1<<40)/int64(mult) {
		return 0, fmt.Errorf("%q is not a byte count (e.g. 4096, 64K, 4M)", s)
	}
	return int(n) * mult, nil
}

func sizeFlag(fs *flag.FlagSet, name string, def int, usage string) *int {
	b := byteSize(def)
	fs.Var(&b, name, usage)
	return (*int)(&b)
}

// parseSizeList reads a comma-separated list of byte sizes ("8K,1M").
func parseSizeList(list string) ([]int, error) {
	var out []int
	for _, s := range strings.Split(list, ",") {
		n, err := parseByteSize(s)
		if err != nil || n < 1 {
			return nil, usageError("%q is not a size", s)
		}
		out = append(out, n)
	}
	return out, nil
}

// parseCPUs reads --cpus: comma-separated CPU numbers ("" is none).
func parseCPUs(list string) ([]int, error) {
	if list == "" {
		return nil, nil
	}
	var out []int
	for _, f := range strings.Split(list, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || n < 0 || n >= 1024 {
			return nil, usageError("--cpus %q: want CPU numbers like 0,1", list)
		}
		out = append(out, n)
	}
	return out, nil
}

// parseItemValue reads ITEM[:N] (item id and number in decimal or 0x hex, as spead2 writes ids): flag
// is the flag's name for the message, def the N when it is left out (0: N is required).
func parseItemValue(flag, s string, def uint64) (item, n uint64, err error) {
	id, val, hasVal := strings.Cut(s, ":")
	item, err = strconv.ParseUint(strings.TrimSpace(id), 0, 64)
	if err != nil || item == 0 {
		return 0, 0, usageError("--%s %q: want an item id such as 0x1600", flag, s)
	}
	if !hasVal {
		if def == 0 {
			return 0, 0, usageError("--%s %q: want ITEM:COUNT, e.g. 0x4101:64", flag, s)
		}
		return item, def, nil
	}
	n, err = strconv.ParseUint(strings.TrimSpace(val), 0, 64)
	if err != nil || n == 0 {
		return 0, 0, usageError("--%s %q: the number after ':' must be a positive integer", flag, s)
	}
	return item, n, nil
}
