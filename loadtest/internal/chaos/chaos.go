// Package chaos is the load test's fault injector: scripted faults against
// a running system (kill -9 of a process, SIGSTOP and SIGCONT of a server),
// each run while traffic flows and judged by the oracle. A Fault is a name,
// what to do at its start (Inject), how long it lasts (Hold), and what to do
// at its end (Recover); Parse builds one from a command-line spec.
package chaos

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// ErrBadSpec means a fault spec cannot be parsed.
var ErrBadSpec = errors.New("bad fault spec")

// Fault is one scripted fault.
type Fault struct {
	// Name is how the results table names it, e.g. "freeze redis 20s".
	Name string
	// Inject starts the fault.
	Inject func(ctx context.Context) error
	// Hold is how long the fault lasts before Recover.
	Hold time.Duration
	// Recover ends it (SIGCONT, a restart); nil when something else does
	// (a supervisor restarts a killed process).
	Recover func(ctx context.Context) error
}

// Spec is the syntax Parse accepts, for usage messages.
const Spec = `kill:NAME:PID[:RESTART]   kill -9 the process, then run RESTART (sh -c, in the background) if given
freeze:NAME:PID:DURATION  SIGSTOP the process for DURATION, then SIGCONT
PID is a number, or a shell command (no ':') that prints one, run when the fault starts`

// Parse builds a fault from a spec (see Spec).
func Parse(spec string) (Fault, error) {
	parts := strings.SplitN(spec, ":", 4)
	if len(parts) < 3 || parts[1] == "" || parts[2] == "" {
		return Fault{}, fmt.Errorf("fault %q: want kind:name:pid[:arg]: %w", spec, ErrBadSpec)
	}
	kind, name, pidSpec := parts[0], parts[1], parts[2]
	arg := ""
	if len(parts) == 4 {
		arg = parts[3]
	}
	switch kind {
	case "kill":
		f := Fault{Name: "kill -9 " + name, Inject: func(ctx context.Context) error {
			pid, err := ResolvePID(ctx, pidSpec)
			if err != nil {
				return err
			}
			return Signal(pid, syscall.SIGKILL)
		}}
		if arg != "" {
			f.Recover = func(context.Context) error { return StartDetached(arg) }
		}
		return f, nil
	case "freeze":
		d, err := time.ParseDuration(arg)
		if err != nil || d <= 0 {
			return Fault{}, fmt.Errorf("fault %q: want a positive duration after the pid: %w", spec, ErrBadSpec)
		}
		var pid int
		return Fault{
			Name: fmt.Sprintf("freeze %s %s", name, d),
			Hold: d,
			Inject: func(ctx context.Context) error {
				p, err := ResolvePID(ctx, pidSpec)
				if err != nil {
					return err
				}
				pid = p
				return Signal(pid, syscall.SIGSTOP)
			},
			Recover: func(context.Context) error { return Signal(pid, syscall.SIGCONT) },
		}, nil
	}
	return Fault{}, fmt.Errorf("fault %q: kind %q: want kill or freeze: %w", spec, kind, ErrBadSpec)
}

// ResolvePID returns the PID a spec names: a number, or the first number a
// shell command prints.
func ResolvePID(ctx context.Context, spec string) (int, error) {
	if pid, err := strconv.Atoi(spec); err == nil {
		if pid <= 1 {
			return 0, fmt.Errorf("pid %d: %w", pid, ErrBadSpec)
		}
		return pid, nil
	}
	out, err := exec.CommandContext(ctx, "sh", "-c", spec).Output()
	if err != nil {
		return 0, fmt.Errorf("find pid with %q: %w", spec, err)
	}
	fields := strings.Fields(string(out))
	if len(fields) == 0 {
		return 0, fmt.Errorf("find pid with %q: it printed nothing", spec)
	}
	pid, err := strconv.Atoi(fields[0])
	if err != nil || pid <= 1 {
		return 0, fmt.Errorf("find pid with %q: %q is not a pid", spec, fields[0])
	}
	return pid, nil
}

// Signal sends sig to pid.
func Signal(pid int, sig syscall.Signal) error {
	p, err := os.FindProcess(pid)
	if err != nil {
		return fmt.Errorf("find process %d: %w", pid, err)
	}
	if err := p.Signal(sig); err != nil {
		return fmt.Errorf("send %s to %d: %w", sig, pid, err)
	}
	return nil
}

// StartDetached runs a shell command in the background in its own process
// group (so it outlives this process's signals), its output discarded.
func StartDetached(command string) error {
	cmd := exec.Command("sh", "-c", command)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %q: %w", command, err)
	}
	go func() { _ = cmd.Wait() }() // reap it when it exits
	return nil
}

// Run injects f, holds it, and recovers, unless ctx ends first (then it
// still recovers, so a frozen server is never left frozen). It returns when
// the fault ended.
func Run(ctx context.Context, f Fault) (end time.Time, err error) {
	if err := f.Inject(ctx); err != nil {
		return time.Now(), fmt.Errorf("inject %s: %w", f.Name, err)
	}
	if f.Hold > 0 {
		t := time.NewTimer(f.Hold)
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
	}
	if f.Recover != nil {
		if err := f.Recover(context.WithoutCancel(ctx)); err != nil {
			return time.Now(), fmt.Errorf("recover from %s: %w", f.Name, err)
		}
	}
	return time.Now(), nil
}
