package failure_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/failure"
)

func TestClassify(t *testing.T) {
	t.Parallel()
	cause := errors.New("boom")
	_, decodeErr := events.DecodeClick([]byte("{not json"))
	_, versionErr := events.DecodeClick([]byte(`{"v":99}`))
	tests := []struct {
		name string
		err  error
		want failure.Decision
	}{
		{"nil_is_done", nil, failure.Decision{Kind: failure.Done}},
		{"plain_error_is_retried", cause, failure.Decision{Kind: failure.Retry, Reason: failure.ReasonUnclassified}},
		{"context_deadline_is_retried", context.DeadlineExceeded, failure.Decision{Kind: failure.Retry, Reason: failure.ReasonUnclassified}},
		{"permanent_is_parked", failure.Permanent("bad_target", cause), failure.Decision{Kind: failure.Park, Reason: "bad_target"}},
		{"wrapped_permanent_is_parked", fmt.Errorf("handle job: %w", failure.Permanent("not_found", cause)), failure.Decision{Kind: failure.Park, Reason: "not_found"}},
		{"retryable_keeps_its_reason", failure.Retryable("timeout", cause), failure.Decision{Kind: failure.Retry, Reason: "timeout"}},
		{"retry_after_is_kept", failure.RetryableAfter("rate_limited", 3*time.Second, cause), failure.Decision{Kind: failure.Retry, Reason: "rate_limited", RetryAfter: 3 * time.Second}},
		{"malformed_event_is_parked", decodeErr, failure.Decision{Kind: failure.Park, Reason: events.ReasonMalformed}},
		{"unknown_version_is_parked", versionErr, failure.Decision{Kind: failure.Park, Reason: events.ReasonUnknownVersion}},
		{"invalid_event_is_parked_under_its_reason", &events.InvalidError{Reason: events.ReasonWrongPartition, Err: events.ErrInvalid}, failure.Decision{Kind: failure.Park, Reason: events.ReasonWrongPartition}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if diff := cmp.Diff(tc.want, failure.Classify(tc.err)); diff != "" {
				t.Errorf("Classify (-want +got):\n%s", diff)
			}
			if got, want := failure.IsPermanent(tc.err), tc.want.Kind == failure.Park; got != want {
				t.Errorf("IsPermanent = %v, want %v", got, want)
			}
		})
	}
}

func TestErrorKeepsItsCause(t *testing.T) {
	t.Parallel()
	cause := errors.New("connection refused")
	err := fmt.Errorf("fetch: %w", failure.Retryable("unreachable", cause))
	if !errors.Is(err, cause) {
		t.Errorf("errors.Is(%v, cause) = false", err)
	}
	if got, want := err.Error(), "fetch: unreachable: connection refused"; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}
