package redisstore

import "github.com/redis/go-redis/v9"

// applyScript writes one batch atomically. It checks that the partition's
// write generation and watermark are still those the batch was filtered
// against; looks the batch's event fingerprints up in the recent-ID record
// and its click IDs up in the verdict labels, and if anything is already
// counted or labelled otherwise than assumed, writes nothing and says so;
// else applies the aggregated increments, appends the fingerprints, moves
// the watermark, and switches reads to the write generation if a recount
// has just caught up.
//
// KEYS[1] meta, KEYS[2] the write generation's pos, KEYS[3..] the rest.
// ARGV: gen, wm, new wm, stored (unix ms), events counted, dedup TTL (ms),
// number of ID groups, number of label groups, referrer cap; then the ID
// groups (key, first position, fingerprints), the label groups (key, first
// position, count, then id and assumed label for each), then the ops:
//
//	h key field n          HINCRBY
//	r key field other n    HINCRBY; a new field that overfills the hash goes to other
//	                       (one call when the field exists, the common case)
//	p key count v...       PFADD
//	x key unix             EXPIREAT, if an op above created a field or changed
//	                       the HyperLogLog (a key is only ever created so, so
//	                       every key gets its expiry; most batches skip it)
var applyScript = redis.NewScript(`
local meta, pos = KEYS[1], KEYS[2]
local m = redis.call('HMGET', meta, 'read', 'write', 'until')
local write = tonumber(m[2]) or 1
local untl = tonumber(m[3]) or 0
local wm = tonumber(redis.call('HGET', pos, 'seq') or '0')
if write ~= tonumber(ARGV[1]) or wm ~= tonumber(ARGV[2]) then
  return {'conflict'}
end
local nid, nlab, cap = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local i = 10
local dups, labs, appends = {}, {}, {}
for _ = 1, nid do
  local key, start, blob = KEYS[tonumber(ARGV[i])], tonumber(ARGV[i+1]), ARGV[i+2]
  i = i + 3
  local data = redis.call('GET', key)
  if data then
    for j = 0, #blob / 8 - 1 do
      local fp = string.sub(blob, j*8 + 1, j*8 + 8)
      local s = 1
      while true do
        local at = string.find(data, fp, s, true)
        if not at then break end
        if (at - 1) % 8 == 0 then
          dups[#dups + 1] = start + j
          break
        end
        s = at + 1
      end
    end
  end
  appends[#appends + 1] = key
  appends[#appends + 1] = blob
end
for _ = 1, nlab do
  local key, start, n = KEYS[tonumber(ARGV[i])], tonumber(ARGV[i+1]), tonumber(ARGV[i+2])
  i = i + 3
  if redis.call('EXISTS', key) == 1 then
    local ids = {}
    for j = 1, n do ids[j] = ARGV[i + 2*(j-1)] end
    local got = redis.call('HMGET', key, unpack(ids))
    for j = 1, n do
      local have = ''
      if got[j] then have = string.sub(got[j], 1, 1) end
      if have ~= ARGV[i + 2*(j-1) + 1] then
        labs[#labs + 1] = start + j - 1
        labs[#labs + 1] = have
      end
    end
  else
    for j = 1, n do
      if ARGV[i + 2*(j-1) + 1] ~= '' then
        labs[#labs + 1] = start + j - 1
        labs[#labs + 1] = ''
      end
    end
  end
  i = i + 2*n
end
if #dups > 0 or #labs > 0 then
  return {'recheck', dups, labs}
end
local n = #ARGV
local fresh = {}
while i <= n do
  local op = ARGV[i]
  if op == 'h' then
    local k, d = tonumber(ARGV[i+1]), ARGV[i+3]
    if redis.call('HINCRBY', KEYS[k], ARGV[i+2], d) == tonumber(d) then fresh[k] = true end
    i = i + 4
  elseif op == 'r' then
    local key, f, n = KEYS[tonumber(ARGV[i+1])], ARGV[i+2], ARGV[i+4]
    if redis.call('HINCRBY', key, f, n) == tonumber(n) and redis.call('HLEN', key) > cap then
      redis.call('HDEL', key, f)
      redis.call('HINCRBY', key, ARGV[i+3], n)
    end
    i = i + 5
  elseif op == 'p' then
    local k, c = tonumber(ARGV[i+1]), tonumber(ARGV[i+2])
    if redis.call('PFADD', KEYS[k], unpack(ARGV, i+3, i+2+c)) == 1 then fresh[k] = true end
    i = i + 3 + c
  else
    local k = tonumber(ARGV[i+1])
    if fresh[k] then redis.call('EXPIREAT', KEYS[k], ARGV[i+2]) end
    i = i + 3
  end
end
for k = 1, #appends, 2 do
  redis.call('APPEND', appends[k], appends[k+1])
  redis.call('PEXPIRE', appends[k], ARGV[6])
end
redis.call('HSET', pos, 'seq', ARGV[3], 'stored', ARGV[4])
redis.call('HINCRBY', pos, 'events', ARGV[5])
if untl > 0 and tonumber(ARGV[3]) >= untl then
  redis.call('HSET', meta, 'read', write, 'write', write, 'until', 0)
  return {'switched'}
end
return {'ok'}
`)

