package metrics

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strings"
	"testing"

	"github.com/ibvbridge/ibvbridge/internal/version"
	"github.com/ibvbridge/ibvbridge/ring"
	"github.com/ibvbridge/ibvbridge/ring/ringtest"
	"github.com/ibvbridge/ibvbridge/spead/pattern"
)

type fakePipeline struct {
	p         *ring.Producer
	transport map[string]uint64
	malformed map[string]uint64
	threads   []map[string]uint64
}

func (f fakePipeline) Producer() *ring.Producer             { return f.p }
func (f fakePipeline) TransportCounters() map[string]uint64 { return f.transport }
func (f fakePipeline) MalformedByReason() map[string]uint64 { return f.malformed }
func (f fakePipeline) ThreadCounters() []map[string]uint64  { return f.threads }

// testProducer is a small ring in a temporary directory, closed when the test ends.
func testProducer(t *testing.T) (string, *ring.Producer) {
	t.Helper()
	name := fmt.Sprintf("metrics-%d", os.Getpid())
	return name, ringtest.New(t, name, ring.Config{HugePages: ring.HugePagesOff})
}

func scrape(t *testing.T, s *Server) string {
	t.Helper()
	resp, err := http.Get("http://" + s.Addr().String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("status %d, err %v", resp.StatusCode, err)
	}
	return string(b)
}

