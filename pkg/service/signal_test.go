package service

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/service/servicetest"
)

// signalChild is set in the environment of the process the signal test
// starts: the test binary again, which then runs Main instead of tests.
const signalChild = "SNIP_SERVICE_SIGNAL_CHILD"

// A service is stopped by its first SIGTERM, each stage bounded by the
// components themselves. One whose stop hangs (here a component that never
// returns) is ended by a second SIGTERM, at once and with a line that says
// why, not left for a SIGKILL; one that stops cleanly exits 0.
func TestSecondSignalEndsAStopThatHangs(t *testing.T) {
	if mode := os.Getenv(signalChild); mode != "" {
		runSignalChild(mode)
		return
	}
	t.Parallel()
	for _, c := range []struct {
		mode     string
		signals  int
		wantCode int
		wantLog  string
	}{
		{"hangs", 2, 1, `"msg":"test exits at once: a second signal during the stop","signal":"terminated"`},
		{"clean", 1, 0, `"msg":"test stopped"`},
	} {
		t.Run(c.mode, func(t *testing.T) {
			t.Parallel()
			cmd := exec.Command(os.Args[0], "-test.run=^TestSecondSignalEndsAStopThatHangs$")
			cmd.Env = append(os.Environ(), signalChild+"="+c.mode)
			p := servicetest.StartProcess(t, cmd)
			p.WaitFor(t, `"msg":"component running"`)
			p.Signal(t, syscall.SIGTERM)
			if c.signals == 2 {
				p.WaitFor(t, `"msg":"stopping test"`)
				p.Signal(t, syscall.SIGTERM)
			}
			p.WaitFor(t, c.wantLog)
			if code := p.ExitCode(t, 10*time.Second); code != c.wantCode {
				t.Fatalf("exit code %d, want %d; the service said:\n%s", code, c.wantCode, p.Log())
			}
		})
	}
}

// runSignalChild is the service the signal test runs: one component, which
// after the stop either returns (clean) or never does (hangs).
func runSignalChild(mode string) {
	load := func(environ, _ []string) (testConfig, error) {
		return LoadConfig(environ, testConfig{Base: Base{HTTPAddr: "127.0.0.1:0", ShutdownTimeout: time.Second}}, nil)
	}
	Main("test", load, func(ctx context.Context, log *slog.Logger, cfg testConfig) error {
		return Run(ctx, log, "test", cfg, func(ctx context.Context, g *Group) error {
			g.Go(Intake, "component", func(ctx context.Context) error {
				log.Info("component running")
				<-ctx.Done()
				if mode == "hangs" {
					select {} // a stop that never ends
				}
				return nil
			})
			return nil
		})
	})
}
