package main

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/testenv"
)

// A ramp stopped (Ctrl-C) in the middle of a step does not judge the part
// of the step it ran: a second of a 30 s step is not the step held, and
// the ramp's answer is the highest rate held for a whole step.
func TestAStoppedRampDoesNotJudgeTheStepItCut(t *testing.T) {
	t.Parallel()
	var requests atomic.Int64
	base := bare302(&Env{Log: slog.New(slog.DiscardHandler)}).Handler()
	srv := httptest.NewServer(countRequests(&requests, base))
	defer srv.Close()
	dir := t.TempDir()
	ctx, stop := context.WithCancel(t.Context())
	defer stop()
	var out lockedBuffer
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, []string{"ramp", "--target", srv.URL, "--create-links=false", "--from", "100", "--to", "100",
			"--step-duration", "30s", "--links", "5", "--out", dir}, nil, &out, &out, slog.New(slog.DiscardHandler))
	}()
	testenv.WaitFor(t, 30*time.Second, "the step's first 100 requests", func() bool { return requests.Load() >= 100 })
	stop() // Ctrl-C, a second into the 30 s step
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("loadtest ramp: %v\n%s", err, out.String())
		}
	case <-time.After(time.Minute):
		t.Fatalf("loadtest ramp did not return within a minute of the stop:\n%s", out.String())
	}
	b, err := os.ReadFile(filepath.Join(dir, "ramp.json"))
	if err != nil {
		t.Fatal(err)
	}
	var r struct {
		Best  int               `json:"best"`
		Steps []json.RawMessage `json:"steps"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	if r.Best != 0 || len(r.Steps) != 0 || !strings.Contains(out.String(), "without errors: 0/s") {
		t.Errorf("a ramp stopped a second into its only step: best %d, %d steps judged; want none held and none judged\n%s", r.Best, len(r.Steps), out.String())
	}
}

// countRequests counts the requests h serves.
func countRequests(n *atomic.Int64, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		h.ServeHTTP(w, r)
	})
}
