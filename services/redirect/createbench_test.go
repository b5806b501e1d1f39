package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/testenv"
)

// BenchmarkCreateLink measures POST /api/links, one at a time, in alternating
// rounds of one run (each variant first in one round): a target named by an IP literal with no limit (the
// baseline), the same with the per-owner limit on (one Redis script per
// call), and a target named by DNS (the self-loop check resolves it). Run
// it alone:
//
//	go test -run '^$' -bench CreateLink -benchtime 1x ./services/redirect
func BenchmarkCreateLink(b *testing.B) {
	const (
		rounds = 3
		perRnd = 300
	)
	_, db := servers.Redis.NewDB(b)
	n := testenv.StartNATS(b)
	plain := startInstance(b, testConfig(servers.Redis.URL(db), n.URL))
	limitedCfg := testConfig(servers.Redis.URL(db), n.URL)
	limitedCfg.LinkCreateLimit, limitedCfg.LinkCreateWindow = 1_000_000, time.Hour
	limited := startInstance(b, limitedCfg)
	create := func(base, target string) time.Duration {
		start := time.Now()
		for i := range perRnd {
			body, _ := json.Marshal(map[string]string{"target": fmt.Sprintf("%s/%d", target, i)})
			r := do(b, "POST", base+"/api/links", string(body), "Authorization", "Bearer "+acmeKey, "Content-Type", "application/json")
			if r.Status != http.StatusCreated {
				b.Fatalf("create: %d %s", r.Status, r.Body)
			}
		}
		return time.Since(start) / perRnd
	}
	create(plain.URL, "http://192.0.2.1") // warm up
	b.ResetTimer()
	var base, lim, dns time.Duration
	steps := []func(){
		func() { base += create(plain.URL, "http://192.0.2.1") },
		func() { lim += create(limited.URL, "http://192.0.2.1") },
		func() { dns += create(plain.URL, "https://example.com") },
	}
	for r := range rounds { // each variant goes first once: order costs nothing
		for i := range steps {
			steps[(r+i)%len(steps)]()
		}
	}
	b.StopTimer()
	b.ReportMetric(float64(base.Microseconds())/rounds, "us/create-ip")
	b.ReportMetric(float64(lim.Microseconds())/rounds, "us/create-ip-limited")
	b.ReportMetric(float64(dns.Microseconds())/rounds, "us/create-dns")
	b.ReportMetric(float64(lim)/float64(base), "limited/base")
	b.ReportMetric(float64(dns)/float64(base), "dns/base")
}
