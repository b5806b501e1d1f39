package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/snipdev/snip/pkg/events"
	"github.com/snipdev/snip/pkg/testenv"
	"github.com/snipdev/snip/pkg/topology"
	"github.com/snipdev/snip/services/redirect/internal/linkstore"
)

// TestAPIRefusesBadInput: bad URLs and schemes, codes, bodies, content
// types and credentials each get a clear JSON error and change nothing.
func TestAPIRefusesBadInput(t *testing.T) {
	t.Parallel()
	rdb, db := servers.Redis.NewDB(t)
	n := testenv.StartNATS(t)
	in := startInstance(t, testConfig(servers.Redis.URL(db), n.URL))
	js := n.JetStream(t)
	createLink(t, in.URL, "https://example.com/taken", "taken")
	// filledLanes lists the outbox lanes that hold entries (or could not be
	// read), as "<lane> holds <n> entries".
	filledLanes := func(ctx context.Context) (filled []string) {
		for _, k := range []string{"*:outbox:links", "*:outbox:jobs", "*:outbox:clicks"} {
			lanes, err := rdb.Keys(ctx, k).Result()
			if err != nil {
				return append(filled, fmt.Sprintf("%s: %v", k, err))
			}
			for _, l := range lanes {
				if n, err := rdb.XLen(ctx, l).Result(); err != nil || n != 0 {
					filled = append(filled, fmt.Sprintf("%s holds %d entries (%v)", l, n, err))
				}
			}
		}
		return filled
	}
	// The relay deletes an entry from its lane after JetStream has acked its
	// publish, so the lanes empty a moment after the streams hold it: wait
	// for both, so that the cleanup's lanes are what the bad requests left.
	testenv.WaitFor(t, 30*time.Second, "link.created and its job relayed, and the outbox lanes empty", func() bool {
		return streamCount(js, events.LinksStream) == 1 && streamCount(js, events.PreviewJobsStream) == 1 &&
			len(filledLanes(t.Context())) == 0
	})

	const json = "application/json"
	bearer := "Bearer " + acmeKey
	tests := []struct {
		name        string
		method      string
		path        string
		body        string
		contentType string
		auth        string
		wantStatus  int
		wantCode    string
	}{
		{"no_api_key_is_401", "POST", "/api/links", `{"target":"https://example.com"}`, json, "", 401, "unauthorized"},
		{"unknown_api_key_is_401", "POST", "/api/links", `{"target":"https://example.com"}`, json, "Bearer snip_nosuchkey0000000000000", 401, "unauthorized"},
		{"basic_auth_is_401", "POST", "/api/links", `{"target":"https://example.com"}`, json, "Basic YTpi", 401, "unauthorized"},
		{"text_plain_is_415", "POST", "/api/links", `{"target":"https://example.com"}`, "text/plain", bearer, 415, "unsupported_media_type"},
		{"missing_content_type_is_415", "POST", "/api/links", `{"target":"https://example.com"}`, "", bearer, 415, "unsupported_media_type"},
		{"form_is_415", "POST", "/api/links", `target=https://example.com`, "application/x-www-form-urlencoded", bearer, 415, "unsupported_media_type"},
		{"json_with_charset_is_fine_but_empty_body_is_400", "POST", "/api/links", ``, "application/json; charset=utf-8", bearer, 400, "bad_request"},
		{"not_json_is_400", "POST", "/api/links", `{target:`, json, bearer, 400, "bad_request"},
		{"array_is_400", "POST", "/api/links", `["https://example.com"]`, json, bearer, 400, "bad_request"},
		{"unknown_field_is_400", "POST", "/api/links", `{"target":"https://example.com","owner":"other"}`, json, bearer, 400, "bad_request"},
		{"trailing_data_is_400", "POST", "/api/links", `{"target":"https://example.com"} {}`, json, bearer, 400, "bad_request"},
		{"missing_target_is_400", "POST", "/api/links", `{"code":"abcd"}`, json, bearer, 400, "invalid_target"},
		{"target_and_url_both_is_400", "POST", "/api/links", `{"target":"https://a.example","url":"https://b.example"}`, json, bearer, 400, "bad_request"},
		{"javascript_url_alias_is_400", "POST", "/api/links", `{"url":"javascript:alert(1)"}`, json, bearer, 400, "invalid_target"},
		{"javascript_target_is_400", "POST", "/api/links", `{"target":"javascript:alert(1)"}`, json, bearer, 400, "invalid_target"},
		{"data_target_is_400", "POST", "/api/links", `{"target":"data:text/html,hi"}`, json, bearer, 400, "invalid_target"},
		{"relative_target_is_400", "POST", "/api/links", `{"target":"/a/b"}`, json, bearer, 400, "invalid_target"},
		{"credentials_in_target_is_400", "POST", "/api/links", `{"target":"https://u:p@example.com/"}`, json, bearer, 400, "invalid_target"},
		{"target_without_host_is_400", "POST", "/api/links", `{"target":"https:///x"}`, json, bearer, 400, "invalid_target"},
		{"target_pointing_here_is_400", "POST", "/api/links", `{"target":"http://HOST/x"}`, json, bearer, 400, "invalid_target"},
		{"too_long_target_is_400", "POST", "/api/links", `{"target":"https://example.com/` + strings.Repeat("a", 2100) + `"}`, json, bearer, 400, "invalid_target"},
		{"code_with_dot_is_400", "POST", "/api/links", `{"target":"https://example.com","code":"a.b.c"}`, json, bearer, 400, "invalid_code"},
		{"short_code_is_400", "POST", "/api/links", `{"target":"https://example.com","code":"ab"}`, json, bearer, 400, "invalid_code"},
		{"reserved_code_is_400", "POST", "/api/links", `{"target":"https://example.com","code":"Metrics"}`, json, bearer, 400, "reserved_code"},
		{"taken_code_is_409", "POST", "/api/links", `{"target":"https://example.com","code":"taken"}`, json, bearer, 409, "code_taken"},
		{"oversize_body_is_413", "POST", "/api/links", `{"target":"https://example.com/` + strings.Repeat("a", 9000) + `"}`, json, bearer, 413, "body_too_large"},
		{"other_owners_link_is_404", "GET", "/api/links/taken", ``, "", "Bearer " + otherKey, 404, "not_found"},
		{"unknown_link_is_404", "GET", "/api/links/nosuch", ``, "", bearer, 404, "not_found"},
		{"deleting_other_owners_link_is_404", "DELETE", "/api/links/taken", ``, "", "Bearer " + otherKey, 404, "not_found"},
		{"redirect_unknown_code_is_404", "GET", "/nosuchcode", ``, "", "", 404, "not_found"},
		{"redirect_impossible_code_is_404", "GET", "/favicon.ico", ``, "", "", 404, "not_found"},
		{"wrong_method_is_405", "PUT", "/api/links", `{}`, json, bearer, 405, "method_not_allowed"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			body := strings.ReplaceAll(tc.body, "HOST", strings.TrimPrefix(in.URL, "http://"))
			var hdr []string
			if tc.contentType != "" {
				hdr = append(hdr, "Content-Type", tc.contentType)
			}
			if tc.auth != "" {
				hdr = append(hdr, "Authorization", tc.auth)
			}
			r := do(t, tc.method, in.URL+tc.path, body, hdr...)
			var got struct {
				Error struct{ Code, Message string }
			}
			r.json(t, &got)
			if r.Status != tc.wantStatus || got.Error.Code != tc.wantCode || got.Error.Message == "" {
				t.Fatalf("%s %s = %d %s; want %d with code %q and a message", tc.method, tc.path, r.Status, r.Body, tc.wantStatus, tc.wantCode)
			}
			if r.Status == 401 && r.Header.Get("WWW-Authenticate") == "" {
				t.Fatal("401 without WWW-Authenticate")
			}
		})
	}
	t.Cleanup(func() {
		// Runs after the parallel subtests: bad input changed nothing, no
		// link and no event.
		ctx := context.Background()
		keys, _ := rdb.Keys(ctx, "*:link:*").Result()
		if len(keys) != 1 {
			t.Errorf("link keys after bad requests: %v, want only the one created", keys)
		}
		for _, f := range filledLanes(ctx) {
			t.Errorf("after bad requests: %s", f)
		}
		if l, j, c := streamCount(js, events.LinksStream), streamCount(js, events.PreviewJobsStream), streamCount(js, events.ClicksStream); l != 1 || j != 1 || c != 0 {
			t.Errorf("after bad requests LINKS=%d PREVIEW_JOBS=%d CLICKS=%d, want 1, 1, 0", l, j, c)
		}
	})
}

