-- frontier.lua: one round trip of a worker (or of the push helper) with the frontier.
--
-- In one atomic step it: returns the cached reply of a repeated call (op id), reclaims
-- expired leases (back to the queue, or to the dead letters after max_leases expiries),
-- acknowledges finished requests, releases unstarted ones, dead-letters corrupt ones,
-- extends live leases (heartbeat), pushes new requests through the Bloom filter, leases up
-- to `take` requests with fresh fencing tokens, and tracks fleet idleness.
-- All times are the Redis server's clock (TIME), in milliseconds.
--
-- KEYS (built by keys.CrawlKeys.frontier_keys, never here):
--   1 queue  2 data  3 leases  4 lease  5 expiries  6 dead  7 seq  8 token  9 stats
--   10 idle_since  11 workers  12 op (this call)  13 op (previous call of this client)
--   14 bloom meta  15.. bloom slices
-- ARGV[1]: msgpack map (see frontier.py, SyncBatch.to_arg):
--   w worker id ("" for the push helper), lm lease ms, ml max leases, ot op ttl ms,
--   a acks [[id, token]...], r releases [[id, token]...], d dead [[id, token, reason]...],
--   x extends [[id, token]...], p pushes [[fp12 or "", priority, payload]...], t take,
--   bn bloom capacity, bp bloom error rate, rc reclaim limit
-- Reply: msgpack map (see frontier.py, SyncResult.from_reply).

local cached = redis.call('GET', KEYS[12])
if cached then
  return cached
end

local Q, DATA, LEASES, LEASE, EXPIRIES, DEAD = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local SEQ, TOKEN, STATS, IDLE, WORKERS = KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11]

local ok, req = pcall(cmsgpack.unpack, ARGV[1])
if not ok or type(req) ~= 'table' then
  return redis.error_reply('ERR fleet: bad frontier call argument')
end
-- Validate every list before the first write (a runtime error after a write keeps the
-- earlier writes; OOM is only checked before the first write).
for _, name in ipairs({'a', 'r', 'd', 'x', 'p'}) do
  if req[name] == nil then req[name] = {} end
  if type(req[name]) ~= 'table' then
    return redis.error_reply('ERR fleet: field ' .. name .. ' must be a list')
  end
end
for _, p in ipairs(req.p) do
  if type(p) ~= 'table' or type(p[1]) ~= 'string' or type(p[2]) ~= 'number'
      or type(p[3]) ~= 'string' or (p[1] ~= '' and #p[1] ~= 12) then
    return redis.error_reply('ERR fleet: bad push entry')
  end
end
local take = tonumber(req.t) or 0
local lease_ms = tonumber(req.lm) or 30000
local max_leases = tonumber(req.ml) or 3
local worker = req.w or ''

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)

local out = {leased = {}, lost = {}, pf = {}, new = 0, dup = 0, acked = 0, released = 0,
             reclaimed = 0, dead = 0, full = false, now = now}
local counters = {}
local function count(name, n)
  counters[name] = (counters[name] or 0) + n
end

local function parse_lease(v)
  if not v then return nil end
  local tok, score, who = string.match(v, '^(%d+)|([^|]*)|(.*)$')
  return tok, score, who
end

local function to_dead(id, reason)
  local data = redis.call('HGET', DATA, id)
  redis.call('HSET', DEAD, id, cmsgpack.pack({reason = reason, at = now, data = data or ''}))
  redis.call('HDEL', DATA, id)
  redis.call('HDEL', EXPIRIES, id)
  out.dead = out.dead + 1
  count('dead_lettered', 1)
end

-- Holds `token` the current lease of `id`?  Returns its score when it does.
local function holds(id, token)
  local tok, score = parse_lease(redis.call('HGET', LEASE, id))
  if tok and tok == tostring(token) then
    return score
  end
  return nil
end

local function drop_lease(id)
  redis.call('ZREM', LEASES, id)
  redis.call('HDEL', LEASE, id)
end

-- 1. reclaim expired leases (of any worker), a bounded number per call
local expired = redis.call('ZRANGEBYSCORE', LEASES, '-inf', now, 'LIMIT', 0, tonumber(req.rc) or 100)
for _, id in ipairs(expired) do
  local _, score = parse_lease(redis.call('HGET', LEASE, id))
  drop_lease(id)
  local n = redis.call('HINCRBY', EXPIRIES, id, 1)
  if n >= max_leases then
    to_dead(id, 'lease expired ' .. n .. ' times')
  else
    redis.call('ZADD', Q, tonumber(score) or 0, id)
    out.reclaimed = out.reclaimed + 1
  end
