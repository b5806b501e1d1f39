// Package chaos is the load test's fault injector: scripted faults against
// a running system (kill -9 of a process, SIGSTOP and SIGCONT of a server),
// each run while traffic flows and judged by the oracle. A Fault is a name,
// what to do at its start (Inject), how long it lasts (Hold), and what to do
// at its end (Recover); Parse builds one from a command-line spec. Freeze
// and Kill confirm through /proc that the process stopped or died, so a
// run is never judged after a fault that did not happen.
package chaos

import (
	"bytes"
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
			return Kill(ctx, pid)
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
				return Freeze(ctx, pid)
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

// ErrNotApplied means a fault's signal was sent but did not do what the
// fault is named after: the process was not running (a zombie, a PID
// reused by nothing), or it did not stop or die in time. A run judged after
// such a fault would claim a fault it never had.
var ErrNotApplied = errors.New("fault not applied")

// confirmWithin bounds the wait for a signalled process to show the fault.
const confirmWithin = 10 * time.Second

// Freeze sends SIGSTOP to pid, which must be running, and waits until the
// kernel shows it stopped: kill(2) returns before the process has stopped
// (it stops when it next runs), and a zombie accepts the signal and
// changes nothing. The checks need Linux's /proc; elsewhere Freeze only
// signals. Once the signal is sent, ctx ending does not cut the check off
// (it is bounded by confirmWithin): a freeze that returned an error there
// would leave the process stopped with no Recover to come. A freeze that
// does not take is undone (SIGCONT) before its error is returned.
func Freeze(ctx context.Context, pid int) error {
	if err := running(pid); err != nil {
		return err
	}
	if err := Signal(pid, syscall.SIGSTOP); err != nil {
		return err
	}
	err := confirm(context.WithoutCancel(ctx), pid, "stopped", func(state byte, gone bool) bool { return !gone && (state == 'T' || state == 't') })
	if err != nil {
		_ = Signal(pid, syscall.SIGCONT)
	}
	return err
}

// Kill sends SIGKILL to pid, which must be running, and waits until it is
// gone or a zombie (dead, waiting for its parent to reap it).
func Kill(ctx context.Context, pid int) error {
	if err := running(pid); err != nil {
		return err
	}
	if err := Signal(pid, syscall.SIGKILL); err != nil {
		return err
	}
	return confirm(ctx, pid, "dead", func(state byte, gone bool) bool { return gone || state == 'Z' || state == 'X' })
}

// running refuses a process that is not there or already dead. Without
// /proc (not Linux) nothing can be confirmed, and the signal alone is the
// fault, as before.
func running(pid int) error {
	if !hasProc() {
		return nil
	}
	state, gone, err := stateOf(pid)
	switch {
	case err != nil:
		return err
	case gone:
		return fmt.Errorf("process %d is not running: %w", pid, ErrNotApplied)
	case state == 'Z' || state == 'X':
		return fmt.Errorf("process %d is already dead (state %c): %w", pid, state, ErrNotApplied)
	}
	return nil
}

// confirm polls pid's state until done says the fault shows.
func confirm(ctx context.Context, pid int, what string, done func(state byte, gone bool) bool) error {
	if !hasProc() {
		return nil
	}
	deadline := time.Now().Add(confirmWithin)
	for {
		state, gone, err := stateOf(pid)
		if err != nil {
			return err
		}
		if done(state, gone) {
			return nil
		}
		if !time.Now().Before(deadline) {
			return fmt.Errorf("process %d not %s %s after the signal (state %c): %w", pid, what, confirmWithin, state, ErrNotApplied)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("process %d %s: %w", pid, what, ctx.Err())
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// hasProc reports whether this system has Linux's /proc.
func hasProc() bool {
	_, err := os.Stat("/proc/self/stat")
	return err == nil
}

// stateOf reads a process's state letter from /proc/<pid>/stat (R, S, D,
// T, t, Z, X...); gone when there is no such process.
func stateOf(pid int) (state byte, gone bool, err error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
		return 0, true, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("state of process %d: %w", pid, err)
	}
	// "pid (comm) S ...": comm may hold spaces and parentheses.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0, false, fmt.Errorf("state of process %d: unexpected /proc stat %.60q", pid, b)
	}
	return b[i+2], false, nil
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
