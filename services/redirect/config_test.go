package main

import (
	"testing"
	"time"
)

// The group commit's linger is on by default and must leave the request's
// wait (SNIP_OUTBOX_WAIT) room for the round trip and any replica wait.
func TestConfigCommitLinger(t *testing.T) {
	t.Parallel()
	cfg, err := loadConfig(nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.CommitLinger != 500*time.Microsecond {
		t.Fatalf("default linger %s, want 500µs", cfg.CommitLinger)
	}
	for _, env := range [][]string{{"SNIP_COMMIT_LINGER=0"}, {"SNIP_COMMIT_LINGER=5ms"}} {
		if _, err := loadConfig(env, nil); err != nil {
			t.Errorf("%v refused: %v", env, err)
		}
	}
	for _, env := range [][]string{
		{"SNIP_COMMIT_LINGER=-1ms"},
		{"SNIP_COMMIT_LINGER=100ms"}, // = SNIP_OUTBOX_WAIT
		{"SNIP_COMMIT_LINGER=60ms", "SNIP_OUTBOX_WAIT_REPLICAS=1", "SNIP_OUTBOX_WAIT_REPLICAS_TIMEOUT=40ms"},
	} {
		if _, err := loadConfig(env, nil); err == nil {
			t.Errorf("%v accepted", env)
		}
	}
}
