-- monitoring.lua: worker heartbeats, exact fleet-wide counters and the bounded time series
-- (docs/monitoring.md), applied inside the frontier call a worker makes anyway (and by
-- sample.lua); it defines locals only.  A call repeated with the same op id returns its
-- cached reply before any of this runs, so a delta sent with a call is applied once; a batch
-- of deltas resent after a call whose every retry failed carries the same sequence number
-- (cs) and is skipped when it was applied already.
--
-- Keys (of K): worker_info (HASH, expires fa ms after the worker's last call), mon (HASH),
--   series_10s, series_1m, series_10m (STRING ring buffers), hoststats (HASH "p|host",
--   "b|host", "f|host"), hostbans (ZSET host -> bans); read for the samples: stats, workers,
--   queue_count, leases, deferred, parked, dead; workers_first (the frontier call's only: a
--   lower bound of the scores in workers, kept by monitor_apply).
-- Writes: worker_info, mon, stats (counter deltas), hoststats, hostbans, workers (departed
--   ones removed), workers_first, the series.
-- Work per call: 2 HMGET (checks and reads), about 5 commands, one HINCRBY per counter delta
--   and 1-4 per host delta; a ZREMRANGEBYSCORE of departed workers, a ZRANGE and a SET when
--   the oldest worker's last call may be forget_ms old (every call of sample.lua); a sample
--   (once per 10 s fleet-wide) about 15 more.
-- ARGV[2] (optional; absent for the push helper): msgpack map
--   hb  heartbeat {st state, l leases, dl downloads, pg pages, it items, er errors,
--       sv Scrapy version, fv package version, h host, pid, sa started at (unix s)}
--   cs  sequence number of the deltas below (per worker, +1 per batch)
--   c   counter deltas {field: n} into the stats hash (fields: see MON_COUNTER_OK)
--   hp  per-host deltas [[host, responses, bans]...]
--   da  a worker is dead after this many ms without a call (default 6000)
--   fa  a worker's key and its entry in `workers` are gone after this many ms (default 120000)
-- Series sample (monitoring/series.py): t_ms due scheduled leased parked dead pages items bans
-- workers_alive, as i64 at slot (t / step) mod points of each tier.

local MON_TIERS = {{10000, 360}, {60000, 1440}, {600000, 1008}}
local MON_SERIES = {'series_10s', 'series_1m', 'series_10m'}  -- (their keys, of K)
local MON_FIELDS = 10
local MON_HB_FIELDS = {st = true, l = true, dl = true, pg = true, it = true, er = true,
                       sv = true, fv = true, h = true, pid = true, sa = true, ro = true}
local MON_COUNTERS = {pages = true, items_scraped = true, items_dropped = true,
                      items_failed = true, response_bytes = true, bans = true, rate_limited = true,
                      robots_denied = true, proxy_bans = true,
                      -- recrawl (issue 22): outcomes of revisits (recrawl/middleware.py)
                      revisit_not_modified = true, revisit_unchanged = true,
                      revisit_changed = true, revisit_gone = true}

local function mon_counter_ok(name)
  if MON_COUNTERS[name] then return true end
  return string.match(name, '^resp/%d%d%d$') ~= nil
      or string.match(name, '^errors/[a-z_]+$') ~= nil and #name <= 40
end

local function mon_wrong_type(key, want)
  local got = redis.call('TYPE', key).ok
  if got ~= 'none' and got ~= want then
    return 'key ' .. key .. ' holds a ' .. got .. ', not a ' .. want ..
           ' (not written by the fleet): delete it'
  end
  return nil
end

-- The monitoring keys this call writes hold what this script writes there, or nothing:
-- checked before the call's first write, since a wrong type met after it would leave the call
-- half done (and a retry would run it again); the per-host keys only when the call carries
-- per-host deltas (`hp`, m's), the only writes to them.  The two hashes every call writes are
-- checked by reading what monitor_apply needs of them (HMGET answers WRONGTYPE for another
-- type): the heartbeat hash's `seen` (every write of it has one: none, a new worker) and
-- `cs`, and the samples' last slots in `mon`.  Returns nil, or an error message naming the
-- key; sets m.fresh (the worker's heartbeat hash is missing), m.cs_done, m.seen, m.hd (the
-- heartbeat hash's `seen`, `cs` and `hd`) and m.last (mon's s1 s2 s3 t0 lw).
local function monitor_check_keys(K, m)
  local info = redis.pcall('HMGET', K.worker_info, 'seen', 'cs', 'hd')
  if info.err then return mon_wrong_type(K.worker_info, 'hash') or info.err end
  local last = redis.pcall('HMGET', K.mon, 's1', 's2', 's3', 't0', 'lw')
  if last.err then return mon_wrong_type(K.mon, 'hash') or last.err end
  if m.hp ~= nil and #m.hp > 0 then
    local bad = mon_wrong_type(K.hoststats, 'hash') or mon_wrong_type(K.hostbans, 'zset')
    if bad then return bad end
  end
  m.fresh, m.cs_done, m.last = not info[1], tonumber(info[2]) or 0, last
  m.seen, m.hd = tonumber(info[1]), info[3]
  return nil
end

-- ARGV[2] unpacked and checked: the map, or nil and an error message.
local function mon_unpack(raw)
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

-- The last ARGV[2] of each worker (by its heartbeat hash's key), unpacked and checked, and
-- its SHA1 once asked: {raw, map, digest}.  An idle worker sends the same ARGV[2] call after
-- call, which is then neither unpacked nor checked again.  It lives as long as the script's
-- chunk: the Functions library's (lua/library.py: until it is loaded again), one call's for
-- an EVALSHA; it is a cache (what it holds is what unpacking raw gives), bounded: emptied
-- once it holds MON_MEMO_MAX workers.  The map is never written to (monitor_parse copies it).
local MON_MEMO, MON_MEMO_MAX = {n = 0, v = {}}, 1024

-- Parse and check ARGV[2] (and the keys) before the call's first write.
-- Returns the map (or {}), or nil and an error message.
local function monitor_parse(raw, K)
  local m = {}
  if raw ~= nil and raw ~= '' then
    local entry = MON_MEMO.v[K.worker_info]
    if not entry or entry[1] ~= raw then
      local parsed, err = mon_unpack(raw)
      if not parsed then return nil, err end
      if MON_MEMO.n >= MON_MEMO_MAX then MON_MEMO.v, MON_MEMO.n = {}, 0 end
      if not entry then MON_MEMO.n = MON_MEMO.n + 1 end
      entry = {raw, parsed}
      MON_MEMO.v[K.worker_info] = entry
    end
    for k, v in pairs(entry[2]) do m[k] = v end
    m.memo = entry
  end
  -- (m.fresh, m.cs_done, m.seen, m.hd, m.last: not fields of ARGV[2], read by
  -- monitor_check_keys; m.raw: ARGV[2] as sent; m.memo: its entry in MON_MEMO)
  m.raw = raw or ''
  local bad_key = monitor_check_keys(K, m)
  if bad_key then return nil, bad_key end
  return m
end

local function mon_int(v)
  return string.format('%d', tonumber(v) or 0)
end

-- How often (ms) a heartbeat that tells nothing new is written at most: the worker's hash
-- (its fields, `seen` and its expiry) is rewritten when its heartbeat changed (`hd`: the SHA1
-- of ARGV[2] as last written), when the call applies counter deltas or acknowledges, and
-- otherwise once per this many ms (at most a quarter of `da` and of `fa`: the hash outlives
-- the worker's calls), so an idle worker calling in a loop writes its hash about once a
-- second.  Its entry in `workers` (step_idle.lua, every call) is what tells it alive (monitoring/snapshot.py: the later of that and `seen`); mon's `lw`
-- (the fleet's last worker call) is written as seldom.
local MON_BEAT_EVERY = 1000

-- Apply a parsed map: heartbeat, deltas, worker expiry, and one sample per due tier; sets
-- m.applied when it applied a batch of deltas (cs).
-- *first*: a lower bound of the scores in K.workers (K.workers_first, read by the frontier
-- call; nil: unknown): departed workers are looked for only once it is forget_ms old, and
-- then, when the call has K.workers_first, the bound is recomputed (the set's first score).
local function monitor_apply(m, K, now, worker, acked, first)
  local INFO, MON, HOSTSTATS, HOSTBANS = K.worker_info, K.mon, K.hoststats, K.hostbans
  local fk = K
  local dead_ms = tonumber(m.da) or 6000
  local forget_ms = tonumber(m.fa) or 120000
  local every = math.min(MON_BEAT_EVERY, dead_ms / 4, forget_ms / 4)
  local last = m.last  -- (read by monitor_check_keys: no step writes MON)
  local mon_set = {}  -- fields of MON written once, below
  if acked > 0 then mon_set[#mon_set + 1], mon_set[#mon_set + 2] = 'la', now end
  if worker ~= '' then
    local cs = tonumber(m.cs)
    local info_set = {}  -- fields of INFO written once, below
    if cs ~= nil and cs > m.cs_done then
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
      info_set = {'cs', cs}
      m.applied = true  -- (the call's reply is cached then: lua/step_reply.lua)
    end
    -- (a write a busy call makes anyway, acknowledging or applying deltas, stores no digest,
    -- "": a busy worker's heartbeat changes at every call; the next call with nothing new
    -- stores it)
    local busy = acked > 0 or #info_set > 0
    local digest = ''
    if not busy then
      digest = m.memo and m.memo[3] or redis.sha1hex(m.raw or '')
      if m.memo then m.memo[3] = digest end
    end
    if busy or m.fresh or digest ~= m.hd or not m.seen or now - m.seen >= every or now < m.seen then
      local fields = {'seen', now, 'hd', digest}
      for name, v in pairs(m.hb or {}) do
        fields[#fields + 1] = name
        fields[#fields + 1] = v
      end
      for _, v in ipairs(info_set) do fields[#fields + 1] = v end
      if m.fresh or acked > 0 then
        fields[#fields + 1] = 'la'
        fields[#fields + 1] = now
      end
      redis.call('HSET', INFO, unpack(fields))
      redis.call('PEXPIRE', INFO, forget_ms)
    end
    local lw = tonumber(last[5])
    if #mon_set > 0 or not lw or now - lw >= every or now < lw then
      mon_set[#mon_set + 1], mon_set[#mon_set + 2] = 'lw', now
    end
  end

  if not first or now - forget_ms >= first then
    redis.call('ZREMRANGEBYSCORE', fk.workers, '-inf', now - forget_ms)  -- departed workers
    if K.workers_first then
      local oldest = redis.call('ZRANGE', fk.workers, 0, 0, 'WITHSCORES')
      local bound = string.format('%d', math.floor(tonumber(oldest[2]) or 9e15))
      if tonumber(bound) ~= first then redis.call('SET', K.workers_first, bound) end
    end
  end

  -- one sample per tier whose step changed since its last sample, fleet-wide
  if not last[4] then mon_set[#mon_set + 1], mon_set[#mon_set + 2] = 't0', now end
  if #mon_set > 0 then redis.call('HSET', MON, unpack(mon_set)) end
  if math.floor(now / MON_TIERS[1][1]) == tonumber(last[1]) then return end
  local c = redis.call('HMGET', fk.stats, 'pages', 'items_scraped', 'bans')
  local vals = {now, Queue.queued(K), redis.call('ZCARD', fk.deferred),
                redis.call('ZCARD', fk.leases), redis.call('LLEN', fk.parked),
                redis.call('HLEN', fk.dead), tonumber(c[1]) or 0, tonumber(c[2]) or 0,
                tonumber(c[3]) or 0, redis.call('ZCOUNT', fk.workers, now - dead_ms, '+inf')}
  for i, tier in ipairs(MON_TIERS) do
    local slot = math.floor(now / tier[1])
    if slot ~= tonumber(last[i]) then
      local key = K[MON_SERIES[i]]
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
