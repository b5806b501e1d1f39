package service

import (
	"bufio"
	"context"
	"errors"
	"log/slog"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
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
			stderr, err := cmd.StderrPipe()
			if err != nil {
				t.Fatal(err)
			}
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			lines := make(chan string, 100)
			go func() {
				sc := bufio.NewScanner(stderr)
				for sc.Scan() {
					lines <- sc.Text()
				}
				close(lines)
				exited <- cmd.Wait()
			}()
			t.Cleanup(func() { _ = cmd.Process.Kill() })
			var log strings.Builder
			waitFor := func(what string) {
				t.Helper()
				deadline := time.After(30 * time.Second)
				for {
					select {
					case l, ok := <-lines:
						if !ok {
							t.Fatalf("the service's stderr ended before %q; it said:\n%s", what, log.String())
						}
						log.WriteString(l + "\n")
						if strings.Contains(l, what) {
							return
						}
					case <-deadline:
						t.Fatalf("no %q within 30s; the service said:\n%s", what, log.String())
					}
				}
			}
			waitFor(`"msg":"component running"`)
			if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
				t.Fatal(err)
			}
			if c.signals == 2 {
				waitFor(`"msg":"stopping test"`)
				if err := cmd.Process.Signal(syscall.SIGTERM); err != nil {
					t.Fatal(err)
				}
			}
			waitFor(c.wantLog)
			for range lines { // the rest, until the pipe closes
			}
			select {
			case err := <-exited:
				code := 0
				var ee *exec.ExitError
				if errors.As(err, &ee) {
					code = ee.ExitCode()
				} else if err != nil {
					t.Fatal(err)
				}
				if code != c.wantCode {
					t.Fatalf("exit code %d, want %d; the service said:\n%s", code, c.wantCode, log.String())
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("still running 10s after its last SIGTERM; the service said:\n%s", log.String())
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
