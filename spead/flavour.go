package spead

import "strconv"

// Flavour is a SPEAD-64-* flavour, identified by its heap address width in bits. Item pointers are always 64
// bits wide: the top bit is the immediate flag, the next 63-HeapAddressBits bits the item id, the low
// HeapAddressBits bits the immediate value or heap address.
type Flavour uint8

// The two flavours spead2 uses in practice.
const (
	Flavour64_40 Flavour = 40
	Flavour64_48 Flavour = 48
)

// Valid reports whether f is one of the supported flavours.
func (f Flavour) Valid() bool { return f == Flavour64_40 || f == Flavour64_48 }

// HeapAddressBits is the width of heap addresses and immediate values.
func (f Flavour) HeapAddressBits() int { return int(f) }

// ImmediateBytes is the width of an immediate value in bytes (5 for 64-40, 6 for 64-48).
func (f Flavour) ImmediateBytes() int { return int(f) / 8 }

// IDBits is the width of an item id (23 for 64-40, 15 for 64-48).
func (f Flavour) IDBits() int { return 63 - int(f) }

// MaxID is the largest item id the flavour can carry.
func (f Flavour) MaxID() uint64 { return 1<<uint(f.IDBits()) - 1 }

// MaxValue is the largest immediate value or heap address the flavour can carry.
func (f Flavour) MaxValue() uint64 { return 1<<uint(f) - 1 }

func (f Flavour) String() string {
	return "SPEAD-64-" + strconv.Itoa(int(f))
}

// pointer assembles an item pointer; callers have checked that id and value fit.
func (f Flavour) pointer(id uint64, immediate bool, value uint64) uint64 {
	p := id<<uint(f) | value
	if immediate {
		p |= 1 << 63
	}
	return p
}

// SplitPointer splits a raw item pointer of flavour f into its immediate flag, id and value: the inverse
// of how the encoder builds one.
func (f Flavour) SplitPointer(raw uint64) ItemPointer {
	return ItemPointer{
		ID:        (raw >> uint(f)) & f.MaxID(),
		Immediate: raw>>63 != 0,
		Value:     raw & f.MaxValue(),
	}
}
