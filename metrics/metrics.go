// Package metrics owns recv's Prometheus exposition: a collector that reads a receive pipeline's counters
// when it is scraped — the packet path pays nothing for it — and the HTTP server for /metrics and the
// probes an orchestrator asks: /healthz (the process serves) and /readyz (the ring exists and its stream
// has not ended).
//
// Names: every ring counter (spec §2.6) is ibvbridge_<counter>_total{ring}, malformed packets are split by
// reason, every transport counter is ibvbridge_transport_<counter>_total{ring,transport}, and the ring's
// state is in gauges (slots, unread heaps, end of stream, producer start time).
package metrics

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/rs/zerolog"

	"github.com/ibvbridge/ibvbridge/internal/version"
	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/spead"
)

// Pipeline is what the collector reads; bridge.Receiver implements it. Every method is called at scrape
// time from the HTTP server's goroutine and must be safe for that.
type Pipeline interface {
	Producer() *ring.Producer
	TransportCounters() map[string]uint64
	MalformedByReason() map[string]uint64
	// ThreadCounters is each receive thread's share (nil with one thread).
	ThreadCounters() []map[string]uint64
}

// transportGauges are transport counters that are levels, not totals.
var transportGauges = map[string]bool{"buffer_size": true, "zero_copy": true}

// Collector is a prometheus.Collector over one pipeline. Its metrics are unchecked (Describe sends
// nothing): the transport's counter names are known only at scrape time.
type Collector struct {
	ring      string
	transport string
	p         atomic.Pointer[Pipeline]
	start     time.Time
}

// NewCollector makes the collector of a pipeline receiving into ring over transport. It reports nothing
// until Attach gives it the pipeline: recv binds the metrics address before it creates the ring, so a busy
// port fails before anything exists.
func NewCollector(ringName, transportName string) *Collector {
	return &Collector{ring: ringName, transport: transportName, start: time.Now()}
}

// Attach starts collecting pipeline p; safe while scrapes run.
func (c *Collector) Attach(p Pipeline) { c.p.Store(&p) }

// NotReady says why the pipeline cannot take consumers now ("" when it can): before Attach the ring does
// not exist yet; after the stream's end it takes no more heaps. /readyz answers 503 with this line.
func (c *Collector) NotReady() string {
	pp := c.p.Load()
	if pp == nil {
		return "ring " + c.ring + " not created yet"
	}
	if (*pp).Producer().Stats().Get(ring.CounterEndOfStream) != 0 {
		return "ring " + c.ring + ": end of stream"
	}
	return ""
}

// Describe implements prometheus.Collector.
func (c *Collector) Describe(chan<- *prometheus.Desc) {}

