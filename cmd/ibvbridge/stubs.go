package main

import "io"

// The receive path lands with issue 4; until then these commands say so.

func runRecv(args []string, stdout, stderr io.Writer) error {
	return usageError("recv: not in this build yet (issue 4)")
}

func runSend(args []string, stdout, stderr io.Writer) error {
	return usageError("send: not in this build yet (issue 4)")
}

func runBenchUDP(args []string, stdout, stderr io.Writer) error {
	return usageError("bench udp: not in this build yet (issue 4)")
}
