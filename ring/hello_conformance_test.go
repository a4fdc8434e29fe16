package ring_test

import (
	"encoding/binary"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/ring/ringtest"
)

// helloWith connects to sock, sends a consumer hello changed by mutate (which may also resize it), and
// returns the socket and the answer's status (descriptors closed); 0xFF when the answer is no record.
func helloWith(t *testing.T, sock string, mutate func([]byte) []byte) (int, uint32) {
	t.Helper()
	fd, err := unix.Socket(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: sock}); err != nil {
		t.Fatal(err)
	}
	h := make([]byte, ring.HelloSize)
	binary.LittleEndian.PutUint64(h, ring.Magic)
	binary.LittleEndian.PutUint16(h[8:], ring.MajorVersion)
	binary.LittleEndian.PutUint16(h[10:], ring.MinorVersion)
	binary.LittleEndian.PutUint32(h[12:], uint32(ring.RoleConsumer))
	if _, err := unix.Write(fd, mutate(h)); err != nil {
		t.Fatal(err)
	}
	buf, oob := make([]byte, ring.ErrorRecordMax), make([]byte, unix.CmsgSpace(4*4))
	n, oobn, _, _, _ := unix.Recvmsg(fd, buf, oob, unix.MSG_CMSG_CLOEXEC)
	msgs, _ := unix.ParseSocketControlMessage(oob[:max(oobn, 0)])
	for i := range msgs {
		fds, _ := unix.ParseUnixRights(&msgs[i])
		for _, f := range fds {
			unix.Close(f)
		}
	}
	if n < 16 {
		return fd, 0xFF
	}
	return fd, binary.LittleEndian.Uint32(buf[12:])
}

// The producer's answers to a hello (spec §1.2): status 5 for a wrong role or start and for non-zero
// reserved bytes, status 1 for another major, a welcome for any minor; a record sent after the welcome
// ends the attachment.
func TestHelloAnswersAsSpecified(t *testing.T) {
	cfg := testConfig(t)
	p := ringtest.New(t, "hello", cfg)
	sock := directSocket(t, p.SocketPath())
	set := func(off int, v uint32) func([]byte) []byte {
		return func(b []byte) []byte { binary.LittleEndian.PutUint32(b[off:], v); return b }
	}
	cases := []struct {
		name   string
		mutate func([]byte) []byte
		want   uint32
	}{
		{"role 3", set(0x0C, 3), ring.StatusProtocol},
		{"start 2", set(0x10, 2), ring.StatusProtocol},
		{"reserved 0x18", set(0x18, 1), ring.StatusProtocol}, // 0x14 is §14's group_id (group_test.go)
		{"reserved 0x1C", set(0x1C, 1<<24), ring.StatusProtocol},
		{"31 bytes", func(b []byte) []byte { return b[:31] }, ring.StatusProtocol},
		{"major 3", func(b []byte) []byte { binary.LittleEndian.PutUint16(b[8:], 3); return b }, ring.StatusVersion},
		{"minor 99", func(b []byte) []byte { binary.LittleEndian.PutUint16(b[10:], 99); return b }, 0},
	}
	for _, tc := range cases {
		fd, st := helloWith(t, sock, tc.mutate)
		if st != tc.want {
			t.Errorf("%s: status %d, want %d", tc.name, st, tc.want)
		}
		if st == 0 {
			waitConsumers(t, p, 1)
			if _, err := unix.Write(fd, []byte("stray")); err != nil {
				t.Fatal(err)
			}
			waitConsumers(t, p, 0) // the stray record ended the attachment
		}
	}
}
