package workqueue

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/failure"
)

var errCause = errors.New("cause")

func TestBackoffDelay(t *testing.T) {
	t.Parallel()
	b := Backoff{Base: time.Second, Max: 8 * time.Second, Jitter: 0.5, RetryAfterMax: time.Minute}
	tests := []struct {
		name       string
		attempt    uint64
		retryAfter time.Duration
		rnd        float64
		want       time.Duration
	}{
		{"first_try_waits_base", 1, 0, 0, time.Second},
		{"doubles", 2, 0, 0, 2 * time.Second},
		{"doubles_again", 3, 0, 0, 4 * time.Second},
		{"capped", 6, 0, 0, 8 * time.Second},
		{"capped_far_out_without_overflow", 200, 0, 0, 8 * time.Second},
		{"jitter_adds_up_to_half", 2, 0, 0.5, 2500 * time.Millisecond},
		{"retry_after_raises_the_delay", 1, 30 * time.Second, 0, 30 * time.Second},
		{"retry_after_below_backoff_changes_nothing", 3, time.Second, 0, 4 * time.Second},
		{"retry_after_is_capped", 1, time.Hour, 0, time.Minute},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := b.Delay(tc.attempt, tc.retryAfter, tc.rnd); got != tc.want {
				t.Fatalf("Delay(%d, %s, %v) = %s, want %s", tc.attempt, tc.retryAfter, tc.rnd, got, tc.want)
			}
		})
	}
}

func TestNakDelayCompensatesForTheServersBackOff(t *testing.T) {
	t.Parallel()
	withBackOff := consumerPolicy{maxDeliver: 5, ackWait: time.Second, backoff: []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second}}
	plain := consumerPolicy{maxDeliver: 5, ackWait: 30 * time.Second}
	tests := []struct {
		name      string
		p         consumerPolicy
		want      time.Duration
		delivered uint64
		nak       time.Duration
	}{
		{"first_delivery_no_offset", withBackOff, 1500 * time.Millisecond, 1, 1500 * time.Millisecond},
		{"second_delivery_offset_by_1s", withBackOff, 2 * time.Second, 2, time.Second},
		{"fourth_delivery_offset_by_7s", withBackOff, 9 * time.Second, 4, 2 * time.Second},
		{"fifth_delivery_uses_the_last_step", withBackOff, 9 * time.Second, 5, 2 * time.Second},
		{"want_below_offset_is_the_offset", withBackOff, 100 * time.Millisecond, 3, time.Millisecond},
		{"no_backoff_list", plain, 5 * time.Second, 3, 5 * time.Second},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := tc.p.nakDelay(tc.want, tc.delivered); got != tc.nak {
				t.Fatalf("nakDelay(%s, %d) = %s, want %s", tc.want, tc.delivered, got, tc.nak)
			}
		})
	}
}

func TestKeepAliveIsWellInsideTheDeadline(t *testing.T) {
	t.Parallel()
	p := consumerPolicy{ackWait: time.Second, backoff: []time.Duration{time.Second, 2 * time.Second, 4 * time.Second}}
	for delivered, want := range map[uint64]time.Duration{1: time.Second / 3, 2: 2 * time.Second / 3, 3: 4 * time.Second / 3, 9: 4 * time.Second / 3} {
		if got := p.keepAliveEvery(delivered); got != want {
			t.Errorf("keepAliveEvery(%d) = %s, want %s", delivered, got, want)
		}
	}
}

func TestDecide(t *testing.T) {
	t.Parallel()
	p := consumerPolicy{maxDeliver: 5, ackWait: time.Second}
	unlimited := consumerPolicy{maxDeliver: -1, ackWait: time.Second}
	b := Backoff{Base: time.Second, Max: time.Minute, RetryAfterMax: time.Minute}
	tests := []struct {
		name      string
		err       error
		aborted   bool
		delivered uint64
		p         consumerPolicy
		want      decision
	}{
		{"success_acks", nil, false, 1, p, decision{action: ack}},
		{"success_after_abort_still_acks", nil, true, 1, p, decision{action: ack}},
		{"aborted_is_handed_back", errors.New("context canceled"), true, 2, p, decision{action: requeue, reason: "shutdown"}},
		{"permanent_is_dead_at_once", failure.Permanent("not_found", errCause), false, 1, p, decision{action: dead, reason: "not_found"}},
		{"wrapped_permanent_is_dead", fmt.Errorf("process: %w", failure.Permanent("not_html", errCause)), false, 1, p, decision{action: dead, reason: "not_html"}},
		{"transient_is_retried_with_backoff", failure.Retryable("timeout", errCause), false, 2, p, decision{action: retry, reason: "timeout", delay: 2 * time.Second}},
		{"transient_honours_retry_after", failure.RetryableAfter("rate_limited", 20*time.Second, errCause), false, 1, p, decision{action: retry, reason: "rate_limited", delay: 20 * time.Second}},
		{"transient_on_last_try_is_dead_with_its_reason", failure.Retryable("http_5xx", errCause), false, 5, p, decision{action: dead, reason: "http_5xx"}},
		{"unclassified_is_transient", errors.New("boom"), false, 1, p, decision{action: retry, reason: ReasonUnclassified, delay: time.Second}},
		{"malformed_payload_is_dead_at_once", fmt.Errorf("decode job: %w", events.ErrMalformed), false, 1, p, decision{action: dead, reason: events.ReasonMalformed}},
		{"unlimited_deliveries_never_run_out", failure.Retryable("timeout", errCause), false, 50, unlimited, decision{action: retry, reason: "timeout", delay: time.Minute}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got := decide(tc.err, tc.aborted, tc.delivered, tc.p, b, 0)
			if d := cmp.Diff(tc.want, got, cmp.AllowUnexported(decision{})); d != "" {
				t.Fatalf("decide (-want +got):\n%s", d)
			}
		})
	}
}
