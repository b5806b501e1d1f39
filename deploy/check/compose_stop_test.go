package check

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"
)

// Docker sends SIGTERM at a stop and SIGKILL once the service's
// stop_grace_period has passed (10 s when it sets none). Every long-running
// Snip service is given longer than its SHUTDOWN_TIMEOUT (the value compose
// sets, else its config.go's default) plus its SHUTDOWN_READY_DELAY (where
// compose sets one), so its graceful stop is not cut short by the kill: a
// killed consumer leaves its batch in hand to be delivered again, a killed
// redirect its outbox to the next start.
func TestComposeStopGraceOutlastsTheShutdownTimeout(t *testing.T) {
	eachCompose(t, stopGraceOutlastsTheShutdownTimeout)
}

func stopGraceOutlastsTheShutdownTimeout(t *testing.T, file string) {
	p := loadCompose(t, file)
	checked := 0
	for name, svc := range p.Services {
		if svc.Build == nil || svc.Restart == "no" || len(svc.Profiles) > 0 {
			continue // not a Snip service, or a one-shot
		}
		arg := svc.Build.Args["SERVICE"]
		if arg == nil {
			t.Errorf("%s: no SERVICE build argument", name)
			continue
		}
		timeout := defaultShutdownTimeout(t, filepath.Join(root, "services", *arg, "config.go"))
		if v := svc.Environment["SHUTDOWN_TIMEOUT"]; v != nil {
			d, err := time.ParseDuration(*v)
			if err != nil {
				t.Errorf("%s: SHUTDOWN_TIMEOUT %q: %v", name, *v, err)
				continue
			}
			timeout = d
		}
		// The HTTP server takes connections for SHUTDOWN_READY_DELAY
		// (default 0) before the first stage can end.
		if v := svc.Environment["SHUTDOWN_READY_DELAY"]; v != nil {
			d, err := time.ParseDuration(*v)
			if err != nil {
				t.Errorf("%s: SHUTDOWN_READY_DELAY %q: %v", name, *v, err)
				continue
			}
			timeout += d
		}
		grace := 10 * time.Second // Docker's default
		if svc.StopGracePeriod != nil {
			grace = time.Duration(*svc.StopGracePeriod)
		}
		if grace <= timeout {
			t.Errorf("%s: stop_grace_period %s, not longer than its SHUTDOWN_TIMEOUT (plus SHUTDOWN_READY_DELAY) %s: Docker kills it before its graceful stop may end", name, grace, timeout)
		}
		checked++
	}
	if checked < 7 {
		t.Errorf("only %d long-running Snip services checked in %s", checked, file)
	}
}

// defaultShutdownTimeout is the ShutdownTimeout a service's config.go puts
// in its service.Base literal (the default of SHUTDOWN_TIMEOUT), written as
// N * time.Unit.
func defaultShutdownTimeout(t *testing.T, path string) time.Duration {
	t.Helper()
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	f, err := parser.ParseFile(token.NewFileSet(), path, src, 0)
	if err != nil {
		t.Fatal(err)
	}
	var found []time.Duration
	ast.Inspect(f, func(n ast.Node) bool {
		lit, ok := n.(*ast.CompositeLit)
		if !ok || !isSelector(lit.Type, "service", "Base") {
			return true
		}
		for _, e := range lit.Elts {
			kv, ok := e.(*ast.KeyValueExpr)
			if !ok {
				continue
			}
			if k, ok := kv.Key.(*ast.Ident); !ok || k.Name != "ShutdownTimeout" {
				continue
			}
			d, ok := durationOf(kv.Value)
			if !ok {
				t.Fatalf("%s: ShutdownTimeout is not N * time.Unit", path)
			}
			found = append(found, d)
		}
		return true
	})
	if len(found) != 1 {
		t.Fatalf("%s: %d ShutdownTimeout defaults in a service.Base literal, want 1", path, len(found))
	}
	return found[0]
}

func isSelector(e ast.Expr, pkg, name string) bool {
	s, ok := e.(*ast.SelectorExpr)
	if !ok {
		return false
	}
	x, ok := s.X.(*ast.Ident)
	return ok && x.Name == pkg && s.Sel.Name == name
}

// durationOf evaluates N * time.Unit (or time.Unit * N).
func durationOf(e ast.Expr) (time.Duration, bool) {
	b, ok := e.(*ast.BinaryExpr)
	if !ok || b.Op != token.MUL {
		return 0, false
	}
	n, unit := b.X, b.Y
	if _, ok := n.(*ast.SelectorExpr); ok {
		n, unit = unit, n
	}
	lit, ok := n.(*ast.BasicLit)
	if !ok || lit.Kind != token.INT {
		return 0, false
	}
	v, err := strconv.Atoi(lit.Value)
	if err != nil {
		return 0, false
	}
	units := map[string]time.Duration{"Millisecond": time.Millisecond, "Second": time.Second, "Minute": time.Minute}
	for name, d := range units {
		if isSelector(unit, "time", name) {
			return time.Duration(v) * d, true
		}
	}
	return 0, false
}
