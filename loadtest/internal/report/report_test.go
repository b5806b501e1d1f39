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
		{Reader: "click-counter", FirstHalf: 20, SecondHalf: 50, Read: 3, Seconds: 3, Bounded: true},
		{Reader: "warehouse-loader", FirstHalf: 200, SecondHalf: 500, Read: 3, Seconds: 3, Bounded: true},
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

// A run that did not get to the judgement has an unknown verdict, not
// "no": its load cut short (stopped, or the driver stopped early), or
// stopped before its catch-up was seen. A run stopped after both (during
// its verification) was judged.
func TestKeepUpOfARunStoppedEarlyIsUnknown(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		stopped, cut bool
		catchUp      time.Duration
		unknown      string
		kept         bool
	}{
		"stopped during the load":              {true, true, -1, "the run was stopped during the load", false},
		"driver stopped early":                 {false, true, time.Second, "the load ended before its duration (the driver stopped early)", false},
		"stopped before the catch-up was seen": {true, false, -1, "the run was stopped before its catch-up was seen", false},
		"stopped after the catch-up was seen":  {true, false, time.Second, "", true},
		"never caught up, not stopped":         {false, false, -1, "", false},
	} {
		r := sample(t)
		r.Stopped, r.LoadCut, r.CatchUp = c.stopped, c.cut, c.catchUp
		k := report.KeepUpOf(r)
		if k.Unknown != c.unknown || k.KeptUp != c.kept {
			t.Errorf("%s: unknown %q, kept up %v; want %q, %v", name, k.Unknown, k.KeptUp, c.unknown, c.kept)
		}
		if len(k.Readers) != 2 {
			t.Errorf("%s: %d readers' lags, want both reported", name, len(k.Readers))
		}
	}
	r := sample(t)
	r.Stopped, r.LoadCut, r.CatchUp = true, true, -1
	r.KeepUp = report.KeepUpOf(r)
	var out bytes.Buffer
	report.Text(&out, r)
	if want := "kept up              unknown (the run was stopped during the load: the keep-up rule was not judged)"; !strings.Contains(out.String(), want) ||
		strings.Contains(out.String(), "kept up              no") {
		t.Errorf("text lacks %q, or says no:\n%s", want, out.String())
	}
}

// A second in which no backlog read finished repeats an earlier read's
// figure: the rule takes it as unknown, not as within bounds, and a reader
// read in fewer than 3 of 4 of the second half's seconds is not judged
// bounded, whatever its last figures say.
func TestKeepUpTakesASecondWithoutARead(t *testing.T) {
	t.Parallel()
	// 8 s of load at 100/s: at most 1,000 behind; the second half is the
	// last 4 seconds. Each case reads the backlog in the seconds marked
	// 'r' (the reader at lag[i]); in the others no read finished, and the
	// meter repeats the last one read.
	tests := []struct {
		name  string
		reads string
		lag   [8]uint64
		want  report.ReaderLag
		kept  bool
	}{
		{
			name: "every_second_read", reads: "rrrrrrrr", lag: [8]uint64{1, 2, 3, 4, 5, 6, 7, 8},
			want: report.ReaderLag{FirstHalf: 4, SecondHalf: 8, Read: 4, Seconds: 4, Bounded: true}, kept: true,
		},
		{
			// 3 of 4: the allowance for a read that outlasts its second.
			name: "one_second_of_four_unread_is_allowed", reads: "rrrrr.rr", lag: [8]uint64{1, 2, 3, 4, 5, 6, 7, 8},
			want: report.ReaderLag{FirstHalf: 4, SecondHalf: 8, Read: 3, Seconds: 4, Bounded: true}, kept: true,
		},
		{
			// Reads failing from the second half on: the last figure
			// read, low, repeated, must not pass for the reader's lag.
			name: "reads_failing_in_the_second_half_is_unknown", reads: "rrrr....", lag: [8]uint64{1, 2, 3, 4, 5000, 6000, 7000, 8000},
			want: report.ReaderLag{FirstHalf: 4, Read: 0, Seconds: 4, Unknown: true}, kept: false,
		},
		{
			name: "half_the_second_half_unread_is_unknown", reads: "rrrrr.r.", lag: [8]uint64{1, 2, 3, 4, 5, 6, 7, 8},
			want: report.ReaderLag{FirstHalf: 4, SecondHalf: 7, Read: 2, Seconds: 4, Unknown: true}, kept: false,
		},
		{
			name: "a_read_peak_over_the_bound_is_not_bounded", reads: "rrrrrrr.", lag: [8]uint64{1, 2, 3, 4, 5, 1001, 7, 8},
			want: report.ReaderLag{FirstHalf: 4, SecondHalf: 1001, Read: 3, Seconds: 4}, kept: false,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			start := time.Date(2025, 6, 1, 12, 0, 0, 0, time.UTC)
			m := series.NewMeter(start, 100)
			for i := range 8 {
				if tc.reads[i] == 'r' {
					m.SetLag(map[string]uint64{"click-counter": tc.lag[i]})
				}
				m.Tick(start.Add(time.Duration(i+1)*time.Second), series.PhaseLoad)
			}
			r := &report.Report{Rate: 100, LoadTime: 8 * time.Second, CatchUp: time.Second, Summary: m.Summarise(8 * time.Second)}
			k := report.KeepUpOf(r)
			want := &report.KeepUp{KeptUp: tc.kept, MaxLag: 1000, Readers: []report.ReaderLag{tc.want}}
			want.Readers[0].Reader = "click-counter"
			if diff := cmp.Diff(want, k); diff != "" {
				t.Errorf("KeepUpOf (-want +got):\n%s", diff)
			}
		})
	}

	// The text names the unknown reader and why.
	r := sample(t)
	r.Summary.Seconds[3].LagRead = false
	r.KeepUp = report.KeepUpOf(r)
	var out bytes.Buffer
	report.Text(&out, r)
	for _, line := range []string{
		"kept up              no (",
		"warehouse-loader                       peak lag 200 in the first half, 500 in the second: unknown (backlog read in 2 of the second half's 3 seconds, fewer than 75%)",
	} {
		if !strings.Contains(out.String(), line) {
			t.Errorf("text lacks %q:\n%s", line, out.String())
		}
	}
}
