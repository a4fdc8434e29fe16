package spead_test

import (
	"testing"

	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/spead/speadtest"
)

func BenchmarkDecode(b *testing.B) {
	oneEncoded := func(h spead.Heap, size, index int) []byte {
		packets := speadtest.EncodeAll(b, spead.Flavour64_40, size, &h)
		return packets[index]
	}
	cases := []struct {
		name   string
		packet []byte
	}{
		// A 4 KiB heap in one packet, as in small_4KiB_1pkt.
		{"heap_1pkt_4KiB", oneEncoded(spead.Heap{Cnt: 2, Items: []spead.Item{{ID: 0x1000, Data: make([]byte, 4096)}}}, 8972, 0)},
		// A middle packet of a 1 MiB heap, as in large_1MiB_p8972.
		{"large_heap_p8972", oneEncoded(spead.Heap{Cnt: 2, Items: []spead.Item{{ID: 0x1000, Data: make([]byte, 1<<20)}}}, 8972, 50)},
	}
	for _, c := range cases {
		b.Run(c.name, func(b *testing.B) {
			var p spead.Packet
			b.ReportAllocs()
			for b.Loop() {
				if err := spead.Decode(c.packet, &p); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

func BenchmarkEncodeNext(b *testing.B) {
	h := spead.Heap{Cnt: 1, Items: []spead.Item{{ID: 0x1000, Data: make([]byte, 1<<20)}}}
	enc, err := spead.NewEncoder(spead.Flavour64_40, 8972)
	if err != nil {
		b.Fatal(err)
	}
	buf := make([]byte, enc.MaxPacketSize())
	b.ReportAllocs()
	b.SetBytes(int64(len(buf)))
	for b.Loop() {
		if !enc.More() {
			if err := enc.Reset(&h); err != nil {
				b.Fatal(err)
			}
		}
		if _, err := enc.Next(buf); err != nil {
			b.Fatal(err)
		}
	}
}