// TestRedirectRecordsClickAndHeadIsNotAClick follows one click end to end:
// 302 to the target, one click in CLICKS with Nats-Msg-Id = event ID and
// the anonymised visitor fields; HEAD answers 302 without a click; the
// link.created event reaches LINKS and the preview job PREVIEW_JOBS.
func TestRedirectRecordsClickAndHeadIsNotAClick(t *testing.T) {
	t.Parallel()
	_, db := servers.Redis.NewDB(t)
	n := testenv.StartNATS(t)
	js := n.JetStream(t)
	in := startInstance(t, testConfig(servers.Redis.URL(db), n.URL))
	code := createLink(t, in.URL, "https://example.com/landing?x=1", "")

	r := do(t, "HEAD", in.URL+"/"+code, "")
	if r.Status != http.StatusFound || r.Header.Get("Location") != "https://example.com/landing?x=1" {
		t.Fatalf("HEAD = %d Location %q", r.Status, r.Header.Get("Location"))
	}
	r = do(t, "GET", in.URL+"/"+code, "", "X-Request-Id", "req-1", "User-Agent", "Slackbot-LinkExpanding 1.0",
		"Referer", "https://news.example/", "X-Country", "fr")
	if r.Status != http.StatusFound || r.Header.Get("Location") != "https://example.com/landing?x=1" {
		t.Fatalf("GET = %d Location %q", r.Status, r.Header.Get("Location"))
	}
	testenv.WaitFor(t, 30*time.Second, "one click in CLICKS", func() bool { return streamCount(js, events.ClicksStream) >= 1 })
	testenv.WaitFor(t, 30*time.Second, "link.created in LINKS and a job in PREVIEW_JOBS", func() bool {
		return streamCount(js, events.LinksStream) == 1 && streamCount(js, events.PreviewJobsStream) == 1
	})
	clicks := readClicks(t, js)
	if len(clicks) != 1 {
		t.Fatalf("CLICKS has %d clicks, want 1 (HEAD is not a click)", len(clicks))
	}
	c := clicks[0]
	if c.MsgID != c.Click.ID {
		t.Fatalf("Nats-Msg-Id %q, event ID %q", c.MsgID, c.Click.ID)
	}
	want := events.Click{
		V: events.ClickVersion, ID: c.Click.ID, Time: c.Click.Time, Code: code, Owner: "acme",
		Target: "https://example.com/landing?x=1", IPPrefix: "127.0.0.0/24", Visitor: c.Click.Visitor,
		UserAgent: "Slackbot-LinkExpanding 1.0", Referrer: "https://news.example/", Country: "FR",
		RequestID: "req-1", Bot: true,
	}
	if d := cmp.Diff(want, c.Click); d != "" {
		t.Fatalf("click (-want +got):\n%s", d)
	}
	if len(c.Click.Visitor) != 32 {
		t.Fatalf("visitor %q: want 32 hex characters", c.Click.Visitor)
	}
	if got := metric(t, in.URL, "snip_redirect_head_requests_total"); got != 1 {
		t.Fatalf("head_requests_total = %v, want 1", got)
	}
	links := readStream(t, js, events.LinksStream)
	ev, err := events.DecodeLinkEvent(links[0].Data())
	if err != nil || ev.Kind != events.LinkCreated || ev.Code != code || links[0].Headers().Get(events.HeaderMsgID) != ev.ID {
		t.Fatalf("LINKS[0] = %+v, %v", ev, err)
	}
	jobs := readStream(t, js, events.PreviewJobsStream)
	job, err := events.DecodePreviewJob(jobs[0].Data())
	if err != nil || job.Code != code || job.Target != "https://example.com/landing?x=1" {
		t.Fatalf("PREVIEW_JOBS[0] = %+v, %v", job, err)
	}
}

