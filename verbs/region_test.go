package verbs

import (
	"testing"
)

func TestPlanRegionSpead2Defaults(t *testing.T) {
	l, err := PlanRegion(0x7f0000000000, 32<<20, DefaultMaxSize, DefaultBufferSize)
	if err != nil {
		t.Fatal(err)
	}
	want := RegionLayout{Start: 0, Stride: 9216, SlotSize: 9200, Slots: 1823}
	if l != want {
		t.Fatalf("got %+v want %+v", l, want)
	}
	if l.Offset(1) != 9216 || l.Offset(1822) != 1822*9216 || l.Span() != 1822*9216+9200 {
		t.Fatalf("offsets %d %d span %d", l.Offset(1), l.Offset(1822), l.Span())
	}
	for i := range l.Slots {
		if (0x7f0000000000+l.Offset(i))%SlotAlign != 0 {
			t.Fatalf("slot %d misaligned", i)
		}
	}
}

func TestPlanRegionTooSmall(t *testing.T) {
	_, err := PlanRegion(0x10000, 4<<20, 9200, 16<<20)
	const want = "ibverbs: packet area 4 MiB holds 455 packets of 9200 bytes; buffer size 16 MiB needs 1823"
	if err == nil || err.Error() != want {
		t.Fatalf("got %v\nwant %s", err, want)
	}
	_, err = PlanRegion(0, 100, 9200, 9200)
	if err == nil || err.Error() != "ibverbs: packet area 100 bytes holds 0 packets of 9200 bytes; buffer size 9200 bytes needs 1" {
		t.Fatal(err)
	}
}

func TestPlanRegionAlignsStart(t *testing.T) {
	l, err := PlanRegion(0x1008, 1<<20, 1500, 15000)
	if err != nil {
		t.Fatal(err)
	}
	if l.Start != 56 || l.Stride != 1536 || l.Slots != 10 {
		t.Fatalf("%+v", l)
	}
	// Exactly enough: the last slot needs SlotSize, not a whole stride.
	exact := 56 + 9*1536 + 1500
	if _, err := PlanRegion(0x1008, exact, 1500, 15000); err != nil {
		t.Fatal(err)
	}
	if _, err := PlanRegion(0x1008, exact-1, 1500, 15000); err == nil {
		t.Fatal("one byte short accepted")
	}
}

func TestPlanRegionMinimumOneSlot(t *testing.T) {
	l, err := PlanRegion(0, 9200, 9200, 100)
	if err != nil || l.Slots != 1 {
		t.Fatal(l, err)
	}
}

func TestPlanRegionBadArgs(t *testing.T) {
	for _, a := range [][3]int{{-1, 9200, 1}, {100, 0, 1}, {100, 10, 0}} {
		if _, err := PlanRegion(0, a[0], a[1], a[2]); err == nil {
			t.Errorf("%v accepted", a)
		}
	}
}

func TestPlanAreaSlots(t *testing.T) {
	area := make([]byte, 1<<20)
	l, err := PlanArea(area, 2000, 20000)
	if err != nil {
		t.Fatal(err)
	}
	s := l.Slot(area, 3)
	if len(s) != 2000 || cap(s) != 2000 {
		t.Fatalf("slot len %d cap %d", len(s), cap(s))
	}
}
