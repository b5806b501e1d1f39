package main

import (
	"context"
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/service/servicetest"
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
