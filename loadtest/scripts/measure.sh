#!/usr/bin/env bash
# The load-test measurements of docs/benchmarks.md ("Load test"), in order:
#   (1) ramp: a bare 302 handler, the redirect service alone, the redirect
#       inside `make demo`; one HTTP run through every reader with the oracle;
#   (2) nats bench, loadtest ceiling (a bare publisher and three bare acking
#       consumers: the denominator of the readers' rates) and loadtest events
#       on a standalone nats-server, then
#       loadtest events against `make demo` at rising rates with the oracle;
#   (3) a sustained flood (FLOOD_RATE, default 12,000/s, for FLOOD_DURATION,
#       default 300s, half on the viral link) through every reader, with the
#       memory of the demo's process (which runs the NATS server) sampled
#       every 10 s (RSS, and the Go heap from its profiles on port 8225),
#       a heap profile saved at the end of the load, then the oracle.
# Needs: make build, nats-server (the version pkg/go.mod requires) and nats (the CLI) on PATH, redis-server and
# clickhouse-server (for the demo), jq (for STEPS=goals), free ports 4222, 4333, 6390, 6391,
# 8080-8085, 8089, 8090, 8180, 8222, 8225, 19000. About 25 minutes.
#
#   loadtest/scripts/measure.sh                  # all of it
#   RATES="4000 6000" loadtest/scripts/measure.sh    # other event rates
#   STEPS=events loadtest/scripts/measure.sh     # only (2)
#   STEPS=ramp loadtest/scripts/measure.sh       # only the first two ramps of (1): a bare 302, the redirect alone
#   BARE_TO=30000 STEPS=ramp loadtest/scripts/measure.sh   # the bare ramp's top (default 24,000/s: a top it holds is no limit)
#   STEPS=redirect-cpu loadtest/scripts/measure.sh   # (7) CPU per click of each process, the bare 302 handler and
#                                                #     the redirect alone at CPU_RATE (default 6,000/s), ROUNDS times;
#                                                #     REDIRECT_SETTINGS="SNIP_COMMIT_LINGER=0,SNIP_RELAY_LINGER=5ms|defaults"
#                                                #     compares settings; a setting may name the binary it runs
#                                                #     with REDIRECT_BIN=<path> (default .demo/bin/redirect), e.g.
#                                                #     REDIRECT_SETTINGS="REDIRECT_BIN=/tmp/main/.demo/bin/redirect|defaults"
#                                                #     alternates another tree's build (git archive main, make build
#                                                #     there) with this one's
#   STEPS=flood loadtest/scripts/measure.sh      # only (3)
#   STEPS=hot loadtest/scripts/measure.sh        # (4) HOT_RATES with every click on one link
#   STEPS=cpu loadtest/scripts/measure.sh        # (5) CPU per click of every process, HTTP at CPU_RATE
#   STEPS=generator loadtest/scripts/measure.sh  # (10) the generator's own CPU a click (and the server's, storing what it
#                                                #     publishes) at GEN_RATE (20,000/s), no readers; GEN_BINS="<old> <new>"
#                                                #     alternates builds, ROUNDS times (default 2)
#   STEPS=goals loadtest/scripts/measure.sh      # (6) the ceiling, then in one fresh demo every reader at
#                                                #     PLAIN_RATE (default 16,000/s) with the flood not yet
#                                                #     labelled, then at FLOOD_RATE (default 12,000/s) with it
#                                                #     (PROFILE=1: a CPU profile of the demo's NATS server in each run)
#   DEMO_CLUSTER=1 STEPS=cpu loadtest/scripts/measure.sh   # the same on the clusters
#   LOAD_OWNER=demo STEPS=events loadtest/scripts/measure.sh   # the load also to the demo's webhook receiver
set -u
cd "$(dirname "$0")/../.."
B=$PWD/.demo/bin
# LOADTEST_BIN=<path> runs another build of the generator (e.g. an older
# tree's, to compare the generator's own cost a click in the same demo).
LT=${LOADTEST_BIN:-$B/loadtest}
OUT=${OUT:-$PWD/loadtest/reports/measure-$(date +%Y%m%d-%H%M%S)}
TMP=$(mktemp -d)
mkdir -p "$OUT"
KEY=snip_demo_local_only_0123456789

