// Package chartcheck tests the Helm chart in ../ibvbridge: helm lint, and helm template over the value sets
// in testdata, every rendered object decoded strictly (unknown fields are errors) into the Kubernetes API
// types (k8s.io/api, and the Prometheus operator's for its monitors and rules), and the chart's
// invariants checked on the decoded objects. It is a module of its own so that the product's module does
// not carry the Kubernetes API's dependencies.
//
// The helm binary comes from $HELM, else $HOME/.cache/ibvbridge-tools/helm (make test-deploy builds it).
package chartcheck

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"sigs.k8s.io/yaml"
)

const chartDir = "../ibvbridge"

func helmBinary(t *testing.T) string {
	t.Helper()
	h := os.Getenv("HELM")
	if h == "" {
		home, _ := os.UserHomeDir()
		h = filepath.Join(home, ".cache", "ibvbridge-tools", "helm")
	}
	if _, err := os.Stat(h); err != nil {
		t.Skipf("no helm binary at %s (make test-deploy builds it; or set HELM)", h)
	}
	return h
}

func helm(t *testing.T, args ...string) (string, error) {
	t.Helper()
	cmd := exec.Command(helmBinary(t), args...)
	cmd.Env = append(os.Environ(), "HELM_CACHE_HOME="+t.TempDir(), "HELM_CONFIG_HOME="+t.TempDir(), "HELM_DATA_HOME="+t.TempDir())
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if err != nil {
		return out.String(), fmt.Errorf("helm %s: %w: %s%s", strings.Join(args, " "), err, errb.String(), out.String())
	}
	return out.String(), nil
}

// rendered is what one value set renders, decoded.
type rendered struct {
	workload    *corev1.PodTemplateSpec
	kind        string
	services    []*corev1.Service
	podMons     []*monitoringv1.PodMonitor
	serviceMons []*monitoringv1.ServiceMonitor
	rules       []*monitoringv1.PrometheusRule
}

// decodeStrict decodes one YAML document into v, failing on any field the type does not have.
func decodeStrict(doc []byte, v any) error { return yaml.UnmarshalStrict(doc, v) }

// decodeAll splits helm template's output and decodes each object into its API type.
func decodeAll(manifest string) (*rendered, error) {
	r := &rendered{}
	for _, doc := range strings.Split(manifest, "\n---") {
		doc = strings.TrimSpace(doc)
		var meta struct {
			APIVersion string `json:"apiVersion"`
			Kind       string `json:"kind"`
		}
		if err := yaml.Unmarshal([]byte(doc), &meta); err != nil {
			return nil, fmt.Errorf("not YAML: %w\n%s", err, doc)
		}
		if meta.Kind == "" {
			continue // a document of comments only
		}
		var err error
		switch meta.APIVersion + " " + meta.Kind {
		case "apps/v1 Deployment":
			var d appsv1.Deployment
			if err = decodeStrict([]byte(doc), &d); err == nil {
				r.workload, r.kind = &d.Spec.Template, meta.Kind
			}
		case "apps/v1 DaemonSet":
			var d appsv1.DaemonSet
			if err = decodeStrict([]byte(doc), &d); err == nil {
				r.workload, r.kind = &d.Spec.Template, meta.Kind
			}
		case "v1 Service":
			var s corev1.Service
			if err = decodeStrict([]byte(doc), &s); err == nil {
				r.services = append(r.services, &s)
			}
		case "monitoring.coreos.com/v1 PodMonitor":
			var m monitoringv1.PodMonitor
			if err = decodeStrict([]byte(doc), &m); err == nil {
				r.podMons = append(r.podMons, &m)
			}
		case "monitoring.coreos.com/v1 ServiceMonitor":
			var m monitoringv1.ServiceMonitor
			if err = decodeStrict([]byte(doc), &m); err == nil {
				r.serviceMons = append(r.serviceMons, &m)
			}
		case "monitoring.coreos.com/v1 PrometheusRule":
			var m monitoringv1.PrometheusRule
			if err = decodeStrict([]byte(doc), &m); err == nil {
				r.rules = append(r.rules, &m)
			}
		default:
			return nil, fmt.Errorf("the chart renders %s %s, which this test does not know", meta.APIVersion, meta.Kind)
		}
		if err != nil {
			return nil, fmt.Errorf("%s: %w\n%s", meta.Kind, err, doc)
		}
	}
	if r.workload == nil {
		return nil, fmt.Errorf("no Deployment or DaemonSet rendered")
	}
	return r, nil
}

