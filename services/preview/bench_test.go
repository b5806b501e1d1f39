package main

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/testenv"
)

// BenchmarkQueueScaling measures jobs/s through 1, 2 and 4 preview
// instances (one job at a time each) against a page server that takes 50ms
// per page: the queue should drain about twice as fast with twice the
// workers. b.N jobs per run; use -benchtime=200x (docs/benchmarks.md).
// It fails unless every job stored its page's preview.
func BenchmarkQueueScaling(b *testing.B) {
	for _, workers := range []int{1, 2, 4} {
		b.Run("workers="+strconv.Itoa(workers), func(b *testing.B) {
			w := newWorld(b, nil)
			w.pages.handle("/page", func(rw http.ResponseWriter, r *http.Request) {
				select { // the page takes 50 ms: the fixed delay the queue's scaling is measured against
				case <-time.After(50 * time.Millisecond):
				case <-r.Context().Done():
					return
				}
				html("bench")(rw, r)
			})
			for range workers {
				start(b, w.config(b, "PREVIEW_CONCURRENCY=1", "LOG_LEVEL=warn"))
			}
			b.ResetTimer()
			began := time.Now()
			for i := range b.N {
				publishJob(b, w.js, "b"+strconv.Itoa(i), w.pages.URL+"/page?i="+strconv.Itoa(i))
			}
			testenv.WaitFor(b, 10*time.Minute, fmt.Sprintf("%d previews", b.N), func() bool {
				n, err := w.rdb.DBSize(context.Background()).Result()
				return err == nil && n == int64(b.N)
			})
			elapsed := time.Since(began)
			b.StopTimer()
			// A job that failed writes its preview's key too: the rate is
			// one of previews fetched only if each was.
			for i := range b.N {
				if h := previewHash(b, w.rdb, "b"+strconv.Itoa(i)); h["status"] != "ok" || h["title"] != "bench" {
					b.Fatalf("preview b%d = %v, want the page's (status ok)", i, h)
				}
			}
			b.ReportMetric(float64(b.N)/elapsed.Seconds(), "jobs/s")
		})
	}
}