// Collect implements prometheus.Collector.
func (c *Collector) Collect(ch chan<- prometheus.Metric) {
	pp := c.p.Load()
	if pp == nil {
		return
	}
	p := *pp
	prod := p.Producer()
	st := prod.Stats()
	ringLabel := []string{"ring"}
	for _, k := range ring.Counters() {
		switch k {
		case ring.CounterEndOfStream:
			c.gauge(ch, "ibvbridge_end_of_stream", "1 once the stream has ended (end-of-stream published)", ringLabel, float64(st.Get(k)), c.ring)
		case ring.CounterConsumersAttached:
			c.gauge(ch, "ibvbridge_consumers_attached", "consumers attached to the ring now", ringLabel, float64(st.Get(k)), c.ring)
		case ring.CounterMalformedPackets:
			// By reason below; their sum is this counter.
		default:
			c.counter(ch, "ibvbridge_"+k.String()+"_total", "ring counter "+k.String()+" (docs/ring-layout.md §2.3)", ringLabel, float64(st.Get(k)), c.ring)
		}
	}
	// Every rejection reason has its series from the start (0 until it happens), so rate() works at once;
	// there is no reason="none" series: "none" is not a rejection.
	byReason := map[string]uint64{}
	for r := spead.ReasonNone + 1; r < spead.NumReasons; r++ {
		byReason[r.String()] = 0
	}
	for reason, n := range p.MalformedByReason() {
		byReason[reason] = n
	}
	for reason, n := range byReason {
		c.counter(ch, "ibvbridge_malformed_packets_total", "packets the SPEAD decoder or assembler rejected, by reason",
			[]string{"ring", "reason"}, float64(n), c.ring, reason)
	}
	geo := prod.Geometry()
	c.gauge(ch, "ibvbridge_ring_slots", "payload slots in the ring", ringLabel, float64(geo.SlotCount), c.ring)
	c.gauge(ch, "ibvbridge_ring_slot_bytes", "payload bytes per slot", ringLabel, float64(geo.SlotSize), c.ring)
	c.gauge(ch, "ibvbridge_ring_unread_heaps", "heaps published and still holding slots: what the slowest consumer has not released (the ring's fill)",
		ringLabel, float64(prod.Backlog()), c.ring)
	c.gauge(ch, "ibvbridge_start_time_seconds", "when this recv started (Unix time)", ringLabel, float64(c.start.UnixNano())/1e9, c.ring)
	c.gauge(ch, "ibvbridge_build_info", "1, labelled with the version recv runs", []string{"ring", "version"}, 1, c.ring, version.Version)
	for _, r := range prod.ConsumerRows() {
		if r.Attached() {
			c.gauge(ch, "ibvbridge_consumer_lag_heaps", "heaps an attached consumer has still to release (head - its position)",
				[]string{"ring", "row", "pid"}, float64(r.Lag), c.ring, strconv.Itoa(r.Index), strconv.FormatUint(r.PID, 10))
		}
	}
	if threads := p.ThreadCounters(); len(threads) > 1 {
		for k, m := range threads {
			for name, v := range m {
				c.counter(ch, "ibvbridge_transport_thread_"+sanitize(name)+"_total", "per receive thread: "+name,
					[]string{"ring", "transport", "thread"}, float64(v), c.ring, c.transport, strconv.Itoa(k))
			}
		}
	}
	tl := []string{"ring", "transport"}
	for name, v := range p.TransportCounters() {
		n := sanitize(name)
		if transportGauges[name] {
			c.gauge(ch, "ibvbridge_transport_"+n, "transport level "+name, tl, float64(v), c.ring, c.transport)
		} else {
			c.counter(ch, "ibvbridge_transport_"+n+"_total", "transport counter "+name, tl, float64(v), c.ring, c.transport)
		}
	}
}

func (c *Collector) counter(ch chan<- prometheus.Metric, name, help string, labels []string, v float64, values ...string) {
	ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(name, help, labels, nil), prometheus.CounterValue, v, values...)
}

func (c *Collector) gauge(ch chan<- prometheus.Metric, name, help string, labels []string, v float64, values ...string) {
	ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(name, help, labels, nil), prometheus.GaugeValue, v, values...)
}

// sanitize makes a counter name a valid metric-name part: [a-zA-Z0-9_], everything else '_'.
func sanitize(s string) string {
	return strings.Map(func(r rune) rune {
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '_' {
			return r
		}
		return '_'
	}, s)
}

// Server serves /metrics for one collector, with the Go runtime's and the process's own metrics beside it.
type Server struct {
	srv *http.Server
	ln  net.Listener
}

// Listen binds addr (host:port; ":9100" for every address) and starts serving; a serving error after
// that is logged to log (nil: dropped). The error names the address.
func Listen(addr string, c *Collector, log *zerolog.Logger) (*Server, error) {
	reg := prometheus.NewRegistry()
	if err := reg.Register(c); err != nil {
		return nil, fmt.Errorf("metrics: %w", err)
	}
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("metrics: listen on %s: %w", addr, err)
	}
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.ContinueOnError}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprintln(w, "ok") })
	mux.HandleFunc("/readyz", func(w http.ResponseWriter, _ *http.Request) {
		if why := c.NotReady(); why != "" {
			http.Error(w, "not ready: "+why, http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ready")
	})
	s := &Server{srv: &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}, ln: ln}
	go func() {
		if err := s.srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) && log != nil {
			log.Error().Err(err).Str("addr", addr).Msg("metrics server stopped")
		}
	}()
	return s, nil
}

// Addr is the address the server listens on (useful with port 0).
func (s *Server) Addr() net.Addr { return s.ln.Addr() }

// Close stops the server, letting a scrape in flight finish for up to a second.
func (s *Server) Close() error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	return s.srv.Shutdown(ctx)
}