// TestGetLinkShowsPreviewToItsOwnerOnly: GET /api/links/:code shows the
// owner's link with the preview the preview service stored, and is 404 (not
// 403) for another owner, so codes are not probeable.
func TestGetLinkShowsPreviewToItsOwnerOnly(t *testing.T) {
	t.Parallel()
	rdb, db := servers.Redis.NewDB(t)
	n := testenv.StartNATS(t)
	in := startInstance(t, testConfig(servers.Redis.URL(db), n.URL))
	code := createLink(t, in.URL, "https://example.com/article", "my-article")

	var got struct {
		Code, Target, Owner string
		ShortURL            string `json:"short_url"`
		Preview             *linkstore.Preview
	}
	r := do(t, "GET", in.URL+"/api/links/"+code, "", "Authorization", "Bearer "+acmeKey)
	r.json(t, &got)
	if r.Status != 200 || got.Preview == nil || *got.Preview != (linkstore.Preview{Status: "pending"}) || got.Owner != "acme" ||
		got.Target != "https://example.com/article" || got.ShortURL != in.URL+"/my-article" {
		t.Fatalf("before preview: %d %s", r.Status, r.Body)
	}
	fetched := time.Date(2026, 11, 30, 12, 0, 0, 0, time.UTC)
	rdb.HSet(t.Context(), linkstore.PreviewKey(code), "status", "ok", "title", "An article", "description", "About things",
		"image", "https://example.com/i.png", "site_name", "Example", "fetched_at", fetched.Format(time.RFC3339))
	r = do(t, "GET", in.URL+"/api/links/"+code, "", "Authorization", "Bearer "+acmeKey)
	got.Preview = nil
	r.json(t, &got)
	want := &linkstore.Preview{Status: "ok", Title: "An article", Description: "About things", Image: "https://example.com/i.png", SiteName: "Example", FetchedAt: &fetched}
	if d := cmp.Diff(want, got.Preview); d != "" {
		t.Fatalf("preview (-want +got):\n%s", d)
	}
	rdb.Del(t.Context(), linkstore.PreviewKey(code))
	rdb.HSet(t.Context(), linkstore.PreviewKey(code), "status", "failed", "reason", "timeout")
	got.Preview = nil
	do(t, "GET", in.URL+"/api/links/"+code, "", "Authorization", "Bearer "+acmeKey).json(t, &got)
	if d := cmp.Diff(&linkstore.Preview{Status: "unavailable", Reason: "timeout"}, got.Preview); d != "" {
		t.Fatalf("failed preview (-want +got):\n%s", d)
	}
	if r := do(t, "GET", in.URL+"/api/links/"+code, "", "Authorization", "Bearer "+otherKey); r.Status != 404 {
		t.Fatalf("other owner: %d %s, want 404", r.Status, r.Body)
	}
}

