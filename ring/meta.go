package ring

import (
	"encoding/binary"
	"fmt"
	"time"
	"unicode/utf8"
)

// ItemDescriptor is a SPEAD item descriptor as the ring's stream-metadata area stores it (spec §6), so a
// consumer attaching late can still name and shape items.
type ItemDescriptor struct {
	ID          uint64
	Name        string
	Description string
	Format      []byte  // the SPEAD format field, raw
	DType       string  // numpy header text, e.g. {'descr': '>u4', 'fortran_order': False, 'shape': (8,)}
	Shape       []int64 // -1: variable dimension; nil with ShapeKnown false: unknown
	ShapeKnown  bool
}

const metaRecordFixed = 0x20

func encodeMeta(ds []ItemDescriptor) []byte {
	var out []byte
	le := binary.LittleEndian
	for _, d := range ds {
		ndim := uint32(0xFFFFFFFF)
		if d.ShapeKnown {
			ndim = uint32(len(d.Shape))
		}
		size := metaRecordFixed + 8*len(d.Shape) + len(d.Name) + len(d.Description) + len(d.Format) + len(d.DType)
		size = int(alignUp(uint64(size), 8))
		rec := make([]byte, size)
		le.PutUint32(rec[0:], uint32(size))
		le.PutUint32(rec[4:], ndim)
		le.PutUint64(rec[8:], d.ID)
		le.PutUint32(rec[0x10:], uint32(len(d.Name)))
		le.PutUint32(rec[0x14:], uint32(len(d.Description)))
		le.PutUint32(rec[0x18:], uint32(len(d.Format)))
		le.PutUint32(rec[0x1C:], uint32(len(d.DType)))
		o := metaRecordFixed
		if d.ShapeKnown {
			for _, s := range d.Shape {
				le.PutUint64(rec[o:], uint64(s))
				o += 8
			}
		}
		o += copy(rec[o:], d.Name)
		o += copy(rec[o:], d.Description)
		o += copy(rec[o:], d.Format)
		copy(rec[o:], d.DType)
		out = append(out, rec...)
	}
	return out
}

// decodeMeta parses records, rejecting any that runs past its bounds (spec §6). An id met twice keeps its
// last record (in the place of its first); strings are decoded as UTF-8 with replacement.
func decodeMeta(b []byte) ([]ItemDescriptor, error) {
	le := binary.LittleEndian
	var ds []ItemDescriptor
	at := map[uint64]int{}
	for len(b) > 0 {
		if len(b) < metaRecordFixed {
			return nil, fmt.Errorf("%w: metadata record header truncated", ErrCorrupt)
		}
		size := uint64(le.Uint32(b[0:]))
		if size < metaRecordFixed || size%8 != 0 || size > uint64(len(b)) {
			return nil, fmt.Errorf("%w: metadata record size %d", ErrCorrupt, size)
		}
		rec := b[:size]
		d := ItemDescriptor{ID: le.Uint64(rec[8:])}
		ndim := le.Uint32(rec[4:])
		lens := []uint64{uint64(le.Uint32(rec[0x10:])), uint64(le.Uint32(rec[0x14:])), uint64(le.Uint32(rec[0x18:])), uint64(le.Uint32(rec[0x1C:]))}
		o := uint64(metaRecordFixed)
		if ndim != 0xFFFFFFFF {
			if uint64(ndim) > (size-o)/8 {
				return nil, fmt.Errorf("%w: metadata record ndim %d", ErrCorrupt, ndim)
			}
			d.ShapeKnown = true
			d.Shape = make([]int64, ndim)
			for i := range d.Shape {
				d.Shape[i] = int64(le.Uint64(rec[o:]))
				o += 8
			}
		}
		var fields [4][]byte
		for i, n := range lens {
			if n > size-o {
				return nil, fmt.Errorf("%w: metadata record field runs past the record", ErrCorrupt)
			}
			fields[i] = rec[o : o+n]
			o += n
		}
		d.Name, d.Description, d.DType = validUTF8(fields[0]), validUTF8(fields[1]), validUTF8(fields[3])
		d.Format = append([]byte(nil), fields[2]...)
		if i, ok := at[d.ID]; ok {
			ds[i] = d
		} else {
			at[d.ID] = len(ds)
			ds = append(ds, d)
		}
		b = b[size:]
	}
	return ds, nil
}

// validUTF8 decodes b as UTF-8, each invalid byte replaced by U+FFFD (spec §6: the stream's bytes are
// not trusted to be text).
func validUTF8(b []byte) string {
	if utf8.Valid(b) {
		return string(b)
	}
	return string([]rune(string(b)))
}

// SetDescriptors replaces the stream's item descriptors in the metadata area, under its seqlock.
func (p *Producer) SetDescriptors(ds []ItemDescriptor) error {
	rec := encodeMeta(ds)
	g := p.geo
	if uint64(len(rec)) > g.MetaSize-metaHeaderSize {
		return fmt.Errorf("ring %s: %d bytes of item descriptors do not fit the %d-byte metadata area", p.name, len(rec), g.MetaSize)
	}
	area := p.data[g.MetaOffset : g.MetaOffset+g.MetaSize]
	seq := u64at(area, 0)
	s := seq.Load()
	seq.Store(s + 1) // odd: being rewritten
	binary.LittleEndian.PutUint64(area[8:], uint64(len(rec)))
	copy(area[metaHeaderSize:], rec)
	seq.Store(s + 2)
	return nil
}

// Metadata reader limits (spec §6): it gives up after this many tries or this long, whichever is longer.
const (
	metaMaxTries = 1000
	metaMaxWait  = 10 * time.Millisecond
)

// Descriptors reads the stream's item descriptors from the metadata area (spec §6): a private copy taken
// while the sequence number stayed even and unchanged, validated only then (a length read while the
// producer rewrote the area means nothing). ErrMetaBusy when no stable copy came within 1000 tries or 10 ms.
func (c *Consumer) Descriptors() ([]ItemDescriptor, error) {
	g := c.hdr.Geometry
	area := c.data[g.MetaOffset : g.MetaOffset+g.MetaSize]
	seq := u64at(area, 0)
	buf := make([]byte, 0, 256)
	start := time.Now()
	for tries := 0; ; tries++ {
		if tries >= metaMaxTries && time.Since(start) >= metaMaxWait {
			return nil, fmt.Errorf("ring %s: %w (rewritten during %d reads)", c.name, ErrMetaBusy, tries)
		}
		s1 := seq.Load()
		if s1&1 != 0 {
			continue
		}
		n := u64at(area, 8).Load()
		buf = append(buf[:0], area[metaHeaderSize:metaHeaderSize+min(n, g.MetaSize-metaHeaderSize)]...)
		if seq.Load() != s1 { // sequentially consistent: the copy above is ordered before it
			continue
		}
		if n > g.MetaSize-metaHeaderSize {
			return nil, fmt.Errorf("%w: metadata length %d exceeds the %d-byte area", ErrCorrupt, n, g.MetaSize)
		}
		return decodeMeta(buf)
	}
}
