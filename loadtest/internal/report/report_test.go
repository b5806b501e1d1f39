package report_test

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"html"
	"image/png"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/snipdev/snip/loadtest/internal/oracle"
	"github.com/snipdev/snip/loadtest/internal/report"
	"github.com/snipdev/snip/loadtest/internal/series"
)

func sample(t *testing.T) *report.Report {
	t.Helper()
	start := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
	m := series.NewMeter(start, 100)
	for s := 1; s <= 5; s++ {
		for i := range 100 {
			m.Sent()
			m.Done(time.Duration(i+1)*time.Millisecond, i != 0)
		}
		m.SetLag(map[string]uint64{"click-counter": uint64(10 * s), "warehouse-loader": uint64(100 * s)})
		m.Tick(start.Add(time.Duration(s)*time.Second), series.PhaseLoad)
	}
	m.SetLag(map[string]uint64{"click-counter": 0, "warehouse-loader": 0})
	m.Tick(start.Add(6*time.Second), series.PhaseDrain)
	m.ProbeSent(start.Add(time.Second))
	m.ProbeCount("counter", 1, start.Add(1300*time.Millisecond))
	return &report.Report{
		Command: "loadtest http --rate 100", Mode: "http", Tag: "abc", Target: "http://127.0.0.1:8080",
		Started: start, LoadTime: 5 * time.Second, Rate: 100, CatchUp: 900 * time.Millisecond,
		Answers: map[string]uint64{"302": 495, "503": 5},
		Summary: m.Summarise(5 * time.Second),
		Verify: &oracle.Report{Passed: false, Rows: []oracle.Result{
			{Sink: oracle.SinkLog, Expected: 495, Got: 494, Missing: 1, Status: oracle.Fail},
			{Sink: oracle.SinkWarehouse, Status: oracle.Skipped, Note: "not configured"},
		}},
	}
}

func TestSummaryFigures(t *testing.T) {
	t.Parallel()
	r := sample(t)
	s := r.Summary
	got := map[string]float64{
		"throughput": s.Throughput, "ok": float64(s.OK), "errors": float64(s.Errors),
		"peak counter lag": float64(s.PeakLag["click-counter"]),
		"click-to-counted": s.ClickToCounted["counter"].P50,
	}
	want := map[string]float64{"throughput": 99, "ok": 495, "errors": 5, "peak counter lag": 50, "click-to-counted": 300}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("summary (-want +got):\n%s", diff)
	}
	// Latencies 2..100 ms (the 1 ms answer of each second was an error).
	if s.P50 < 50 || s.P50 > 52 || s.P99 < 99 || s.P99 > 100.1 {
		t.Errorf("p50 %.2f p99 %.2f, want about 51 and 99-100", s.P50, s.P99)
	}
	if n := len(s.Seconds); n != 6 || s.Seconds[5].Phase != series.PhaseDrain || s.Seconds[0].Offered != 100 {
		t.Errorf("seconds: %+v", s.Seconds)
	}
}

func TestWriteIsSelfContained(t *testing.T) {
	t.Parallel()
	r := sample(t)
	dir := t.TempDir()
	jsPath, htmlPath, err := report.Write(dir, r)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(jsPath)
	if err != nil {
		t.Fatal(err)
	}
	var back report.Report
	if err := json.Unmarshal(b, &back); err != nil {
		t.Fatalf("report.json does not parse: %v", err)
	}
	if diff := cmp.Diff(r.Summary.Seconds, back.Summary.Seconds); diff != "" {
		t.Errorf("seconds changed through report.json (-want +got):\n%s", diff)
	}
	page, err := os.ReadFile(htmlPath)
	if err != nil {
		t.Fatal(err)
	}
	doc := string(page)
	imgs := regexp.MustCompile(`src="data:image/png;base64,([^"]+)"`).FindAllStringSubmatch(doc, -1)
	if len(imgs) != 3 {
		t.Fatalf("%d embedded PNG plots, want 3 (rate, latency, lag)", len(imgs))
	}
	for _, m := range imgs {
		raw, err := base64.StdEncoding.DecodeString(html.UnescapeString(m[1]))
		if err != nil {
			t.Fatalf("plot is not base64: %v", err)
		}
		if _, err := png.Decode(bytes.NewReader(raw)); err != nil {
			t.Errorf("plot is not a PNG: %v", err)
		}
	}
	if ext := regexp.MustCompile(`(src|href)="(https?:)?//`).FindString(doc); ext != "" {
		t.Errorf("the page loads something from elsewhere: %s", ext)
	}
	for _, want := range []string{"clicks log (CLICKS)", `class="FAIL"`, "SKIPPED", "99/s", "click-to-counter", "catch-up time"} {
		if !strings.Contains(doc, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
}

// The keep-up rule judges each reader by its peak lag in the load's second
// half against 10 s of the offered rate, and the run by its catch-up.
func TestKeepUpJudgesTheSecondHalfAndTheCatchUp(t *testing.T) {
	t.Parallel()
	r := sample(t) // rate 100: at most 1,000 behind; lags rise 10..50 and 100..500 over 5 s
	k := report.KeepUpOf(r)
	want := &report.KeepUp{KeptUp: true, MaxLag: 1000, Readers: []report.ReaderLag{
		{Reader: "click-counter", FirstHalf: 20, SecondHalf: 50, Bounded: true},
		{Reader: "warehouse-loader", FirstHalf: 200, SecondHalf: 500, Bounded: true},
	}}
	if diff := cmp.Diff(want, k); diff != "" {
		t.Fatalf("KeepUpOf (-want +got):\n%s", diff)
	}

	for name, c := range map[string]struct {
		lagAt4  uint64
		catchUp time.Duration
		kept    bool
	}{
		"a reader 1,001 behind in the second half": {1001, time.Second, false},
		"exactly at the bound":                     {1000, time.Second, true},
		"never caught up":                          {0, -1, false},
		"caught up after 11 s":                     {0, 11 * time.Second, false},
	} {
		r := sample(t)
		r.Summary.Seconds[3].Lag["warehouse-loader"] = c.lagAt4
		r.CatchUp = c.catchUp
		if k := report.KeepUpOf(r); k.KeptUp != c.kept {
			t.Errorf("%s: kept up = %v, want %v (%+v)", name, k.KeptUp, c.kept, k)
		}
	}

	// A peak in the first half is reported, not judged.
	r = sample(t)
	r.Summary.Seconds[0].Lag["click-counter"] = 5000
	if k := report.KeepUpOf(r); !k.KeptUp || k.Readers[0].FirstHalf != 5000 {
		t.Errorf("a first-half peak: %+v, want kept up with first half 5000", k)
	}

	// No reader watched: no verdict, and the text says nothing about it.
	r = sample(t)
	for i := range r.Summary.Seconds {
		r.Summary.Seconds[i].Lag = nil
	}
	if k := report.KeepUpOf(r); k != nil {
		t.Errorf("no lag recorded: %+v, want nil", k)
	}

	r = sample(t)
	r.KeepUp = report.KeepUpOf(r)
	var out bytes.Buffer
	report.Text(&out, r)
	for _, line := range []string{
		"kept up              yes (every reader's lag in the second half of the load at most 10 s of load, 1000 events, and caught up within 10s)",
		"warehouse-loader                       peak lag 200 in the first half, 500 in the second: bounded",
	} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("text lacks %q:\n%s", line, out.String())
		}
	}
}
