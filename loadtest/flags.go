package main

import (
	"crypto/rand"
	"encoding/binary"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/snipdev/snip/loadtest/internal/oracle"
	"github.com/snipdev/snip/loadtest/internal/whrecv"
	"github.com/snipdev/snip/loadtest/internal/workload"
)

// workloadFlags shape the traffic (workload.Spec).
type workloadFlags struct {
	links        int
	zipf         float64
	viral        float64
	botShare     float64
	burstShare   float64
	burstSize    int
	visitors     int
	probeEvery   int
	countryShare float64
	seed         uint64
	linkBase     string
}

// demoSite is where `make demo` (snipctl demo) serves the local site its
// links point at: an article page for any name.
const demoSite = "http://127.0.0.1:8089/articles"

func (w *workloadFlags) register(fs *flag.FlagSet) {
	fs.IntVar(&w.links, "links", 1000, "links to create and click")
	fs.Float64Var(&w.zipf, "zipf", 1.1, "Zipf exponent of link popularity (1 = classic; higher = more skewed)")
	fs.Float64Var(&w.viral, "viral", 0, "share of all clicks that go to one viral link (0.5: it takes half the traffic)")
	fs.Float64Var(&w.botShare, "bot-share", 0.05, "share of clicks made with well-known bot user agents (labelled at the source)")
	fs.Float64Var(&w.burstShare, "burst-share", 0.02, "share of clicks in bursts: many clicks by one identity on one link, with a browser user agent")
	fs.IntVar(&w.burstSize, "burst-size", 50, "clicks per burst (fraud detection flags more than 20 a minute by default)")
	fs.IntVar(&w.visitors, "visitors", 0, "human visitor pool (0: a minute of traffic, at least 10000)")
	fs.IntVar(&w.probeEvery, "probe-every", 0, "send every Nth click to the probe link (0: about 10 a second; -1: no probes)")
	fs.Float64Var(&w.countryShare, "country-share", 0.9, "share of clicks with a country header")
	fs.Uint64Var(&w.seed, "seed", 0, "traffic seed (0: random; the same seed gives the same traffic)")
	fs.StringVar(&w.linkBase, "link-base", demoSite, "base URL the run's links point at (link <code> goes to <link-base>/<code>); the preview workers fetch each one, so keep it a site you run")
}

func (w *workloadFlags) spec(rate int) workload.Spec {
	s := workload.Spec{
		Seed: w.seed, Links: w.links, ZipfS: w.zipf, ViralShare: w.viral, BotShare: w.botShare,
		BurstShare: w.burstShare, BurstSize: w.burstSize, Visitors: w.visitors, ProbeEvery: w.probeEvery,
		CountryShare: w.countryShare,
	}
	if s.Seed == 0 {
		var b [8]byte
		_, _ = rand.Read(b[:])
		s.Seed = binary.BigEndian.Uint64(b[:]) | 1
	}
	if s.Visitors == 0 {
		s.Visitors = workload.DefaultVisitors(rate)
	}
	switch {
	case s.ProbeEvery == 0:
		s.ProbeEvery = workload.DefaultProbeEvery(rate)
	case s.ProbeEvery < 0:
		s.ProbeEvery = 0
	}
	return s
}

// runFlags are common to the drivers.
type runFlags struct {
	rate     int
	duration time.Duration
	verify   bool
	out      string
}

func (r *runFlags) register(fs *flag.FlagSet, rate int) {
	fs.IntVar(&r.rate, "rate", rate, "clicks per second (constant arrival rate)")
	fs.DurationVar(&r.duration, "duration", 30*time.Second, "how long to send")
	fs.BoolVar(&r.verify, "verify", false, "after the run, check every reader against the truth (exit 1 if any differs, 3 if stopped before the check ended)")
	fs.StringVar(&r.out, "out", "", "report directory (default loadtest/reports/<time>-<tag>)")
}

// check refuses a rate or a duration the drivers cannot run, before
// anything is connected to or created.
func (r *runFlags) check() error {
	if r.rate < 1 || r.duration <= 0 {
		return fmt.Errorf("--rate %d --duration %s: want a rate of at least 1 and a duration above 0: %w", r.rate, r.duration, errUsage)
	}
	return nil
}

