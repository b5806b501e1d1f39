package events_test

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/snipdev/snip/pkg/events"
)

// A click is published on clicks.<owner>.<code>; CLICKS stores it with the
// partition of its link code in front, so every click of one link is in one
// partition, in order.
func ExamplePartitionedClickSubject() {
	fmt.Println(events.ClickSubject("acme", "abc123"))
	fmt.Println(events.PartitionedClickSubject(8, "acme", "abc123"))
	fmt.Println(events.PartitionFilter(events.Partition("abc123", 8)))
	// Output:
	// clicks.acme.abc123
	// 5.clicks.acme.abc123
	// 5.clicks.>
}

// ReadClick is the one rule of validity: every reader, and the outbox relay
// before publishing, applies it, and an event that fails it is parked by all
// of them under the same reason.
func ExampleReadClick() {
	stored := time.Now().UTC()
	click := events.Click{
		V: events.ClickVersion, ID: events.NewID(), Time: stored,
		Code: "abc123", Owner: "acme", Target: "https://example.com/", Visitor: "v1",
	}
	data, _ := json.Marshal(click)

	c, err := events.ReadClick(data, events.PartitionedClickSubject(8, "acme", "abc123"), 8, stored)
	fmt.Println(c.Code, err)

	// The same payload published under another owner's subject.
	_, err = events.ReadClick(data, events.PartitionedClickSubject(8, "mallory", "abc123"), 8, stored)
	fmt.Println(events.Reason(err))

	_, err = events.ReadClick([]byte(`{"v":1,"id":`), events.PartitionedClickSubject(8, "acme", "abc123"), 8, stored)
	fmt.Println(events.Reason(err))
	// Output:
	// abc123 <nil>
	// subject_mismatch
	// malformed
}

// Dead letters go to dead.<source>.<reason>: who gave up, and why.
func ExampleDeadLetterSubject() {
	fmt.Println(events.DeadLetterSubject("preview", "not_found"))
	fmt.Println(events.DeadLetterSubject("click-counter", events.ReasonUnknownVersion))
	// Output:
	// dead.preview.not_found
	// dead.click-counter.unknown_version
}
