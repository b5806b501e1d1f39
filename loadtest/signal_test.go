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
// command exits 3, not judged (the verification asked for did not happen,
// and no failure was seen either), instead of
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
	if code := exitCode(err); code != exitNotJudged {
		t.Errorf("exit status %d for a run stopped before its verification, want %d (not judged; 1 is a failure seen)", code, exitNotJudged)
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

// A run stopped during the load (a --duration cut short by Ctrl-C) did not
// get to judge the keep-up rule: its verdict is unknown, not "no" (the
// readers' catch-up was not waited for and its second half is not the
// load's), and its exit status is 3, not judged, not a failure it never
// saw.
func TestARunStoppedDuringTheLoadIsNotJudged(t *testing.T) {
	t.Parallel()
	s := startSystem(t, nil)
	dir := t.TempDir()
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	var out lockedBuffer
	done := make(chan error, 1)
	go func() {
		args := []string{"events", "--rate", "200", "--duration", "10m", "--links", "20", "--verify", "--out", dir}
		done <- run(ctx, append(args, s.flags...), s.environ, &out, &out, slog.New(slog.DiscardHandler))
	}()
	js := s.js
	testenv.WaitFor(t, 30*time.Second, "3 s of the run's clicks in CLICKS (the readers' lag read meanwhile)", func() bool {
		st, err := js.Stream(t.Context(), events.ClicksStream)
		if err != nil {
			return false
		}
		info, err := st.Info(t.Context())
		return err == nil && info.State.Msgs >= 600
	})
	stop() // Ctrl-C during the load
	var err error
	select {
	case err = <-done:
	case <-time.After(time.Minute):
		t.Fatalf("loadtest events did not return within a minute of the stop:\n%s", out.String())
	}
	if code := exitCode(err); code != exitNotJudged {
		t.Errorf("exit status %d (err %v), want %d: not judged", code, err, exitNotJudged)
	}
	const unknown = "kept up              unknown (the run was stopped during the load: the keep-up rule was not judged)"
	if !strings.Contains(out.String(), unknown) || strings.Contains(out.String(), "kept up              no") {
		t.Errorf("want %q and no \"kept up no\":\n%s", unknown, out.String())
	}
	b, rerr := os.ReadFile(filepath.Join(dir, "report.json"))
	if rerr != nil || !strings.Contains(string(b), `"unknown": "the run was stopped during the load"`) || !strings.Contains(string(b), `"load_cut": true`) {
		t.Errorf("report.json does not say the keep-up verdict is unknown and the load cut (%v):\n%s", rerr, b)
	}

	// The command the stop named judges the clicks the run sent, saying
	// it judges a stopped run and that the load it was asked for was not
	// offered: every click sent is in every sink, so its rows pass.
	vout, err := loadtest(t, s.environ, append([]string{"verify", "--truth", filepath.Join(dir, "truth.json")}, s.flags...)...)
	if err != nil {
		t.Fatalf("verify of the stopped run: %v\n%s", err, vout)
	}
	const note = "a stopped run: the run was stopped during the load, after "
	if !strings.Contains(vout, note) || !strings.Contains(vout, " of its 10m0s. The rows judge the clicks it sent before then, not the load it was asked for; its keep-up verdict stays unknown") {
		t.Errorf("verify of the stopped run does not say it judges a stopped run (want %q ...):\n%s", note, vout)
	}
}