log() { echo "== $(date +%T) load $(cut -d' ' -f1-3 /proc/loadavg) :: $*"; }
waitport() {
	for _ in $(seq 1 300); do
		(echo >/dev/tcp/127.0.0.1/"$1") 2>/dev/null && return 0
		sleep 0.2
	done
	echo "port $1 never opened" >&2
	return 1
}
pids=()
stop() {
	for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
	wait 2>/dev/null
	pids=()
}
trap 'stop; rm -rf "$TMP"' EXIT

log "make build"
make build >/dev/null || exit 1
git log --oneline -1
# The standalone server (the ceiling, nats bench) must be the one the demo
# embeds, or the ratios compare two servers.
want=$(awk '$1 == "github.com/nats-io/nats-server/v2" {print $2}' pkg/go.mod)
have=$(nats-server --version 2>/dev/null | awk '{print $2}')
if [[ $have != "$want" ]]; then
	echo "nats-server on PATH is ${have:-missing}; the demo embeds $want: go install github.com/nats-io/nats-server/v2@$want" >&2
	exit 1
fi

if [[ ${STEPS:-all} == all || ${STEPS:-all} == ramp ]]; then
	$LT bare302 --addr 127.0.0.1:8090 >"$OUT/bare302.log" 2>&1 &
	pids+=($!)
	waitport 8090 || exit 1
	log "ramp: bare 302"
	$LT ramp --target http://127.0.0.1:8090 --create-links=false --from 1000 --to "${BARE_TO:-24000}" --step 1000 \
		--step-duration 5s --pause 2s --out "$OUT/ramp-bare302"
fi

nats-server -js -sd "$TMP/nats" -a 127.0.0.1 -p 4333 >"$OUT/nats.log" 2>&1 &
NATS_PID=$!
pids+=($!)
redis-server --port 6391 --bind 127.0.0.1 --save "" --appendonly no >"$OUT/redis.log" 2>&1 &
pids+=($!)
waitport 4333 && waitport 6391 || exit 1
NATS_URL=nats://127.0.0.1:4333 $B/snipctl topology apply >/dev/null || exit 1

if [[ ${STEPS:-all} == all || ${STEPS:-all} == ramp ]]; then
	HTTP_ADDR=127.0.0.1:8180 NATS_URL=nats://127.0.0.1:4333 REDIS_URL=redis://127.0.0.1:6391/0 \
		SNIP_BOOTSTRAP_OWNERS=demo:$KEY SNIP_TRUSTED_PROXIES=127.0.0.1/32 \
		$B/redirect >"$OUT/redirect.log" 2>&1 &
	pids+=($!)
	waitport 8180 || exit 1
	log "ramp: the redirect service alone"
	$LT ramp --target http://127.0.0.1:8180 --from 500 --to 12000 --step 500 --step-duration 5s \
		--pause 2s --links 1000 --out "$OUT/ramp-redirect"
fi
if [[ ${STEPS:-all} == ramp ]]; then
	log "done: reports in $OUT"
	exit 0
fi

