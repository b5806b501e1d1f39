package check

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// The docs name modules, configuration variables and metrics; each must be
// one the code has, and what the code adds must be in the docs. These tests
// catch the names a change leaves behind in prose.

// docs/dependencies.md explains every module a go.mod requires directly, and
// no module that none requires any more.
func TestDependenciesExplainEveryModuleInUse(t *testing.T) {
	b, err := os.ReadFile(filepath.Join(root, "docs/dependencies.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	required := map[string][]string{} // module -> go.mod files requiring it
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == ".demo" || d.Name() == "node_modules") {
			return filepath.SkipDir
		}
		if d.IsDir() || d.Name() != "go.mod" {
			return nil
		}
		rel, _ := filepath.Rel(root, path)
		for _, m := range directRequires(t, path) {
			required[m] = append(required[m], rel)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(required) < 10 {
		t.Fatalf("found %d directly required modules; the go.mod files were not read", len(required))
	}
	for m, by := range required {
		if !strings.Contains(doc, m) {
			t.Errorf("docs/dependencies.md does not explain %s (required by %s)", m, strings.Join(by, ", "))
		}
	}
	// Each row of the table names its module first.
	rowRe := regexp.MustCompile(`(?m)^\| ((?:github\.com|golang\.org|gonum\.org)/[^\s|,]+)`)
	rows := rowRe.FindAllStringSubmatch(doc, -1)
	if len(rows) < 10 {
		t.Fatalf("docs/dependencies.md has %d module rows; the table was not read", len(rows))
	}
	for _, r := range rows {
		m := r[1]
		if !slices.ContainsFunc(keys(required), func(req string) bool { return req == m || strings.HasPrefix(req, m+"/") }) {
			t.Errorf("docs/dependencies.md explains %s, which no go.mod requires directly", m)
		}
	}
}

// directRequires lists the modules a go.mod requires without "// indirect",
// Snip's own modules left out.
func directRequires(t *testing.T, path string) []string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	block := false
	for line := range strings.Lines(string(b)) {
		line = strings.TrimSpace(line)
		switch {
		case line == "require (":
			block = true
			continue
		case block && line == ")":
			block = false
			continue
		case strings.HasPrefix(line, "require ") && !strings.HasSuffix(line, "("):
			line = strings.TrimPrefix(line, "require ")
		case !block:
			continue
		}
		f := strings.Fields(line)
		if len(f) < 2 || strings.Contains(line, "// indirect") || strings.HasPrefix(f[0], "github.com/snipdev/snip") {
			continue
		}
		out = append(out, f[0])
	}
	return out
}

// bucketNames are the KV buckets' names pkg/topology declares (its
// constants named ...Bucket).
func bucketNames(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(root, "pkg/topology/topology.go"))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^\t[A-Za-z]+Bucket += "([a-z_]+)"`).FindAllStringSubmatch(string(b), -1) {
		out[m[1]] = true
	}
	if !out["snip_members"] {
		t.Fatalf("found the buckets %v in pkg/topology/topology.go; its bucket constants were not read", out)
	}
	return out
}

func keys(m map[string][]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}

// Every variable a service's config.go reads is in the service's README:
// its own, and those of the pkg/service blocks its Config embeds
// (service.NATS, service.Topology, ...), which it reads as well.
func TestServiceREADMEsNameEveryVariableTheirConfigReads(t *testing.T) {
	tagRe := regexp.MustCompile("env:\"([A-Z][A-Z0-9_]*)\"")
	embedded := regexp.MustCompile(`(?m)^\tservice\.([A-Z][A-Za-z]*)$`)
	configs, err := filepath.Glob(filepath.Join(root, "services/*/config.go"))
	if err != nil || len(configs) < 7 {
		t.Fatalf("services' config.go files: %v, %v", configs, err)
	}
	blocks := 0
	for _, c := range configs {
		dir := filepath.Dir(c)
		b, err := os.ReadFile(c)
		if err != nil {
			t.Fatal(err)
		}
		src := string(b)
		for _, m := range embedded.FindAllStringSubmatch(src, -1) {
			src += serviceBlock(t, m[1])
			blocks++
		}
		readme, err := os.ReadFile(filepath.Join(dir, "README.md"))
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range tagRe.FindAllStringSubmatch(src, -1) {
			if !strings.Contains(string(readme), "`"+m[1]+"`") {
				t.Errorf("services/%s/README.md does not name %s, which config.go reads", filepath.Base(dir), m[1])
			}
		}
	}
	if blocks < len(configs) {
		t.Errorf("found %d embedded pkg/service blocks in %d config.go files; the embedded blocks were not read", blocks, len(configs))
	}
}

// A metric the docs name is one the code registers. A name counts as a
// metric name when it starts like one the code registers (its first two
// words, e.g. snip_reader_ or fraud_events_), so a bucket or a key that
// happens to start with snip_ is not taken for one; nor is a KV bucket's
// name that pkg/topology declares (snip_console_sessions starts like the
// console's metrics).
func TestDocsNameMetricsTheCodeRegisters(t *testing.T) {
	registered := registeredMetrics(t)
	if len(registered) < 80 {
		t.Fatalf("found %d registered metrics; the metric definitions were not read", len(registered))
	}
	buckets := bucketNames(t)
	families := map[string]bool{}
	for _, r := range registered {
		families[firstTwoWords(strings.TrimPrefix(r.String(), "^"))] = true
	}
	nameRe := regexp.MustCompile("`([a-z][a-z0-9]*(?:_[a-z0-9]+)+)(?:\\{[^`]*\\})?`")
	checked := 0
	for _, doc := range docsToCheck(t) {
		b, err := os.ReadFile(doc)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range nameRe.FindAllStringSubmatch(string(b), -1) {
			name := m[1]
			if !families[firstTwoWords(name)] || buckets[name] {
				continue
			}
			checked++
			if !slices.ContainsFunc(registered, func(r *regexp.Regexp) bool { return r.MatchString(name) }) {
				rel, _ := filepath.Rel(root, doc)
				t.Errorf("%s names the metric %s, which the code does not register", rel, name)
			}
		}
	}
	if checked < 50 {
		t.Errorf("checked only %d metric names in the docs", checked)
	}
	t.Logf("%d metric names in the docs, %d registered metrics", checked, len(registered))
}

// docsToCheck are the documents that describe the system as it is now:
// decision records keep the names of their time.
func docsToCheck(t *testing.T) []string {
	t.Helper()
	var docs []string
	err := filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == ".git" || d.Name() == ".demo" || d.Name() == "node_modules" || d.Name() == "decisions") {
			return filepath.SkipDir
		}
		if strings.HasSuffix(path, ".md") {
			docs = append(docs, path)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return docs
}

func firstTwoWords(name string) string {
	parts := strings.SplitN(name, "_", 3)
	if len(parts) < 2 {
		return name
	}
	return parts[0] + "_" + parts[1]
}

// registeredMetrics reads every prometheus CounterOpts, GaugeOpts,
// HistogramOpts and SummaryOpts literal in the services' and pkg's code and
// returns a pattern for each full name (Namespace_Subsystem_Name; a
// histogram's _bucket, _sum and _count too). A part built at run time (the
// work queue's "snip_" + source) matches any word.
func registeredMetrics(t *testing.T) []*regexp.Regexp {
	t.Helper()
	var out []*regexp.Regexp
	for _, dir := range []string{"services", "pkg"} {
		err := filepath.WalkDir(filepath.Join(root, dir), func(path string, d os.DirEntry, err error) error {
			if err != nil || d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
				return err
			}
			fset := token.NewFileSet()
			f, err := parser.ParseFile(fset, path, nil, 0)
			if err != nil {
				return err
			}
			consts := stringConsts(f)
			ast.Inspect(f, func(n ast.Node) bool {
				lit, ok := n.(*ast.CompositeLit)
				if !ok {
					return true
				}
				sel, ok := lit.Type.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if x, ok := sel.X.(*ast.Ident); !ok || x.Name != "prometheus" || !strings.HasSuffix(sel.Sel.Name, "Opts") {
					return true
				}
				var parts []string
				for _, field := range []string{"Namespace", "Subsystem", "Name"} {
					for _, e := range lit.Elts {
						kv, ok := e.(*ast.KeyValueExpr)
						if !ok {
							continue
						}
						if k, ok := kv.Key.(*ast.Ident); ok && k.Name == field {
							parts = append(parts, stringPattern(kv.Value, consts))
						}
					}
				}
				if len(parts) == 0 {
					return true
				}
				suffix := ""
				if sel.Sel.Name == "HistogramOpts" || sel.Sel.Name == "SummaryOpts" {
					suffix = "(_bucket|_sum|_count)?"
				}
				out = append(out, regexp.MustCompile("^"+strings.Join(parts, "_")+suffix+"$"))
				return true
			})
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	return out
}

// stringConsts maps the names bound to a string literal anywhere in f
// (const, var, :=) to their value.
func stringConsts(f *ast.File) map[string]string {
	out := map[string]string{}
	bind := func(names []*ast.Ident, values []ast.Expr) {
		for i, n := range names {
			if i < len(values) {
				if lit, ok := values[i].(*ast.BasicLit); ok && lit.Kind == token.STRING {
					if s, err := strconv.Unquote(lit.Value); err == nil {
						out[n.Name] = s
					}
				}
			}
		}
	}
	ast.Inspect(f, func(n ast.Node) bool {
		switch n := n.(type) {
		case *ast.ValueSpec:
			bind(n.Names, n.Values)
		case *ast.AssignStmt:
			var names []*ast.Ident
			for _, l := range n.Lhs {
				if id, ok := l.(*ast.Ident); ok {
					names = append(names, id)
				}
			}
			if len(names) == len(n.Lhs) {
				bind(names, n.Rhs)
			}
		}
		return true
	})
	return out
}

// stringPattern is the regexp of a metric name part: a literal, a name bound
// to one, or, for anything built at run time, one or more words.
func stringPattern(e ast.Expr, consts map[string]string) string {
	switch e := e.(type) {
	case *ast.BasicLit:
		if s, err := strconv.Unquote(e.Value); err == nil {
			return regexp.QuoteMeta(s)
		}
	case *ast.Ident:
		if s, ok := consts[e.Name]; ok {
			return regexp.QuoteMeta(s)
		}
	case *ast.BinaryExpr:
		if e.Op == token.ADD {
			return stringPattern(e.X, consts) + stringPattern(e.Y, consts)
		}
	}
	return "[a-z][a-z0-9_]*"
}
