package ring

import (
	"encoding/binary"
	"errors"
	"testing"
)

// The client's reading of the producer's answer (spec §1.2): a welcome of 64 … 256 bytes is accepted (a
// later minor may append fields), a shorter one and a status-0 answer of another major are protocol
// errors, and an error record's message ends at its first NUL or at the record's end.
func TestDecodeWelcomeAsSpecified(t *testing.T) {
	w := welcome{Index: 3, Generation: 7, SessionID: 9, CtlSize: 8192, DataSize: 1 << 20, RegionLength: RegionSize}
	for _, n := range []int{WelcomeSize, 100, ErrorRecordMax} {
		b := append(w.encode(), make([]byte, n-WelcomeSize)...)
		got, err := decodeWelcome(b)
		if err != nil || got != w {
			t.Errorf("welcome of %d bytes: %+v %v", n, got, err)
		}
	}
	if _, err := decodeWelcome(w.encode()[:WelcomeSize-1]); !errors.Is(err, ErrProtocol) {
		t.Errorf("welcome of 63 bytes: %v, want ErrProtocol", err)
	}
	b := w.encode()
	binary.LittleEndian.PutUint16(b[msgMajor:], 3)
	if _, err := decodeWelcome(b); !errors.Is(err, ErrProtocol) || errors.Is(err, ErrVersion) {
		t.Errorf("status 0 with major 3: %v, want ErrProtocol", err)
	}
	rec := encodeRefusal(StatusBusy, "busy now")
	if _, err := decodeWelcome(rec[:len(rec)-1]); !errors.Is(err, ErrBusy) || err.Error() != "ring busy: busy now" {
		t.Errorf("error record without its NUL: %v", err)
	}
	if _, err := decodeWelcome(append(rec, "tail"...)); err == nil || err.Error() != "ring busy: busy now" {
		t.Errorf("error record with bytes after the NUL: %v", err)
	}
}
