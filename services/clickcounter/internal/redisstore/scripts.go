package redisstore

import "github.com/redis/go-redis/v9"

// idsFromLua reads a recent-ID bucket: 8-byte fingerprints, after a 20-byte
// header ("#" and the 19-digit first sequence the bucket vouches for) in a
// bucket made since the header exists. A bucket without one (its length a
// multiple of 8) vouches for everything, as every bucket did before.
const idsFromLua = `
local function idsFrom(data)
  if #data % 8 == 4 then return 21 end
  return 1
end
local function idsVouchFrom(data)
  if #data % 8 == 4 then return tonumber(string.sub(data, 2, 20)) end
  return 0
end
`

// applyScript writes one batch atomically. It checks that the partition's
// write generation and watermark are still those the batch was filtered
// against; looks the batch's event fingerprints up in the recent-ID record
// and its click IDs up in the verdict labels, and if anything is already
// counted or labelled otherwise than assumed, writes nothing and says so;
// else applies the aggregated increments, appends the fingerprints, moves
// the watermark, and switches reads to the write generation if a recount
// has just caught up.
//
// KEYS[1] meta, KEYS[2] the write generation's pos, KEYS[3] its recent-ID
// index, KEYS[4..] the rest.
// ARGV: gen, wm, new wm, stored (unix ms), events counted, dedup TTL (ms),
// number of ID groups, number of label groups, referrer cap, the referrer
// a link's fields beyond the cap go to ("(other)"), the batch's first
// sequence (recorded as the pos's "first" by a generation's first write),
// the write's token (recorded as the pos's "tok" with the watermark, so a
// writer whose answer was lost can tell its write landed); then the ID
// groups (key, first position, fingerprints), the label groups (key, first
// position, count, the click IDs packed in one value of 36 bytes each, and
// the assumed labels in one value of a byte each, '-' for none: a label
// hash that does not exist, the common case, costs one EXISTS and no Lua
// string per click), then the counts, one group per link and day:
//
//	k at nf field n ... nh field n ... nv v ...
//
// KEYS[k] is the day hash and, if the day has visitors, KEYS[k+1] their
// HyperLogLog; on a link's first day (nf > 0) KEYS[k-1] is the link hash.
// at is the day's keys' expiry (unix; 0: leave it). Then the link's nf
// fields, each a HINCRBY (a new field that overfills the hash goes to its
// label and country's "(other)" referrer field: one call when the field
// exists, the common case); the day's nh hour fields, each a HINCRBY; and
// its nv visitors, PFADD in commands of 1,000 (Lua's unpack fails beyond
// about 8,000, and a script that fails halfway keeps what it wrote).
//
// The recent-ID keys the batch appended to are scored in the index by the
// batch's stored time (the last event's; ZADD GT), and the keys scored
// more than the dedup window before it are deleted: a key goes once the
// partition's position has passed its events by the window (a copy stored
// within the window of its first copy is counted before that), or when its
// TTL of the window runs out, whichever comes first. Live, the two agree;
// in a catch-up, which counts an hour of clicks in a minute, the TTL alone
// kept a key for nearly every click of the last window of wall time.
//
// A key's EXPIREAT is called if a command above created a field or
// changed the HyperLogLog (a key is only ever created so, so every key
// gets its expiry; most batches skip it). The store sends 0 for a day
// whose keys an applied batch has already given their expiry
// (Store.expiring). A field costs two arguments and a link and day five,
// with the keys in a row named by one index: an op code and a key index
// per field would cost twice as many.
var applyScript = redis.NewScript(idsFromLua + `
local meta, pos = KEYS[1], KEYS[2]
local m = redis.call('HMGET', meta, 'read', 'write', 'until')
local write = tonumber(m[2]) or 1
local untl = tonumber(m[3]) or 0
local wm = tonumber(redis.call('HGET', pos, 'seq') or '0')
if write ~= tonumber(ARGV[1]) or wm ~= tonumber(ARGV[2]) then
  return {'conflict'}
end
local nid, nlab, cap, other = tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9]), ARGV[10]
local i = 13
local dups, labs, appends = {}, {}, {}
for _ = 1, nid do
  local key, start, blob = KEYS[tonumber(ARGV[i])], tonumber(ARGV[i+1]), ARGV[i+2]
  i = i + 3
  -- The key holds every fingerprint counted in its span of ID time, the
  -- batch a few of them: index the batch's and run through the key once.
  local data = redis.call('GET', key)
  if data then
    local mine, sub = {}, string.sub
    for j = 0, #blob / 8 - 1 do mine[sub(blob, j*8 + 1, j*8 + 8)] = start + j end
    for o = idsFrom(data), #data - 7, 8 do
      local j = mine[sub(data, o, o + 7)]
      if j then dups[#dups + 1] = j end
    end
  else
    -- A new bucket (or one made again after it expired) can vouch only for
    -- the events counted from this batch on: it starts with the first
    -- sequence past the watermark ("#" and 19 digits, 20 bytes, so its
    -- length is 4 more than a multiple of 8, unlike a bucket of
    -- fingerprints alone).
    blob = string.format('#%019d', tonumber(ARGV[2]) + 1) .. blob
  end
  appends[#appends + 1] = key
  appends[#appends + 1] = blob
end
for _ = 1, nlab do
  local key, start, n, ids, asm = KEYS[tonumber(ARGV[i])], tonumber(ARGV[i+1]), tonumber(ARGV[i+2]), ARGV[i+3], ARGV[i+4]
  i = i + 5
  if redis.call('EXISTS', key) == 1 then
    for s = 1, n, 1000 do
      local e = math.min(s + 999, n)
      local part = {}
      for j = s, e do part[j - s + 1] = string.sub(ids, j*36 - 35, j*36) end
      local got = redis.call('HMGET', key, unpack(part))
      for j = s, e do
        local have, want = '', string.sub(asm, j, j)
        if got[j - s + 1] then have = string.sub(got[j - s + 1], 1, 1) end
        if want == '-' then want = '' end
        if have ~= want then
          labs[#labs + 1] = start + j - 1
          labs[#labs + 1] = have
        end
      end
    end
  elseif string.find(asm, '[^-]') then
    for j = 1, n do
      if string.sub(asm, j, j) ~= '-' then
        labs[#labs + 1] = start + j - 1
        labs[#labs + 1] = ''
      end
    end
  end
end
if #dups > 0 or #labs > 0 then
  return {'recheck', dups, labs}
end
local n = #ARGV
while i <= n do
  local k, at, nf = tonumber(ARGV[i]), ARGV[i+1], tonumber(ARGV[i+2])
  i = i + 3
  if nf > 0 then
    local lkey = KEYS[k-1]
    for _ = 1, nf do
      local f, d = ARGV[i], ARGV[i+1]
      if redis.call('HINCRBY', lkey, f, d) == tonumber(d) and redis.call('HLEN', lkey) > cap then
        -- f is "<label>|<country>|<referrer>": keep "<label>|<country>|"
        redis.call('HDEL', lkey, f)
        redis.call('HINCRBY', lkey, string.sub(f, 1, string.find(f, '|', 3, true)) .. other, d)
      end
      i = i + 2
    end
  end
  local dkey, nh = KEYS[k], tonumber(ARGV[i])
  i = i + 1
  local fresh = false
  for _ = 1, nh do
    local d = ARGV[i+1]
    if redis.call('HINCRBY', dkey, ARGV[i], d) == tonumber(d) then fresh = true end
    i = i + 2
  end
  if fresh and at ~= '0' then redis.call('EXPIREAT', dkey, at) end
  local nv = tonumber(ARGV[i])
  i = i + 1
  if nv > 0 then
    local ukey, last = KEYS[k+1], i + nv - 1
    fresh = false
    for s = i, last, 1000 do
      if redis.call('PFADD', ukey, unpack(ARGV, s, math.min(s + 999, last))) == 1 then fresh = true end
    end
    if fresh and at ~= '0' then redis.call('EXPIREAT', ukey, at) end
    i = last + 1
  end
end
local idx, stored = KEYS[3], tonumber(ARGV[4])
for k = 1, #appends, 2 do
  redis.call('APPEND', appends[k], appends[k+1])
  redis.call('PEXPIRE', appends[k], ARGV[6])
  if stored > 0 then redis.call('ZADD', idx, 'GT', stored, appends[k]) end
end
if stored > 0 then
  -- The buckets whose last events were stored a window before this batch's
  -- last: a copy of them stored within the window has been counted
  -- already. In a catch-up that is seconds of wall time, not the window.
  -- (The keys deleted are the index's members, not in KEYS: they carry the
  -- partition's hash tag, so they are in this script's slot.)
  local cut = string.format('(%d', stored - tonumber(ARGV[6]))
  repeat
    local old = redis.call('ZRANGEBYSCORE', idx, '-inf', cut, 'LIMIT', 0, 1000)
    if #old > 0 then
      redis.call('DEL', unpack(old))
      redis.call('ZREM', idx, unpack(old))
    end
  until #old < 1000
  if #appends > 0 then redis.call('PEXPIRE', idx, ARGV[6]) end
end
-- A generation that has counted nothing starts at this batch (unless a
-- recount's start recorded where): it counts nothing before it, which the
-- verdict script's watermark must not say it did.
if wm == 0 then redis.call('HSETNX', pos, 'first', ARGV[11]) end
redis.call('HSET', pos, 'seq', ARGV[3], 'stored', ARGV[4], 'tok', ARGV[12])
redis.call('HINCRBY', pos, 'events', ARGV[5])
if untl > 0 and tonumber(ARGV[3]) >= untl then
  redis.call('HSET', meta, 'read', write, 'write', write, 'until', 0)
  return {'switched'}
end
return {'ok'}
`)

