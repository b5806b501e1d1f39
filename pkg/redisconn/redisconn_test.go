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

// OpenWithTimeout bounds every socket read and write by its timeout, not by
// the URL's read_timeout and write_timeout, on one server and on a cluster;
// 3 s, which Open takes for go-redis's default and tunes to 2 s, included.
func TestOpenWithTimeoutOverridesTheURLsTimeouts(t *testing.T) {
	t.Parallel()
	for _, url := range []string{"redis://h1:6379/0?read_timeout=200ms&write_timeout=100ms", "redis+cluster://h1:7000,h2:7001?read_timeout=200ms"} {
		for _, timeout := range []time.Duration{3 * time.Second, 1500 * time.Millisecond} {
			c, err := redisconn.OpenWithTimeout(url, timeout)
			if err != nil {
				t.Fatalf("OpenWithTimeout(%q): %v", url, err)
			}
			var read, write time.Duration
			switch c := c.(type) {
			case *redis.Client:
				read, write = c.Options().ReadTimeout, c.Options().WriteTimeout
			case *redis.ClusterClient:
				read, write = c.Options().ReadTimeout, c.Options().WriteTimeout
			}
			if read != timeout || write != timeout {
				t.Errorf("OpenWithTimeout(%q, %s): read timeout %s, write timeout %s", url, timeout, read, write)
			}
			_ = c.Close()
		}
	}
	if c, err := redisconn.Open("redis://h1:6379/0?read_timeout=200ms"); err != nil {
		t.Fatal(err)
	} else if got := c.(*redis.Client).Options().ReadTimeout; got != 200*time.Millisecond {
		t.Errorf("Open: read timeout %s, want the URL's 200ms", got)
	}
	if _, err := redisconn.OpenWithTimeout("redis://h1:6379/0", 0); err == nil {
		t.Error("OpenWithTimeout with no timeout accepted")
	}
}