func TestScrape(t *testing.T) {
	name, p := testProducer(t)
	c := NewCollector(name, "udp")
	s, err := Listen("127.0.0.1:0", c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if body := scrape(t, s); strings.Contains(body, "ibvbridge_heaps_total") {
		t.Errorf("ring metrics before the pipeline is attached:\n%s", body)
	}
	p.Add(ring.CounterHeaps, 3)
	p.Add(ring.CounterMalformedPackets, 5)
	c.Attach(fakePipeline{p: p, transport: map[string]uint64{"kernel_drops": 7, "buffer_size": 1 << 20, "skipped_bad ip": 2},
		malformed: map[string]uint64{"short header": 5},
		threads:   []map[string]uint64{{"packets": 10}, {"packets": 11}}})
	body := scrape(t, s)
	for _, want := range []string{
		fmt.Sprintf(`ibvbridge_heaps_total{ring=%q} 3`, name),
		fmt.Sprintf(`ibvbridge_malformed_packets_total{reason="short header",ring=%q} 5`, name),
		fmt.Sprintf(`ibvbridge_transport_kernel_drops_total{ring=%q,transport="udp"} 7`, name),
		fmt.Sprintf(`ibvbridge_transport_buffer_size{ring=%q,transport="udp"} 1.048576e+06`, name),
		fmt.Sprintf(`ibvbridge_transport_skipped_bad_ip_total{ring=%q,transport="udp"} 2`, name),
		fmt.Sprintf(`ibvbridge_ring_slots{ring=%q} 8`, name),
		fmt.Sprintf(`ibvbridge_transport_thread_packets_total{ring=%q,thread="1",transport="udp"} 11`, name),
		fmt.Sprintf(`ibvbridge_ring_unread_heaps{ring=%q} 0`, name),
		fmt.Sprintf(`ibvbridge_end_of_stream{ring=%q} 0`, name),
		fmt.Sprintf(`ibvbridge_build_info{ring=%q,version=%q} 1`, name, version.Version),
		"# TYPE ibvbridge_dropped_heaps_total counter",
		"# TYPE ibvbridge_consumers_attached gauge",
		"# TYPE ibvbridge_consumer_overruns_total counter",
		"go_goroutines ",
	} {
		if !strings.Contains(body, want) {
			t.Errorf("scrape lacks %q", want)
		}
	}
	// every rejection reason is a series from the start, and "none" (no rejection) is not one
	for _, want := range []string{
		fmt.Sprintf(`ibvbridge_malformed_packets_total{reason="bad magic",ring=%q} 0`, name),
		fmt.Sprintf(`ibvbridge_malformed_packets_total{reason="other",ring=%q} 0`, name),
	} {
		if !strings.Contains(body, want) {
			t.Errorf("scrape lacks %q", want)
		}
	}
	if strings.Contains(body, `reason="none"`) {
		t.Error(`scrape has a reason="none" series`)
	}
	if t.Failed() {
		t.Logf("scrape:\n%s", body)
	}
}

func TestListenBusyPort(t *testing.T) {
	s, err := Listen("127.0.0.1:0", NewCollector("x", "udp"), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := Listen(s.Addr().String(), NewCollector("x", "udp"), nil); err == nil || !strings.Contains(err.Error(), s.Addr().String()) {
		t.Errorf("second listen on %s: %v, want an error naming the address", s.Addr(), err)
	}
}

// scrapeUDPWithConsumer is one scrape of a UDP receiver's metrics with a consumer attached (the lag series
// exist only for attached consumers).
func scrapeUDPWithConsumer(t *testing.T) string {
	t.Helper()
	name, p := testProducer(t)
	cons, err := ring.Attach(p.SocketPath(), ring.AttachOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer cons.Close()
	c := NewCollector(name, "udp")
	c.Attach(fakePipeline{p: p, transport: map[string]uint64{"packets": 0, "kernel_drops": 0}})
	s, err := Listen("127.0.0.1:0", c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	return scrape(t, s)
}

// TestDashboardQueriesExportedMetrics: every metric the Grafana dashboard in deploy/ queries is one this
// package exports (for a UDP receiver), so the dashboard cannot silently show empty panels.
func TestDashboardQueriesExportedMetrics(t *testing.T) {
	b, err := os.ReadFile("../deploy/grafana/ibvbridge-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string
			Targets []struct{ Expr string }
		}
	}
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	body := scrapeUDPWithConsumer(t)
	metricName := regexp.MustCompile(`ibvbridge_[a-z_]+`)
	queried := 0
	for _, pn := range dash.Panels {
		for _, tg := range pn.Targets {
			for _, m := range metricName.FindAllString(tg.Expr, -1) {
				queried++
				if !strings.Contains(body, "\n"+m+"{") {
					t.Errorf("panel %q queries %s, which is not exported", pn.Title, m)
				}
			}
		}
	}
	if queried == 0 {
		t.Fatal("the dashboard queries no ibvbridge metric")
	}
}

// TestAlertRulesQueryExportedMetrics: every metric the Prometheus alerting rules in deploy/ query is one
// this package exports (for a UDP receiver with a consumer attached), so no alert silently never fires.
// (deploy/prometheus/rulecheck parses the rules as Prometheus does.)
func TestAlertRulesQueryExportedMetrics(t *testing.T) {
	b, err := os.ReadFile("../deploy/prometheus/ibvbridge-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	body := scrapeUDPWithConsumer(t)
	var alerts, queried int
	for _, line := range strings.Split(string(b), "\n") {
		if strings.Contains(line, "- alert: ") {
			alerts++
		}
		if strings.HasPrefix(strings.TrimSpace(line), "#") || strings.Contains(line, "summary:") || strings.Contains(line, "description:") {
			continue
		}
		for _, m := range regexp.MustCompile(`ibvbridge_[a-z_]+`).FindAllString(line, -1) {
			queried++
			if !strings.Contains(body, "\n"+m+"{") {
				t.Errorf("an alert queries %s, which is not exported", m)
			}
		}
	}
	if alerts < 5 || queried == 0 {
		t.Fatalf("%d alerts querying %d metrics: want the losses, kernel drops, stalled ring, no traffic and consumers gone", alerts, queried)
	}
}

// Scrapes while the producer publishes: under -race this fails if Collect reads producer state that only
// the producer's goroutine may touch.
func TestScrapeWhilePublishing(t *testing.T) {
	name, p := testProducer(t)
	c := NewCollector(name, "udp")
	c.Attach(fakePipeline{p: p, transport: map[string]uint64{}})
	s, err := Listen("127.0.0.1:0", c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	done := make(chan struct{})
	go func() {
		defer close(done)
		pb := pattern.Publisher{P: p, Size: 64}
		for cnt := uint64(1); cnt <= 2000; cnt++ {
			pb.Publish(cnt, 0) // drop policy, no consumer: the ring fills, later heaps are refused
		}
	}()
	for range 5 {
		if body := scrape(t, s); !strings.Contains(body, "ibvbridge_ring_unread_heaps") {
			t.Fatal("no fill gauge")
		}
	}
	<-done
	if body := scrape(t, s); !strings.Contains(body, fmt.Sprintf(`ibvbridge_ring_unread_heaps{ring=%q} 8`, name)) {
		t.Errorf("a full 8-slot ring should show 8 unread heaps:\n%s", body)
	}
}

func probe(t *testing.T, s *Server, path string) (int, string) {
	t.Helper()
	resp, err := http.Get("http://" + s.Addr().String() + path)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, strings.TrimSpace(string(b))
}

// The probes a Kubernetes pod spec points at: /healthz answers while the process serves; /readyz only
// while the ring exists and its stream has not ended, with the reason otherwise.
func TestProbesHealthzAlwaysReadyzWhileRingLive(t *testing.T) {
	name, p := testProducer(t)
	c := NewCollector(name, "udp")
	s, err := Listen("127.0.0.1:0", c, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if code, body := probe(t, s, "/healthz"); code != http.StatusOK || body != "ok" {
		t.Errorf("/healthz before attach: %d %q, want 200 ok", code, body)
	}
	if code, body := probe(t, s, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "not created") {
		t.Errorf("/readyz before attach: %d %q, want 503 naming the missing ring", code, body)
	}
	c.Attach(fakePipeline{p: p})
	if code, body := probe(t, s, "/readyz"); code != http.StatusOK || body != "ready" {
		t.Errorf("/readyz with the ring live: %d %q, want 200 ready", code, body)
	}
	if err := p.PublishEndOfStream(0, 0); err != nil {
		t.Fatal(err)
	}
	if code, body := probe(t, s, "/readyz"); code != http.StatusServiceUnavailable || !strings.Contains(body, "end of stream") {
		t.Errorf("/readyz after end of stream: %d %q, want 503 end of stream", code, body)
	}
	if code, _ := probe(t, s, "/healthz"); code != http.StatusOK {
		t.Errorf("/healthz after end of stream: %d, want 200", code)
	}
}