// startScript begins a recount: a new write generation, numbered above
// every one in use, that takes over the reads when its watermark reaches
// until (at once when until is 0), and counts from sequence from on (its
// pos's "first": correctScript's watermark says nothing below it). A replay
// ID already seen changes nothing: it answers 'same', or 'started' when the
// start was made with the caller's token (meta's "starter"): its own
// earlier try, whose answer was lost.
//
// KEYS[1] meta. ARGV: replay id, until, from, token. Returns {status, read,
// write, until}. The new generation's pos is written by name (not in KEYS:
// its number is decided here), in the partition's slot like meta.
var startScript = redis.NewScript(`
local m = redis.call('HMGET', KEYS[1], 'read', 'write', 'until', 'replay', 'starter')
local read = tonumber(m[1]) or 1
local write = tonumber(m[2]) or 1
if m[4] == ARGV[1] then
  local status = 'same'
  if ARGV[4] ~= '' and m[5] == ARGV[4] then status = 'started' end
  return {status, read, write, tonumber(m[3]) or 0}
end
local g = math.max(read, write) + 1
local untl = tonumber(ARGV[2])
if untl == 0 then read = g end
redis.call('HSET', KEYS[1], 'read', read, 'write', g, 'until', untl, 'replay', ARGV[1], 'starter', ARGV[4])
-- "cc:{p<N>}:meta" -> "cc:{p<N>}:g<g>:pos" (posKey)
redis.call('HSET', string.sub(KEYS[1], 1, -5) .. 'g' .. g .. ':pos', 'first', ARGV[3])
return {'started', read, g, untl}
`)

