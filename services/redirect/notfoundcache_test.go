package main

import (
	"net/http"
	"testing"

	"github.com/snipdev/snip/pkg/testenv"
)

// TestNotFoundIsNotStoredByCachesInFront: a code's 404 (unknown, not yet
// created, impossible, or deleted), to GET and HEAD, says what its 302 says,
// Cache-Control: private, max-age=0, so no shared cache in front (Varnish and
// Fastly keep a 404 without one for minutes) goes on answering 404 once the
// code is created; the link then redirects at once.
func TestNotFoundIsNotStoredByCachesInFront(t *testing.T) {
	t.Parallel()
	_, db := servers.Redis.NewDB(t)
	n := testenv.StartNATS(t)
	in := startInstance(t, testConfig(servers.Redis.URL(db), n.URL))
	notStored := func(what string, r response) {
		t.Helper()
		if r.Status != http.StatusNotFound || r.Header.Get("Cache-Control") != "private, max-age=0" {
			t.Errorf("%s = %d with Cache-Control %q; want 404 with \"private, max-age=0\"", what, r.Status, r.Header.Get("Cache-Control"))
		}
	}
	for _, method := range []string{"GET", "HEAD"} {
		notStored(method+" of a code not created yet", do(t, method, in.URL+"/soon-here", ""))
		notStored(method+" of a code that cannot exist", do(t, method, in.URL+"/favicon.ico", ""))
	}
	code := createLink(t, in.URL, "https://example.com/here-now", "soon-here")
	if r := do(t, "GET", in.URL+"/"+code, ""); r.Status != http.StatusFound || r.Header.Get("Cache-Control") != "private, max-age=0" {
		t.Fatalf("GET after create = %d with Cache-Control %q, want 302 with \"private, max-age=0\"", r.Status, r.Header.Get("Cache-Control"))
	}
	if r := do(t, "DELETE", in.URL+"/api/links/"+code, "", "Authorization", "Bearer "+acmeKey); r.Status != http.StatusNoContent {
		t.Fatalf("DELETE = %d %s", r.Status, r.Body)
	}
	for _, method := range []string{"GET", "HEAD"} {
		notStored(method+" of a deleted code", do(t, method, in.URL+"/"+code, ""))
	}
}
