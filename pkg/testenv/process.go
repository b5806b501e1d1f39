package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// searchDirs are looked in after PATH: Debian puts clickhouse-server in
// /usr/sbin, which is not on an ordinary user's PATH.
var searchDirs = []string{"/usr/sbin", "/usr/local/sbin", "/usr/bin", "/usr/local/bin"}

// ErrBinaryMissing is returned when a server binary cannot be found.
var ErrBinaryMissing = errors.New("server binary not found")

// FindBinary locates a server binary on PATH or in the sbin folders, or
// explains how to get it. Tests and `snipctl demo` find their servers with it.
func FindBinary(name, debianPkg string) (string, error) {
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	for _, d := range searchDirs {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s: %w in PATH or %s; install it (Debian/Ubuntu: apt-get install %s, or run `bash .ci/run` as root)",
		name, ErrBinaryMissing, strings.Join(searchDirs, ", "), debianPkg)
}

// process is a server running as a child of the test binary.
type process struct {
	mu   sync.Mutex
	name string
	bin  string
	args []string
	dir  string // working directory and log location
	cmd  *exec.Cmd
	done chan struct{}
}

func (p *process) logPath() string { return filepath.Join(p.dir, p.name+".log") }

// start launches the process, unless it is running. The kernel kills it if
// the test binary dies.
func (p *process) start() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd != nil {
		select {
		case <-p.done:
			// It died on its own or was killed from outside (an operator's
			// kill -9 in snipctl demo --cluster): start it again.
		default:
			return nil
		}
	}
	logf, err := os.OpenFile(p.logPath(), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("open %s log: %w", p.name, err)
	}
	cmd := exec.Command(p.bin, p.args...)
	cmd.Dir = p.dir
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start %s: %w", p.name, err)
	}
	done := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		logf.Close()
		close(done)
	}()
	p.cmd, p.done = cmd, done
	return nil
}

// exited reports whether the process has exited on its own.
func (p *process) exited() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil {
		return true
	}
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// signal sends sig and, if wait is set, waits up to timeout for the exit,
// escalating to SIGKILL.
func (p *process) signal(sig syscall.Signal, wait bool, timeout time.Duration) {
	p.mu.Lock()
	cmd, done := p.cmd, p.done
	p.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = cmd.Process.Signal(sig)
	if !wait {
		return
	}
	select {
	case <-done:
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-done
	}
	p.mu.Lock()
	p.cmd, p.done = nil, nil
	p.mu.Unlock()
}

// pid is the running process's ID, 0 when it is not running.
func (p *process) pid() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.cmd == nil || p.cmd.Process == nil {
		return 0
	}
	return p.cmd.Process.Pid
}

// stop terminates the process gracefully (SIGTERM, then SIGKILL after timeout).
func (p *process) stop(timeout time.Duration) { p.signal(syscall.SIGTERM, true, timeout) }

// kill is kill -9.
func (p *process) kill() { p.signal(syscall.SIGKILL, true, 10*time.Second) }

// pause freezes the process (SIGSTOP): it keeps its sockets but answers
// nothing, like a hung server or a network partition.
func (p *process) pause() { p.signal(syscall.SIGSTOP, false, 0) }

// resume undoes pause.
func (p *process) resume() { p.signal(syscall.SIGCONT, false, 0) }

// tailLog returns the end of the process log, for failure messages.
func (p *process) tailLog() string {
	b, err := os.ReadFile(p.logPath())
	if err != nil {
		return "(no log: " + err.Error() + ")"
	}
	if len(b) > 2000 {
		b = b[len(b)-2000:]
	}
	return string(b)
}

// waitReady polls ready until it succeeds, the process exits, or timeout.
func (p *process) waitReady(timeout time.Duration, ready func() error) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		if p.exited() {
			return fmt.Errorf("%s exited during start; log:\n%s", p.name, p.tailLog())
		}
		if last = ready(); last == nil {
			return nil
		}
		time.Sleep(25 * time.Millisecond)
	}
	return fmt.Errorf("%s not ready after %s: %v; log:\n%s", p.name, timeout, last, p.tailLog())
}
