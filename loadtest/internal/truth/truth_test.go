package truth_test

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/snipdev/snip/loadtest/internal/truth"
	"github.com/snipdev/snip/loadtest/internal/workload"
)

const tag = workload.Tag(0x123456789)

func spec() workload.Spec {
	return workload.Spec{Seed: 7, Links: 5, ZipfS: 1, BotShare: 0.2, BurstShare: 0.2, BurstSize: 5, Visitors: 1000, CountryShare: 0.5}
}

// good is a valid truth of 10 attempts: 2 refused, 7 and 8 uncertain.
func good() truth.Truth {
	return truth.Truth{
		Version: truth.Version, Mode: truth.ModeEvents, Tag: tag.String(), Owner: "demo", Spec: spec(),
		Started: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC), Ended: time.Date(2026, 3, 1, 12, 0, 2, 0, time.UTC),
		Attempts: 10, Refused: []uint64{2}, Uncertain: []uint64{7, 8},
	}
}

func TestTruthRoundTrip(t *testing.T) {
	t.Parallel()
	rec := truth.NewRecorder(10)
	for seq := range uint64(10) {
		switch seq {
		case 2:
			rec.Record(seq, truth.Refused, "503")
		case 7:
			rec.Record(seq, truth.Uncertain, "timeout")
		case 8:
			// never answered: no record
		default:
			rec.Record(seq, truth.Sent, "302")
		}
	}
	refused, uncertain, answers := rec.Finish(10)
	tr := &truth.Truth{Version: truth.Version, Mode: truth.ModeHTTP, Tag: tag.String(), Owner: "demo", Spec: spec(),
		Started: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC), Ended: time.Date(2026, 3, 1, 12, 0, 2, 0, time.UTC),
		ForwardedFor: true, Attempts: 10, Refused: refused, Uncertain: uncertain, Answers: answers}
	path := filepath.Join(t.TempDir(), "truth.json")
	if err := tr.Save(path); err != nil {
		t.Fatal(err)
	}
	got, err := truth.Load(path)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(tr, got); diff != "" {
		t.Errorf("truth changed on the way through a file (-saved +loaded):\n%s", diff)
	}
	wantOutcomes := map[uint64]truth.Outcome{0: truth.Sent, 2: truth.Refused, 7: truth.Uncertain, 8: truth.Uncertain, 9: truth.Sent, 10: truth.NotSent}
	for seq, want := range wantOutcomes {
		if o := got.Outcome(seq); o != want {
			t.Errorf("outcome of %d = %s, want %s", seq, o, want)
		}
	}
	if got.SentCount() != 7 {
		t.Errorf("sent count %d, want 7", got.SentCount())
	}
	if diff := cmp.Diff(map[string]uint64{"302": 7, "503": 1, "timeout": 1}, got.Answers); diff != "" {
		t.Errorf("answers (-want +got):\n%s", diff)
	}
	if rt, err := got.RunTag(); err != nil || rt != tag {
		t.Errorf("run tag %v, %v; want %v", rt, err, tag)
	}
}

