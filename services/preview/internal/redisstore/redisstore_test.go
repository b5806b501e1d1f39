package redisstore_test

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/services/preview/internal/preview"
	"github.com/snipdev/snip/services/preview/internal/redisstore"
	"github.com/snipdev/snip/services/preview/internal/unfurl"
)

var servers *testenv.Servers

func TestMain(m *testing.M) {
	os.Exit(testenv.Main(m, &servers, testenv.WithRedis(), testenv.WithRedisCluster()))
}

// TestOnRedisCluster runs the store's tests on a Redis Cluster.
func TestOnRedisCluster(t *testing.T) {
	servers.RunOnRedisCluster(t,
		TestStore,
	)
}

var at = time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)

func rec(job, title string) preview.Record {
	return preview.Record{JobID: job, Preview: unfurl.Preview{Title: title, Image: "https://example.com/i.png"}, URL: "https://example.com/", FetchedAt: at}
}

// step is one call on the store; want is its result.
type step struct {
	op    string // save (false: superseded), save_again (true: this job's preview was there), fail, done, stored
	job   string
	title string
	want  bool
}

func TestStore(t *testing.T) {
	testenv.Parallel(t)
	older, newer := events.NewID(), events.NewID()
	// IDs whose upper case compares wrongly as strings: "0193BBBB" sorts
	// before "0193aaaa" although it is the newer.
	lowOlder, lowNewer := "0193aaaa-0000-7000-8000-000000000000", "0193bbbb-0000-7000-8000-000000000000"
	upOlder, upNewer := strings.ToUpper(lowOlder), strings.ToUpper(lowNewer)
	okHash := func(job, title string) map[string]string {
		return map[string]string{"job_id": job, "status": "ok", "title": title, "description": "", "image": "https://example.com/i.png",
			"site_name": "", "url": "https://example.com/", "fetched_at": "2026-11-30T12:00:00Z"}
	}
	failedHash := func(job string) map[string]string {
		return map[string]string{"job_id": job, "status": "failed", "reason": "not_found", "error": "404", "failed_at": "2026-11-30T12:00:00Z"}
	}
	tests := []struct {
		name  string
		steps []step
		want  map[string]string
	}{
		{"save_then_the_job_is_done", []step{{"done", older, "", false}, {"save", older, "A", true}, {"done", older, "", true}}, okHash(older, "A")},
		{"redelivered_job_does_not_write_again", []step{{"save", older, "A", true}, {"save_again", older, "B", true}}, okHash(older, "A")},
		{"newer_job_replaces_older", []step{{"save", older, "A", true}, {"done", newer, "", false}, {"save", newer, "B", true}}, okHash(newer, "B")},
		{"older_job_is_superseded_by_newer", []step{{"save", newer, "B", true}, {"done", older, "", true}, {"save", older, "A", false}}, okHash(newer, "B")},
		{"failure_marker_then_redrive_succeeds", []step{{"fail", older, "", true}, {"done", older, "", false}, {"save", older, "A", true}}, okHash(older, "A")},
		{"failure_marker", []step{{"fail", older, "", true}}, failedHash(older)},
		{"failure_of_newer_job_keeps_the_older_preview", []step{{"save", older, "A", true}, {"fail", newer, "", false}}, okHash(older, "A")},
		{"newer_failure_replaces_older_failure", []step{{"fail", older, "", true}, {"fail", newer, "", true}}, failedHash(newer)},
		{"newer_job_in_upper_case_replaces_older", []step{{"save", lowOlder, "A", true}, {"done", upNewer, "", false}, {"save", upNewer, "B", true}}, okHash(lowNewer, "B")},
		{"newer_failure_in_upper_case_replaces_older_failure", []step{{"fail", lowOlder, "", true}, {"fail", upNewer, "", true}}, failedHash(lowNewer)},
		{"redelivered_job_in_another_case_does_not_write_again", []step{{"save", lowOlder, "A", true}, {"done", upOlder, "", true}, {"save_again", upOlder, "B", true}}, okHash(lowOlder, "A")},
		{"older_job_is_superseded_by_newer_stored_in_upper_case", []step{{"stored", upNewer, "B", true}, {"done", lowOlder, "", true}, {"save", lowOlder, "A", false}}, okHash(upNewer, "B")},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			testenv.Parallel(t)
			rdb := servers.RedisClient(t)
			s := redisstore.New(rdb)
			for i, st := range tc.steps {
				var got bool
				var err error
				switch st.op {
				case "save":
					var res preview.SaveResult
					res, err = s.Save(t.Context(), "abc", rec(st.job, st.title))
					got = res == preview.Stored
					if err == nil && !got && res != preview.Superseded {
						t.Fatalf("step %d save(%s) = %v, want superseded (%v)", i, st.job, res, preview.Superseded)
					}
				case "save_again":
					var res preview.SaveResult
					res, err = s.Save(t.Context(), "abc", rec(st.job, st.title))
					got = res == preview.AlreadyStored
				case "done":
					got, err = s.Done(t.Context(), "abc", st.job)
				case "fail":
					err = s.MarkFailed(t.Context(), "abc", st.job, "not_found", "404", at)
					got = err == nil && strings.EqualFold(rdb.HGet(t.Context(), redisstore.Key("abc"), "job_id").Val(), st.job)
				case "stored": // a hash as a writer that kept the job's case left it
					err = rdb.HSet(t.Context(), redisstore.Key("abc"), okHash(st.job, st.title)).Err()
					got = err == nil
				}
				if err != nil {
					t.Fatalf("step %d %s: %v", i, st.op, err)
				}
				if got != st.want {
					t.Fatalf("step %d %s(%s) = %v, want %v", i, st.op, st.job, got, st.want)
				}
			}
			h, err := rdb.HGetAll(t.Context(), redisstore.Key("abc")).Result()
			if err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, h); d != "" {
				t.Fatalf("hash (-want +got):\n%s", d)
			}
		})
	}
}