// correctScript applies one partition's verdicts, with the effect of
// applying them one by one in their order. It checks the generations, then
// reads (before any write, as applyScript does) the labels recorded for the
// batch's clicks and the counts the batch may move; it decides each verdict
// against the label before it (an equal or older FRAUD sequence is stale,
// the same label unchanged) and plays the moves on its copy of the counts,
// exactly as one HINCRBY after another would (a new link field beyond the
// cap goes to the "(other)" referrer, as when counting); then it writes
// what changed: one HSET per label hash (with its expiry) and per link
// hash, one HINCRBY per day-hash field. A flooded link's 300 verdicts cost
// a handful of commands, not 300 times as many.
//
// A move happens in each generation that counted the click: the click
// leaves its (old label, country, referrer) field and hour and joins the
// new label's. Whether a generation counted it is read from its recent-ID
// record, by event ID: the bucket of the click's ID time holds its
// fingerprint or not (applyScript writes both in one step with the
// counts). Only when that bucket is gone (expired, or dropped once the
// partition's position passed it by the dedup window) does the watermark
// decide: at or past the click's sequence
// in its own partition means counted.
//
// KEYS[1] meta, KEYS[1+g] the pos of generation g (read, then write if it
// differs), then the rest, by index. ARGV: read, write, number of
// generations, combo cap; then per verdict: label hash (index), click id,
// fraud seq, new label, source label, click seq, label expiry (unix),
// "|<country>|<referrer host>", "|<country>|(other)", hour (HH), the
// click's 8-byte fingerprint, then per generation the link hash, the day
// hash and the recent-ID bucket (indexes).
//
// Returns {'conflict'}, or {'ok', s} with one character of s per verdict:
// 's' stale, 'u' unchanged, or the number of generations the click moved in.
var correctScript = redis.NewScript(idsFromLua + `
local m = redis.call('HMGET', KEYS[1], 'read', 'write')
if (tonumber(m[1]) or 1) ~= tonumber(ARGV[1]) or (tonumber(m[2]) or 1) ~= tonumber(ARGV[2]) then
  return {'conflict'}
end
local ngen, cap = tonumber(ARGV[3]), tonumber(ARGV[4])
local first, stride, n = 5, 11 + 3*ngen, #ARGV
local wm, gfrom = {}, {}
for g = 1, ngen do
  local pos = redis.call('HMGET', KEYS[1+g], 'seq', 'first')
  wm[g], gfrom[g] = tonumber(pos[1]) or 0, tonumber(pos[2]) or 0
end

-- counted says whether generation g counted the click of verdict i: its
-- fingerprint is in the recent-ID bucket (read, and made a set, once per
-- bucket), or the bucket is gone and the watermark is at or past the click.
local buckets = {}
local function counted(i, g)
  local key = KEYS[tonumber(ARGV[i+10+3*g])]
  local b = buckets[key]
  if b == nil then
    local data = redis.call('GET', key)
    b = false
    if data then
      b = {set = {}, from = idsVouchFrom(data)}
      for o = idsFrom(data), #data - 7, 8 do b.set[string.sub(data, o, o + 7)] = true end
    end
    buckets[key] = b
  end
  local seq = tonumber(ARGV[i+5])
  -- A bucket made again after it expired says nothing about the clicks
  -- counted before it: the watermark decides for those, as when it is gone,
  -- within what the generation counts (a recount's starts at the oldest
  -- event retained then: a click aged out before it is in none of its
  -- counts).
  if not b or seq < b.from then return gfrom[g] <= seq and seq <= wm[g] end
  return b.set[ARGV[i+10]] == true
end

-- hmget reads fields of key into into[field] (absent fields stay nil), in
-- commands of at most 1,000 fields.
local function hmget(key, fields, into)
  for s = 1, #fields, 1000 do
    local e = math.min(s + 999, #fields)
    local got = redis.call('HMGET', key, unpack(fields, s, e))
    for j = s, e do
      if got[j - s + 1] then into[fields[j]] = got[j - s + 1] end
    end
  end
end

-- 1. Read the labels recorded for the batch's clicks.
local labs, lorder = {}, {}
for i = first, n, stride do
  local k, id = ARGV[i], ARGV[i+1]
  local l = labs[k]
  if not l then
    l = {key = KEYS[tonumber(k)], expiry = ARGV[i+6], ids = {}, cur = {}, touched = {}, changed = {}}
    labs[k] = l
    lorder[#lorder + 1] = l
  end
  if l.cur[id] == nil then
    l.cur[id] = false
    l.ids[#l.ids + 1] = id
  end
end
for _, l in ipairs(lorder) do hmget(l.key, l.ids, l.cur) end

-- 2. Decide, in order, each verdict against the label before it.
local out, moves = {}, {}
for i = first, n, stride do
  local l, id, fseq, new = labs[ARGV[i]], ARGV[i+1], ARGV[i+2], ARGV[i+3]
  local old, status = ARGV[i+4], nil
  local have = l.cur[id]
  if have then
    local hl, hs = string.match(have, '^(%a):(%d+)$')
    if tonumber(hs) >= tonumber(fseq) then status = 's' else old = hl end
  end
  if not status then
    if not l.touched[id] then
      l.touched[id] = true
      l.changed[#l.changed + 1] = id
    end
    l.cur[id] = new .. ':' .. fseq
    if old == new then
      status = 'u'
    else
      local moved = 0
      for g = 1, ngen do
        if counted(i, g) then
          moved = moved + 1
          local mv = #moves
          moves[mv + 1], moves[mv + 2], moves[mv + 3], moves[mv + 4] = i, g, old, new
        end
      end
      status = tostring(moved)
    end
  end
  out[#out + 1] = status
end

-- 3. Read the counts the moves touch: per link hash, its length and the
-- fields a move may use; per day hash, whether it exists.
local links, days, korder, dlist = {}, {}, {}, {}
local function want(h, f)
  if h.base[f] == nil then
    h.base[f] = false
    h.want[#h.want + 1] = f
  end
end
for j = 1, #moves, 4 do
  local i, g, old, new = moves[j], moves[j+1], moves[j+2], moves[j+3]
  local lkey, dkey = KEYS[tonumber(ARGV[i+8+3*g])], KEYS[tonumber(ARGV[i+9+3*g])]
  local h = links[lkey]
  if not h then
    h = {key = lkey, want = {}, val = {}, base = {}, dirty = {}}
    links[lkey] = h
    korder[#korder + 1] = h
  end
  want(h, old .. ARGV[i+7])
  want(h, old .. ARGV[i+8])
  want(h, new .. ARGV[i+7])
  want(h, new .. ARGV[i+8])
  if days[dkey] == nil then
    days[dkey] = {key = dkey, val = {}, order = {}}
    dlist[#dlist + 1] = days[dkey]
  end
end
for _, h in ipairs(korder) do
  hmget(h.key, h.want, h.base)
  h.len = redis.call('HLEN', h.key)
  for _, f in ipairs(h.want) do h.val[f] = tonumber(h.base[f]) end
end
local dorder = {}
for _, d in ipairs(dlist) do
  if redis.call('EXISTS', d.key) == 1 then dorder[#dorder + 1] = d else d.gone = true end
end

-- 4. Play the moves on those values, as one HINCRBY after another would.
local function incr(h, f, by)
  local v = h.val[f]
  if v == nil then h.len = h.len + 1 end
  v = (v or 0) + by
  h.val[f] = v
  if not h.dirty[f] then
    h.dirty[f] = true
    h.dirty[#h.dirty + 1] = f
  end
  return v
end
for j = 1, #moves, 4 do
  local i, g, old, new = moves[j], moves[j+1], moves[j+2], moves[j+3]
  local host, oth, hour = ARGV[i+7], ARGV[i+8], ARGV[i+9]
  local h = links[KEYS[tonumber(ARGV[i+8+3*g])]]
  -- The click was counted under its host, or under (other) if the link
  -- was full then; a field once created is never removed, so the host
  -- field exists now exactly if it did then.
  local src = old .. host
  if h.val[src] == nil then src = old .. oth end
  incr(h, src, -1)
  local dst = new .. host
  if incr(h, dst, 1) == 1 and h.len > cap then
    h.val[dst] = nil -- as HDEL: the new field would overfill the link
    h.len = h.len - 1
    incr(h, new .. oth, 1)
  end
  local d = days[KEYS[tonumber(ARGV[i+9+3*g])]]
  if not d.gone then -- an expired day hash is not brought back (it would never expire)
    local from, to = old .. hour, new .. hour
    if d.val[from] == nil then d.order[#d.order + 1] = from end
    d.val[from] = (d.val[from] or 0) - 1
    if d.val[to] == nil then d.order[#d.order + 1] = to end
    d.val[to] = (d.val[to] or 0) + 1
  end
end

-- 5. Write: the labels, then the counts that changed.
local function hset(key, kv)
  for s = 1, #kv, 1000 do redis.call('HSET', key, unpack(kv, s, math.min(s + 999, #kv))) end
end
for _, l in ipairs(lorder) do
  if #l.changed > 0 then
    local kv = {}
    for _, id in ipairs(l.changed) do
      kv[#kv + 1] = id
      kv[#kv + 1] = l.cur[id]
    end
    hset(l.key, kv)
    redis.call('EXPIREAT', l.key, l.expiry)
  end
end
for _, h in ipairs(korder) do
  local kv, gone = {}, {}
  for _, f in ipairs(h.dirty) do
    local v = h.val[f]
    if v == nil then
      if h.base[f] then gone[#gone + 1] = f end
    elseif v ~= tonumber(h.base[f]) then
      kv[#kv + 1] = f
      kv[#kv + 1] = string.format('%d', v)
    end
  end
  hset(h.key, kv)
  for s = 1, #gone, 1000 do redis.call('HDEL', h.key, unpack(gone, s, math.min(s + 999, #gone))) end
end
for _, d in ipairs(dorder) do
  for _, f in ipairs(d.order) do
    if d.val[f] ~= 0 then redis.call('HINCRBY', d.key, f, d.val[f]) end
  end
end
return {'ok', table.concat(out)}
`)

