// Package report writes a run's report: report.json with every figure and
// every second, and report.html, a self-contained page (plots are PNG data
// URIs, no script, no stylesheet from anywhere) with the summary, the plots
// of rate, latency and reader lag over time, and the oracle's table.
package report

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"html/template"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/snipdev/snip/loadtest/internal/oracle"
	"github.com/snipdev/snip/loadtest/internal/series"
	"github.com/snipdev/snip/loadtest/internal/workload"
)

// Report is everything known about a run.
type Report struct {
	Command string    `json:"command"`
	Mode    string    `json:"mode"`
	Tag     string    `json:"tag"`
	Target  string    `json:"target"`
	Started time.Time `json:"started"`
	// LoadTime is how long the driver sent; Rate what it was asked to.
	LoadTime time.Duration `json:"load_time_ns"`
	Rate     int           `json:"rate"`
	// CatchUp is the time from the end of the load until every click was
	// in the log and every reader had acknowledged the run's last events
	// (other traffic may still be waiting); negative if never seen.
	CatchUp time.Duration     `json:"catch_up_ns"`
	Spec    workload.Spec     `json:"spec"`
	Answers map[string]uint64 `json:"answers"`
	Summary series.Summary    `json:"summary"`
	// KeepUp is the keep-up verdict (KeepUpOf); nil when no reader was watched.
	KeepUp *KeepUp `json:"keep_up,omitempty"`
	// Verify is the oracle's report; nil when the run was not verified.
	Verify *oracle.Report `json:"verify,omitempty"`
	// Notes are things the reader of the report should know.
	Notes []string `json:"notes,omitempty"`
	// Stopped: the run was stopped (Ctrl-C, SIGTERM) before it ended; a
	// catch-up not seen by then was not waited for.
	Stopped bool `json:"stopped,omitempty"`
	// LoadCut: the load ended before its --duration (the run was stopped
	// during it, or the driver stopped early).
	LoadCut bool `json:"load_cut,omitempty"`
}

// Write writes report.json and report.html into dir and returns their paths.
func Write(dir string, r *Report) (string, string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", "", fmt.Errorf("write report: %w", err)
	}
	js := filepath.Join(dir, "report.json")
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return "", "", fmt.Errorf("write report: %w", err)
	}
	if err := os.WriteFile(js, append(b, '\n'), 0o644); err != nil {
		return "", "", fmt.Errorf("write report: %w", err)
	}
	var page bytes.Buffer
	if err := HTML(&page, r); err != nil {
		return "", "", err
	}
	htm := filepath.Join(dir, "report.html")
	if err := os.WriteFile(htm, page.Bytes(), 0o644); err != nil {
		return "", "", fmt.Errorf("write report: %w", err)
	}
	return js, htm, nil
}

// Text writes the summary as plain text.
func Text(w io.Writer, r *Report) {
	s := r.Summary
	fmt.Fprintf(w, "run %s (%s) against %s: %s at %d/s offered\n", r.Tag, r.Mode, r.Target, r.LoadTime.Round(time.Millisecond), r.Rate)
	fmt.Fprintf(w, "  achieved throughput  %.0f/s (%d ok, %d errors of %d sent)\n", s.Throughput, s.OK, s.Errors, s.Sent)
	fmt.Fprintf(w, "  %-20s p50 %s  p99 %s  p99.9 %s  max %s\n", latencyName(r.Mode), msf(s.P50), msf(s.P99), msf(s.P999), msf(s.Max))
	for _, sink := range sortedKeys(s.ClickToCounted) {
		l := s.ClickToCounted[sink]
		fmt.Fprintf(w, "  click-to-%-11s p50 %s  p99 %s  max %s  (%d of %d probes seen)\n", sink, msf(l.P50), msf(l.P99), msf(l.Max), l.Seen, l.Probes)
	}
	for _, g := range sortedKeys(s.PeakLag) {
		fmt.Fprintf(w, "  peak lag %-24s %d\n", g, s.PeakLag[g])
	}
	switch {
	case r.CatchUp >= 0:
		fmt.Fprintf(w, "  catch-up time        %s (end of load to every event of the run processed by every reader)\n", r.CatchUp.Round(time.Millisecond))
	case r.Stopped:
		fmt.Fprintln(w, "  catch-up time        not measured (the run was stopped before every reader was seen to have processed it)")
	default:
		fmt.Fprintln(w, "  catch-up time        not reached (a reader had not processed every event of the run)")
	}
	if k := r.KeepUp; k != nil {
		verdict := "no"
		if k.KeptUp {
			verdict = "yes"
		}
		if k.Unknown != "" {
			fmt.Fprintf(w, "  kept up              unknown (%s: the keep-up rule was not judged)\n", k.Unknown)
		} else {
			fmt.Fprintf(w, "  kept up              %s (every reader's lag in the second half of the load at most %d s of load, %d events, and caught up within %s)\n",
				verdict, MaxLagSeconds, k.MaxLag, MaxCatchUp)
		}
		for _, l := range k.Readers {
			bounded := "bounded"
			switch {
			case l.Unknown:
				bounded = fmt.Sprintf("unknown (backlog read in %d of the second half's %d seconds, fewer than %d%%)", l.Read, l.Seconds, MinFreshPercent)
			case !l.Bounded:
				bounded = "NOT bounded"
			}
			fmt.Fprintf(w, "    %-38s peak lag %d in the first half, %d in the second: %s\n", l.Reader, l.FirstHalf, l.SecondHalf, bounded)
		}
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "  note: %s\n", n)
	}
}

