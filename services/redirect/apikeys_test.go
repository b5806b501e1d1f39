package main

import (
	"encoding/json"
	"net/http"
	"strconv"
	"testing"
	"time"

	"github.com/snipdev/snip/pkg/owners"
	"github.com/snipdev/snip/pkg/testenv"
)

func createAs(t *testing.T, base, key, target string) response {
	t.Helper()
	body, _ := json.Marshal(map[string]string{"target": target})
	return do(t, "POST", base+"/api/links", string(body), "Authorization", "Bearer "+key, "Content-Type", "application/json")
}

// Each owner may create SNIP_LINK_CREATE_LIMIT links per window; over it,
// 429 with Retry-After, and nothing is created. Other owners are not
// affected.
func TestLinkCreationIsLimitedPerOwner(t *testing.T) {
	t.Parallel()
	rdb, db := servers.Redis.NewDB(t)
	n := testenv.StartNATS(t)
	cfg := testConfig(servers.Redis.URL(db), n.URL)
	cfg.LinkCreateLimit, cfg.LinkCreateWindow = 3, time.Hour
	in := startInstance(t, cfg)
	for i := range 3 {
		if r := createAs(t, in.URL, acmeKey, "https://example.com/"+strconv.Itoa(i)); r.Status != http.StatusCreated {
			t.Fatalf("link %d within the limit: %d %s", i+1, r.Status, r.Body)
		}
	}
	r := createAs(t, in.URL, acmeKey, "https://example.com/over")
	var e struct{ Error struct{ Code string } }
	_ = json.Unmarshal(r.Body, &e)
	retry, _ := strconv.Atoi(r.Header.Get("Retry-After"))
	if r.Status != http.StatusTooManyRequests || e.Error.Code != "rate_limited" || retry < 1 || retry > 3600 {
		t.Errorf("link over the limit: %d %s, Retry-After %q; want 429 rate_limited with Retry-After in (0, 3600]", r.Status, r.Body, r.Header.Get("Retry-After"))
	}
	if r := createAs(t, in.URL, otherKey, "https://example.com/other"); r.Status != http.StatusCreated {
		t.Errorf("another owner's link: %d %s", r.Status, r.Body)
	}
	keys, _ := rdb.Keys(t.Context(), "*:link:*").Result()
	if len(keys) != 4 {
		t.Errorf("%d links stored, want 4 (3 of acme, 1 of other)", len(keys))
	}
}

// An owner rotates its own key through the API: the new key works, the old
// one fails at once on every route; a revoked key fails at once too.
func TestOwnerRotatesItsKeyAndOldKeysFailAtOnce(t *testing.T) {
	t.Parallel()
	rdb, db := servers.Redis.NewDB(t)
	n := testenv.StartNATS(t)
	in := startInstance(t, testConfig(servers.Redis.URL(db), n.URL))
	code := createLink(t, in.URL, "https://example.com/mine", "")

	r := do(t, "POST", in.URL+"/api/key/rotate", "", "Authorization", "Bearer "+acmeKey)
	var got struct {
		Owner  string
		APIKey string `json:"api_key"`
	}
	r.json(t, &got)
	if r.Status != http.StatusCreated || got.Owner != "acme" || got.APIKey == "" || got.APIKey == acmeKey {
		t.Fatalf("rotate: %d %s", r.Status, r.Body)
	}
	for _, c := range []struct{ method, path string }{{"GET", "/api/links/" + code}, {"POST", "/api/key/rotate"}} {
		if r := do(t, c.method, in.URL+c.path, "", "Authorization", "Bearer "+acmeKey); r.Status != http.StatusUnauthorized {
			t.Errorf("old key on %s %s after rotate: %d, want 401", c.method, c.path, r.Status)
		}
	}
	if r := createAs(t, in.URL, acmeKey, "https://example.com/old"); r.Status != http.StatusUnauthorized {
		t.Errorf("old key creating a link after rotate: %d, want 401", r.Status)
	}
	if r := do(t, "GET", in.URL+"/api/links/"+code, "", "Authorization", "Bearer "+got.APIKey); r.Status != http.StatusOK {
		t.Errorf("new key reading the owner's link: %d %s", r.Status, r.Body)
	}
	if _, err := owners.NewStore(rdb).Revoke(t.Context(), "acme"); err != nil {
		t.Fatal(err)
	}
	if r := createAs(t, in.URL, got.APIKey, "https://example.com/revoked"); r.Status != http.StatusUnauthorized {
		t.Errorf("revoked key: %d, want 401", r.Status)
	}
	if r := do(t, "POST", in.URL+"/api/key/rotate", "", "Authorization", "Bearer "+got.APIKey); r.Status != http.StatusUnauthorized {
		t.Errorf("revoked key rotating: %d, want 401", r.Status)
	}
}
