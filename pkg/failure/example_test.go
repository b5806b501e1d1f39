package failure_test

import (
	"errors"
	"fmt"
	"time"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/failure"
)

// A handler says "done", "try again" or "never"; Classify is how every
// runtime reads the answer.
func ExampleClassify() {
	answers := []error{
		nil,
		errors.New("redis: i/o timeout"),
		failure.RetryableAfter("rate_limited", 30*time.Second, errors.New("429 Too Many Requests")),
		failure.Permanent("not_found", errors.New("404 Not Found")),
		fmt.Errorf("decode job: %w", events.ErrMalformed),
	}
	for _, err := range answers {
		d := failure.Classify(err)
		fmt.Println(d.Kind, d.Reason, d.RetryAfter)
	}
	// Output:
	// done  0s
	// retry error 0s
	// retry rate_limited 30s
	// park not_found 0s
	// park malformed 0s
}
