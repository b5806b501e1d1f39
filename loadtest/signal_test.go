package main

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/service/servicetest"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
)

// signalChild makes the test binary a loadtest whose command never returns
// once told to stop: TestMain calls mainThatHangs.
const signalChild = "LOADTEST_TEST_SIGNAL_CHILD"

// mainThatHangs runs main as the command line would, with a command that
// never finishes its stop (a run that waits for its readers to catch up,
// on a system that no longer counts).
func mainThatHangs() {
	commands["hang"] = command{run: func(ctx context.Context, _ *Env, _ []string) error {
		os.Stderr.WriteString("waiting for a signal\n")
		<-ctx.Done()
		os.Stderr.WriteString("stopping\n")
		select {}
	}}
	os.Args = []string{"loadtest", "hang"}
	main()
	os.Exit(0)
}

// SIGTERM stops a run; a second one while it stops ends loadtest at once,
// with a line that says so, instead of doing nothing.
func TestSecondSignalEndsAStopThatHangs(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), signalChild+"=1")
	p := servicetest.StartProcess(t, cmd)
	p.WaitFor(t, "waiting for a signal")
	p.Signal(t, syscall.SIGTERM)
	p.WaitFor(t, "stopping")
	p.Signal(t, syscall.SIGTERM)
	p.WaitFor(t, `"msg":"loadtest exits at once: a second signal during the stop","signal":"terminated"`)
	if code := p.ExitCode(t, 10*time.Second); code != 1 {
		t.Fatalf("exit code %d, want 1; loadtest said:\n%s", code, p.Log())
	}
}

// Ctrl-C during a verified run stops the load and keeps what was measured:
// the summary is printed and the report written with the truth, a note
// saying the run was not verified and how to verify it later, and the
// command fails (the verification asked for did not happen), instead of
// ending with "context canceled" and no report at all. Its catch-up time
// is not measured, not "not reached": no reader was seen behind, the run
// stopped waiting.
func TestAStopDuringAVerifiedRunWritesTheReport(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	js := n.JetStream(t)
	if err := topology.Apply(t.Context(), js, topology.Defaults()); err != nil {
		t.Fatalf("topology: %v", err)
	}
	dir := t.TempDir()
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	var out lockedBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"events", "--rate", "200", "--duration", "10m", "--verify", "--out", dir,
			"--counter-url", "off", "--clickhouse", "off", "--fraud", "off"},
			[]string{"NATS_URL=" + n.URL, "SNIP_API_KEY=" + testKey}, &out, &out, slog.New(slog.DiscardHandler))
	}()
	testenv.WaitFor(t, 30*time.Second, "the run's first 100 clicks in CLICKS", func() bool {
		s, err := js.Stream(t.Context(), events.ClicksStream)
		if err != nil {
			return false
		}
		info, err := s.Info(t.Context())
		return err == nil && info.State.Msgs >= 100
	})
	stop() // the first Ctrl-C
	var err error
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatalf("loadtest events did not return within a minute of the stop:\n%s", out.String())
	}
	truthFile := filepath.Join(dir, "truth.json")
	if err == nil || !strings.Contains(err.Error(), "not verified") || !strings.Contains(err.Error(), "loadtest verify --truth "+truthFile) {
		t.Errorf("loadtest events stopped before its verification: err %v, want one saying it was not verified and how to verify %s\n%s", err, truthFile, out.String())
	}
	for _, f := range []string{"truth.json", "report.json", "report.html"} {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("report file: %v", err)
		}
	}
	if !strings.Contains(out.String(), "achieved throughput") {
		t.Errorf("no summary printed:\n%s", out.String())
	}
	// Stopped during the load: no reader failed to catch up, the run
	// did not wait for them.
	if !strings.Contains(out.String(), "catch-up time        not measured (the run was stopped") || strings.Contains(out.String(), "not reached") {
		t.Errorf("want the catch-up time not measured, the run stopped, and nothing \"not reached\":\n%s", out.String())
	}
	b, rerr := os.ReadFile(filepath.Join(dir, "report.json"))
	if rerr == nil && !strings.Contains(string(b), "not verified") {
		t.Errorf("report.json has no note that the run was not verified:\n%s", b)
	}
}