// startScript begins a recount: a new write generation, numbered above
// every one in use, that takes over the reads when its watermark reaches
// until (at once when until is 0). A replay ID already seen changes nothing.
//
// KEYS[1] meta. ARGV: replay id, until. Returns {status, read, write, until}.
var startScript = redis.NewScript(`
local m = redis.call('HMGET', KEYS[1], 'read', 'write', 'until', 'replay')
local read = tonumber(m[1]) or 1
local write = tonumber(m[2]) or 1
if m[4] == ARGV[1] then
  return {'same', read, write, tonumber(m[3]) or 0}
end
local g = math.max(read, write) + 1
local untl = tonumber(ARGV[2])
if untl == 0 then read = g end
redis.call('HSET', KEYS[1], 'read', read, 'write', g, 'until', untl, 'replay', ARGV[1])
return {'started', read, g, untl}
`)

// correctScript applies one verdict. It checks the generations, orders the
// verdict against the label already recorded (by FRAUD sequence), records
// the new label, and if the label changed moves the click from its old to
// its new label in each generation whose watermark shows it counted it.
//
// KEYS[1] meta, KEYS[2] the label hash, then per generation: pos, link, day.
// ARGV: read, write, click id, fraud seq, new label, source label, click seq,
// label expiry (unix), country, referrer host, hour (HH), other-referrer
// name, combo cap, number of generations.
var correctScript = redis.NewScript(`
local m = redis.call('HMGET', KEYS[1], 'read', 'write')
if (tonumber(m[1]) or 1) ~= tonumber(ARGV[1]) or (tonumber(m[2]) or 1) ~= tonumber(ARGV[2]) then
  return {'conflict'}
end
local old = ARGV[6]
local cur = redis.call('HGET', KEYS[2], ARGV[3])
if cur then
  local l, fs = string.match(cur, '^(%a):(%d+)$')
  if tonumber(fs) >= tonumber(ARGV[4]) then return {'stale'} end
  old = l
end
local new = ARGV[5]
redis.call('HSET', KEYS[2], ARGV[3], new .. ':' .. ARGV[4])
redis.call('EXPIREAT', KEYS[2], ARGV[8])
if old == new then return {'unchanged'} end
local country, host, hour, other, cap = ARGV[9], ARGV[10], ARGV[11], ARGV[12], tonumber(ARGV[13])
local moved, k = 0, 3
for _ = 1, tonumber(ARGV[14]) do
  local pos, lk, dk = KEYS[k], KEYS[k+1], KEYS[k+2]
  k = k + 3
  if tonumber(redis.call('HGET', pos, 'seq') or '0') >= tonumber(ARGV[7]) then
    -- The click was counted under its host, or under (other) if the link
    -- was full then; a field once created is never removed, so the host
    -- field exists now exactly if it did then.
    local src = old .. '|' .. country .. '|' .. host
    if redis.call('HEXISTS', lk, src) == 0 then src = old .. '|' .. country .. '|' .. other end
    redis.call('HINCRBY', lk, src, -1)
    local dst = new .. '|' .. country .. '|' .. host
    if redis.call('HINCRBY', lk, dst, 1) == 1 and redis.call('HLEN', lk) > cap then
      redis.call('HDEL', lk, dst)
      redis.call('HINCRBY', lk, new .. '|' .. country .. '|' .. other, 1)
    end
    if redis.call('EXISTS', dk) == 1 then
      redis.call('HINCRBY', dk, old .. hour, -1)
      redis.call('HINCRBY', dk, new .. hour, 1)
    end
    moved = moved + 1
  end
end
return {'relabelled', moved}
`)

// linkScript records a LINKS event unless one at or after its sequence
// was recorded. KEYS[1] the registry key. ARGV: seq, state, owner, ts.
var linkScript = redis.NewScript(`
if tonumber(redis.call('HGET', KEYS[1], 'seq') or '0') >= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'seq', ARGV[1], 'state', ARGV[2], 'owner', ARGV[3], 'ts', ARGV[4])
return 1
`)