# (7) CPU per click of each process at one HTTP rate: the bare 302 handler,
# then the redirect alone (this step's nats-server and redis-server) once
# per setting in REDIRECT_SETTINGS ("|" between settings, "," between the
# variables of one; "defaults": none set), ROUNDS times in turn.
# Each is sampled for 10 s of a 25 s step; the redirect's from its first
# recorded click, after its links are created.
ticks() { awk '{ print $14 + $15 }' /proc/"$1"/stat; }
if [[ ${STEPS:-all} == redirect-cpu ]]; then
	rate=${CPU_RATE:-6000}
	hz=$(getconf CLK_TCK)
	nats_pid=${pids[0]} redis_pid=${pids[1]}
	# perclick <name> <ticks before> <ticks after> <seconds>
	perclick() { awk -v n="$1" -v a="$2" -v b="$3" -v s="$4" -v r="$rate" -v hz="$hz" 'BEGIN { printf " %s %.0f", n, (b - a) / hz * 1e6 / (s * r) }'; }
	sample() { # sample <label> <service pid> <generator pid>
		local n0 r0 s0 g0 n1 r1 s1 g1 t0 t1
		redis-cli -p 6391 config resetstat >/dev/null
		n0=$(ticks "$nats_pid") r0=$(ticks "$redis_pid") s0=$(ticks "$2") g0=$(ticks "$3") t0=$(date +%s.%N)
		sleep 10
		n1=$(ticks "$nats_pid") r1=$(ticks "$redis_pid") s1=$(ticks "$2") g1=$(ticks "$3") t1=$(date +%s.%N)
		local secs
		secs=$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')
		{
			printf '%s at %d/s, CPU µs per click:' "$1" "$rate"
			perclick service "$s0" "$s1" "$secs"
			perclick nats-server "$n0" "$n1" "$secs"
			perclick redis-server "$r0" "$r1" "$secs"
			perclick generator "$g0" "$g1" "$secs"
			echo
			redis-cli -p 6391 info commandstats | awk -F'[:,=]' -v s="$secs" \
				'/^cmdstat_(xadd|xread|evalsha)/ { printf "  redis %s: %.0f calls/s, %s µs a call\n", substr($1, 9), $3 / s, $7 }'
		} | tee -a "$OUT/redirect-cpu.txt"
	}
	$LT bare302 --addr 127.0.0.1:8090 >"$OUT/bare302.log" 2>&1 &
	bare_pid=$!
	waitport 8090 || exit 1
	IFS='|' read -r -a settings <<<"${REDIRECT_SETTINGS:-defaults}"
	for round in $(seq 1 "${ROUNDS:-2}"); do
		$LT ramp --target http://127.0.0.1:8090 --create-links=false --from "$rate" --to "$rate" --step 1000 \
			--step-duration 25s --retries 0 --out "$OUT/cpu-bare-$round" >/dev/null 2>&1 &
		gen=$!
		sleep 5 # the step starts at once; 5 s of warm-up
		sample "round $round: bare 302" "$bare_pid" "$gen"
		wait "$gen"
		jq -r '.steps[0] | "  the step: \(.achieved | floor)/s achieved, \(.errors) errors, p50 \(.p50_ms) ms, p99 \(.p99_ms) ms"' \
			"$OUT/cpu-bare-$round/ramp.json" | tee -a "$OUT/redirect-cpu.txt"
		for i in "${!settings[@]}"; do
			setting=${settings[$i]}
			vars=${setting//,/ }
			[[ $setting == defaults ]] && vars=
			bin=$B/redirect
			for v in $vars; do [[ $v == REDIRECT_BIN=* ]] && bin=${v#REDIRECT_BIN=}; done
			env $vars HTTP_ADDR=127.0.0.1:8180 NATS_URL=nats://127.0.0.1:4333 REDIS_URL=redis://127.0.0.1:6391/0 \
				SNIP_BOOTSTRAP_OWNERS=demo:$KEY SNIP_TRUSTED_PROXIES=127.0.0.1/32 \
				"$bin" >"$OUT/redirect-cpu-$round-$i.log" 2>&1 &
			svc=$!
			waitport 8180 || exit 1
			$LT ramp --target http://127.0.0.1:8180 --from "$rate" --to "$rate" --step 1000 --step-duration 25s \
				--retries 0 --links 1000 --out "$OUT/cpu-redirect-$round-$i" >/dev/null 2>&1 &
			gen=$!
			for _ in $(seq 1 300); do # until the links are made and the clicks begin
				curl -fsS http://127.0.0.1:8180/metrics 2>/dev/null | grep -q '^snip_redirect_clicks_recorded_total' && break
				sleep 0.1
			done
			sleep 3 # warm-up
			sample "round $round: redirect ($setting)" "$svc" "$gen"
			batch=$(curl -fsS http://127.0.0.1:8180/metrics | awk '/^snip_redirect_commit_batch_size_sum/ { s = $2 } /^snip_redirect_commit_batch_size_count/ { c = $2 } END { if (c) printf "%.1f", s / c }')
			echo "  clicks per group commit (whole run): $batch" | tee -a "$OUT/redirect-cpu.txt"
			wait "$gen"
			# The figures above divide by the rate asked for: a step that fell
			# short of it, or answered errors, says so here.
			jq -r '.steps[0] | "  the step: \(.achieved | floor)/s achieved, \(.errors) errors, p50 \(.p50_ms) ms, p99 \(.p99_ms) ms"' \
				"$OUT/cpu-redirect-$round-$i/ramp.json" | tee -a "$OUT/redirect-cpu.txt"
			kill "$svc"
			wait "$svc" 2>/dev/null
			redis-cli -p 6391 flushall >/dev/null
		done
	done
	kill "$bare_pid"
	log "done: reports in $OUT"
	exit 0
fi

if [[ ${STEPS:-all} == generator ]]; then
	# The generator's own cost a click: `loadtest events` at GEN_RATE
	# (default 20,000/s) into the standalone server, no readers, for 30 s;
	# the CPU of the generator and of the server over 20 s in the middle.
	# GEN_BINS lists the builds to alternate (default this tree's), ROUNDS
	# times.
	for round in $(seq 1 "${ROUNDS:-2}"); do
		for bin in ${GEN_BINS:-$LT}; do
			NATS_URL=nats://127.0.0.1:4333 $bin events --rate "${GEN_RATE:-20000}" --duration 30s --links 1000 --viral 0.5 \
				--counter-url off --clickhouse off --fraud off --out "$OUT/generator-$round-$(basename "$bin")" >"$TMP/gen.log" 2>&1 &
			gen=$!
			sleep 5 # into the load: a measured interval of fixed length, not a wait for a condition
			g0=$(awk '{print $14 + $15}' /proc/$gen/stat) n0=$(awk '{print $14 + $15}' /proc/"$NATS_PID"/stat)
			sleep 20
			g1=$(awk '{print $14 + $15}' /proc/$gen/stat) n1=$(awk '{print $14 + $15}' /proc/"$NATS_PID"/stat)
			wait $gen
			awk -v r="${GEN_RATE:-20000}" -v g=$((g1 - g0)) -v n=$((n1 - n0)) -v tck="$(getconf CLK_TCK)" -v b="$bin" -v round="$round" \
				'BEGIN { printf "round %d %s: generator %.1f µs a click, nats-server %.1f\n", round, b, g / tck / (20 * r) * 1e6, n / tck / (20 * r) * 1e6 }' |
				tee -a "$OUT/generator.txt"
		done
	done
	stop
	log "done: reports in $OUT"
	exit 0
fi

if [[ ${STEPS:-all} == goals ]]; then
	log "loadtest ceiling: a bare publisher and three bare acking consumers"
	NATS_URL=nats://127.0.0.1:4333 $LT ceiling --duration 20s | tee "$OUT/ceiling.txt"
	CEILING=$(sed -n 's/^ceiling: \([0-9]*\) events\/s$/\1/p' "$OUT/ceiling.txt")
elif [[ ${STEPS:-all} != flood && ${STEPS:-all} != hot && ${STEPS:-all} != cpu ]]; then
log "nats bench js pub"
nats -s nats://127.0.0.1:4333 bench js pub async --create --dedup --size 450B --msgs 300000 \
	--batch 500 --no-progress bench.clicks
log "loadtest ceiling: a bare publisher and three bare acking consumers"
NATS_URL=nats://127.0.0.1:4333 $LT ceiling --duration 20s | tee "$OUT/ceiling.txt"
CEILING=$(sed -n 's/^ceiling: \([0-9]*\) events\/s$/\1/p' "$OUT/ceiling.txt")
for r in 15000 20000 25000 30000 40000; do
	log "loadtest events at $r/s, no readers"
	NATS_URL=nats://127.0.0.1:4333 $LT events --rate "$r" --duration 20s --links 1000 --viral 0.5 \
		--counter-url off --clickhouse off --fraud off --out "$OUT/events-noreaders-$r" 2>&1 |
		grep -vE '^ *[0-9]+s (load|drain) '
done
fi
stop

# DEMO_CLUSTER=1: the demo on a 3-node NATS cluster (streams R3) and a
# Redis Cluster of 3 masters and 3 replicas (`snipctl demo --cluster`).
PROF_PORT=8225 # the demo process's profiles (its embedded NATS server); not with DEMO_CLUSTER
if [[ -n ${DEMO_CLUSTER:-} ]]; then
	demo_flags=(--cluster)
else
	demo_flags=(--nats-prof-port "$PROF_PORT")
fi
$B/snipctl demo --dir "$TMP/demo" --bin "$B" --rate 0 "${demo_flags[@]}" >"$OUT/demo.log" 2>&1 &
pids+=($!)
DEMO_PID=$!
for p in 8080 8081 8082 8083 19000; do waitport $p || { tail -30 "$OUT/demo.log"; exit 1; }; done
for _ in $(seq 1 240); do # the warehouse is ready once ClickHouse is
	curl -fsS http://127.0.0.1:8083/readyz >/dev/null 2>&1 && break
	sleep 0.5
done
if [[ -n ${DEMO_CLUSTER:-} ]]; then
	NATS_URL=$(grep -o 'nats://[^ ]* (3 nodes' "$OUT/demo.log" | head -1 | cut -d' ' -f1)
	[[ -n $NATS_URL ]] || { echo "no cluster NATS URL in the demo's output" >&2; tail -30 "$OUT/demo.log"; exit 1; }
	export NATS_URL
	log "make demo-cluster is up: NATS $NATS_URL"
else
	log "make demo is up"
fi

# The load's clicks belong to owner LOAD_OWNER (default "load"), which has
# no webhook endpoint, like most owners at 100,000 clicks/s: the webhooks
# group's consumers are narrowed to the owners with click endpoints, so the
# server does not send it the load at all. The demo's own receiver wants
# every click of the demo owner: LOAD_OWNER=demo measures the load with an
# endpoint that wants all of it (every click queued, signed and POSTed).
LOAD_OWNER=${LOAD_OWNER:-load}
if [[ $LOAD_OWNER != demo ]]; then
	DEMO_REDIS=$(grep -o 'redis[+a-z]*://[^ ]*' "$OUT/demo.log" | head -1)
	SNIP_API_KEY=$(REDIS_URL=$DEMO_REDIS $B/snipctl owners create "$LOAD_OWNER" | sed -n 's/^api key: //p')
	[[ -n $SNIP_API_KEY ]] || { echo "could not create owner $LOAD_OWNER in $DEMO_REDIS" >&2; exit 1; }
	export SNIP_API_KEY
fi
log "the load's owner: $LOAD_OWNER"

if [[ ${STEPS:-all} == all ]]; then
	log "ramp: the redirect inside the demo"
	$LT ramp --target http://127.0.0.1:8080 --from 500 --to 6000 --step 500 --step-duration 5s \
		--pause 2s --links 1000 --out "$OUT/ramp-demo"
	log "HTTP through every reader, with the oracle"
	$LT http --target http://127.0.0.1:8080 --rate 400 --duration 15s --links 50 --viral 0.3 \
		--require counter,warehouse,fraud --verify --out "$OUT/http-verify" 2>&1 | grep -vE '^ *[0-9]+s (load|drain) '
fi

warmup() {
	# Fraud detection does not judge a link first seen within a minute
	# (its flood window) of its state's start: its clicks before the start
	# were not seen. A run of 70 s first, so the next run's viral link is
	# new to a state older than that and judged a flood (every one of its
	# clicks labelled). 20 s was not enough: the flood went unlabelled.
	log "warm-up run, 1000 events/s for 70s"
	$LT events --owner "$LOAD_OWNER" --rate 1000 --duration 70s --links 100 --viral 0.5 --require counter,warehouse,fraud \
		--out "$OUT/warmup" 2>&1 | grep -vE '^ *[0-9]+s (load|drain) '
}

# cputicks prints "<name> <utime+stime in ticks>" for the demo process
# (which runs the NATS server, unless DEMO_CLUSTER) and each process it
# started (the nodes of a cluster add up under one name).
cputicks() {
	local self="nats-server(snipctl-demo)"
	[[ -n ${DEMO_CLUSTER:-} ]] && self="snipctl-demo"
	for pid in "$DEMO_PID" $(pgrep -P "$DEMO_PID"); do
		awk -v pid="$pid" -v self="$self" '{ n = $2; gsub(/[()]/, "", n); if (pid == dp) n = self; print n, $14 + $15 }' \
			dp="$DEMO_PID" /proc/"$pid"/stat 2>/dev/null
	done
}

if [[ ${STEPS:-all} == cpu ]]; then
	# Where the time goes: CPU per click of every process, from one HTTP
	# run through every reader at a rate the demo holds (CPU_RATE), less
	# each process's idle CPU measured for 30 s before it. The generator's
	# own CPU comes from the shell's children times.
	RATES=none
	rate=${CPU_RATE:-1500}
	warmup
	log "cpu: 30 s idle"
	cputicks >"$TMP/idle0"
	t0=$(date +%s.%N)
	sleep 30 # a measured idle interval of fixed length, not a wait for a condition
	cputicks >"$TMP/idle1"
	t1=$(date +%s.%N)
	log "cpu: HTTP at $rate/s for ${CPU_DURATION:-60s} through every reader"
	cputicks >"$TMP/load0"
	t2=$(date +%s.%N)
	bash -c "$LT http --target http://127.0.0.1:8080 --rate $rate --duration ${CPU_DURATION:-60s} --links 1000 --viral 0.5 \
		--require counter,warehouse,fraud --out $OUT/cpu-$rate; times" >"$OUT/cpu-run.txt" 2>&1
	cputicks >"$TMP/load1"
	t3=$(date +%s.%N)
	grep -vE '^ *[0-9]+s (load|drain) ' "$OUT/cpu-run.txt"
	clicks=$(sed -n 's/^ *achieved throughput *[0-9]*\/s (\([0-9]*\) ok.*/\1/p' "$OUT/cpu-run.txt" | head -1)
	gen=$(tail -1 "$OUT/cpu-run.txt" | awk '{ split($1, u, /[ms]/); split($2, s, /[ms]/); print (u[1] * 60 + u[2]) + (s[1] * 60 + s[2]) }')
	tck=$(getconf CLK_TCK)
	log "cpu: $clicks clicks; CPU µs per click (load interval less idle rate):"
	awk -v tck="$tck" -v idle="$(echo "$t1 - $t0" | bc)" -v load="$(echo "$t3 - $t2" | bc)" -v clicks="$clicks" -v gen="$gen" '
		FILENAME ~ /idle0$/ { i0[$1] += $2 } FILENAME ~ /idle1$/ { i1[$1] += $2 }
		FILENAME ~ /load0$/ { l0[$1] += $2 } FILENAME ~ /load1$/ { l1[$1] += $2 }
		END {
			printf "%-28s %12s %12s %12s\n", "process", "load s", "idle s/s", "µs/click"
			for (n in l1) {
				used = (l1[n] - l0[n]) / tck; rest = (i1[n] - i0[n]) / tck / idle
				net = used - rest * load; tot += net
				printf "%-28s %12.2f %12.4f %12.1f\n", n, used, rest, net / clicks * 1e6
			}
			printf "%-28s %12.2f %12s %12.1f\n", "loadtest (generator)", gen, "-", gen / clicks * 1e6
			printf "%-28s %12s %12s %12.1f\n", "total", "", "", (tot + gen) / clicks * 1e6
		}' "$TMP/idle0" "$TMP/idle1" "$TMP/load0" "$TMP/load1" | tee "$OUT/cpu-per-click.txt"
fi

if [[ ${STEPS:-all} == hot ]]; then
	# One hot partition: every click but the injected bursts on one link,
	# so each reader group reads it with one member.
	RATES=none
	warmup
	for r in ${HOT_RATES:-2000 4000 6000}; do
		log "loadtest events at $r/s, every click on the viral link (one partition), every reader"
		$LT events --owner "$LOAD_OWNER" --rate "$r" --duration 60s --links 1000 --viral 1.0 --require counter,warehouse,fraud \
			--verify --deadline 300s --out "$OUT/hot-$r" 2>&1 | grep -vE '^ *[0-9]+s (load|drain) '
	done
fi

if [[ ${STEPS:-all} == goals ]]; then
	# The two keep-up goals in one fresh demo. Fraud detection does not
	# judge a link first seen within a minute of its state's start, so the
	# first run (no warm-up) is the load without the flood labelled; the
	# second run's viral link is new to a state more than a minute old, so
	# every one of its clicks is labelled (the report's fraud verdicts row
	# counts the link_flood labels: the check that each run was what it
	# claims). Kept up is loadtest's keep-up rule (its summary and
	# report.json): every reader's lag in the second half of the load at
	# most 10 s of load, and every reader caught up within 10 s of its end.
	RATES=none
	goal() { # name rate
		local name=$1 rate=$2 rep="$OUT/goal-$1/report.json"
		log "goal run $name: every reader at $rate events/s for 60s"
		cputicks >"$TMP/goal0"
		if [[ -n ${PROFILE:-} && -z ${DEMO_CLUSTER:-} ]]; then
			# PROFILE=1: 25 s of the demo process's CPU (its embedded NATS
			# server) from 20 s into the load.
			(sleep 20 && curl -fsS -o "$OUT/goal-$name-nats-cpu.pb.gz" "http://127.0.0.1:$PROF_PORT/debug/pprof/profile?seconds=25") &
		fi
		# The generator shares the cores with what it loads: its own CPU
		# (the shell's children times, load and verification) is reported
		# with the demo's processes.
		bash -c "$LT events --owner $LOAD_OWNER --rate $rate --duration 60s --links 1000 --viral 0.5 --require counter,warehouse,fraud \
			--verify --deadline 300s --out $OUT/goal-$name; times" 2>&1 | grep -vE '^ *[0-9]+s (load|drain) ' | tee "$OUT/goal-$name.txt"
		cputicks >"$TMP/goal1"
		tail -1 "$OUT/goal-$name.txt" | awk -v tck="$(getconf CLK_TCK)" '{ split($1, u, /[ms]/); split($2, s, /[ms]/); print "loadtest-events", ((u[1] * 60 + u[2]) + (s[1] * 60 + s[2])) * tck }' \
			>>"$TMP/goal1"
		[[ -f $rep ]] || { echo "no report for goal run $name" >&2; return 1; }
		echo "--- goal run $name: labels, the ceiling, kept up? (loadtest's keep-up rule, in its summary above)"
		jq -r '.verify.rows[] | select(.sink | startswith("fraud verdicts")) | "labels: " + .note' "$rep"
		jq -r --argjson ceiling "${CEILING:-0}" '
			.summary.throughput as $got
			| "achieved \($got | floor)/s = \(if $ceiling > 0 then ($got / $ceiling * 100 | floor) / 100 else "?" end) x ceiling (\($ceiling))",
			  "kept up: \(if .keep_up.unknown then "unknown (\(.keep_up.unknown))" elif .keep_up.kept_up then "yes" else "NO" end)"' "$rep"
		jq -r 'if .verify.passed then "oracle: PASS" else "oracle: FAIL" end' "$rep"
		echo "CPU seconds over the run (the load, then until every reader had it; the generator's verification included):"
		awk -v tck="$(getconf CLK_TCK)" 'FILENAME ~ /goal0$/ { a[$1] -= $2 } FILENAME ~ /goal1$/ { a[$1] += $2 }
			END { for (n in a) { printf "  %-28s %8.2f\n", n, a[n] / tck; t += a[n] / tck } printf "  %-28s %8.2f\n", "(total)", t }' \
			"$TMP/goal0" "$TMP/goal1" | sort
		if [[ -s $OUT/goal-$name-nats-cpu.pb.gz ]] && command -v go >/dev/null; then
			echo "the demo process's CPU, 25 s of the load ($OUT/goal-$name-nats-cpu.pb.gz), inclusive:"
			go tool pprof -top -cum -nodecount=25 "$B/snipctl" "$OUT/goal-$name-nats-cpu.pb.gz" 2>/dev/null | sed -n '/flat%/,$p'
		fi
	}
	goal plain "${PLAIN_RATE:-16000}"
	goal flood "${FLOOD_RATE:-12000}"
fi

if [[ ${STEPS:-all} == flood ]]; then
	RATES=none
	rate=${FLOOD_RATE:-12000}
	warmup
	# The demo process runs the NATS server embedded; with DEMO_CLUSTER the
	# NATS nodes are processes of their own and this samples only the demo.
	log "flood: $rate events/s for ${FLOOD_DURATION:-300s}, every reader; memory of the demo process every 10 s"
	# RSS, the Go heap allocated (HeapAlloc: live data and garbage not yet
	# collected, so it swings with every GC cycle), what the last GC found
	# live (half the next GC's target, NextGC, at the default GOGC=100),
	# and what the runtime has asked the OS for (Sys).
	heap() { curl -fsS "http://127.0.0.1:$PROF_PORT/debug/pprof/heap?debug=1" 2>/dev/null | awk '/^# HeapAlloc = / {h = $4} /^# NextGC = / {g = $4} /^# Sys = / {s = $4} END {if (h) printf "heap %d MB, live %d MB, sys %d MB", h / 1048576, g / 2 / 1048576, s / 1048576}'; }
	(
		while kill -0 "$DEMO_PID" 2>/dev/null; do
			echo "$(date +%T) rss $(awk '/^VmRSS/ {printf "%d", $2 / 1024}' /proc/"$DEMO_PID"/status) MB, $(heap)"
			sleep 10
		done
	) >"$OUT/flood-rss.txt" &
	pids+=($!)
	dur=${FLOOD_DURATION:-300s}
	[[ $dur =~ ^[0-9]+s$ ]] || { echo "FLOOD_DURATION=$dur: want seconds, as 300s" >&2; exit 2; }
	(
		# The heap profile near the end of the load: what the server holds.
		sleep $((${dur%s} - 5))
		curl -fsS -o "$OUT/flood-heap.pb.gz" "http://127.0.0.1:$PROF_PORT/debug/pprof/heap"
	) &
	pids+=($!)
	$LT events --owner "$LOAD_OWNER" --rate "$rate" --duration "$dur" --links 1000 --viral 0.5 \
		--require counter,warehouse,fraud --verify --deadline 600s --out "$OUT/flood-$rate" 2>&1 | grep -vE '^ *[0-9]+s (load|drain) '
	log "memory of the demo process, every 10 s:"
	cat "$OUT/flood-rss.txt"
	if [[ -s $OUT/flood-heap.pb.gz ]] && command -v go >/dev/null; then
		log "the demo process's heap 5 s before the load's end ($OUT/flood-heap.pb.gz):"
		go tool pprof -sample_index=inuse_space -top -nodecount=12 "$B/snipctl" "$OUT/flood-heap.pb.gz" 2>/dev/null | sed -n '/flat%/,$p'
	fi
fi

for r in ${RATES:-1000 2000 4000 6000 8000}; do
	[[ $r == none ]] && break
	log "loadtest events at $r/s, every reader"
	$LT events --owner "$LOAD_OWNER" --rate "$r" --duration 60s --links 1000 --viral 0.5 --require counter,warehouse,fraud \
		--verify --deadline 300s --out "$OUT/events-$r" 2>&1 | grep -vE '^ *[0-9]+s (load|drain) ' | tee "$OUT/events-$r.txt"
	if [[ -n ${CEILING:-} ]]; then
		# "kept up?" is the report's verdict above; this is the rate the
		# generator achieved (not the one offered) against the ceiling.
		got=$(sed -n 's/^ *achieved throughput *\([0-9]*\)\/s.*/\1/p' "$OUT/events-$r.txt" | head -1)
		echo "readers at $r events/s offered, ${got:-?}/s achieved = $(awk -v r="${got:-0}" -v c="$CEILING" 'BEGIN { printf "%.2f", r / c }') x ceiling ($CEILING events/s)"
	fi
done
log "done: reports in $OUT"
