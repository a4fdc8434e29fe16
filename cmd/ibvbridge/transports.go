package main

import (
	"strings"

	"github.com/ibvbridge/ibvbridge/bridge"
	"github.com/ibvbridge/ibvbridge/spead"
	"github.com/ibvbridge/ibvbridge/transport"
)

// transportKind is one --transport of recv and send. Each lives in its own file (transport_NAME.go: its
// flags' use, its checks, its opening); the table below is the only other place that names it.
type transportKind struct {
	name string
	// send opens the sender to destination e (nil: recv only); o is validated, enc is this sender's own.
	send func(o *sendOptions, e transport.Endpoint, enc *spead.Encoder) (transport.HeapSender, error)
	// recvCheck checks recv's options for this transport, opening nothing (nil: send only).
	recvCheck func(o *recvOptions) error
	// recv sets cfg.Source, or cfg.AreaSource for a transport that receives into the ring's packet area
	// (the pipeline opens it once the ring exists); o has passed recvCheck.
	recv func(o *recvOptions, cfg *bridge.Config) error
}

// transports are recv's and send's transports, in the order their usage errors list them.
var transports = []transportKind{udpTransport, pcapTransport, xdpTransport, ibvTransport}

// lookupTransport returns the transport named name (def if name is empty) among those ok accepts; any
// other name is a usage error listing them.
func lookupTransport(name, def string, ok func(transportKind) bool) (transportKind, error) {
	if name == "" {
		name = def
	}
	var names []string
	for _, t := range transports {
		if ok(t) {
			if t.name == name {
				return t, nil
			}
			names = append(names, t.name)
		}
	}
	want := strings.Join(names[:len(names)-1], ", ") + " or " + names[len(names)-1]
	return transportKind{}, usageError("--transport %q: want %s", name, want)
}
