// Package inprogress keeps JetStream messages that are still being worked on
// from being redelivered: it tells the server, every interval, that they are
// in progress, which restarts their AckWait. The log readers (package
// reader) keep a batch so while its handler runs, waits to retry or parks
// an event; the work queue (package workqueue) keeps a job so while its
// handler runs or its park waits for DEAD_LETTER; the click counter's LINKS
// and verdict feeds keep a fetched batch so until it is settled. AckWait then bounds only
// how long a process that died or froze holds its messages.
package inprogress

import (
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Keep marks msgs in progress every interval, the first time one interval
// from now, until the returned stop is called. stop returns once no more
// marks will be sent; calling it again does nothing. A mark that fails is
// not retried before the next interval: callers pick an interval of a third
// of AckWait or less, so one lost mark costs no redelivery. every must be
// positive.
func Keep(every time.Duration, msgs ...jetstream.Msg) (stop func()) {
	done, exited := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(exited)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				for _, msg := range msgs {
					_ = msg.InProgress()
				}
			}
		}
	}()
	return sync.OnceFunc(func() {
		close(done)
		<-exited
	})
}
