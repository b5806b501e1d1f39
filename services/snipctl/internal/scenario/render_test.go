package scenario

import (
	"bytes"
	"math"
	"strings"
	"testing"
)

// A prediction of never (rush's catch-up with a reader no faster than the
// arrivals) is printed as "never", not as Go's "+Inf".
func TestPrintSaysNeverForAPredictionThatNeverComes(t *testing.T) {
	t.Parallel()
	r := &Result{Scenario: "rush", Speed: 1, Checks: []Check{
		{Name: "log: catch-up time", Unit: "s", Predicted: math.Inf(1), Measured: 41, Tolerance: "≥ measured -25% -1", OK: true},
	}, Pass: true}
	var out bytes.Buffer
	Print(&out, r)
	var row string
	for l := range strings.Lines(out.String()) {
		if strings.Contains(l, "log: catch-up time") {
			row = l
		}
	}
	if !strings.Contains(row, "never") || strings.Contains(row, "Inf") {
		t.Errorf("the row does not say never: %q\n%s", row, out.String())
	}
}
