package chaos

import (
	"context"
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/testenv"
)

func TestParse(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		spec     string
		wantName string
		wantHold time.Duration
		recovers bool
		bad      bool
	}{
		{name: "kill_left_to_a_supervisor", spec: "kill:counter:1234", wantName: "kill -9 counter"},
		{name: "kill_with_a_restart_command", spec: "kill:redirect:pgrep -n redirect:bin/redirect --x=1", wantName: "kill -9 redirect", recovers: true},
		{name: "freeze", spec: "freeze:redis:4321:20s", wantName: "freeze redis 20s", wantHold: 20 * time.Second, recovers: true},
		{name: "freeze_without_duration", spec: "freeze:redis:4321", bad: true},
		{name: "freeze_with_a_bad_duration", spec: "freeze:redis:4321:soon", bad: true},
		{name: "unknown_kind", spec: "drop:redis:4321", bad: true},
		{name: "no_pid", spec: "kill:counter:", bad: true},
		{name: "no_name", spec: "kill::12", bad: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			f, err := Parse(tc.spec)
			if tc.bad {
				if !errors.Is(err, ErrBadSpec) {
					t.Fatalf("Parse(%q) err = %v, want ErrBadSpec", tc.spec, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if f.Name != tc.wantName || f.Hold != tc.wantHold || (f.Recover != nil) != tc.recovers {
				t.Fatalf("Parse(%q) = {%q, hold %s, recovers %v}, want {%q, %s, %v}", tc.spec, f.Name, f.Hold, f.Recover != nil, tc.wantName, tc.wantHold, tc.recovers)
			}
		})
	}
}

// TestFreezeAndKillARealProcess: a freeze stops the process for its hold
// and continues it; a kill -9 found by a pid command ends it.
func TestFreezeAndKillARealProcess(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	pid := cmd.Process.Pid

	f, err := Parse("freeze:sleep:" + itoa(pid) + ":200ms")
	if err != nil {
		t.Fatal(err)
	}
	// A process left stopped by a failure below is killed with the test.
	t.Cleanup(func() { _ = cmd.Process.Kill() })
	inject := f.Inject
	f.Inject = func(ctx context.Context) error {
		if err := inject(ctx); err != nil {
			return err
		}
		// kill(2) returns before the process has stopped (it stops when it
		// next runs): the fault returns only once it has, before Run's hold
		// begins.
		if s := procState(t, pid); s != "T" {
			t.Errorf("state %q when the freeze began, want T (stopped)", s)
		}
		return nil
	}
	start := time.Now()
	if _, err := Run(t.Context(), f); err != nil {
		t.Fatal(err)
	}
	if time.Since(start) < 200*time.Millisecond {
		t.Fatal("recovered before the hold ended")
	}
	if s := procState(t, pid); s == "T" {
		t.Fatal("still stopped after recover")
	}

	k, err := Parse("kill:sleep:echo " + itoa(pid))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Run(t.Context(), k); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.Sys().(syscall.WaitStatus).Signal() != syscall.SIGKILL {
			t.Fatalf("process ended with %v, want SIGKILL", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("process still running after kill -9")
	}
}

func procState(t *testing.T, pid int) string {
	t.Helper()
	out, err := exec.Command("ps", "-o", "stat=", "-p", itoa(pid)).Output()
	if err != nil {
		t.Fatalf("ps: %v", err)
	}
	return strings.TrimSpace(string(out))[:1]
}

func itoa(n int) string { return strconv.Itoa(n) }

// A fault whose signal changes nothing is an error, not a fault that
// happened: a PID that names a zombie (a crashed server its parent has not
// reaped yet) takes SIGSTOP and SIGKILL without complaint, and a run judged
// after it would report surviving a freeze or a kill it never had.
func TestFaultsOnAProcessThatIsNotRunningAreNotApplied(t *testing.T) {
	t.Parallel()
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Wait() }) // reap it at the end
	pid := cmd.Process.Pid
	testenv.WaitFor(t, 30*time.Second, "the exited child to be a zombie (Z)", func() bool {
		return procState(t, pid) == "Z"
	})
	for _, spec := range []string{"freeze:true:" + itoa(pid) + ":100ms", "kill:true:" + itoa(pid)} {
		f, err := Parse(spec)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := Run(t.Context(), f); !errors.Is(err, ErrNotApplied) {
			t.Errorf("%s on a zombie: %v, want ErrNotApplied", f.Name, err)
		}
	}
}

// A run stopped while a freeze is being confirmed (kill(2) has returned, the
// kernel does not show the process stopped yet) leaves no process stopped:
// the stop cannot cut the confirmation off between the SIGSTOP and the
// SIGCONT that would end it. A context ended before the run begins is the
// widest such window; a process stops a moment after kill(2) returns, so
// most tries see it still running at the first look.
func TestARunStoppedDuringTheFreezeLeavesNoProcessStopped(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	for i := range 20 {
		cmd := exec.Command("sleep", "60")
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		pid := cmd.Process.Pid
		f, err := Parse("freeze:sleep:" + itoa(pid) + ":1m")
		if err != nil {
			t.Fatal(err)
		}
		_, err = Run(ctx, f)
		s := procState(t, pid)
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if s == "T" {
			t.Fatalf("try %d: process left stopped (state %s) by a run stopped during its freeze (Run: %v)", i, s, err)
		}
	}
}
