-- monitoring.lua (library, prepended to frontier.lua; defines locals only): worker
-- heartbeats, exact fleet-wide counters and the bounded time series (docs/monitoring.md),
-- applied inside the frontier call a worker makes anyway.  A call repeated with the same op
-- id returns its cached reply before any of this runs, so a delta sent with a call is applied
-- once; a batch of deltas resent after a call whose every retry failed carries the same
-- sequence number (cs) and is skipped when it was applied already.
--
-- KEYS: the last MON_NKEYS of the call (keys.CrawlKeys.monitor_keys), from index k:
--   k worker info (HASH, expires fa ms after the worker's last call)  k+1 mon (HASH)
--   k+2 series:10s  k+3 series:1m  k+4 series:10m (STRING ring buffers)
--   k+5 hoststats (HASH "p|host", "b|host", "f|host")  k+6 hostbans (ZSET host -> bans)
-- ARGV[2] (optional; absent for the push helper): msgpack map
--   hb  heartbeat {st state, l leases, dl downloads, pg pages, it items, er errors,
--       sv Scrapy version, fv package version, h host, pid, sa started at (unix s)}
--   cs  sequence number of the deltas below (per worker, +1 per batch)
--   c   counter deltas {field: n} into the stats hash (fields: see MON_COUNTER_OK)
--   hp  per-host deltas [[host, responses, bans]...]
--   da  a worker is dead after this many ms without a call (default 15000)
--   fa  a worker's key and its entry in `workers` are gone after this many ms (default 120000)
-- Series sample (monitoring/series.py): t_ms due scheduled leased parked dead pages items bans
-- workers_alive, as i64 at slot (t / step) mod points of each tier.

local MON_NKEYS = 7
local MON_TIERS = {{10000, 360}, {60000, 1440}, {600000, 1008}}
local MON_FIELDS = 10
local MON_HB_FIELDS = {st = true, l = true, dl = true, pg = true, it = true, er = true,
                       sv = true, fv = true, h = true, pid = true, sa = true, ro = true}
local MON_COUNTERS = {pages = true, items_scraped = true, items_dropped = true,
                      items_failed = true, response_bytes = true, bans = true, rate_limited = true,
                      robots_denied = true, proxy_bans = true}

local function mon_counter_ok(name)
  if MON_COUNTERS[name] then return true end
  return string.match(name, '^resp/%d%d%d$') ~= nil
      or string.match(name, '^errors/[a-z_]+$') ~= nil and #name <= 40
end

-- The monitoring keys (from index k) hold what this script writes there, or nothing: checked
-- before the call's first write, since a wrong type met after it would leave the call half
-- done (and a retry would run it again).  Returns nil, or an error message naming the key.
local function monitor_check_keys(k)
  for _, it in ipairs({{0, 'hash'}, {1, 'hash'}, {5, 'hash'}, {6, 'zset'}}) do
    local i, t = it[1], it[2]
    local got = redis.call('TYPE', KEYS[k + i]).ok
    if got ~= 'none' and got ~= t then
      return 'key ' .. KEYS[k + i] .. ' holds a ' .. got .. ', not a ' .. t ..
             ' (not written by the fleet): delete it'
    end
  end
  return nil
end

-- Parse and check ARGV[2] (and the keys, from index k) before the call's first write.
-- Returns the map (or {}), or nil and an error message.
local function monitor_parse(raw, k)
  local bad_key = monitor_check_keys(k)
  if bad_key then return nil, bad_key end
  if raw == nil or raw == '' then return {} end
  local ok, m = pcall(cmsgpack.unpack, raw)
  if not ok or type(m) ~= 'table' then return nil, 'bad monitoring argument' end
  if m.hb ~= nil then
    if type(m.hb) ~= 'table' then return nil, 'hb must be a map' end
    for k, v in pairs(m.hb) do
      if not MON_HB_FIELDS[k] or (type(v) ~= 'string' and type(v) ~= 'number')
          or (type(v) == 'string' and #v > 200) then
        return nil, 'bad heartbeat field'
      end
    end
  end
  if m.c ~= nil then
    if type(m.c) ~= 'table' then return nil, 'c must be a map' end
    for k, v in pairs(m.c) do
      if type(k) ~= 'string' or not mon_counter_ok(k) or type(v) ~= 'number' or v ~= v
          or v < 0 or v > 1e15 then
        return nil, 'bad counter delta'
      end
    end
  end
  if m.hp ~= nil then
    if type(m.hp) ~= 'table' then return nil, 'hp must be a list' end
    for _, e in ipairs(m.hp) do
      if type(e) ~= 'table' or type(e[1]) ~= 'string' or #e[1] > 300
          or type(e[2]) ~= 'number' or type(e[3]) ~= 'number' or e[2] < 0 or e[3] < 0 then
        return nil, 'bad host delta'
      end
    end
  end
  if m.cs ~= nil and type(m.cs) ~= 'number' then return nil, 'cs must be a number' end
  return m
end

local function mon_int(v)
  return string.format('%d', tonumber(v) or 0)
end

-- Apply a parsed map: heartbeat, deltas, worker expiry, and one sample per due tier.
-- fk: {stats, workers, q, qn, leases, delayed, parked, dead} key names of the frontier (q the
-- previous format's queue, qn the count of the queue buckets).
local function monitor_apply(m, k, now, worker, fk, acked)
  local INFO, MON, HOSTSTATS, HOSTBANS = KEYS[k], KEYS[k + 1], KEYS[k + 5], KEYS[k + 6]
  local dead_ms = tonumber(m.da) or 15000
  local forget_ms = tonumber(m.fa) or 120000
  if acked > 0 then redis.call('HSET', MON, 'la', now) end
  if worker ~= '' then
    local fresh = redis.call('EXISTS', INFO) == 0
    local last_cs = tonumber(redis.call('HGET', INFO, 'cs')) or 0
    local cs = tonumber(m.cs)
    if cs ~= nil and cs > last_cs then
      for name, n in pairs(m.c or {}) do
        if n > 0 then hincrby(fk.stats, name, n) end
      end
      for _, e in ipairs(m.hp or {}) do
        if e[2] > 0 then hincrby(HOSTSTATS, 'p|' .. e[1], e[2]) end
        if e[3] > 0 then
          hincrby(HOSTSTATS, 'b|' .. e[1], e[3])
          redis.call('HSETNX', HOSTSTATS, 'f|' .. e[1], now)
          redis.call('ZINCRBY', HOSTBANS, e[3], e[1])
        end
      end
      redis.call('HSET', INFO, 'cs', cs)
    end
    local fields = {'seen', now}
    for name, v in pairs(m.hb or {}) do
      fields[#fields + 1] = name
      fields[#fields + 1] = v
    end
    redis.call('HSET', INFO, unpack(fields))
    if fresh then redis.call('HSET', INFO, 'la', now) end
    if acked > 0 then redis.call('HSET', INFO, 'la', now) end
    redis.call('PEXPIRE', INFO, forget_ms)
    redis.call('HSET', MON, 'lw', now)
  end
  redis.call('ZREMRANGEBYSCORE', fk.workers, '-inf', now - forget_ms)  -- departed workers
  redis.call('HSETNX', MON, 't0', now)

  -- one sample per tier whose step changed since its last sample, fleet-wide
  local last = redis.call('HMGET', MON, 's1', 's2', 's3')
  if math.floor(now / MON_TIERS[1][1]) == tonumber(last[1]) then return end
  local c = redis.call('HMGET', fk.stats, 'pages', 'items_scraped', 'bans')
  local queued = (tonumber(redis.call('GET', fk.qn)) or 0) + redis.call('ZCARD', fk.q)
  local vals = {now, queued, redis.call('ZCARD', fk.delayed),
                redis.call('ZCARD', fk.leases), redis.call('LLEN', fk.parked),
                redis.call('HLEN', fk.dead), tonumber(c[1]) or 0, tonumber(c[2]) or 0,
                tonumber(c[3]) or 0, redis.call('ZCOUNT', fk.workers, now - dead_ms, '+inf')}
  for i, tier in ipairs(MON_TIERS) do
    local slot = math.floor(now / tier[1])
    if slot ~= tonumber(last[i]) then
      local key = KEYS[k + 1 + i]
      local size = tier[2] * MON_FIELDS * 8
      if redis.call('EXISTS', key) == 1 and (redis.call('TYPE', key).ok ~= 'string'
          or redis.call('STRLEN', key) ~= size) then
        redis.call('DEL', key)  -- not written by this script: start the ring afresh
      end
      if redis.call('EXISTS', key) == 0 then
        redis.call('SETRANGE', key, size - 1, '\0')  -- the ring's full size from the start
      end
      local args = {'BITFIELD', key}  -- acl: BITFIELD (called as redis.call(unpack(args)))
      local base = (slot % tier[2]) * MON_FIELDS
      for j, v in ipairs(vals) do
        args[#args + 1] = 'SET'
        args[#args + 1] = 'i64'
        args[#args + 1] = '#' .. (base + j - 1)
        args[#args + 1] = mon_int(v)
      end
      redis.call(unpack(args))
      redis.call('HSET', MON, 's' .. i, slot)
    end
  end
end
