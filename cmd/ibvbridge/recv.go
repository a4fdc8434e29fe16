package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime/pprof"
	"strconv"
	"syscall"
	"time"

	"github.com/rs/zerolog"

	"github.com/ibvbridge/ibvbridge/bridge"
	"github.com/ibvbridge/ibvbridge/internal/proccpu"
	"github.com/ibvbridge/ibvbridge/internal/sdnotify"
	"github.com/ibvbridge/ibvbridge/internal/version"
	"github.com/ibvbridge/ibvbridge/metrics"
	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead/assemble"
	"github.com/ibvbridge/ibvbridge/transport"
)

func runRecv(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("recv", stderr)
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), recvUsage)
		fs.PrintDefaults()
	}
	o := recvFlags(fs)
	if err := parseRecv(fs, o, args); err != nil {
		return err
	}
	log, _ := newLogger(o.logFormat, stderr) // validated
	cfg := bridge.Config{Ring: o.name, RingCfg: o.ringConfig(),
		Assembler:    assemble.AssemblerConfig{MaxHeaps: o.maxHeaps, Incomplete: o.incomplete, ChunkWindow: o.chunkWindow, KeepGoing: o.keepGoing},
		WaitConsumer: o.waitConsumer, StatsInterval: o.statsEvery, LossSummary: o.lossSummary, Log: &log}
	if o.chunkPlace != "" { // loaded before anything is opened: a bad library leaves nothing behind
		plug, err := loadChunkPlace(o.chunkPlace, o.chunkPlaceArg, o.set, o.placeItems, o.chunks)
		if err != nil {
			return err
		}
		defer plug.Close()
		cfg.Assembler.Placement = plug
	}
	if o.cpuProfile != "" { // before anything is opened: a bad path fails without leaving anything behind
		stop, err := startCPUProfile(o.cpuProfile)
		if err != nil {
			return err
		}
		defer stop()
	}
	notify, err := sdnotify.FromEnv() // $NOTIFY_SOCKET: under systemd (Type=notify) or a supervisor like it
	if err != nil {
		return err
	}
	defer notify.Close()
	notifyHooks(&cfg, notify, o.name, &log)
	// Signals are ours from before the ring exists: a SIGINT that arrives while it is being created must
	// still end in a clean stop, not the default exit that would leave the ring behind.
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	defer signal.Stop(sigs)
	// A log pipe whose reader went away (`recv ... 2>&1 | head`) must not kill the receiver and leave its
	// ring behind: writes to it fail with EPIPE instead, and the stream goes on until it is stopped.
	signal.Ignore(syscall.SIGPIPE)
	tr, _ := lookupTransport(o.transport, "udp", func(t transportKind) bool { return t.recv != nil }) // validated
	if err := tr.recv(o, &cfg); err != nil {
		return err
	}
	var collector *metrics.Collector
	if o.metricsAddr != "" { // bound before the ring exists: a busy port leaves nothing behind
		collector = metrics.NewCollector(o.name, o.transport)
		srv, err := metrics.Listen(o.metricsAddr, collector, &log)
		if err != nil {
			closeSource(cfg.Source)
			return err
		}
		defer srv.Close()
	}
	rcv, err := bridge.Open(cfg)
	if err != nil {
		return err
	}
	defer rcv.Close()
	if collector != nil {
		collector.Attach(rcv)
	}
	return receive(o, rcv, sigs, notify, &log, stdout)
}

// notifyHooks tells the service manager (sd_notify) that recv is ready and, at each tick, alive.
func notifyHooks(cfg *bridge.Config, notify *sdnotify.Notifier, name string, log *zerolog.Logger) {
	cfg.Ready = func() {
		if err := notify.Send("READY=1\nSTATUS=receiving into ring " + name); err != nil {
			log.Warn().Err(err).Msg("sd_notify READY")
		}
	}
	cfg.Tick = func(now time.Time) {
		if err := notify.Ping(now); err != nil {
			log.Warn().Err(err).Msg("sd_notify WATCHDOG")
		}
	}
}

