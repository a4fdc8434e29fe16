package ring_test

import (
	"encoding/binary"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/ring/ringtest"
)

// metaArea is the producer's writable view of the metadata area (spec §6), for tests that play a producer
// in the middle of a rewrite.
func metaArea(p *ring.Producer) []byte {
	ctl := ring.CtlForTest(p)
	off, size := binary.LittleEndian.Uint64(ctl[0x68:]), binary.LittleEndian.Uint64(ctl[0x70:])
	return ring.DataForTest(p)[off : off+size]
}

func metaWord(area []byte, off int) *atomic.Uint64 {
	return (*atomic.Uint64)(unsafe.Pointer(&area[off]))
}

// A length read while the producer rewrites the area means nothing (spec §6): the reader validates it only
// after the sequence number proved the copy stable, so a rewrite that passes through a huge length never
// makes a reader report a corrupt ring.
func TestMetadataLengthValidatedOnlyOnceStable(t *testing.T) {
	cfg := testConfig(t)
	p := ringtest.New(t, "metalen", cfg)
	c := ringtest.Attach(t, "metalen", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
	if err := p.SetDescriptors([]ring.ItemDescriptor{{ID: 0x1000, Name: "x"}}); err != nil {
		t.Fatal(err)
	}
	area := metaArea(p)
	seq, length := metaWord(area, 0), metaWord(area, 8)
	good := length.Load()
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // a producer rewriting the area over and over, its length briefly garbage each time
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			s := seq.Load()
			seq.Store(s + 1)
			length.Store(^uint64(0))
			length.Store(good)
			seq.Store(s + 2)
			for i := 0; i < 50; i++ { // a stable window, so readers can finish
				_ = seq.Load()
			}
		}
	}()
	var ok, busy int
	for i := 0; i < 20000; i++ {
		ds, err := c.Descriptors()
		switch {
		case err == nil && len(ds) == 1 && ds[0].Name == "x":
			ok++
		case errors.Is(err, ring.ErrMetaBusy):
			busy++
		default:
			close(stop)
			<-done
			t.Fatalf("read %d during rewrites: %v %v (a length seen mid-rewrite was judged)", i, ds, err)
		}
	}
	close(stop)
	<-done
	if ok == 0 {
		t.Fatalf("no read succeeded (%d busy)", busy)
	}
}

// A reader gives up after 1000 tries or 10 ms, whichever is longer, with "metadata area busy" (spec §6).
func TestMetadataReaderGivesUpBusy(t *testing.T) {
	cfg := testConfig(t)
	p := ringtest.New(t, "metabusy", cfg)
	c := ringtest.Attach(t, "metabusy", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
	seq := metaWord(metaArea(p), 0)
	seq.Store(seq.Load() | 1) // a producer that never finishes its rewrite
	_, err := c.Descriptors()
	if !errors.Is(err, ring.ErrMetaBusy) || !strings.Contains(err.Error(), "metadata area busy") {
		t.Fatalf("reader of a never-stable area: %v, want ErrMetaBusy", err)
	}
}

// A re-described id keeps its last record (spec §6), and strings are decoded as UTF-8 with replacement.
func TestMetadataRepeatedIDKeepsLastAndStringsAreValidUTF8(t *testing.T) {
	cfg := testConfig(t)
	p := ringtest.New(t, "metadup", cfg)
	c := ringtest.Attach(t, "metadup", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
	if err := p.SetDescriptors([]ring.ItemDescriptor{
		{ID: 0x1000, Name: "first"}, {ID: 0x1001, Name: "other"}, {ID: 0x1000, Name: "last\xff\xfe", Description: "d\x80"},
	}); err != nil {
		t.Fatal(err)
	}
	ds, err := c.Descriptors()
	if err != nil {
		t.Fatal(err)
	}
	if len(ds) != 2 {
		t.Fatalf("%d descriptors for 2 ids: %+v", len(ds), ds)
	}
	var d ring.ItemDescriptor
	for _, x := range ds {
		if x.ID == 0x1000 {
			d = x
		}
	}
	if d.Name != "last\uFFFD\uFFFD" || d.Description != "d\uFFFD" || !utf8.ValidString(d.Name) {
		t.Fatalf("id 0x1000: name %q description %q, want the last record with replacement characters", d.Name, d.Description)
	}
}

// A minor never adds a header or row state (spec §8): a consumer that reads an unknown one reports a
// corrupt ring, not a detach or a timeout.
func TestUnknownHeaderOrRowStateIsCorrupt(t *testing.T) {
	cfg := testConfig(t)
	p := ringtest.New(t, "unkstate", cfg)
	c := ringtest.Attach(t, "unkstate", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
	ctl := ring.CtlForTest(p)
	state := (*atomic.Uint32)(unsafe.Pointer(&ctl[0x10]))
	state.Store(7)
	if _, err := c.Next(50 * time.Millisecond); !errors.Is(err, ring.ErrCorrupt) {
		t.Fatalf("header state 7: %v, want ErrCorrupt", err)
	}
	state.Store(uint32(ring.StateReady))
	row := (*atomic.Uint32)(unsafe.Pointer(&ctl[0x1000+128*c.Index()]))
	row.Store(9)
	if _, _, err := c.TryNext(); !errors.Is(err, ring.ErrCorrupt) || errors.Is(err, ring.ErrDetached) {
		t.Fatalf("row state 9: %v, want ErrCorrupt", err)
	}
}

// A region of size 0 is not checked for alignment or overlap, only its offset ≤ data_size (spec §9 step 5,
// §2.1: an empty packet area's offset may sit at the unaligned end of the payload slots).
func TestZeroSizeRegionNeedsOnlyOffsetWithinData(t *testing.T) {
	for _, tc := range []struct {
		name string
		off  func(dataSize, payloadEnd uint64) uint64
		ok   bool
	}{
		{"unaligned, inside the payload", func(_, pe uint64) uint64 { return pe - 32 }, true},
		{"unaligned, below data_size", func(ds, _ uint64) uint64 { return ds - 8 }, true},
		{"data_size", func(ds, _ uint64) uint64 { return ds }, true},
		{"past data_size", func(ds, _ uint64) uint64 { return ds + 1 }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(t)
			p := ringtest.New(t, "zero", cfg)
			ctl := ring.CtlForTest(p)
			le := binary.LittleEndian
			ds := le.Uint64(ctl[0x50:])
			pe := le.Uint64(ctl[0x78:]) + le.Uint64(ctl[0x30:])*le.Uint64(ctl[0x38:])
			patchCtl(p, 0x88, le64(0))
			patchCtl(p, 0x80, le64(tc.off(ds, pe)))
			c, err := ring.Attach("zero", ring.AttachOptions{Dir: cfg.Dir, Timeout: time.Second})
			if err == nil {
				c.Close()
			}
			if tc.ok != (err == nil) || (err != nil && !errors.Is(err, ring.ErrCorrupt)) {
				t.Fatalf("packet_offset %d with packet_size 0 (data_size %d): %v", tc.off(ds, pe), ds, err)
			}
		})
	}
}