// sinkFlags say where the readers' public views are, for the oracle and the
// click-to-counted probes. "auto" means `make demo`'s address, skipped when
// nothing answers there; an explicit address is checked strictly; "off"
// skips the sink.
type sinkFlags struct {
	counter    string
	clickhouse string
	fraud      string
	require    string
	deadline   time.Duration
	setLimit   uint64
	// burstThreshold is fraud detection's visitor_burst threshold: bursts
	// cut to it or fewer clicks in the log are not judged.
	burstThreshold int
	// webhooks is the webhooks API ("auto", "off" or a base URL); "" is
	// auto when webhooks are required, else off. webhooksListen is the
	// receiver's address.
	webhooks       string
	webhooksListen string
}

const auto, off = "auto", "off"

// Where `make demo` (snipctl demo) runs the readers.
const (
	demoCounterURL = "http://127.0.0.1:8081"
	demoClickHouse = "clickhouse://127.0.0.1:19000/snip"
	demoWebhooks   = "http://127.0.0.1:8087"
)

func (s *sinkFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&s.counter, "counter-url", auto, "click counter base URL (auto: "+demoCounterURL+" if it answers; off)")
	fs.StringVar(&s.clickhouse, "clickhouse", auto, "warehouse ClickHouse DSN (auto: "+demoClickHouse+" if it answers; off)")
	fs.StringVar(&s.fraud, "fraud", auto, "check fraud detection's verdicts and alerts: auto (if the fraud-detection group exists), on, off (a checked counter is judged by the verdicts either way)")
	fs.StringVar(&s.require, "require", "", "comma-separated sinks that must be checked, not skipped: counter,warehouse,fraud,webhooks")
	fs.DurationVar(&s.deadline, "deadline", 3*time.Minute, "how long verification waits for readers to catch up and agree")
	fs.Uint64Var(&s.setLimit, "set-limit", 2_000_000, "compare the warehouse's event IDs one by one up to this many clicks (counts above)")
	fs.IntVar(&s.burstThreshold, "burst-threshold", 20, "fraud detection's FRAUD_VISITOR_THRESHOLD: a burst is expected labelled and alerted only if the log holds more of its clicks than this")
	fs.StringVar(&s.webhooks, "webhooks", "", "webhooks API base URL: register a receiver of the run's own as an endpoint of the run's owner and check what it is delivered (auto: "+demoWebhooks+" if it answers; off; default: auto when --require names webhooks, else off)")
	fs.StringVar(&s.webhooksListen, "webhooks-listen", "127.0.0.1:0", "address of the run's webhook receiver; its endpoint URL is http://<this address>"+whrecv.Path+", so the webhooks service must reach it and allow it (WEBHOOKS_HTTP_HOSTS, WEBHOOKS_ALLOW_CIDRS)")
}

// check refuses the values the oracle would otherwise replace with its
// defaults without a word (a --set-limit of 0 compared 2,000,000 IDs, a
// --deadline of 0 waited 2 minutes), and a bad --require.
func (s *sinkFlags) check() error {
	switch {
	case s.deadline <= 0:
		return fmt.Errorf("--deadline %s: want more than 0: %w", s.deadline, errUsage)
	case s.setLimit < 1:
		return fmt.Errorf("--set-limit %d: want at least 1: %w", s.setLimit, errUsage)
	case s.burstThreshold < 1:
		return fmt.Errorf("--burst-threshold %d: want at least 1 (fraud detection's FRAUD_VISITOR_THRESHOLD): %w", s.burstThreshold, errUsage)
	}
	_, err := s.required()
	return err
}

func (s *sinkFlags) required() ([]string, error) {
	if s.require == "" {
		return nil, nil
	}
	var out []string
	for _, k := range strings.Split(s.require, ",") {
		k = strings.TrimSpace(k)
		switch k {
		case oracle.KeyCounter, oracle.KeyWarehouse, oracle.KeyFraud, oracle.KeyWebhooks:
			out = append(out, k)
		default:
			return nil, fmt.Errorf("--require %q: want counter, warehouse, fraud or webhooks: %w", k, errUsage)
		}
	}
	return out, nil
}

// parse parses args, printing flag errors to w.
func parse(fs *flag.FlagSet, args []string, w io.Writer) error {
	fs.SetOutput(w)
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return err
		}
		return fmt.Errorf("%s: %w", err, errUsage)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("unexpected arguments %q: %w", fs.Args(), errUsage)
	}
	return nil
}

// reportDir is where a run's files go: --out, else loadtest/reports/ when
// run from the repository root (as make does), else reports/.
func reportDir(out string, started time.Time, tag workload.Tag) string {
	if out != "" {
		return out
	}
	base := "reports"
	if st, err := os.Stat("loadtest"); err == nil && st.IsDir() {
		base = filepath.Join("loadtest", "reports")
	}
	return filepath.Join(base, started.Format("20060102-150405")+"-"+tag.String())
}
