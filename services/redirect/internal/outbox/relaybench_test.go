package outbox

import (
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
)

// BenchmarkRelay relays b.N clicks from one shard's outbox into a real
// JetStream (dedup, the expected stream), batches of at most 16 as at a few
// thousand clicks a second over 16 shards: the time and the allocations per
// click of the relay's read, validity check, publish and fenced delete (XTRIM MINID), the
// clients' included.
func BenchmarkRelay(b *testing.B) {
	e := newEnv(b, 1)
	for added := 0; added < b.N; added += 1000 {
		e.addClicks(b, "bench", min(1000, b.N-added))
	}
	r := NewRelay(e.rdb, e.js, e.nc.IsConnected, e.layout, RelayConfig{
		Instance: "bench", Window: 16, LeaseTTL: 10 * time.Second, Block: 100 * time.Millisecond, MaxBackoff: 200 * time.Millisecond,
	}, slog.New(slog.DiscardHandler), NewMetrics(prometheus.NewRegistry()))
	b.ReportAllocs()
	b.ResetTimer()
	rr := start(r)
	testenv.WaitFor(b, 5*time.Minute, "the outbox relayed", func() bool { return e.outboxLen(b) == 0 })
	b.StopTimer()
	rr.stop()
	// An empty outbox is entries trimmed: the time is a relay's only if
	// each of them is in CLICKS.
	if n := count(e.js, events.ClicksStream); n != b.N {
		b.Fatalf("CLICKS holds %d of the %d clicks the outbox held", n, b.N)
	}
}
