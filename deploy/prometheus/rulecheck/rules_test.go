package rulecheck

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

// TestAlertRulesParse: the alerting rules parse as Prometheus parses them (YAML, PromQL of every expr,
// templates of every annotation), and there is one alert per condition an operator must hear of: losses,
// kernel drops, a stalled ring, no traffic, consumers gone.
func TestAlertRulesParse(t *testing.T) {
	groups, errs := rulefmt.ParseFile("../ibvbridge-alerts.yml", false, model.UTF8Validation,
		parser.NewParser(parser.Options{}), slog.New(slog.DiscardHandler))
	for _, err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}
	have := map[string]bool{}
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			have[r.Alert] = true
			if r.Annotations["summary"] == "" || !strings.Contains(r.Expr, "ibvbridge_") {
				t.Errorf("alert %s: want a summary and an expression over ibvbridge's metrics", r.Alert)
			}
		}
	}
	for _, a := range []string{"IbvbridgeLosingData", "IbvbridgeKernelDrops", "IbvbridgeRingStalled", "IbvbridgeNoTraffic", "IbvbridgeConsumersGone"} {
		if !have[a] {
			t.Errorf("no alert %s", a)
		}
	}
}
