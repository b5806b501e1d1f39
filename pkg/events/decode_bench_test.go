package events

import (
	stdjson "encoding/json"
	"testing"
	"time"
)

func benchClickJSON(b *testing.B) []byte {
	c := Click{V: ClickVersion, ID: NewID(), Time: time.Now().UTC(), Code: "abc123", Owner: "acme",
		Target: "https://example.com/some/long/path?utm_source=x", IPPrefix: "203.0.113.0/24",
		Visitor: "7f3a9c2e1b4d5f60", UserAgent: "Mozilla/5.0 (X11; Linux x86_64) AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120.0 Safari/537.36",
		Referrer: "news.ycombinator.com", Country: "DE", RequestID: "01JABCDEF"}
	data, err := stdjson.Marshal(c)
	if err != nil {
		b.Fatal(err)
	}
	return data
}

func BenchmarkDecodeClick(b *testing.B) {
	data := benchClickJSON(b)
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := DecodeClick(data); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReadClick is DecodeClick plus the rule of validity's subject,
// partition and time checks: the cost each reader and the relay pay per click.
func BenchmarkReadClick(b *testing.B) {
	data := benchClickJSON(b)
	subject := benchSubject()
	stored := time.Now()
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if _, err := ReadClick(data, subject, 8, stored); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkReadClickShared is ReadClick as the reader runtime calls it:
// into an event it already has, the strings sharing the payload.
func BenchmarkReadClickShared(b *testing.B) {
	data := benchClickJSON(b)
	subject := benchSubject()
	stored := time.Now()
	evs := make([]Click, 1)
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if err := ReadClickShared(&evs[0], data, subject, 8, stored); err != nil {
			b.Fatal(err)
		}
	}
}

// benchSubject is the stored subject of benchClickJSON's click with 8
// partitions.
func benchSubject() string {
	return string(rune('0'+Partition("abc123", 8))) + ".clicks.acme.abc123"
}
