package main

import (
	"context"
	"flag"
	"fmt"
	"net/http"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/snipdev/snip/pkg/webserver"
)

// cmdBare302 serves GET /:code with a bare 302 on the same HTTP shell as the
// services (pkg/webserver: echo, recovery, request IDs), and nothing else:
// no Redis, no outbox. Ramping it and the redirect service in one session
// shows what the redirect's own work costs.
func cmdBare302(ctx context.Context, env *Env, args []string) error {
	fs := flag.NewFlagSet("bare302", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:8090", "listen address")
	if err := parse(fs, args, env.Stderr); err != nil {
		return err
	}
	srv := bare302(env)
	return srv.Serve(ctx, *addr, func(a string) { fmt.Fprintf(env.Stderr, "bare302 listening on http://%s\n", a) }, 5*time.Second)
}

func bare302(env *Env) *webserver.Server {
	srv := webserver.New(env.Log, prometheus.NewRegistry())
	location := []string{"https://example.com/"}
	srv.Echo.GET("/:code", func(c echo.Context) error {
		c.Response().Header()["Location"] = location
		c.Response().WriteHeader(http.StatusFound)
		return nil
	})
	return srv
}