// A value set and what it must render.
type valueSet struct {
	file       string
	kind       string
	transport  string
	caps       []string // recv's added capabilities
	consumers  []string // container names besides recv
	groups     map[string]string
	privileged bool
	hugepages  string // resource name, "" for none
	devices    []string
	multus     string
	podMonitor bool
	svcMonitor bool
}

var valueSets = []valueSet{
	{file: "udp-one-consumer.yaml", kind: "Deployment", transport: "udp", caps: []string{"IPC_LOCK"},
		consumers: []string{"printer"}, hugepages: "hugepages-2Mi", podMonitor: true},
	{file: "xdp-four-consumers.yaml", kind: "DaemonSet", transport: "xdp", caps: []string{"IPC_LOCK", "NET_ADMIN", "NET_RAW", "BPF"},
		consumers: []string{"archive", "power", "c-peak", "monitor"}, hugepages: "hugepages-2Mi", svcMonitor: true},
	{file: "ibv-multus-group.yaml", kind: "Deployment", transport: "ibv", caps: []string{"IPC_LOCK", "NET_ADMIN", "NET_RAW"},
		consumers: []string{"beamform-0", "beamform-1", "beamform-2", "beamform-3", "tap"},
		groups:    map[string]string{"beamform-0": "beamform", "beamform-1": "beamform", "beamform-2": "beamform", "beamform-3": "beamform"},
		hugepages: "hugepages-1Gi", devices: []string{"intel.com/sriov_netdevice", "rdma/hca_shared_devices_a"}, multus: "sriov-data"},
	{file: "privileged-asked.yaml", kind: "Deployment", transport: "ibv", caps: []string{"IPC_LOCK", "NET_ADMIN", "NET_RAW"},
		consumers: []string{"printer"}, privileged: true, hugepages: "hugepages-2Mi"},
	{file: "no-hugepages-no-consumers.yaml", kind: "Deployment", transport: "udp", caps: []string{"IPC_LOCK"}},
}

func TestHelmLintCleanForEveryValueSet(t *testing.T) {
	args := []string{"lint", "--strict", chartDir}
	out, err := helm(t, args...)
	if err != nil {
		t.Fatalf("%v", err)
	}
	if !strings.Contains(out, "0 chart(s) failed") {
		t.Errorf("helm lint (defaults):\n%s", out)
	}
	for _, vs := range valueSets {
		out, err := helm(t, "lint", "--strict", chartDir, "-f", filepath.Join("testdata", vs.file))
		if err != nil {
			t.Errorf("%s: %v", vs.file, err)
		} else if strings.Contains(out, "[WARNING]") || strings.Contains(out, "[ERROR]") {
			t.Errorf("helm lint -f %s:\n%s", vs.file, out)
		}
	}
}

func TestChartRendersAndDecodesStrictlyWithInvariants(t *testing.T) {
	for _, vs := range valueSets {
		t.Run(strings.TrimSuffix(vs.file, ".yaml"), func(t *testing.T) {
			out, err := helm(t, "template", "rel", chartDir, "--namespace", "stream", "-f", filepath.Join("testdata", vs.file))
			if err != nil {
				t.Fatal(err)
			}
			r, err := decodeAll(out)
			if err != nil {
				t.Fatal(err)
			}
			checkInvariants(t, vs, r)
		})
	}
}