func latencyName(mode string) string {
	if mode == "events" {
		return "publish-to-ack"
	}
	return "redirect latency"
}

func msf(v float64) string {
	switch {
	case v >= 1000:
		return fmt.Sprintf("%.2fs", v/1000)
	case v >= 10:
		return fmt.Sprintf("%.0fms", v)
	}
	return fmt.Sprintf("%.2fms", v)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// plots renders the three plots as PNG data URIs.
func plots(r *Report) (map[string]template.URL, error) {
	secs := r.Summary.Seconds
	out := map[string]template.URL{}
	line := func(get func(series.Second) float64) plotter.XYs {
		xy := make(plotter.XYs, len(secs))
		for i, s := range secs {
			xy[i].X, xy[i].Y = s.At, get(s)
		}
		return xy
	}
	render := func(name, title, ylabel string, series ...any) error {
		p := plot.New()
		p.Title.Text = title
		p.X.Label.Text = "seconds since start"
		p.Y.Label.Text = ylabel
		p.Legend.Top = true
		p.Add(plotter.NewGrid())
		if err := plotutil.AddLines(p, series...); err != nil {
			return fmt.Errorf("plot %s: %w", name, err)
		}
		wt, err := p.WriterTo(9*vg.Inch, 3.2*vg.Inch, "png")
		if err != nil {
			return fmt.Errorf("plot %s: %w", name, err)
		}
		var b bytes.Buffer
		if _, err := wt.WriteTo(&b); err != nil {
			return fmt.Errorf("plot %s: %w", name, err)
		}
		out[name] = template.URL("data:image/png;base64," + base64.StdEncoding.EncodeToString(b.Bytes()))
		return nil
	}
	if len(secs) == 0 {
		return out, nil
	}
	if err := render("rate", "Rate", "per second",
		"offered", line(func(s series.Second) float64 { return s.Rate(s.Offered) }),
		"sent", line(func(s series.Second) float64 { return s.Rate(s.Sent) }),
		"ok", line(func(s series.Second) float64 { return s.Rate(s.OK) }),
		"errors", line(func(s series.Second) float64 { return s.Rate(s.Errors) })); err != nil {
		return nil, err
	}
	if err := render("latency", "Latency of the answers received each second ("+latencyName(r.Mode)+")", "ms",
		"p50", line(func(s series.Second) float64 { return s.P50 }),
		"p99", line(func(s series.Second) float64 { return s.P99 }),
		"p99.9", line(func(s series.Second) float64 { return s.P999 })); err != nil {
		return nil, err
	}
	groups := map[string]bool{}
	for _, s := range secs {
		for g := range s.Lag {
			groups[g] = true
		}
	}
	var lags []any
	for _, g := range sortedKeys(groups) {
		lags = append(lags, g, line(func(s series.Second) float64 { return float64(s.Lag[g]) }))
	}
	if len(lags) > 0 {
		if err := render("lag", "Reader backlog (events not yet processed)", "events", lags...); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// HTML writes the report page.
func HTML(w io.Writer, r *Report) error {
	imgs, err := plots(r)
	if err != nil {
		return fmt.Errorf("render report: %w", err)
	}
	var text strings.Builder
	Text(&text, r)
	var table strings.Builder
	if r.Verify != nil {
		_ = oracle.WriteTable(&table, r.Verify.Rows)
	}
	data := map[string]any{"R": r, "Text": text.String(), "Plots": imgs, "Table": table.String()}
	if err := page.Execute(w, data); err != nil {
		return fmt.Errorf("render report: %w", err)
	}
	return nil
}

var page = template.Must(template.New("report").Funcs(template.FuncMap{
	"keys": sortedKeys[uint64],
}).Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>Snip load test {{.R.Tag}}</title>
<style>
body{font-family:system-ui,sans-serif;margin:2em auto;max-width:60em;color:#222}
pre{background:#f6f6f6;padding:1em;overflow-x:auto}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.2em .6em;text-align:right}
td:first-child,th:first-child{text-align:left}
.PASS{color:#070;font-weight:bold}.FAIL{color:#b00;font-weight:bold}.SKIPPED{color:#777}
img{max-width:100%}
</style></head><body>
<h1>Snip load test {{.R.Tag}}</h1>
<p>{{.R.Command}}<br>started {{.R.Started.Format "2006-01-02 15:04:05 MST"}}</p>
<h2>Summary</h2>
<pre>{{.Text}}</pre>
{{with .R.Verify}}<h2>Oracle: {{if .Passed}}<span class="PASS">PASS</span>{{else}}<span class="FAIL">FAIL</span>{{end}}</h2>
<table><tr><th>sink</th><th>expected</th><th>got</th><th>missing</th><th>extra</th><th>dup</th><th>verdict</th><th>note</th></tr>
{{range .Rows}}<tr><td>{{.Sink}}</td>{{if eq .Status "SKIPPED"}}<td>-</td><td>-</td><td>-</td><td>-</td><td>-</td>{{else}}<td>{{.Expected}}</td><td>{{.Got}}</td><td>{{.Missing}}</td><td>{{.Extra}}</td><td>{{.Dup}}</td>{{end}}<td class="{{.Status}}">{{.Status}}</td><td style="text-align:left">{{.Note}}</td></tr>
{{end}}</table>{{else}}<h2>Oracle</h2><p>Not verified (run with --verify, or <code>loadtest verify --truth truth.json</code>).</p>{{end}}
<h2>Over time</h2>
{{with .Plots.rate}}<p><img alt="rate per second" src="{{.}}"></p>{{end}}
{{with .Plots.latency}}<p><img alt="latency percentiles per second" src="{{.}}"></p>{{end}}
{{with .Plots.lag}}<p><img alt="reader backlog over time" src="{{.}}"></p>{{else}}<p>No reader lag was sampled.</p>{{end}}
<h2>Answers</h2>
<table><tr><th>answer</th><th>count</th></tr>{{range $k := keys .R.Answers}}<tr><td>{{$k}}</td><td>{{index $.R.Answers $k}}</td></tr>{{end}}</table>
<h2>Definitions</h2>
<ul>
<li><b>offered</b>: what the constant-rate schedule asked for; <b>sent</b>: requests (or publishes) started; <b>ok</b>: 302s (or acks) received.</li>
<li><b>redirect latency</b>: from the request's start to its 302, per vegeta; the schedule is open, so slow answers do not lower the offered load. <b>publish-to-ack</b>: from the async publish to its ack.</li>
<li><b>click-to-counted</b>: for probe clicks (a link that gets nothing else), from the 302 (or ack) to the first time the reader's public view (the counter's stats API, the warehouse's clicks table) includes it.</li>
<li><b>lag</b>: a reader's events not yet processed (pending + unacknowledged); <b>catch-up time</b>: end of load to every event of the run processed by every reader (acknowledged past the run's last event on every partition; other traffic may still be waiting).</li>
</ul>
</body></html>
`))