func TestTruthLoadRejectsBadFiles(t *testing.T) {
	t.Parallel()
	saved := func(change func(*truth.Truth)) func(t *testing.T, path string) {
		return func(t *testing.T, path string) {
			tr := good()
			change(&tr)
			if err := tr.Save(path); err != nil {
				t.Fatal(err)
			}
		}
	}
	written := func(cut func([]byte) []byte) func(t *testing.T, path string) {
		return func(t *testing.T, path string) {
			tr := good()
			if err := tr.Save(path); err != nil {
				t.Fatal(err)
			}
			b, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(path, cut(b), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	tests := []struct {
		name  string
		write func(t *testing.T, path string)
		// want is a phrase the error must hold besides the path.
		want string
	}{
		{name: "future_version", write: saved(func(t *truth.Truth) { t.Version = 99 }), want: "version 99"},
		{name: "unknown_mode", write: saved(func(t *truth.Truth) { t.Mode = "carrier-pigeon" }), want: `mode "carrier-pigeon"`},
		{name: "bad_tag", write: saved(func(t *truth.Truth) { t.Tag = "??" }), want: `tag "??"`},
		{name: "no_owner", write: saved(func(t *truth.Truth) { t.Owner = "" }), want: "no owner"},
		{name: "unsorted_exceptions", write: saved(func(t *truth.Truth) { t.Uncertain = []uint64{8, 7} }), want: "not sorted"},
		{name: "bad_spec", write: saved(func(t *truth.Truth) { t.Spec.Links = 0 }), want: "links 0"},
		// An exception listed twice, beyond the attempts or in both
		// lists would make SentCount too small: the oracle would wait
		// for a click that is not coming and report a missing count
		// wrapped around below zero.
		{name: "exception_listed_twice", write: saved(func(t *truth.Truth) { t.Uncertain = []uint64{7, 7, 8} }), want: "listed twice"},
		{name: "exception_beyond_the_attempts", write: saved(func(t *truth.Truth) { t.Refused = []uint64{2, 10} }), want: "beyond the 10 attempts"},
		{name: "exception_in_both_lists", write: saved(func(t *truth.Truth) { t.Refused = []uint64{2, 7} }), want: "both refused and uncertain"},
		{name: "truncated", write: written(func(b []byte) []byte { return b[:len(b)/2] }), want: "unexpected end of JSON input"},
		{name: "empty", write: written(func([]byte) []byte { return nil }), want: "unexpected end of JSON input"},
		{name: "not_json", write: written(func([]byte) []byte { return []byte("run abc: 10 attempts\n") }), want: "invalid character"},
		{name: "wrong_type", write: written(func(b []byte) []byte {
			return []byte(strings.Replace(string(b), `"attempts": 10`, `"attempts": "ten"`, 1))
		}), want: "attempts"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), tc.name+".json")
			tc.write(t, path)
			tr, err := truth.Load(path)
			if err == nil {
				t.Fatalf("Load accepted a truth with %s: %+v", tc.name, tr)
			}
			if !errors.Is(err, truth.ErrBadTruth) {
				t.Errorf("error %q does not wrap ErrBadTruth", err)
			}
			if msg := err.Error(); !strings.Contains(msg, path) || !strings.Contains(msg, tc.want) {
				t.Errorf("error %q: want it to name %s and say %q", msg, path, tc.want)
			}
		})
	}
	t.Run("missing_file", func(t *testing.T) {
		t.Parallel()
		_, err := truth.Load(filepath.Join(t.TempDir(), "none.json"))
		if !errors.Is(err, fs.ErrNotExist) || errors.Is(err, truth.ErrBadTruth) {
			t.Errorf("error %v: want a missing file, not a bad one", err)
		}
	})
}

func TestOutcomeOfEachClick(t *testing.T) {
	t.Parallel()
	tr := good()
	if err := tr.Validate(); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name string
		seq  uint64
		want truth.Outcome
		str  string
	}{
		{name: "first_is_sent", seq: 0, want: truth.Sent, str: "sent"},
		{name: "listed_refused", seq: 2, want: truth.Refused, str: "refused"},
		{name: "listed_uncertain", seq: 7, want: truth.Uncertain, str: "uncertain"},
		{name: "last_uncertain", seq: 8, want: truth.Uncertain, str: "uncertain"},
		{name: "last_attempt_is_sent", seq: 9, want: truth.Sent, str: "sent"},
		{name: "beyond_the_attempts_not_sent", seq: 10, want: truth.NotSent, str: "not sent"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := tr.Outcome(tc.seq)
			if got != tc.want || got.String() != tc.str {
				t.Errorf("outcome of %d = %v (%q), want %v (%q)", tc.seq, got, got.String(), tc.want, tc.str)
			}
		})
	}
	if got := tr.SentCount(); got != 7 {
		t.Errorf("sent count %d, want 7 (10 attempts, 1 refused, 2 uncertain)", got)
	}
}

