package scenario

import (
	"fmt"
	"io"
	"math"
	"strings"
	"text/tabwriter"
)

// Print writes the result for a terminal: the claim, the predicted-vs-measured
// table (a premise the machine did not meet is marked BUSY, a row not judged
// for it --), one sparkline per series, notes, and the verdict.
func Print(w io.Writer, r *Result) {
	fmt.Fprintf(w, "\n%s (speed %g): %s\n\n", r.Scenario, r.Speed, r.Claim)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "  \tcheck\tpredicted\tmeasured\ttolerance\tunit")
	for _, c := range r.Checks {
		mark := "ok"
		switch {
		case c.Unjudged:
			mark = "--"
		case c.Premise && !c.OK:
			mark = "BUSY"
		case !c.OK:
			mark = "FAIL"
		}
		fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\n", mark, c.Name, predicted(c.Predicted), num(c.Measured), c.Tolerance, c.Unit)
	}
	tw.Flush()
	if len(r.Series) > 0 {
		fmt.Fprintln(w)
		width := 0
		for _, s := range r.Series {
			width = max(width, len(s.Name))
		}
		for _, s := range r.Series {
			lo, hi := bounds(s.Values)
			fmt.Fprintf(w, "  %-*s %s  %s..%s %s over %s s\n", width, s.Name, Sparkline(s.Values, 60),
				num(lo), num(hi), s.Unit, num(s.Step*float64(len(s.Values))))
		}
	}
	if len(r.Notes) > 0 {
		fmt.Fprintln(w)
		for _, n := range r.Notes {
			fmt.Fprintf(w, "  note: %s\n", n)
		}
	}
	verdict := "PASS: the measurements match the lesson"
	switch {
	case !r.Pass:
		verdict = "FAIL: a measurement is outside its tolerance"
	case r.Inconclusive != "":
		verdict = "INCONCLUSIVE: " + r.Inconclusive + "; the rows marked -- were not judged, the others match the lesson"
	}
	fmt.Fprintf(w, "\n%s (real time %s)\n", verdict, r.Wall)
}

var bars = []rune("▁▂▃▄▅▆▇█")

// Sparkline draws values as one line of at most width block characters,
// scaled from 0 (or the minimum, if negative) to the maximum. Longer series
// are averaged into width buckets.
func Sparkline(values []float64, width int) string {
	if len(values) == 0 || width <= 0 {
		return ""
	}
	if len(values) > width {
		b := make([]float64, width)
		for i := range b {
			from, to := i*len(values)/width, (i+1)*len(values)/width
			sum := 0.0
			for _, v := range values[from:to] {
				sum += v
			}
			b[i] = sum / float64(to-from)
		}
		values = b
	}
	lo, hi := bounds(values)
	lo = min(lo, 0)
	var sb strings.Builder
	for _, v := range values {
		i := 0
		if hi > lo {
			i = int(math.Round((v - lo) / (hi - lo) * float64(len(bars)-1)))
		}
		sb.WriteRune(bars[i])
	}
	return sb.String()
}

func bounds(v []float64) (lo, hi float64) {
	if len(v) == 0 {
		return 0, 0
	}
	lo, hi = v[0], v[0]
	for _, x := range v {
		lo, hi = min(lo, x), max(hi, x)
	}
	return lo, hi
}

// predicted formats a prediction for the table: +Inf is a time that never
// comes (rush's catch-up with a reader no faster than the arrivals), said as
// "never"; the JSON has null.
func predicted(v float64) string {
	if math.IsInf(v, 1) {
		return "never"
	}
	return num(v)
}

// num formats a number for the table: integers plainly, others to three
// significant digits.
func num(v float64) string {
	switch {
	case math.IsNaN(v) || math.IsInf(v, 0):
		return fmt.Sprint(v)
	case v == math.Trunc(v) && math.Abs(v) < 1e12:
		return fmt.Sprintf("%d", int64(v))
	case math.Abs(v) >= 100:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 10:
		return fmt.Sprintf("%.1f", v)
	default:
		return fmt.Sprintf("%.2f", v)
	}
}
