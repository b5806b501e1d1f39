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

// signalChild makes the test binary a snipctl whose command never returns
// once told to stop: TestMain calls mainThatHangs.
const signalChild = "SNIPCTL_TEST_SIGNAL_CHILD"

// mainThatHangs runs main as the command line would, with a command that
// stops as slowly as it likes (the demo waits up to 30 s for each service):
// here never.
func mainThatHangs() {
	commands["hang"] = command{run: func(ctx context.Context, env *Env, _ []string) error {
		env.Log.Info("waiting for a signal")
		<-ctx.Done()
		env.Log.Info("stopping")
		select {}
	}}
	os.Args = []string{"snipctl", "hang"}
	main()
	os.Exit(0)
}

// Ctrl-C stops a command; a second Ctrl-C while it stops (a demo stopping
// its services one by one) ends snipctl at once, with a line that says so,
// instead of doing nothing.
func TestSecondSignalEndsAStopThatHangs(t *testing.T) {
	t.Parallel()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), signalChild+"=1")
	p := servicetest.StartProcess(t, cmd)
	p.WaitFor(t, `"msg":"waiting for a signal"`)
	p.Signal(t, syscall.SIGINT)
	p.WaitFor(t, `"msg":"stopping"`)
	p.Signal(t, syscall.SIGINT)
	p.WaitFor(t, `"msg":"snipctl exits at once: a second signal during the stop","signal":"interrupt"`)
	if code := p.ExitCode(t, 10*time.Second); code != 1 {
		t.Fatalf("exit code %d, want 1; snipctl said:\n%s", code, p.Log())
	}
}
