// Package testenv starts the real servers Snip's tests run against: an
// embedded nats-server with JetStream, and redis-server and clickhouse-server
// as child processes on free ports with their data in temporary folders.
//
// Nothing here is mocked, and nothing skips: a missing binary fails the test
// with a message that says how to install it (`bash .ci/run` does). Each test
// gets its own namespace: a fresh NATS server (cheap), its own Redis database
// number, its own ClickHouse database.
//
// Redis and ClickHouse are slow to start compared with a test, so a package
// usually starts one of each in TestMain (Main) and hands tests namespaces on
// it (RedisServer.NewDB, ClickHouseServer.NewDB). Tests that kill or restart a
// server start their own (StartRedis, StartClickHouse).
//
// Clusters: StartNATSCluster starts three nats-server processes with routes
// and JetStream (built once from the module with `go build`), returned once
// every node is healthy and the cluster places a stream on all three (a
// fresh meta leader cannot until it has heard each peer: topology.NoPeersYet;
// NATSCluster.ApplyTopology retries that answer), and
// StartRedisCluster six redis-servers forming a Redis Cluster of three
// masters with a replica each, both on free loopback ports, so tests can
// SIGKILL or SIGSTOP one node. WithRedisCluster and RunOnRedisCluster run a
// package's store tests again on a shared Redis Cluster.
//
// Child processes get SIGKILL when the test binary dies (Pdeathsig), so a
// crashed test run leaves no servers behind.
package testenv
