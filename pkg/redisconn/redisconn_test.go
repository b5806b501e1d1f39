package redisconn_test

import (
	"slices"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/snipdev/snip/pkg/redisconn"
)

// A redis+cluster:// URL lists every seed node, comma-separated, with the
// credentials once; the client knows all of them and re-reads the slot map
// every ClusterStateReloadInterval.
func TestOpenClusterURLListsEveryNode(t *testing.T) {
	t.Parallel()
	for url, want := range map[string][]string{
		"redis+cluster://h1:7000,h2:7001,h3:7002":                        {"h1:7000", "h2:7001", "h3:7002"},
		"redis+cluster://default:s3cret@h1:7000,h2:7001?dial_timeout=1s": {"h1:7000", "h2:7001"},
		"redis+cluster://h1:7000":                                        {"h1:7000"},
	} {
		c, err := redisconn.Open(url)
		if err != nil {
			t.Fatalf("Open(%q): %v", url, err)
		}
		cc, ok := c.(*redis.ClusterClient)
		if !ok {
			t.Fatalf("Open(%q) = %T, want a cluster client", url, c)
		}
		o := cc.Options()
		if !slices.Equal(o.Addrs, want) {
			t.Errorf("Open(%q): addrs %v, want %v", url, o.Addrs, want)
		}
		if o.ClusterStateReloadInterval != redisconn.ClusterStateReloadInterval {
			t.Errorf("Open(%q): reload interval %s", url, o.ClusterStateReloadInterval)
		}
		if url == "redis+cluster://default:s3cret@h1:7000,h2:7001?dial_timeout=1s" &&
			(o.Username != "default" || o.Password != "s3cret" || o.DialTimeout != time.Second) {
			t.Errorf("Open(%q): user %q password %q dial timeout %s", url, o.Username, o.Password, o.DialTimeout)
		}
		_ = c.Close()
	}
	if c, err := redisconn.Open("redis://h1:6379/3"); err != nil {
		t.Fatal(err)
	} else if _, ok := c.(*redis.Client); !ok {
		t.Fatalf("Open(redis://) = %T, want a single-server client", c)
	}
}
