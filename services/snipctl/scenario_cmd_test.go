package main

import (
	"encoding/json"
	"errors"
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
