// Package speadtest owns the test helpers that both the SPEAD wire format's tests (spead) and the
// assembler's (spead/assemble) use: encoding a heap into all its packets, and reading the SPEAD packets
// of a spead2 capture, building raw packets by hand, and generating the values spead2_send --verify fills items with.
package speadtest

import (
	"encoding/binary"
	"path/filepath"
	"testing"

	"github.com/ibvbridge/ibvbridge/frame"
	"github.com/ibvbridge/ibvbridge/frame/frametest"
	"github.com/ibvbridge/ibvbridge/spead"
)

// EncodeAll encodes heap h in flavour f into packets of at most packetSize bytes, each in a buffer of
// its own.
func EncodeAll(t testing.TB, f spead.Flavour, packetSize int, h *spead.Heap) [][]byte {
	t.Helper()
	enc, err := spead.NewEncoder(f, packetSize)
	if err != nil {
		t.Fatal(err)
	}
	if err := enc.Reset(h); err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for enc.More() {
		buf := make([]byte, enc.MaxPacketSize())
		n, err := enc.Next(buf)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, buf[:n])
	}
	return out
}

// CapturePayloads returns the UDP payloads (SPEAD packets) of one spead2 capture.
func CapturePayloads(t testing.TB, name string) [][]byte {
	t.Helper()
	frames := frametest.ReadFrames(t, filepath.Join(frametest.Dir(t), name))
	out := make([][]byte, len(frames))
	for i, f := range frames {
		u, err := frame.Parse(f)
		if err != nil {
			t.Fatalf("%s frame %d: %v", name, i, err)
		}
		out[i] = u.Payload
	}
	return out
}

// Minstd is the generator spead2_send --verify fills items with (the minimal standard LCG); X is its state,
// 1 for a fresh sender.
type Minstd struct{ X uint64 }

// Next is the generator's next value.
func (g *Minstd) Next() uint32 {
	g.X = g.X * 48271 % (1<<31 - 1)
	return uint32(g.X)
}

// Fill fills b with big-endian values of the generator, four bytes each (a tail shorter than four is
// left alone).
func (g *Minstd) Fill(b []byte) {
	for i := 0; i+4 <= len(b); i += 4 {
		binary.BigEndian.PutUint32(b[i:], g.Next())
	}
}

// RawPacket is a SPEAD packet built by hand, byte for byte: a header with idBytes and addrBytes (3 and 5
// for SPEAD-64-40), the raw item pointers and the payload; nothing is checked, so it can be malformed.
func RawPacket(idBytes, addrBytes byte, pointers []uint64, payload []byte) []byte {
	b := []byte{0x53, 0x04, idBytes, addrBytes, 0, 0, 0, 0}
	binary.BigEndian.PutUint16(b[6:], uint16(len(pointers)))
	for _, p := range pointers {
		b = binary.BigEndian.AppendUint64(b, p)
	}
	return append(b, payload...)
}

// Imm40 and Addr40 are SPEAD-64-40 item pointers: immediate value v, or address v, of item id.
func Imm40(id, v uint64) uint64  { return 1<<63 | id<<40 | v }
func Addr40(id, v uint64) uint64 { return id<<40 | v }

// ValidPacket is heap 7, offset 2 of a 10-byte heap, 4 bytes of payload, plus an address item and a
// stream control item (stop), in SPEAD-64-40.
func ValidPacket() []byte {
	return RawPacket(3, 5, []uint64{
		Imm40(1, 7), Imm40(2, 10), Imm40(3, 2), Imm40(4, 4), Addr40(0x1000, 0), Imm40(6, 2),
	}, []byte{1, 2, 3, 4})
}
