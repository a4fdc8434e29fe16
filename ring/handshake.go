package ring

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/fnv"
)

// hello is the record a client sends after connecting (spec §1.2); Group is §14's group_id.
type hello struct {
	Major, Minor uint16
	Role, Start  uint32
	Group        uint32
}

// GroupID is the hello's group_id for a consumer group's name (spec §14): its 32-bit FNV-1a hash, 0 for
// "" (no group). A name whose hash is 0 gets 1, so every named group is a group. Two names with the same
// hash are one group: choosing names that do not collide is the user's part.
func GroupID(name string) uint32 {
	if name == "" {
		return 0
	}
	h := fnv.New32a()
	_, _ = h.Write([]byte(name))
	return max(h.Sum32(), 1)
}

func (h hello) encode() []byte {
	b := make([]byte, HelloSize)
	le := binary.LittleEndian
	le.PutUint64(b[msgMagic:], Magic)
	le.PutUint16(b[msgMajor:], h.Major)
	le.PutUint16(b[msgMinor:], h.Minor)
	le.PutUint32(b[helloRole:], h.Role)
	le.PutUint32(b[helloStart:], h.Start)
	le.PutUint32(b[helloGroup:], h.Group)
	return b
}

// decodeHello parses a client's record; a wrong size or magic, or a reserved byte that is not 0 (spec §1.2:
// a field this producer does not know), is a protocol error.
func decodeHello(b []byte) (hello, error) {
	le := binary.LittleEndian
	if len(b) != HelloSize || le.Uint64(b[msgMagic:]) != Magic {
		return hello{}, fmt.Errorf("hello of %d bytes is not an ibvbridge hello", len(b))
	}
	if r := b[helloReserved:HelloSize]; !bytes.Equal(r, make([]byte, len(r))) {
		return hello{}, fmt.Errorf("hello has non-zero reserved bytes at %#x (a field this producer does not know)", helloReserved)
	}
	return hello{Major: le.Uint16(b[msgMajor:]), Minor: le.Uint16(b[msgMinor:]),
		Role: le.Uint32(b[helloRole:]), Start: le.Uint32(b[helloStart:]), Group: le.Uint32(b[helloGroup:])}, nil
}

// welcome is the producer's answer to a hello that it accepts (spec §1.2).
type welcome struct {
	Index, Generation               uint32
	SessionID                       uint64
	CtlSize, DataSize, RegionLength uint64
}

func (w welcome) encode() []byte {
	b := make([]byte, WelcomeSize)
	le := binary.LittleEndian
	le.PutUint64(b[msgMagic:], Magic)
	le.PutUint16(b[msgMajor:], MajorVersion)
	le.PutUint16(b[msgMinor:], MinorVersion)
	le.PutUint32(b[welcomeIndex:], w.Index)
	le.PutUint32(b[welcomeGen:], w.Generation)
	le.PutUint64(b[welcomeSession:], w.SessionID)
	le.PutUint64(b[welcomeCtlSize:], w.CtlSize)
	le.PutUint64(b[welcomeDataSize:], w.DataSize)
	le.PutUint64(b[welcomeRegion:], w.RegionLength)
	return b
}

// encodeRefusal is an error record: status and a message, no descriptors.
func encodeRefusal(status uint32, msg string) []byte {
	if len(msg) > ErrorRecordMax-errorMessage-1 {
		msg = msg[:ErrorRecordMax-errorMessage-1]
	}
	b := make([]byte, errorMessage+len(msg)+1)
	le := binary.LittleEndian
	le.PutUint64(b[msgMagic:], Magic)
	le.PutUint16(b[msgMajor:], MajorVersion)
	le.PutUint16(b[msgMinor:], MinorVersion)
	le.PutUint32(b[welcomeStatus:], status)
	copy(b[errorMessage:], msg)
	return b
}

// refusalErrors maps an error record's status to the error a client returns.
var refusalErrors = map[uint32]error{
	StatusVersion: ErrVersion, StatusNotAllowed: ErrPermission, StatusBusy: ErrBusy,
	StatusClosing: ErrClosing, StatusProtocol: ErrProtocol,
}

// decodeWelcome parses the producer's answer; an error record becomes the matching error with the
// producer's message.
func decodeWelcome(b []byte) (welcome, error) {
	le := binary.LittleEndian
	if len(b) < errorMessage || le.Uint64(b[msgMagic:]) != Magic {
		return welcome{}, fmt.Errorf("%w: the producer's answer (%d bytes) is not an ibvbridge welcome", ErrProtocol, len(b))
	}
	if st := le.Uint32(b[welcomeStatus:]); st != StatusOK {
		msg := b[errorMessage:]
		if i := bytes.IndexByte(msg, 0); i >= 0 {
			msg = msg[:i]
		}
		base, ok := refusalErrors[st]
		if !ok {
			base = ErrProtocol
		}
		return welcome{}, fmt.Errorf("%w: %s", base, msg)
	}
	if major := le.Uint16(b[msgMajor:]); major != MajorVersion {
		// A producer of another major refuses with status 1; a welcome claiming one is malformed (§1.2).
		return welcome{}, fmt.Errorf("%w: a welcome (status 0) of layout major %d, want %d", ErrProtocol, major, MajorVersion)
	}
	// A later minor may append fields: 64 … 256 bytes, the first 64 read (spec §1.2).
	if len(b) < WelcomeSize || len(b) > ErrorRecordMax {
		return welcome{}, fmt.Errorf("%w: welcome of %d bytes, want %d … %d", ErrProtocol, len(b), WelcomeSize, ErrorRecordMax)
	}
	return welcome{Index: le.Uint32(b[welcomeIndex:]), Generation: le.Uint32(b[welcomeGen:]),
		SessionID: le.Uint64(b[welcomeSession:]), CtlSize: le.Uint64(b[welcomeCtlSize:]),
		DataSize: le.Uint64(b[welcomeDataSize:]), RegionLength: le.Uint64(b[welcomeRegion:])}, nil
}