// TestDeleteLinkPublishesDeletedAndInvalidatesEveryCache: DELETE writes
// link.deleted through the outbox; the deleting instance stops redirecting
// at once, another instance (whose cache holds the link for a minute) stops
// once LINKS tells it, and the code can never be taken again.
func TestDeleteLinkPublishesDeletedAndInvalidatesEveryCache(t *testing.T) {
	t.Parallel()
	_, db := servers.Redis.NewDB(t)
	n := testenv.StartNATS(t)
	js := n.JetStream(t)
	cfg := testConfig(servers.Redis.URL(db), n.URL)
	a := startInstance(t, cfg)
	b := startInstance(t, cfg)
	code := createLink(t, a.URL, "https://example.com/gone-soon", "")
	// b follows LINKS from "new": it must be following before the delete.
	testenv.WaitFor(t, 30*time.Second, "link.created in LINKS", func() bool { return streamCount(js, events.LinksStream) == 1 })
	if r := do(t, "GET", b.URL+"/"+code, ""); r.Status != http.StatusFound { // b caches it
		t.Fatalf("GET via b = %d", r.Status)
	}
	testenv.WaitFor(t, 30*time.Second, "b following LINKS", func() bool {
		return metric(t, b.URL, "snip_redirect_links_following") == 1
	})
	r := do(t, "DELETE", a.URL+"/api/links/"+code, "", "Authorization", "Bearer "+acmeKey)
	if r.Status != http.StatusNoContent {
		t.Fatalf("DELETE = %d %s", r.Status, r.Body)
	}
	if r := do(t, "GET", a.URL+"/"+code, ""); r.Status != http.StatusNotFound {
		t.Fatalf("GET via a after delete = %d, want 404", r.Status)
	}
	testenv.WaitFor(t, 30*time.Second, "b to stop redirecting the deleted link", func() bool {
		return do(t, "GET", b.URL+"/"+code, "").Status == http.StatusNotFound
	})
	testenv.WaitFor(t, 30*time.Second, "link.deleted in LINKS", func() bool { return streamCount(js, events.LinksStream) == 2 })
	msgs := readStream(t, js, events.LinksStream)
	ev, err := events.DecodeLinkEvent(msgs[1].Data())
	if err != nil || ev.Kind != events.LinkDeleted || ev.Code != code || msgs[1].Subject() != events.LinkSubject(events.LinkDeleted, code) {
		t.Fatalf("LINKS[1] = %+v on %s, %v", ev, msgs[1].Subject(), err)
	}
	body, _ := json.Marshal(map[string]string{"target": "https://evil.example/", "code": code})
	r = do(t, "POST", a.URL+"/api/links", string(body), "Authorization", "Bearer "+otherKey, "Content-Type", "application/json")
	if r.Status != http.StatusConflict {
		t.Fatalf("re-creating a deleted code = %d %s, want 409", r.Status, r.Body)
	}
}

