// Package check holds the tests that keep deploy/ honest without a Docker
// engine: docker-compose.yml is loaded and validated with compose-go (the
// library `docker compose` itself uses) and read against the code (every
// environment variable a service is given is one its config.go declares, every
// service image is built from deploy/docker/Dockerfile with a SERVICE that
// exists, every service's stop_grace_period outlasts its SHUTDOWN_TIMEOUT,
// the partition count compose gives is the one deploy/nats is generated for);
// the NATS configurations are parsed by nats-server, started, and each
// service's user is checked to be able to do its job and nothing more;
// the docs are read against the code (the tests they cite exist, the metrics
// they name are registered, each service README names every variable its
// config.go reads, docs/dependencies.md explains exactly the modules in use);
// and the cost of JetStream's fsync settings is measured (BenchmarkSyncInterval).
package check