func checkInvariants(t *testing.T, vs valueSet, r *rendered) {
	t.Helper()
	if r.kind != vs.kind {
		t.Errorf("workload kind %s, want %s", r.kind, vs.kind)
	}
	pod := r.workload.Spec
	ringVol := ""
	for _, v := range pod.Volumes {
		if v.EmptyDir != nil && v.EmptyDir.Medium == corev1.StorageMediumMemory {
			ringVol = v.Name
		}
	}
	if ringVol == "" {
		t.Fatalf("no memory-backed emptyDir for the ring directory: %+v", pod.Volumes)
	}
	var recv *corev1.Container
	var names []string
	for i := range pod.Containers {
		c := &pod.Containers[i]
		if c.Name == "recv" {
			recv = c
		} else {
			names = append(names, c.Name)
		}
	}
	if recv == nil {
		t.Fatal("no recv container")
	}
	if !slices.Equal(names, vs.consumers) {
		t.Errorf("consumer containers %v, want %v", names, vs.consumers)
	}
	mountOf := func(c *corev1.Container) string {
		for _, m := range c.VolumeMounts {
			if m.Name == ringVol {
				return m.MountPath
			}
		}
		return ""
	}
	recvMount := mountOf(recv)
	if recvMount == "" {
		t.Fatal("recv does not mount the ring volume")
	}
	ringDir := ""
	for _, a := range recv.Args {
		if d, ok := strings.CutPrefix(a, "--dir="); ok {
			ringDir = d
		}
	}
	if !strings.HasPrefix(ringDir, recvMount+"/") {
		t.Errorf("recv's --dir %q is not inside its ring volume %s", ringDir, recvMount)
	}
	if !slices.Contains(recv.Args, "--transport="+vs.transport) {
		t.Errorf("recv args %v lack --transport=%s", recv.Args, vs.transport)
	}
	for _, c := range pod.Containers {
		if c.Name == "recv" {
			continue
		}
		if m := mountOf(&c); m != recvMount {
			t.Errorf("consumer %s mounts the ring volume at %q, recv at %q", c.Name, m, recvMount)
		}
		env := map[string]string{}
		for _, e := range c.Env {
			env[e.Name] = e.Value
		}
		if env["IBVBRIDGE_RING_DIR"] != ringDir {
			t.Errorf("consumer %s: IBVBRIDGE_RING_DIR=%q, recv's --dir is %q", c.Name, env["IBVBRIDGE_RING_DIR"], ringDir)
		}
		gi := slices.Index(c.Args, "--group-name")
		want := vs.groups[c.Name]
		switch {
		case want == "" && gi >= 0:
			t.Errorf("consumer %s joins a group (%v) the values do not give", c.Name, c.Args)
		case want != "" && (gi < 0 || gi+1 >= len(c.Args) || c.Args[gi+1] != want):
			t.Errorf("consumer %s args %v, want --group-name %s", c.Name, c.Args, want)
		}
		if sc := c.SecurityContext; sc == nil || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot || sc.Capabilities == nil || len(sc.Capabilities.Add) > 0 {
			t.Errorf("consumer %s is not a non-root container without capabilities: %+v", c.Name, sc)
		}
	}
	// Every container: hugepages and device resources requested = limits; privileged only when asked.
	for _, c := range append(slices.Clone(pod.InitContainers), pod.Containers...) {
		for name, q := range c.Resources.Requests {
			if strings.HasPrefix(string(name), "hugepages-") || strings.Contains(string(name), "/") {
				if l, ok := c.Resources.Limits[name]; !ok || l.Cmp(q) != 0 {
					t.Errorf("%s: %s request %s, limit %v: must be equal", c.Name, name, q.String(), c.Resources.Limits[name])
				}
			}
		}
		for name := range c.Resources.Limits {
			if strings.HasPrefix(string(name), "hugepages-") {
				if _, ok := c.Resources.Requests[name]; !ok {
					t.Errorf("%s: %s limit without a request", c.Name, name)
				}
			}
		}
		priv := c.SecurityContext != nil && c.SecurityContext.Privileged != nil && *c.SecurityContext.Privileged
		if priv && !(vs.privileged && c.Name == "recv") {
			t.Errorf("container %s is privileged and the values did not ask for it", c.Name)
		}
		if vs.privileged && c.Name == "recv" && !priv {
			t.Errorf("recv is not privileged though the values ask for it")
		}
	}
	hp := corev1.ResourceName(vs.hugepages)
	if vs.hugepages != "" {
		if q, ok := recv.Resources.Requests[hp]; !ok || q.IsZero() {
			t.Errorf("recv requests no %s: %v", hp, recv.Resources.Requests)
		}
		if _, ok := recv.Resources.Requests[corev1.ResourceMemory]; !ok {
			t.Errorf("recv requests hugepages but no memory (Kubernetes requires cpu or memory beside them)")
		}
		if !slices.Contains(recv.Args, "--hugepages=require") {
			t.Errorf("recv has %s but not --hugepages=require: %v", hp, recv.Args)
		}
	} else {
		for name := range recv.Resources.Requests {
			if strings.HasPrefix(string(name), "hugepages-") {
				t.Errorf("hugepages disabled but recv requests %s", name)
			}
		}
	}
	for _, d := range vs.devices {
		if q, ok := recv.Resources.Limits[corev1.ResourceName(d)]; !ok || q.Cmp(resource.MustParse("1")) != 0 {
			t.Errorf("recv's limit of %s: %v, want 1", d, recv.Resources.Limits)
		}
	}
	if got := r.workload.Annotations["k8s.v1.cni.cncf.io/networks"]; got != vs.multus {
		t.Errorf("Multus networks annotation %q, want %q", got, vs.multus)
	}
	if vs.multus != "" && pod.HostNetwork {
		t.Errorf("a Multus secondary network with hostNetwork")
	}
	sc := recv.SecurityContext
	if sc == nil || sc.Capabilities == nil || !slices.Equal(sc.Capabilities.Drop, []corev1.Capability{"ALL"}) {
		t.Fatalf("recv does not drop every capability: %+v", sc)
	}
	var caps []string
	for _, c := range sc.Capabilities.Add {
		caps = append(caps, string(c))
	}
	if !slices.Equal(caps, vs.caps) {
		t.Errorf("recv's capabilities %v, want %v for %s", caps, vs.caps, vs.transport)
	}
	if vs.transport == "udp" && (sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot) {
		t.Errorf("the socket transport runs recv as root")
	}
	// Probes on the metrics server's endpoints, on the port it listens on.
	var port int32
	for _, p := range recv.Ports {
		if p.Name == "metrics" {
			port = p.ContainerPort
		}
	}
	if port == 0 || !slices.Contains(recv.Args, fmt.Sprintf("--metrics=:%d", port)) {
		t.Errorf("recv's metrics port %d and args %v disagree", port, recv.Args)
	}
	for probe, path := range map[*corev1.Probe]string{recv.LivenessProbe: "/healthz", recv.ReadinessProbe: "/readyz"} {
		if probe == nil || probe.HTTPGet == nil || probe.HTTPGet.Path != path || probe.HTTPGet.Port.String() != "metrics" {
			t.Errorf("probe %+v, want GET %s on port metrics", probe, path)
		}
	}
	if (len(r.podMons) == 1) != vs.podMonitor || (len(r.serviceMons) == 1) != vs.svcMonitor || (len(r.services) == 1) != vs.svcMonitor {
		t.Errorf("%d PodMonitor(s), %d ServiceMonitor(s), %d Service(s); want podMonitor %v, serviceMonitor %v",
			len(r.podMons), len(r.serviceMons), len(r.services), vs.podMonitor, vs.svcMonitor)
	}
	for _, m := range r.podMons {
		if len(m.Spec.PodMetricsEndpoints) != 1 || m.Spec.PodMetricsEndpoints[0].Port == nil || *m.Spec.PodMetricsEndpoints[0].Port != "metrics" {
			t.Errorf("PodMonitor endpoints %+v, want port metrics", m.Spec.PodMetricsEndpoints)
		}
	}
	for _, m := range r.serviceMons {
		if len(m.Spec.Endpoints) != 1 || m.Spec.Endpoints[0].Port != "metrics" {
			t.Errorf("ServiceMonitor endpoints %+v, want port metrics", m.Spec.Endpoints)
		}
	}
}