// forgetScript gives a deleted link's all-time hash, in the partition's
// read and write generations, its expiry, and records the link in the
// partition's deleted set until then; at or past that time it deletes the
// hashes and records nothing. The hash is made (with a field no reader
// parses, "deleted") if the generation has counted nothing of the link yet:
// a late click's HINCRBY then keeps the expiry, where on a missing hash it
// would make one without. The hashes are named from meta's generations
// (in the partition's slot, like meta).
//
// KEYS[1] meta, KEYS[2] the deleted set. ARGV: "l:<owner>:<code>", expiry
// (unix), now (unix).
var forgetScript = redis.NewScript(`
local m = redis.call('HMGET', KEYS[1], 'read', 'write')
local gens = {tonumber(m[1]) or 1}
local w = tonumber(m[2]) or 1
if w ~= gens[1] then gens[2] = w end
-- "cc:{p<N>}:meta" -> "cc:{p<N>}:g<g>:" (genPrefix)
local pre = string.sub(KEYS[1], 1, -5)
local at, now = tonumber(ARGV[2]), tonumber(ARGV[3])
for _, g in ipairs(gens) do
  local key = pre .. 'g' .. g .. ':' .. ARGV[1]
  if at > now then
    redis.call('HSETNX', key, 'deleted', '0')
    redis.call('EXPIREAT', key, at)
  else
    redis.call('DEL', key)
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if at > now then
  redis.call('ZADD', KEYS[2], at, ARGV[1])
  local ttl = redis.call('TTL', KEYS[2])
  if ttl < 0 or now + ttl < at then redis.call('EXPIREAT', KEYS[2], at) end
end
return 1
`)

// linkScript records a LINKS event unless one at or after its sequence
// was recorded. KEYS[1] the registry key. ARGV: seq, state, owner, ts.
var linkScript = redis.NewScript(`
if tonumber(redis.call('HGET', KEYS[1], 'seq') or '0') >= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'seq', ARGV[1], 'state', ARGV[2], 'owner', ARGV[3], 'ts', ARGV[4])
return 1
`)
