package main

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/snipdev/snip/services/snipctl/internal/scenario"
)

func TestScenarioListNamesEveryLesson(t *testing.T) {
	t.Parallel()
	out, err := snipctl(t, nil, "scenario", "list")
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range scenario.All() {
		if !strings.Contains(out, s.Name) {
			t.Errorf("list does not name %s:\n%s", s.Name, out)
		}
	}
	if got := len(scenario.All()); got != 10 {
		t.Errorf("%d scenarios, want the ten lessons", got)
	}
}

func TestScenarioUsageErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
	}{
		{"no_verb", []string{"scenario"}},
		{"unknown_verb", []string{"scenario", "walk"}},
		{"unknown_name", []string{"scenario", "run", "nope"}},
		{"no_name", []string{"scenario", "run"}},
		{"speed_too_high", []string{"scenario", "run", "kitchen", "--speed", "1000"}},
		{"speed_not_a_number", []string{"scenario", "run", "kitchen", "--speed", "fast"}},
		{"two_names", []string{"scenario", "run", "kitchen", "rush"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if _, err := snipctl(t, nil, tc.args...); !errors.Is(err, errUsage) {
				t.Errorf("snipctl %v: err %v, want a usage error", tc.args, err)
			}
		})
	}
}

// TestScenarioRunJSON runs the quickest lesson through the command and reads
// its JSON result back.
func TestScenarioRunJSON(t *testing.T) {
	t.Parallel()
	out, err := snipctl(t, nil, "scenario", "run", "outbox", "--json")
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	var res scenario.Result
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("decode %q: %v", out, err)
	}
	if res.Scenario != "outbox" || !res.Pass || len(res.Checks) == 0 {
		t.Errorf("result %+v, want a passing outbox run with checks", res)
	}
}

// verdictEnv makes the test binary a snipctl whose scenario run ends with
// the verdict named (pass, fail or inconclusive): TestMain calls
// mainWithVerdict, which runs main as the command line would.
const verdictEnv = "SNIPCTL_TEST_SCENARIO_VERDICT"

func mainWithVerdict(verdict string) {
	runScenario = func(_ context.Context, s scenario.Scenario, o scenario.Options) (*scenario.Result, error) {
		res := &scenario.Result{Scenario: s.Name, Claim: s.Claim, Speed: o.Speed, Pass: true, Wall: "1s",
			Checks: []scenario.Check{{Name: "rows that hold at any speed", Tolerance: "exact", OK: true}}}
		switch verdict {
		case "fail":
			res.Pass = false
			res.Checks[0].OK = false
		case "inconclusive":
			res.Inconclusive = "the machine was too busy for the lesson's premise (offered load)"
			res.Checks = append(res.Checks,
				scenario.Check{Name: "offered load", Tolerance: "≥ 90%", Premise: true},
				scenario.Check{Name: "rate that needs the load", Tolerance: "±10%", NeedsPremise: true, Unjudged: true})
		}
		return res, nil
	}
	os.Args = []string{"snipctl", "scenario", "run", "hot-partition"}
	main()
	os.Exit(0)
}

// A script that runs a scenario reads its verdict from the exit status
// alone: 0 PASS, 1 FAIL, and 3 INCONCLUSIVE, which is not a pass although
// every row judged matched the lesson, nor a usage error (2).
func TestScenarioRunExitStatus(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		verdict string
		status  int
		says    string
	}{
		{"pass", 0, "PASS"},
		{"fail", 1, "FAIL"},
		{"inconclusive", 3, "INCONCLUSIVE"},
	} {
		t.Run(tc.verdict, func(t *testing.T) {
			t.Parallel()
			cmd := exec.CommandContext(t.Context(), os.Args[0], "-test.run=^$")
			cmd.Env = append(os.Environ(), verdictEnv+"="+tc.verdict)
			out, err := cmd.CombinedOutput()
			status := 0
			var exit *exec.ExitError
			if errors.As(err, &exit) {
				status = exit.ExitCode()
			} else if err != nil {
				t.Fatal(err)
			}
			if status != tc.status || !strings.Contains(string(out), tc.says) {
				t.Errorf("scenario run with verdict %s: exit status %d, want %d, and output saying %s:\n%s",
					tc.verdict, status, tc.status, tc.says, out)
			}
		})
	}
}

// A result with a value JSON has no number for (backpressure's alarm that
// never fired is NaN; so is the lead between two alarms when one did not
// fire) is printed by --json with null there, and the run exits with its
// verdict. Before, the encoder refused it: a failed run, the one whose
// numbers are wanted, printed nothing but "json: unsupported value: NaN".
// Not parallel: it puts a result of its own in runScenario's place.
func TestScenarioRunJSONWithAValueThatIsNotANumber(t *testing.T) {
	real := runScenario
	t.Cleanup(func() { runScenario = real })
	runScenario = func(_ context.Context, s scenario.Scenario, o scenario.Options) (*scenario.Result, error) {
		return &scenario.Result{Scenario: s.Name, Claim: s.Claim, Speed: o.Speed, Wall: "1s",
			Checks: []scenario.Check{
				{Name: "age alarm fires", Unit: "s", Predicted: 25, Measured: math.NaN(), Tolerance: "≤"},
				{Name: "lead", Unit: "s", Predicted: math.Inf(1), Measured: 3, Tolerance: "≥", OK: true},
			},
			Series: []scenario.Series{{Name: "age", Unit: "s", Step: 1, Values: []float64{1, math.NaN(), 3}}},
		}, nil
	}
	out, err := snipctl(t, nil, "scenario", "run", "backpressure", "--json")
	if !errors.Is(err, errScenarioFailed) {
		t.Errorf("scenario run --json of a failed result: err = %v, want errScenarioFailed\n%s", err, out)
	}
	var res struct {
		Checks []struct {
			Name      string   `json:"name"`
			Predicted *float64 `json:"predicted"`
			Measured  *float64 `json:"measured"`
		} `json:"checks"`
		Series []struct {
			Values []*float64 `json:"values"`
		} `json:"series"`
	}
	if err := json.Unmarshal([]byte(out), &res); err != nil {
		t.Fatalf("decode %q: %v", out, err)
	}
	if len(res.Checks) != 2 || res.Checks[0].Measured != nil || res.Checks[0].Predicted == nil || *res.Checks[0].Predicted != 25 ||
		res.Checks[1].Predicted != nil || res.Checks[1].Measured == nil || *res.Checks[1].Measured != 3 {
		t.Errorf("checks = %s, want NaN and +Inf as null, the numbers as they are", out)
	}
	if len(res.Series) != 1 || len(res.Series[0].Values) != 3 || res.Series[0].Values[1] != nil || res.Series[0].Values[2] == nil {
		t.Errorf("series = %s, want the NaN sample as null", out)
	}
}
