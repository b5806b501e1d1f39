package servicetest

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"
)

// Process is a command running as a child process, which a test signals
// for real (service.SignalContext is tested so) while it reads what the
// child writes on stderr, line by line.
type Process struct {
	cmd    *exec.Cmd
	lines  chan string
	exited chan error

	mu  sync.Mutex
	log strings.Builder
}

// LineTimeout bounds Process.WaitFor.
const LineTimeout = 30 * time.Second

// StartProcess starts cmd, which must not have its Stderr set, and kills
// it when the test ends, if it still runs.
func StartProcess(tb testing.TB, cmd *exec.Cmd) *Process {
	tb.Helper()
	stderr, err := cmd.StderrPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	p := &Process{cmd: cmd, lines: make(chan string, 1000), exited: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			p.lines <- sc.Text()
		}
		close(p.lines)
		p.exited <- cmd.Wait()
	}()
	tb.Cleanup(func() { _ = cmd.Process.Kill() })
	return p
}

// WaitFor reads stderr until a line that contains what, and fails the test
// if stderr ends first or none comes within LineTimeout.
func (p *Process) WaitFor(tb testing.TB, what string) {
	tb.Helper()
	deadline := time.After(LineTimeout)
	for {
		select {
		case l, ok := <-p.lines:
			if !ok {
				tb.Fatalf("stderr ended before %q; the process said:\n%s", what, p.Log())
			}
			p.add(l)
			if strings.Contains(l, what) {
				return
			}
		case <-deadline:
			tb.Fatalf("no %q within %s; the process said:\n%s", what, LineTimeout, p.Log())
		}
	}
}

// Signal sends sig to the process.
func (p *Process) Signal(tb testing.TB, sig os.Signal) {
	tb.Helper()
	if err := p.cmd.Process.Signal(sig); err != nil {
		tb.Fatal(err)
	}
}

// ExitCode reads the rest of stderr and returns the exit code, failing the
// test if the process is still running after within.
func (p *Process) ExitCode(tb testing.TB, within time.Duration) int {
	tb.Helper()
	deadline := time.After(within)
	for {
		select {
		case l, ok := <-p.lines:
			if ok {
				p.add(l)
				continue
			}
			err := <-p.exited
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				return ee.ExitCode()
			} else if err != nil {
				tb.Fatal(err)
			}
			return 0
		case <-deadline:
			tb.Fatalf("still running %s later; the process said:\n%s", within, p.Log())
		}
	}
}

// Log is what the process wrote on stderr, as far as it was read.
func (p *Process) Log() string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.log.String()
}

func (p *Process) add(line string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.log.WriteString(line + "\n")
}
