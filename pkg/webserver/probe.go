package webserver

import (
	"fmt"
	"net"
	"net/http"
	"time"
)

// Probe GETs /healthz on the service listening at listenAddr and returns an
// error unless it answers 200. Services run it for `<binary> healthcheck`,
// because their distroless images have no shell or curl for a Docker
// HEALTHCHECK.
func Probe(listenAddr string) error {
	host, port, err := net.SplitHostPort(listenAddr)
	if err != nil {
		return fmt.Errorf("probe %q: %w", listenAddr, err)
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	c := http.Client{Timeout: 3 * time.Second}
	resp, err := c.Get("http://" + net.JoinHostPort(host, port) + "/healthz")
	if err != nil {
		return fmt.Errorf("probe: %w", err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("probe: /healthz answered %d", resp.StatusCode)
	}
	return nil
}
