package check

import (
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/model/rulefmt"
	"github.com/prometheus/prometheus/promql/parser"
)

// codeWords collects every lower_snake string literal in the services' and
// pkg's code: metric namespaces, subsystems and names among them.
func codeWords(t *testing.T) map[string]bool {
	t.Helper()
	re := regexp.MustCompile(`"([a-z][a-z0-9_]*)"`)
	words := map[string]bool{}
	for _, dir := range []string{"services", "pkg"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for _, m := range re.FindAllStringSubmatch(string(b), -1) {
				words[m[1]] = true
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return words
}

// metricInCode reports whether name is a literal in the code or can be
// "snip_<subsystem>_<name>" built from literals in it (histograms add
// _bucket, _sum, _count).
func metricInCode(words map[string]bool, name string) bool {
	if name == "up" || words[name] {
		return true
	}
	for _, suf := range []string{"_bucket", "_sum", "_count"} {
		if base, ok := strings.CutSuffix(name, suf); ok && metricInCode(words, base) {
			return true
		}
	}
	rest, ok := strings.CutPrefix(name, "snip_")
	if !ok {
		return false
	}
	for i := range len(rest) {
		if rest[i] == '_' && words[rest[:i]] && words[rest[i+1:]] {
			return true
		}
	}
	return false
}

func metricsIn(t *testing.T, expr string) []string {
	t.Helper()
	var names []string
	for _, vs := range selectorsIn(t, expr) {
		names = append(names, vs.Name)
	}
	return names
}

func selectorsIn(t *testing.T, expr string) []*parser.VectorSelector {
	t.Helper()
	e, err := parser.ParseExpr(expr)
	if err != nil {
		t.Errorf("PromQL %q: %v", expr, err)
		return nil
	}
	var out []*parser.VectorSelector
	parser.Inspect(e, func(n parser.Node, _ []parser.Node) error {
		if vs, ok := n.(*parser.VectorSelector); ok {
			out = append(out, vs)
		}
		return nil
	})
	return out
}

// labelValuesIn returns the label values a rule's selectors match on a
// Snip metric's own labels: the value of an = or != matcher, and each
// alternative of an =~ or !~ matcher that is only alternatives of plain
// words ("schema|auth|partitions"). Prometheus' own labels (job, instance)
// and up's are left out.
func labelValuesIn(t *testing.T, expr string) []string {
	t.Helper()
	plain := regexp.MustCompile(`^[a-z][a-z0-9_]*(\|[a-z][a-z0-9_]*)*$`)
	var values []string
	for _, vs := range selectorsIn(t, expr) {
		if vs.Name == "up" {
			continue
		}
		for _, m := range vs.LabelMatchers {
			switch {
			case m.Name == model.MetricNameLabel || m.Name == "job" || m.Name == "instance":
			case m.Type == labels.MatchEqual || m.Type == labels.MatchNotEqual:
				values = append(values, m.Value)
			case plain.MatchString(m.Value):
				values = append(values, strings.Split(m.Value, "|")...)
			}
		}
	}
	return values
}

// The alert rules load in Prometheus, every rule has a runbook that exists
// and names it, and every metric the rules and the Grafana dashboard use is
// one the code registers (a renamed metric would otherwise silence its
// alert).
func TestAlertRulesAndDashboard(t *testing.T) {
	groups, errs := rulefmt.ParseFile(filepath.Join(root, "deploy/prometheus/alerts.yml"), false, model.UTF8Validation)
	for _, err := range errs {
		t.Errorf("alerts.yml: %v", err)
	}
	if groups == nil {
		t.FailNow()
	}
	words := codeWords(t)
	rules := 0
	for _, g := range groups.Groups {
		for _, r := range g.Rules {
			rules++
			rb := r.Annotations["runbook"]
			if rb == "" {
				t.Errorf("alert %s has no runbook annotation", r.Alert)
			} else if text, err := os.ReadFile(filepath.Join(root, rb)); err != nil {
				t.Errorf("alert %s: runbook %s: %v", r.Alert, rb, err)
			} else if !strings.Contains(string(text), r.Alert) {
				// The operator it pages opens the runbook and looks for it.
				t.Errorf("alert %s: runbook %s does not name it", r.Alert, rb)
			}
			for _, m := range metricsIn(t, r.Expr) {
				if !metricInCode(words, m) {
					t.Errorf("alert %s uses metric %s, which no service registers", r.Alert, m)
				}
			}
			// A label value no code writes (an error class misspelt) would
			// leave the alert silent as surely as a renamed metric.
			for _, v := range labelValuesIn(t, r.Expr) {
				if !words[v] {
					t.Errorf("alert %s matches label value %q, which no code writes", r.Alert, v)
				}
			}
		}
	}
	if rules < 10 {
		t.Errorf("only %d alert rules", rules)
	}

	b, err := os.ReadFile(filepath.Join(root, "deploy/grafana/dashboards/snip-overview.json"))
	if err != nil {
		t.Fatal(err)
	}
	var dash struct{ Panels []dashPanel }
	if err := json.Unmarshal(b, &dash); err != nil {
		t.Fatalf("dashboard JSON: %v", err)
	}
	exprs := 0
	var check func(ps []dashPanel)
	check = func(ps []dashPanel) {
		for _, p := range ps {
			check(p.Panels) // a collapsed row holds its panels
			for _, tg := range p.Targets {
				exprs++
				for _, m := range metricsIn(t, tg.Expr) {
					if !metricInCode(words, m) {
						t.Errorf("dashboard panel %q uses metric %s, which no service registers", p.Title, m)
					}
				}
			}
		}
	}
	check(dash.Panels)
	if exprs < 10 {
		t.Errorf("only %d queries in the dashboard's panels; the panels were not read", exprs)
	}
}

// dashPanel is what the check reads of a Grafana panel: its queries, and
// the panels of a collapsed row.
type dashPanel struct {
	Title   string
	Targets []struct{ Expr string }
	Panels  []dashPanel
}
