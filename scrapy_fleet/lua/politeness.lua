-- politeness.lua: per-host operations outside the frontier's lease step (docs/politeness.md).
--
-- Keys (of K, keys.POLITENESS_CALL): ready, tat, hold, hostlive, hostconf, crawldelay, fails,
--       robots, robots_lock, adaptive
-- ARGV[1]: msgpack map {op, h (host), pt, pb, pc (fleet defaults, as in frontier.lua), ad
--   (1: the host's adaptive controller sets its rate too, lua/adaptive.lua), ...}
--   take         the guard: a GCRA token for a request that did not come from the frontier;
--                reply {wait = ms} (0: taken)
--   refund       give back the turn of a leased request that was not sent
--   hold         reply {wait = ms}: how long the host is still on hold (0: not), for a
--                request leased before a 429/503 put its host on hold
--   backoff      ra = Retry-After seconds (-1: none), base / max = back-off ms, jit = jitter
--                factor chosen by the client; hold the host until now + ra, or until now +
--                min(max, base * 2^(failures-1)) * jit; reply {until, delay} (ms)
--   success      forget the host's failures
--   adaptive_get reply {r, cap}: the host's learned rate and capacity (requests/s; {} when
--                it has no controller state)
--   adaptive_seed cap = a capacity learned by an earlier crawl (requests/s), aw = clean
--                window ms: unless the host has a state, start its controller
--                there (adaptive.lua's adaptive_seed); reply {seeded = 0 or 1, r}
-- robots.txt is per origin (o = "scheme://host:port", RFC 9309), the caps per host (h): the
-- robots_* ops read and write the field o of robots / robots_lock, and robots_store writes
-- the field h of robots (the origin) once one of the host's origins has usable rules or was
-- given up: until then the frontier leases one request of h at a time (the scout).
--   robots_get   o (for tools and tests; the worker uses robots_lock); reply {now, entry =
--                msgpack {status, body, at, fails, next, gone, err} or ''}
--   robots_lock  o, w = owner, ttl = ms, rt = FLEET_ROBOTSTXT_TTL ms: unless o's entry is
--                settled (younger than rt, and usable, given up, or failed with its next
--                attempt still ahead), take (or, for its owner, renew) the right to fetch o's
--                robots.txt; {ok, now, entry}: checked and taken in one step, so that no
--                second fetch starts just after a first one stored its result
--   robots_store o, h, status (0: no answer), body, cd = Crawl-delay ms (-1 none), err = last
--                error, ra = Retry-After ms (-1 none), hold = first wait ms, cap = longest
--                wait ms, ma = attempts before giving up (0: never), w; a failure (status 0,
--                5xx, 429) is the fails-th in a row: next attempt not before now +
--                max(ra, min(cap, hold * 2^(fails-1))), or gone = 1 when fails >= ma;
--                releases the lock; reply {now, entry}
-- None of these is retried by the client: a repeated token take only slows the host down,
-- a repeated back-off only lengthens it.

local READY, TAT, HOLD, HOSTLIVE = K.ready, K.tat, K.hold, K.hostlive
local HOSTCONF, CRAWLDELAY, FAILS, ROBOTS, ROBOTS_LOCK = K.hostconf, K.crawldelay, K.fails,
  K.robots, K.robots_lock

local ok, req = pcall(cmsgpack.unpack, ARGV[1])
if not ok or type(req) ~= 'table' or type(req.op) ~= 'string' or type(req.h) ~= 'string' then
  return redis.error_reply('ERR fleet: bad politeness call argument')
end
local h = req.h
local now = server_now_ms()
local ctx = new_host_ctx(now, TAT, HOLD, HOSTLIVE, HOSTCONF, CRAWLDELAY, req)
if req.ad == 1 then ctx.adaptive = K.adaptive end  -- the host's learned rate (adaptive.lua)

local function hold_until(until_ms)
  local current = tonumber(redis.call('HGET', HOLD, h)) or 0
  if until_ms > current then
    redis.call('HSET', HOLD, h, until_ms)
    local ready_at = tonumber(redis.call('ZSCORE', READY, h))
    if ready_at and ready_at < until_ms then
      redis.call('ZADD', READY, until_ms, h)
    end
  end
end

if req.op == 'take' then
  local T, tau, cap = host_policy_ctx(ctx, h)
  local blocked = host_blocked_until_ctx(ctx, h, T, tau, cap, false)
  if blocked then
    return cmsgpack.pack({wait = blocked - now})
  end
  host_take_token_ctx(ctx, h, T)
  return cmsgpack.pack({wait = 0})
elseif req.op == 'refund' then
  -- a leased request that was not sent (disallowed by robots.txt) gives its turn back
  local T = host_policy_ctx(ctx, h)
  local tat = tonumber(redis.call('HGET', TAT, h)) or 0
  if T > 0 and tat > now then
    redis.call('HSET', TAT, h, math.max(now, tat - T))
    local ready_at = tonumber(redis.call('ZSCORE', READY, h))
    if ready_at and ready_at < 9e15 and ready_at > now then redis.call('ZADD', READY, now, h) end
  end
  return cmsgpack.pack({ok = 1})
elseif req.op == 'hold' then
  local hold = tonumber(redis.call('HGET', HOLD, h)) or 0
  return cmsgpack.pack({wait = math.max(0, hold - now)})
elseif req.op == 'backoff' then
  local ra = tonumber(req.ra) or -1
  local delay
  if ra >= 0 then
    delay = math.floor(ra * 1000)
  else
    local n = hincrby(FAILS, h, 1)
    local base = tonumber(req.base) or 1000
    delay = math.min(tonumber(req.max) or 300000, base * (2 ^ (n - 1))) * (tonumber(req.jit) or 1)
    delay = math.floor(delay)
  end
  hold_until(now + delay)
  return cmsgpack.pack({['until'] = now + delay, delay = delay})
elseif req.op == 'success' then
  redis.call('HDEL', FAILS, h)
  return cmsgpack.pack({})
elseif req.op == 'adaptive_get' then
  local st = adaptive_parse(redis.call('HGET', K.adaptive, h) or nil)
  if not st then return cmsgpack.pack({}) end
  return cmsgpack.pack({r = tostring(st.r), cap = tostring(st.cap)})
elseif req.op == 'adaptive_seed' then
  if redis.call('HEXISTS', K.adaptive, h) == 1 then return cmsgpack.pack({seeded = 0}) end
  local T, _, cap = host_conf_ctx(ctx, h)
  local new = T > 0 and adaptive_seed(now, adaptive_ceiling(nil, T, cap), req.cap,
                                      tonumber(req.aw) or 1000)
  if not new then return cmsgpack.pack({seeded = 0}) end
  redis.call('HSET', K.adaptive, h, new)
  return cmsgpack.pack({seeded = 1, r = tostring(adaptive_parse(new).r)})
elseif req.op == 'robots_get' then
  return cmsgpack.pack({now = now, entry = redis.call('HGET', ROBOTS, req.o or '') or ''})
elseif req.op == 'robots_lock' then
  local o = req.o or ''
  local raw = redis.call('HGET', ROBOTS, o) or ''
  local rt = tonumber(req.rt)
  if raw ~= '' and rt then
    local okp, e = pcall(cmsgpack.unpack, raw)
    if okp and type(e) == 'table' and now - (tonumber(e.at) or 0) < rt then
      local st = tonumber(e.status) or 0
      local failed = st == 0 or st >= 500 or st == 429
      if not failed or (tonumber(e.gone) or 0) == 1 or (tonumber(e.next) or 0) > now then
        return cmsgpack.pack({ok = 0, now = now, entry = raw})  -- settled: nothing to fetch
      end
    end
  end
  local v = redis.call('HGET', ROBOTS_LOCK, o)
  if v then
    local who, until_ms = string.match(v, '^(.*)|(%d+)$')
    if (tonumber(until_ms) or 0) > now and who ~= (req.w or '') then
      -- another worker fetches it (its own lock: renewed)
      return cmsgpack.pack({ok = 0, now = now, entry = raw})
    end
  end
  redis.call('HSET', ROBOTS_LOCK, o, (req.w or '') .. '|' .. (now + (tonumber(req.ttl) or 30000)))
  return cmsgpack.pack({ok = 1, now = now, entry = raw})
elseif req.op == 'robots_store' then
  local o = req.o or ''
  local status = tonumber(req.status) or 0
  local failed = status == 0 or status >= 500 or status == 429
  local fails, nxt, gone = 0, 0, 0
  if failed then
    local old = redis.call('HGET', ROBOTS, o)
    if old then
      local okp, e = pcall(cmsgpack.unpack, old)
      if okp and type(e) == 'table' then fails = tonumber(e.fails) or 0 end
    end
    fails = fails + 1
    local ma = tonumber(req.ma) or 0
    if ma > 0 and fails >= ma then
      gone = 1
    else
      local hold = tonumber(req.hold) or 60000
      local delay = math.min(math.max(tonumber(req.cap) or hold, hold), hold * (2 ^ (fails - 1)))
      local ra = tonumber(req.ra) or -1
      if ra > delay then delay = ra end
      nxt = now + math.floor(delay)
    end
  end
  local entry = cmsgpack.pack({status = status, body = failed and '' or (req.body or ''),
                               at = now, fails = fails, next = nxt, gone = gone,
                               err = req.err or ''})
  redis.call('HSET', ROBOTS, o, entry)
  if (not failed or gone == 1) and h ~= '' then
    redis.call('HSET', ROBOTS, h, o)  -- the host is known: no more scouting (frontier.lua)
  end
  local cd = tonumber(req.cd) or -1
  if cd >= 0 then
    redis.call('HSET', CRAWLDELAY, h, cd)
    -- robots.txt was a request too: the scout that made this fetch waits a Crawl-delay
    -- (in the worker), and the following request one more
    local tat = tonumber(redis.call('HGET', TAT, h)) or 0
    if tat < now + 2 * cd then redis.call('HSET', TAT, h, now + 2 * cd) end
  elseif not failed then
    redis.call('HDEL', CRAWLDELAY, h)
  end
  redis.call('HDEL', ROBOTS_LOCK, o)
  return cmsgpack.pack({now = now, entry = entry})
end
return redis.error_reply('ERR fleet: unknown politeness op ' .. req.op)