// receive runs the opened receiver until the stream ends or a signal stops it, then reports.
func receive(o *recvOptions, rcv *bridge.Receiver, sigs <-chan os.Signal, notify *sdnotify.Notifier, log *zerolog.Logger, stdout io.Writer) error {
	p := rcv.Producer()
	ev := log.Info().Str("ring", o.name).Str("transport", o.transport)
	if len(o.endpoints) > 0 {
		ev = ev.Strs("endpoints", o.endpoints)
	}
	if o.pcapFile != "" { // only a replay has a file
		ev = ev.Str("file", o.pcapFile)
	}
	if o.chunkHeaps > 0 {
		ev = ev.Uint("chunk_heaps", o.chunkHeaps)
	}
	if o.keepGoing {
		ev = ev.Bool("keep_going", true)
	}
	ev.Str("version", version.Version).Int("slots", o.slots).Int("slot_size", p.SlotSize()).Bool("hugepages", p.Huge()).
		Str("policy", o.pol.String()).Msg("receiving")
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go stopOnSignals(sigs, cancel, rcv, log)
	res, err := rcv.Run(ctx)
	_ = notify.Send("STOPPING=1")
	if err != nil {
		return err
	}
	// The stream's CPU ends here: closing a large ring frees its pages, seconds of it for gigabytes.
	cpu := proccpu.Used()
	res.Transport = o.transport
	if err := rcv.Close(); err != nil {
		log.Warn().Err(err).Msg("closing the ring")
	}
	if err := printRecvResult(o, res, cpu.Seconds(), log, stdout); err != nil {
		return err
	}
	if res.Outcome == bridge.OutcomeError {
		return &exitError{code: 1}
	}
	return nil
}

// printRecvResult reports the final counters: one JSON object on stdout with --log-format json (with
// cpu_seconds beside the result's fields: user + system, from the start to the stream's end), else a log line.
func printRecvResult(o *recvOptions, res bridge.Result, cpuSeconds float64, log *zerolog.Logger, stdout io.Writer) error {
	if o.logFormat == "json" {
		var out map[string]json.RawMessage
		b, err := json.Marshal(res)
		if err == nil {
			err = json.Unmarshal(b, &out)
		}
		if err != nil {
			return err
		}
		out["cpu_seconds"] = json.RawMessage(strconv.FormatFloat(cpuSeconds, 'f', 6, 64))
		return json.NewEncoder(stdout).Encode(out)
	}
	ev := log.Info().Str("result", string(res.Outcome)).Float64("seconds", res.Seconds)
	for _, c := range ring.Counters() {
		ev = ev.Uint64(c.String(), res.RingCounters[c.String()])
	}
	if o.chunks.Enabled() {
		ev = ev.Uint64("chunk_rebases", res.ChunkRebases)
	}
	ev.Interface("transport", res.TransportCounters).Msg("stopped")
	return nil
}

// stopOnSignals turns the first SIGINT/SIGTERM into a clean stop (cancel), and a second into an exit at
// once, after closing the ring so that nothing is left behind.
func stopOnSignals(sigs <-chan os.Signal, cancel context.CancelFunc, rcv *bridge.Receiver, log *zerolog.Logger) {
	s, ok := <-sigs
	if !ok {
		return
	}
	log.Info().Str("signal", s.String()).Msg("stopping")
	cancel()
	if s, ok = <-sigs; !ok {
		return
	}
	log.Warn().Str("signal", s.String()).Msg("second signal: exiting at once")
	rcv.Close()
	os.Exit(1)
}

// closeSource closes a source that was opened but never handed to the pipeline (nil for kernel-bypass
// sources, which open later).
func closeSource(s transport.Source) {
	if s != nil {
		s.Close()
	}
}

// startCPUProfile writes a CPU profile to path until the returned function is called.
func startCPUProfile(path string) (stop func(), err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpuprofile: %w", err)
	}
	return func() { pprof.StopCPUProfile(); f.Close() }, nil
}

func parseHugePages(s string) (ring.HugePages, error) {
	switch s {
	case "auto":
		return ring.HugePagesAuto, nil
	case "require":
		return ring.HugePagesRequire, nil
	case "off":
		return ring.HugePagesOff, nil
	}
	return 0, usageError("--hugepages %q: want auto, require or off", s)
}