end
count('reclaimed', out.reclaimed)

-- 2. acknowledgements: the request and its output are done
for _, a in ipairs(req.a) do
  if holds(a[1], a[2]) then
    drop_lease(a[1])
    redis.call('HDEL', DATA, a[1])
    redis.call('HDEL', EXPIRIES, a[1])
    out.acked = out.acked + 1
  else
    out.lost[#out.lost + 1] = a[1]
    count('stale_acks', 1)
  end
end
count('acked', out.acked)

-- 3. releases: leased but never started (worker closing); no expiry is counted
for _, r in ipairs(req.r) do
  local score = holds(r[1], r[2])
  if score then
    drop_lease(r[1])
    redis.call('ZADD', Q, tonumber(score) or 0, r[1])
    out.released = out.released + 1
  end
end
count('released', out.released)

-- 4. dead letters reported by the worker (entry cannot be decoded)
for _, d in ipairs(req.d) do
  if holds(d[1], d[2]) then
    drop_lease(d[1])
    to_dead(d[1], d[3])
  end
end

-- 5. heartbeat: extend live leases, report lost ones
for _, x in ipairs(req.x) do
  if holds(x[1], x[2]) then
    redis.call('ZADD', LEASES, 'XX', now + lease_ms, x[1])
  else
    out.lost[#out.lost + 1] = x[1]
  end
end

-- 6. pushes, through the Bloom filter unless the fingerprint is "" (dont_filter)
if #req.p > 0 then
  local slice_keys = {}
  for i = 15, #KEYS do slice_keys[#slice_keys + 1] = KEYS[i] end
  local bloom = nil
  for _, p in ipairs(req.p) do
    local is_new = 1
    if p[1] ~= '' then
      if bloom == nil then
        bloom = bloom_open(KEYS[14], slice_keys, tonumber(req.bn), tonumber(req.bp))
      end
      local full
      is_new, full = bloom_add(bloom, p[1])
      if full then out.full = true end
    end
    if is_new == 1 then
      local id = string.format('%015d', redis.call('INCR', SEQ))
      redis.call('HSET', DATA, id, p[3])
      redis.call('ZADD', Q, -p[2], id)
      out.new = out.new + 1
    else
      out.dup = out.dup + 1
    end
    out.pf[#out.pf + 1] = is_new
  end
  count('pushed', out.new)
  count('duplicates', out.dup)
end

-- 7. lease up to `take` requests: highest priority first, FIFO among equals
if take > 0 then
  local popped = redis.call('ZPOPMIN', Q, take)
  for i = 1, #popped, 2 do
    local id, score = popped[i], popped[i + 1]
    local data = redis.call('HGET', DATA, id)
    if not data then
      to_dead(id, 'entry has no data')
    else
      local tok = redis.call('INCR', TOKEN)
      redis.call('HSET', LEASE, id, tok .. '|' .. score .. '|' .. worker)
      redis.call('ZADD', LEASES, now + lease_ms, id)
      local n = tonumber(redis.call('HGET', EXPIRIES, id)) or 0
      out.leased[#out.leased + 1] = {id, tok, data, n}
    end
  end
  count('leased', #out.leased)
end

-- 8. fleet idleness: nothing queued and nothing leased, since when?
out.queued = redis.call('ZCARD', Q)
out.inflight = redis.call('ZCARD', LEASES)
if out.queued == 0 and out.inflight == 0 then
  local since = tonumber(redis.call('GET', IDLE))
  if not since then
    redis.call('SET', IDLE, now)
    since = now
  end
  out.idle = now - since
else
  if redis.call('EXISTS', IDLE) == 1 then redis.call('DEL', IDLE) end
  out.idle = -1
end

if worker ~= '' then
  redis.call('ZADD', WORKERS, now, worker)
end
for name, n in pairs(counters) do
  if n > 0 then redis.call('HINCRBY', STATS, name, n) end
end

-- Cache a reply without payloads: a repeated call rebuilds them from DATA (the entries are
-- still leased with these tokens, since the client has not seen the first reply).
local reply = cmsgpack.pack(out)
local light = {}
for i, e in ipairs(out.leased) do light[i] = {e[1], e[2], '', e[4]} end
out.leased = light
local cached_reply = cmsgpack.pack(out)
redis.call('SET', KEYS[12], cached_reply, 'PX', tonumber(req.ot) or 300000)
if KEYS[13] ~= KEYS[12] then
  redis.call('DEL', KEYS[13])
end
return reply
