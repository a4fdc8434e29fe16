package main

// The file-replay transport of recv (--transport pcap, the default with --pcap), in package transport/pcap.

import (
	"github.com/ibvbridge/ibvbridge/bridge"
	"github.com/ibvbridge/ibvbridge/transport/pcap"
)

var pcapTransport = transportKind{name: "pcap", recvCheck: checkPcapRecv, recv: openPcapRecv}

func checkPcapRecv(o *recvOptions) error {
	if o.pcapFile == "" {
		return usageError("--transport pcap needs --pcap FILE")
	}
	return nil
}

// openPcapRecv opens the file recv replays.
func openPcapRecv(o *recvOptions, cfg *bridge.Config) (err error) {
	cfg.Source, err = pcap.Open(pcap.Config{Path: o.pcapFile, Endpoints: o.eps, Paced: o.paced, Log: cfg.Log})
	return err
}
