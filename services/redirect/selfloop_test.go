package main

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/snipdev/snip/pkg/testenv"
)

// A target that leads back to this service is refused whatever its
// spelling: every name and address form of loopback at the port the service
// listens on, and the public URL's host. The same names at another port,
// and other hosts, are accepted.
func TestTargetsLeadingBackHereAreRefused(t *testing.T) {
	t.Parallel()
	_, db := servers.Redis.NewDB(t)
	n := testenv.StartNATS(t)
	cfg := testConfig(servers.Redis.URL(db), n.URL)
	cfg.PublicURL = "https://s.example"
	in := startInstance(t, cfg)
	port := in.URL[strings.LastIndex(in.URL, ":")+1:]
	p, _ := strconv.Atoi(port)
	other := strconv.Itoa(p + 1)

	create := func(target string) (int, string) {
		body, _ := json.Marshal(map[string]string{"target": target})
		r := do(t, "POST", in.URL+"/api/links", string(body), "Authorization", "Bearer "+acmeKey, "Content-Type", "application/json")
		var e struct{ Error struct{ Code string } }
		_ = json.Unmarshal(r.Body, &e)
		return r.Status, e.Error.Code
	}
	for _, target := range []string{
		"http://127.0.0.1:" + port + "/x",
		"http://localhost:" + port + "/x",
		"http://LOCALHOST.:" + port + "/x",
		"http://[::1]:" + port + "/x",
		"http://127.0.0.1:0" + port + "/x",
		"http://127.0.0.1:000" + port + "/x",
		"http://127.1:" + port + "/x",
		"http://127.0.0.2:" + port + "/x",
		"http://2130706433:" + port + "/x",
		"http://0x7f.0.0.1:" + port + "/x",
		"http://0177.0.0.1:" + port + "/x",
		"http://[::ffff:127.0.0.1]:" + port + "/x",
		"http://0.0.0.0:" + port + "/x",
		"https://s.example/x",
		"http://S.EXAMPLE:8443/x",
	} {
		if status, code := create(target); status != http.StatusBadRequest || code != "invalid_target" {
			t.Errorf("%s: %d %s, want 400 invalid_target", target, status, code)
		}
	}
	for _, target := range []string{
		"http://localhost:" + other + "/x",
		"http://127.0.0.1/x",
		"https://example.com/x",
		"http://192.0.2.1:" + port + "/x",
	} {
		if status, code := create(target); status != http.StatusCreated {
			t.Errorf("%s: %d %s, want 201", target, status, code)
		}
	}
}
