package bench

import (
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/ibvbridge/ibvbridge/internal/testnet"
)

// The floor counts every byte of every datagram sent to it, and returns once the stream goes quiet.
func TestFloorCountsEveryByteAndEndsWhenQuiet(t *testing.T) {
	port, err := testnet.FreeUDPPort()
	if err != nil {
		t.Fatal(err)
	}
	endpoint := "127.0.0.1:" + strconv.Itoa(port)
	type result struct {
		r   FloorResult
		err error
	}
	done := make(chan result, 1)
	go func() {
		r, err := Floor(endpoint, 1<<20, 10*time.Second, 200*time.Millisecond)
		done <- result{r, err}
	}()
	if err := waitFor(5*time.Second, func() bool { return udpPortBound(port) }); err != nil {
		t.Fatal("floor did not bind its port:", err)
	}
	c, err := net.Dial("udp4", endpoint)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	var want uint64
	for i := range 300 {
		n := 100 + i*7
		if _, err := c.Write(make([]byte, n)); err != nil {
			t.Fatal(err)
		}
		want += uint64(n)
		if i%50 == 0 {
			time.Sleep(time.Millisecond) // paced a little: a loopback socket buffer of 1 MiB holds the rest
		}
	}
	select {
	case r := <-done:
		if r.err != nil || r.r.Bytes != want || r.r.Messages == 0 || r.r.Calls == 0 || r.r.Calls > r.r.Messages {
			t.Fatalf("floor %+v, %v; want %d bytes", r.r, r.err, want)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("floor did not end after the stream went quiet")
	}
}

// A floor that hears nothing gives up after its first wait, saying so.
func TestFloorWithoutTrafficTimesOut(t *testing.T) {
	port, err := testnet.FreeUDPPort()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Floor("127.0.0.1:"+strconv.Itoa(port), 0, 300*time.Millisecond, time.Second); err == nil {
		t.Fatal("floor without traffic returned no error")
	}
	if _, err := Floor("localhost:1", 0, time.Second, time.Second); err == nil {
		t.Fatal("floor took a host name")
	}
}
