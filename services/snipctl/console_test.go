package main

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/consolesessions"
	"github.com/snipdev/snip/pkg/testenv"
)

// `snipctl console revoke-sessions` ends every console session issued
// before it, as the console's POST /api/sessions/revoke does, on the
// bucket every instance reads: a session from before is refused, one
// issued after is not, and a later not_before already there is kept.
func TestConsoleRevokeSessionsEndsEverySession(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	environ := []string{"NATS_URL=" + n.URL}
	if out, err := snipctl(t, environ, "topology", "apply"); err != nil {
		t.Fatalf("topology apply: %v\n%s", err, out)
	}
	sessions := consolesessions.New(n.JetStream(t)) // as a console instance reads it
	ctx := t.Context()
	before := time.Now().Add(-time.Second)
	if err := sessions.Check(ctx, "a1", before); err != nil {
		t.Fatalf("a session before any revocation: %v", err)
	}

	out, err := snipctl(t, environ, "console", "revoke-sessions")
	if err != nil {
		t.Fatalf("console revoke-sessions: %v\n%s", err, out)
	}
	if !strings.Contains(out, "every console session issued before ") {
		t.Errorf("output does not say what was ended:\n%s", out)
	}
	if err := sessions.Check(ctx, "a1", before); !errors.Is(err, consolesessions.ErrEnded) {
		t.Errorf("a session issued before the revocation: %v, want ErrEnded", err)
	}
	if err := sessions.Check(ctx, "b2", time.Now().Add(time.Second)); err != nil {
		t.Errorf("a session issued after the revocation: %v, want it accepted", err)
	}

	// A not_before ahead of snipctl's clock (a console instance whose clock
	// runs ahead revoked) is not moved back.
	ahead, err := sessions.RevokeAll(ctx, time.Now().Add(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	if out, err := snipctl(t, environ, "console", "revoke-sessions"); err != nil || !strings.Contains(out, ahead.UTC().Format(time.RFC3339Nano)) {
		t.Errorf("console revoke-sessions under a later not_before: %v, want it kept (%s):\n%s", err, ahead.UTC().Format(time.RFC3339Nano), out)
	}
	if err := sessions.Check(ctx, "c3", time.Now().Add(time.Minute)); !errors.Is(err, consolesessions.ErrEnded) {
		t.Errorf("a session issued before the later not_before: %v, want ErrEnded (not_before moved back)", err)
	}
}

// Without the topology (no sessions bucket) the command writes nothing and
// says what creates the bucket; a word it does not know is a usage error.
func TestConsoleRevokeSessionsWithoutTheBucketSaysApplyTheTopology(t *testing.T) {
	t.Parallel()
	n := testenv.StartNATS(t)
	environ := []string{"NATS_URL=" + n.URL}
	out, err := snipctl(t, environ, "console", "revoke-sessions")
	if !errors.Is(err, consolesessions.ErrNoBucket) || !strings.Contains(err.Error(), "snipctl topology apply") {
		t.Errorf("without the bucket: %v, want ErrNoBucket naming snipctl topology apply\n%s", err, out)
	}
	for _, args := range [][]string{{"console"}, {"console", "revoke"}, {"console", "revoke-sessions", "now"}} {
		if _, err := snipctl(t, environ, args...); exitStatus(err) != exitUsage {
			t.Errorf("snipctl %s: %v, want a usage error", strings.Join(args, " "), err)
		}
	}
}
