package preview

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/failure"
	"github.com/snipdev/snip/services/preview/internal/fetch"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	type verdict struct {
		Reason     string
		Permanent  bool
		RetryAfter time.Duration
	}
	tests := []struct {
		name string
		err  *failure.Error
		want verdict
	}{
		{"malformed_job", classifyDecode(fmt.Errorf("decode: %w", events.ErrMalformed)), verdict{ReasonMalformed, true, 0}},
		{"future_job_version", classifyDecode(fmt.Errorf("decode: %w", events.ErrUnknownVersion)), verdict{ReasonUnknownVersion, true, 0}},
		{"404", classifyFetch(&fetch.StatusError{Code: 404}), verdict{ReasonNotFound, true, 0}},
		{"410", classifyFetch(&fetch.StatusError{Code: 410}), verdict{ReasonGone, true, 0}},
		{"403", classifyFetch(&fetch.StatusError{Code: 403}), verdict{ReasonHTTP4xx, true, 0}},
		{"408_is_transient", classifyFetch(&fetch.StatusError{Code: 408}), verdict{ReasonHTTP4xx, false, 0}},
		{"429_with_retry_after", classifyFetch(fmt.Errorf("get: %w", &fetch.StatusError{Code: 429, RetryAfter: time.Minute})), verdict{ReasonRateLimited, false, time.Minute}},
		{"503_with_retry_after", classifyFetch(&fetch.StatusError{Code: 503, RetryAfter: 5 * time.Second}), verdict{ReasonHTTP5xx, false, 5 * time.Second}},
		{"500", classifyFetch(&fetch.StatusError{Code: 500}), verdict{ReasonHTTP5xx, false, 0}},
		{"304_without_location", classifyFetch(&fetch.StatusError{Code: 304}), verdict{ReasonHTTP4xx, true, 0}},
		{"refused", classifyFetch(fmt.Errorf("dial: %w", fetch.ErrRefused)), verdict{ReasonRefusedAddress, true, 0}},
		{"bad_url", classifyFetch(fetch.ErrBadURL), verdict{ReasonBadTarget, true, 0}},
		{"no_such_host", classifyFetch(fetch.ErrNoSuchHost), verdict{ReasonNoSuchHost, true, 0}},
		{"redirect_loop", classifyFetch(fetch.ErrTooManyRedirects), verdict{ReasonTooManyRedirects, true, 0}},
		{"not_html", classifyFetch(fetch.ErrNotHTML), verdict{ReasonNotHTML, true, 0}},
		{"tls", classifyFetch(fetch.ErrTLS), verdict{ReasonTLS, true, 0}},
		{"timeout", classifyFetch(fetch.ErrTimeout), verdict{ReasonTimeout, false, 0}},
		{"transport", classifyFetch(fetch.ErrTransport), verdict{ReasonUnreachable, false, 0}},
		{"anything_else_is_transient", classifyFetch(errors.New("???")), verdict{ReasonUnreachable, false, 0}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := verdict{tc.err.Reason(), tc.err.Permanent(), tc.err.RetryAfter()}
			if d := cmp.Diff(tc.want, got); d != "" {
				t.Fatalf("(-want +got):\n%s", d)
			}
			if !events.ValidToken(got.Reason) {
				t.Fatalf("reason %q is not a subject token", got.Reason)
			}
		})
	}
}
