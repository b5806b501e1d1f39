package testenv

import (
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// StartNATSWithConfig runs an embedded nats-server with the configuration
// file conf (deploy/nats/nats.conf: its users and their permissions) on a
// free port of 127.0.0.1, its JetStream store under t.TempDir(), and shuts
// it down when the test ends. It returns the client URL.
//
// Every $SNIP_NATS_<USER>_PASSWORD the files next to conf name is set to
// "pw-<user>" (lower case) in the environment, where the server reads it;
// so the test may not be parallel (t.Setenv).
//
// The test fails if the server logged a permission violation of any
// client. It is the server's record that counts, not the client's: a
// client hears of a violation asynchronously (an error callback on a
// goroutine of its own, at some point after the fact), so a test reading
// the client's reports could end before they came. The server logs a
// violation as it reads the offending protocol line, and the check runs at
// the end of the test, once every client connection is closed (the server
// has then read each one's input to its end).
func StartNATSWithConfig(t *testing.T, conf string) string {
	t.Helper()
	vars := regexp.MustCompile(`\$SNIP_NATS_([A-Z0-9_]+)_PASSWORD`)
	files, _ := filepath.Glob(filepath.Join(filepath.Dir(conf), "*.conf"))
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatalf("testenv: %v", err)
		}
		for _, v := range vars.FindAllStringSubmatch(string(b), -1) {
			t.Setenv("SNIP_NATS_"+v[1]+"_PASSWORD", "pw-"+strings.ToLower(v[1]))
		}
	}
	opts, err := server.ProcessConfigFile(conf)
	if err != nil {
		t.Fatalf("testenv: nats config %s: %v", conf, err)
	}
	opts.Host, opts.Port, opts.HTTPPort = "127.0.0.1", -1, 0
	opts.StoreDir = filepath.Join(t.TempDir(), "jetstream")
	opts.NoLog, opts.NoSigs = true, true
	ns, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("testenv: nats: %v", err)
	}
	violations := &violationLog{}
	ns.SetLogger(violations, false, false)
	go ns.Start()
	t.Cleanup(func() {
		// The test's own cleanups, registered after this one, have run:
		// every client it started has closed its connection. The server
		// reads a connection's input to its end before it lets it go, so
		// once none is left every violation is in the log.
		deadline := time.Now().Add(10 * time.Second)
		for ns.NumClients() > 0 && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
		left := ns.NumClients()
		ns.Shutdown()
		for _, v := range violations.all() {
			t.Errorf("nats-server: a client met a permission violation: %s", v)
		}
		if left > 0 {
			t.Errorf("nats-server: %d client connections still open 10s after the test; permission violations in their last input may be missing from this check", left)
		}
	})
	if !ns.ReadyForConnections(20 * time.Second) {
		t.Fatalf("testenv: nats-server with %s not ready after 20s", conf)
	}
	return ns.ClientURL()
}

// serverViolation matches the server's log line of a permission violation.
var serverViolation = regexp.MustCompile(`(Publish|Subscription) Violation`)

// violationLog is a server.Logger that keeps the permission violations the
// server reports ("Publish Violation - ...", "Subscription Violation - ...")
// and drops every other line.
type violationLog struct {
	mu    sync.Mutex
	lines []string
}

func (l *violationLog) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

func (l *violationLog) keep(format string, v []any) {
	if line := fmt.Sprintf(format, v...); serverViolation.MatchString(line) {
		l.mu.Lock()
		l.lines = append(l.lines, line)
		l.mu.Unlock()
	}
}

func (l *violationLog) Noticef(format string, v ...any) { l.keep(format, v) }
func (l *violationLog) Warnf(format string, v ...any)   { l.keep(format, v) }
func (l *violationLog) Fatalf(format string, v ...any)  { l.keep(format, v) }
func (l *violationLog) Errorf(format string, v ...any)  { l.keep(format, v) }
func (l *violationLog) Debugf(format string, v ...any)  {}
func (l *violationLog) Tracef(format string, v ...any)  {}