// TestClientAddressFromForwardedForOnlyBehindTrustedProxy: X-Forwarded-For
// is believed only when the peer is a configured trusted proxy; otherwise
// the connection's address is the client's.
func TestClientAddressFromForwardedForOnlyBehindTrustedProxy(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		trusted []string
		want    string
	}{
		{name: "untrusted_peer_header_ignored", trusted: nil, want: "127.0.0.0/24"},
		{name: "trusted_peer_header_used", trusted: []string{"127.0.0.1/32"}, want: "198.51.100.0/24"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			_, db := servers.Redis.NewDB(t)
			n := testenv.StartNATS(t)
			js := n.JetStream(t)
			cfg := testConfig(servers.Redis.URL(db), n.URL)
			cfg.TrustedProxies = tc.trusted
			in := startInstance(t, cfg)
			code := createLink(t, in.URL, "https://example.com/", "")
			if r := do(t, "GET", in.URL+"/"+code, "", "X-Forwarded-For", "198.51.100.23"); r.Status != http.StatusFound {
				t.Fatalf("GET = %d", r.Status)
			}
			testenv.WaitFor(t, 30*time.Second, "the click in CLICKS", func() bool { return streamCount(js, events.ClicksStream) == 1 })
			if got := readClicks(t, js)[0].Click.IPPrefix; got != tc.want {
				t.Fatalf("ip_prefix = %q, want %q", got, tc.want)
			}
		})
	}
}

// TestRelaysIntoExistingStreamsWhenTopologyDiffers: CLICKS exists with
// another partition count than this instance is configured with: the
// service logs, as an error, that it did not apply the topology and why,
// and relays into the streams as they are. (A NATS user that may not
// change streams takes the same path.)
func TestRelaysIntoExistingStreamsWhenTopologyDiffers(t *testing.T) {
	t.Parallel()
	_, db := servers.Redis.NewDB(t)
	n := testenv.StartNATS(t)
	js := n.JetStream(t)
	o := topology.Defaults()
	o.Partitions = 5
	if err := topology.Apply(t.Context(), js, o); err != nil {
		t.Fatal(err)
	}
	logged, log := newLogBuffer()
	in := startInstanceLog(t, testConfig(servers.Redis.URL(db), n.URL), log) // SNIP_PARTITIONS=3
	code := createLink(t, in.URL, "https://example.com/", "")
	if r := do(t, "GET", in.URL+"/"+code, ""); r.Status != http.StatusFound {
		t.Fatalf("GET = %d", r.Status)
	}
	testenv.WaitFor(t, 30*time.Second, "the click in CLICKS", func() bool { return streamCount(js, events.ClicksStream) == 1 })
	if got, err := topology.Partitions(t.Context(), js); err != nil || got != 5 {
		t.Fatalf("CLICKS partitions = %d, %v; want the existing 5", got, err)
	}
	// The click may have gone out directly, before the topology loop
	// logged: wait for the record.
	const notApplied = "topology not applied; the streams exist, relaying into them as they are"
	var said map[string]any
	testenv.WaitFor(t, 30*time.Second, "the log to say the topology was not applied", func() bool {
		for _, rec := range logged.records(t) {
			if rec["msg"] == notApplied {
				said = rec
				return true
			}
		}
		return false
	})
	if err, _ := said["err"].(string); said["level"] != "ERROR" || !strings.Contains(err, topology.ErrPartitionsChanged.Error()) {
		t.Errorf("logged %v; want an ERROR whose err says %q", said, topology.ErrPartitionsChanged)
	}
	for _, rec := range logged.records(t) {
		if rec["msg"] == "topology applied" {
			t.Errorf("logged %v next to streams it did not change", rec)
		}
	}
}