func TestRecorderKeepsTheLastOutcomeOfEachClick(t *testing.T) {
	t.Parallel()
	type record struct {
		seq    uint64
		o      truth.Outcome
		answer string
	}
	tests := []struct {
		name               string
		records            []record
		attempts           uint64
		refused, uncertain []uint64
		answers            map[string]uint64
	}{
		{
			name:     "a_retried_publish_that_succeeds_is_sent",
			records:  []record{{0, truth.Sent, "ack"}, {1, truth.Uncertain, "no ack"}, {1, truth.Sent, "ack"}},
			attempts: 2,
			answers:  map[string]uint64{"ack": 2, "no ack": 1},
		},
		{
			name:      "a_click_without_a_record_is_uncertain",
			records:   []record{{0, truth.Sent, "302"}, {2, truth.Sent, "302"}},
			attempts:  4,
			uncertain: []uint64{1, 3},
			answers:   map[string]uint64{"302": 2},
		},
		{
			name:      "refused_and_uncertain_are_listed_sorted",
			records:   []record{{4, truth.Refused, "404"}, {1, truth.Uncertain, "timeout"}, {3, truth.Refused, "503"}, {0, truth.Sent, "302"}, {2, truth.Sent, "302"}},
			attempts:  5,
			refused:   []uint64{3, 4},
			uncertain: []uint64{1},
			answers:   map[string]uint64{"302": 2, "404": 1, "503": 1, "timeout": 1},
		},
		{
			name:     "records_beyond_the_attempts_are_not_clicks",
			records:  []record{{0, truth.Sent, "ack"}, {5, truth.Refused, "503"}},
			attempts: 1,
			answers:  map[string]uint64{"ack": 1, "503": 1},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			rec := truth.NewRecorder(1)
			for _, r := range tc.records {
				rec.Record(r.seq, r.o, r.answer)
			}
			refused, uncertain, answers := rec.Finish(tc.attempts)
			if diff := cmp.Diff(tc.refused, refused); diff != "" {
				t.Errorf("refused (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.uncertain, uncertain); diff != "" {
				t.Errorf("uncertain (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tc.answers, answers); diff != "" {
				t.Errorf("answers (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRecorderUnderConcurrentDrivers(t *testing.T) {
	t.Parallel()
	const workers, each = 8, 2000
	rec := truth.NewRecorder(16) // it grows as the sequences arrive
	var wg sync.WaitGroup
	for w := range uint64(workers) {
		wg.Go(func() {
			// Worker w answers the sequences w, w+workers, ... from the
			// last down, so the recorder grows under the others.
			for i := each - 1; i >= 0; i-- {
				seq := uint64(i)*workers + w
				switch {
				case seq%97 == 0:
					rec.Record(seq, truth.Refused, "503")
				case seq%89 == 0:
					rec.Record(seq, truth.Uncertain, "timeout")
				default:
					rec.Record(seq, truth.Sent, "302")
				}
			}
		})
	}
	wg.Wait()
	refused, uncertain, answers := rec.Finish(workers * each)
	var wantRefused, wantUncertain []uint64
	for seq := range uint64(workers * each) {
		switch {
		case seq%97 == 0:
			wantRefused = append(wantRefused, seq)
		case seq%89 == 0:
			wantUncertain = append(wantUncertain, seq)
		}
	}
	if diff := cmp.Diff(wantRefused, refused); diff != "" {
		t.Errorf("refused (-want +got):\n%s", diff)
	}
	if diff := cmp.Diff(wantUncertain, uncertain); diff != "" {
		t.Errorf("uncertain (-want +got):\n%s", diff)
	}
	want := map[string]uint64{"503": uint64(len(wantRefused)), "timeout": uint64(len(wantUncertain))}
	want["302"] = workers*each - want["503"] - want["timeout"]
	if diff := cmp.Diff(want, answers); diff != "" {
		t.Errorf("answers (-want +got):\n%s", diff)
	}
}
