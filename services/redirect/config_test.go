package main

import (
	"strings"
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

// Timings that would break the service are refused at start: a sample
// interval of 0 (the monitor's ticker panics), a publish timeout of 0 (an
// ack that never comes blocks the shard for good) or longer than a quarter
// of the streams' duplicate window (a retry after it is stored twice), and a
// commit timeout that lets a commit fail before its clicks' validity has
// passed (the late XADD would be relayed after its request got 503).
func TestConfigRefusesTimingsThatBreakTheService(t *testing.T) {
	t.Parallel()
	for _, env := range [][]string{
		nil, // the defaults keep the rules
		{"SNIP_OUTBOX_VALIDITY=10s", "SNIP_COMMIT_TIMEOUT=11s"},
		{"SNIP_PUBLISH_TIMEOUT=30s", "SNIP_RELAY_LEASE_TTL=30s"},
		// The committer's client waits SNIP_COMMIT_TIMEOUT, not this.
		{"REDIS_URL=redis://127.0.0.1:6379/0?read_timeout=200ms"},
	} {
		if _, err := loadConfig(env, nil); err != nil {
			t.Errorf("%v refused: %v", env, err)
		}
	}
	for _, env := range [][]string{
		{"SNIP_OUTBOX_SAMPLE_INTERVAL=0"},
		{"SNIP_OUTBOX_SAMPLE_INTERVAL=-1s"},
		{"SNIP_PUBLISH_TIMEOUT=0"},
		{"SNIP_PUBLISH_TIMEOUT=31s"},
		{"SNIP_RELAY_LEASE_TTL=31s"},
		{"SNIP_COMMIT_TIMEOUT=0"},
		{"SNIP_COMMIT_TIMEOUT=1100ms"}, // = the validity (1s) plus the wait (100ms)
		{"SNIP_OUTBOX_VALIDITY=10s"},
		{"SNIP_OUTBOX_WAIT=1s", "SNIP_OUTBOX_VALIDITY=2s", "SNIP_COMMIT_TIMEOUT=3s"},
	} {
		if _, err := loadConfig(env, nil); err == nil {
			t.Errorf("%v accepted", env)
		}
	}
}

// A size or a time the service would otherwise take for another value is
// refused at start, naming the variable: the committer and the relay take
// a size below 1 for 1 (a group commit per click), and a cache TTL of 0 or
// less expires every link as it is cached (a Redis lookup per redirect).
func TestConfigRefusesSizesTakenForOthers(t *testing.T) {
	t.Parallel()
	for _, env := range []string{
		"SNIP_COMMIT_MAX_BATCH=0", "SNIP_COMMIT_MAX_BATCH=-5", "SNIP_COMMIT_WORKERS=0",
		"SNIP_RELAY_WINDOW=0", "SNIP_RELAY_WINDOW=-1", "SNIP_RELAY_LINGER=-1ms",
		"SNIP_CACHE_TTL=0", "SNIP_CACHE_TTL=-1s", "SNIP_CACHE_STALE_IF_ERROR=-1s",
	} {
		name, _, _ := strings.Cut(env, "=")
		if _, err := loadConfig([]string{env}, nil); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%s: %v, want a refusal naming %s", env, err, name)
		}
	}
	for _, env := range []string{"SNIP_COMMIT_MAX_BATCH=1", "SNIP_RELAY_LINGER=0", "SNIP_CACHE_STALE_IF_ERROR=0"} {
		if _, err := loadConfig([]string{env}, nil); err != nil {
			t.Errorf("%s refused: %v", env, err)
		}
	}
}
