-- Applies one partition's judgements atomically, once.
-- KEYS[1]    fraud:{p<N>}:hwm
-- KEYS[2..]  the link hashes, then each owner's alert set and alert bodies,
--            then the label counter hashes
-- ARGV       from, to, alerts cap, after,
--            nlinks, then per link: owner, nfields, field, delta, ...
--            nalerts, then per alert: set key index, bodies key index, id, score, json
--            counters' ttl (ms), nhashes, then per hash: key index, nfields, field, value, ...
-- The counters' values are set, not added: they are the state's as of to.
-- Returns {1, to} when applied, {0, hwm} when everything was applied before,
-- {-1, hwm} when part was (the caller resends what is after hwm), {-2, hwm}
-- when hwm is behind after, what the caller applied before: Redis lost
-- acknowledged writes, and nothing is written (applying the batch would
-- move the mark past the lost events for good).
local hwm = tonumber(redis.call('GET', KEYS[1]) or '0')
local from, to = tonumber(ARGV[1]), tonumber(ARGV[2])
if hwm < tonumber(ARGV[4]) then return {-2, hwm} end
if to <= hwm then return {0, hwm} end
if from <= hwm then return {-1, hwm} end

local cap = tonumber(ARGV[3])
local i = 5
local nlinks = tonumber(ARGV[i]); i = i + 1
for l = 1, nlinks do
  local key = KEYS[1 + l]
  redis.call('HSET', key, 'owner', ARGV[i]); i = i + 1
  local nf = tonumber(ARGV[i]); i = i + 1
  for _ = 1, nf do
    redis.call('HINCRBY', key, ARGV[i], ARGV[i + 1]); i = i + 2
  end
end

local nalerts = tonumber(ARGV[i]); i = i + 1
for _ = 1, nalerts do
  local set, bodies = KEYS[tonumber(ARGV[i])], KEYS[tonumber(ARGV[i + 1])]
  local id, score, body = ARGV[i + 2], ARGV[i + 3], ARGV[i + 4]; i = i + 5
  if redis.call('ZADD', set, 'NX', score, id) == 1 then
    redis.call('HSET', bodies, id, body)
    -- Trimmed 1,000 at a time: Lua's unpack fails beyond about 8,000
    -- (a cap lowered under a full set), and Redis keeps what a failing
    -- script wrote before the error: the links' counts, with no mark.
    local n = redis.call('ZCARD', set)
    while n > cap do
      local k = math.min(n - cap, 1000)
      local old = redis.call('ZRANGE', set, 0, k - 1)
      redis.call('ZREMRANGEBYRANK', set, 0, k - 1)
      redis.call('HDEL', bodies, unpack(old))
      n = n - k
    end
  end
end

local ttl = ARGV[i]
local nhashes = tonumber(ARGV[i + 1]); i = i + 2
for _ = 1, nhashes do
  local key = KEYS[tonumber(ARGV[i])]
  local nf = tonumber(ARGV[i + 1]); i = i + 2
  for _ = 1, nf do
    redis.call('HSET', key, ARGV[i], ARGV[i + 1]); i = i + 2
  end
  redis.call('PEXPIRE', key, ttl)
end

redis.call('SET', KEYS[1], ARGV[2])
return {1, to}
