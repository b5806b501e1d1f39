package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/testenv"
)

// syncBuffer collects the demo's output for the failure message.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// freeRange finds n consecutive free ports.
func freeRange(t *testing.T, n int) int {
	t.Helper()
	for try := 0; try < 50; try++ {
		base, err := testenv.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		ok := true
		for i := range n {
			l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(base+i))
			if err != nil {
				ok = false
				break
			}
			l.Close()
		}
		if ok {
			return base
		}
	}
	t.Fatal("no free port range")
	return 0
}

// `make demo` is how most people meet Snip: run it with the real redirect
// and counter binaries and follow one click from the demo's link to the
// counter's stats.
func TestDemoRunsAndCountsAClick(t *testing.T) {
	t.Parallel()
	bin := t.TempDir()
	for _, svc := range []string{"redirect", "clickcounter"} {
		out, err := exec.Command("go", "build", "-o", filepath.Join(bin, svc), "../"+svc).CombinedOutput()
		if err != nil {
			t.Fatalf("build %s: %v\n%s", svc, err, out)
		}
	}
	port := func() string {
		p, err := testenv.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		return strconv.Itoa(p)
	}
	base := freeRange(t, 8) // http-base .. +7 (webhooks)
	dir := t.TempDir()
	args := []string{"demo", "--dir", dir, "--bin", bin, "--rate", "0",
		"--nats-port", port(), "--nats-monitor-port", port(), "--redis-port", port(),
		"--clickhouse-port", port(), "--site-port", port(), "--http-base", strconv.Itoa(base)}
	var out syncBuffer
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- run(ctx, args, []string{"SNIP_PARTITIONS=2"}, &out, &out, slog.New(slog.DiscardHandler))
	}()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("demo returned %v\n%s", err, out.String())
			}
		case <-time.After(2 * time.Minute):
			t.Errorf("demo did not stop\n%s", out.String())
		}
	}
	t.Cleanup(stop)

	redirect := "http://127.0.0.1:" + strconv.Itoa(base)
	counter := "http://127.0.0.1:" + strconv.Itoa(base+1)
	client := &http.Client{Timeout: 5 * time.Second, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	testenv.WaitFor(t, 2*time.Minute, "the demo link to redirect", func() bool {
		resp, err := client.Get(redirect + "/nats-jetstream")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusFound
	})
	var total int
	testenv.WaitFor(t, time.Minute, "the click in the counter's stats", func() bool {
		req, _ := http.NewRequest(http.MethodGet, counter+"/api/links/nats-jetstream/stats", nil)
		req.Header.Set("Authorization", "Bearer "+demoAPIKey)
		resp, err := client.Do(req)
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		var st struct {
			Totals struct{ Human, Bot int }
		}
		if resp.StatusCode != http.StatusOK || json.Unmarshal(b, &st) != nil {
			return false
		}
		total = st.Totals.Human + st.Totals.Bot
		return total >= 1
	})
	if total != 1 {
		t.Errorf("counter shows %d clicks, want the 1 sent\n%s", total, out.String())
	}
	stop()
	// The services stopped while NATS still ran: the counter acked what it
	// held and left its group, and nothing timed out waiting for NATS.
	log, err := os.ReadFile(filepath.Join(dir, "logs", "clickcounter.log"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(log), "left consumer group") || strings.Contains(string(log), "deadline exceeded") {
		t.Errorf("the counter did not leave its group cleanly at the demo's stop:\n%s", log)
	}
}

// A second demo on the ports of one still running (or still stopping) must
// refuse to start and say which port, instead of starting services that
// cannot bind while the old ones answer its health checks.
func TestDemoRefusesAPortInUse(t *testing.T) {
	t.Parallel()
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	port := strconv.Itoa(taken.Addr().(*net.TCPAddr).Port)
	base := freeRange(t, 8) // http-base .. +7 (webhooks)
	free := func() string {
		p, err := testenv.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		return strconv.Itoa(p)
	}
	dir := t.TempDir()
	args := []string{"demo", "--dir", dir, "--bin", t.TempDir(), "--rate", "0",
		"--nats-port", free(), "--nats-monitor-port", free(), "--redis-port", port,
		"--clickhouse-port", free(), "--site-port", free(), "--http-base", strconv.Itoa(base)}
	var out syncBuffer
	err = run(context.Background(), args, nil, &out, &out, slog.New(slog.DiscardHandler))
	if err == nil || !strings.Contains(err.Error(), "port "+port+" (redis) is in use") {
		t.Fatalf("demo with its Redis port taken: err %v, want one naming port %s (redis)\n%s", err, port, out.String())
	}
	if entries, _ := os.ReadDir(filepath.Join(dir, "logs")); len(entries) != 0 {
		t.Errorf("the refused demo started something: logs %v", entries)
	}
}