// The strict decoder is what catches a misspelt field: a Deployment with one must not decode.
func TestStrictDecodeRejectsUnknownField(t *testing.T) {
	doc := "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\nspec:\n  template:\n    spec:\n      containers:\n        - name: recv\n          image: x\n          volumeMount: []\n"
	if _, err := decodeAll(doc); err == nil || !strings.Contains(err.Error(), "volumeMount") {
		t.Errorf("decoding a Deployment with the unknown field volumeMount: err %v, want it named", err)
	}
}

// The schema refuses what the chart cannot render right: an unknown transport, and an unknown key.
func TestSchemaRejectsBadValues(t *testing.T) {
	for _, set := range [][]string{{"--set", "transport=dpdk"}, {"--set", "hugepage.enabled=true"}, {"--set", "transport=xdp"}} {
		if _, err := helm(t, append([]string{"template", "rel", chartDir}, set...)...); err == nil {
			t.Errorf("helm template %v rendered", set)
		}
	}
}

// copyChart copies the chart into a temporary directory, for a test that changes its files.
func copyChart(t *testing.T) string {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "ibvbridge")
	err := filepath.WalkDir(chartDir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(chartDir, p)
		if d.IsDir() {
			return os.MkdirAll(filepath.Join(dst, rel), 0o755)
		}
		b, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		return os.WriteFile(filepath.Join(dst, rel), b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
	return dst
}

// prometheusRule.enabled renders the chart's files/alerts.yaml — the one copy of ibvbridge's alerting
// rules, which deploy/prometheus/ibvbridge-alerts.yml links to — as a PrometheusRule that decodes strictly
// and keeps every rule, their Prometheus templates untouched by Helm; a chart without the file refuses to
// render.
func TestPrometheusRuleFromAlertFile(t *testing.T) {
	shipped, err := os.ReadFile("../../prometheus/ibvbridge-alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var file monitoringv1.PrometheusRuleSpec
	if err := yaml.UnmarshalStrict(shipped, &file); err != nil || len(file.Groups) == 0 {
		t.Fatalf("deploy/prometheus/ibvbridge-alerts.yml: %v (%d groups)", err, len(file.Groups))
	}
	chart := copyChart(t)
	out, err := helm(t, "template", "rel", chart, "--set", "prometheusRule.enabled=true")
	if err != nil {
		t.Fatal(err)
	}
	r, err := decodeAll(out)
	if err != nil {
		t.Fatal(err)
	}
	if len(r.rules) != 1 || len(r.rules[0].Spec.Groups) != len(file.Groups) {
		t.Fatalf("want one PrometheusRule with the file's %d groups, got %d rules", len(file.Groups), len(r.rules))
	}
	for g, group := range file.Groups {
		got := r.rules[0].Spec.Groups[g].Rules
		if len(got) != len(group.Rules) {
			t.Fatalf("group %s: %d rules rendered, the file has %d", group.Name, len(got), len(group.Rules))
		}
		for k, rule := range group.Rules {
			if got[k].Alert != rule.Alert || got[k].Expr != rule.Expr || got[k].Annotations["summary"] != rule.Annotations["summary"] {
				t.Errorf("rule %s rendered as %+v", rule.Alert, got[k])
			}
			if s := got[k].Annotations["summary"]; !strings.Contains(s, "{{ $labels.") {
				t.Errorf("rule %s: summary %q lost its Prometheus template", rule.Alert, s)
			}
		}
	}
	if err := os.Remove(filepath.Join(chart, "files", "alerts.yaml")); err != nil {
		t.Fatal(err)
	}
	if _, err := helm(t, "template", "rel", chart, "--set", "prometheusRule.enabled=true"); err == nil || !strings.Contains(err.Error(), "no alert rules") {
		t.Errorf("prometheusRule.enabled without alert rules: err %v, want a clear failure", err)
	}
}
