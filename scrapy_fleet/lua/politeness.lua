-- politeness.lua: per-host operations outside the frontier's lease step (docs/politeness.md).
--
-- KEYS: 1 ready  2 tat  3 hold  4 hostlive  5 hostconf  6 crawldelay  7 fails  8 robots
--       9 robots_lock
-- ARGV[1]: msgpack map {op, h (host), pt, pb, pc (fleet defaults, as in frontier.lua), ...}
--   take         the guard: a GCRA token for a request that did not come from the frontier;
--                reply {wait = ms} (0: taken)
--   refund       give back the turn of a leased request that was not sent
--   hold         reply {wait = ms}: how long the host is still on hold (0: not), for a
--                request leased before a 429/503 put its host on hold
--   backoff      ra = Retry-After seconds (-1: none), base / max = back-off ms, jit = jitter
--                factor chosen by the client; hold the host until now + ra, or until now +
--                min(max, base * 2^(failures-1)) * jit; reply {until, delay} (ms)
--   success      forget the host's failures
--   robots_get   reply {now, entry = msgpack {status, body, at} or ''}
--   robots_lock  w = worker, ttl = ms: take the right to fetch the host's robots.txt; {ok}
--   robots_store status, body, cd = Crawl-delay ms (-1 none), hold = ms (0 none), w
-- None of these is retried by the client: a repeated token take only slows the host down,
-- a repeated back-off only lengthens it.

local READY, TAT, HOLD, HOSTLIVE = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local HOSTCONF, CRAWLDELAY, FAILS, ROBOTS, ROBOTS_LOCK = KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]

local ok, req = pcall(cmsgpack.unpack, ARGV[1])
if not ok or type(req) ~= 'table' or type(req.op) ~= 'string' or type(req.h) ~= 'string' then
  return redis.error_reply('ERR fleet: bad politeness call argument')
end
local h = req.h
local now = server_now_ms()
local ctx = new_host_ctx(now, TAT, HOLD, HOSTLIVE, HOSTCONF, CRAWLDELAY, req)

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
elseif req.op == 'robots_get' then
  return cmsgpack.pack({now = now, entry = redis.call('HGET', ROBOTS, h) or ''})
elseif req.op == 'robots_lock' then
  local v = redis.call('HGET', ROBOTS_LOCK, h)
  if v then
    local until_ms = tonumber(string.match(v, '|(%d+)$')) or 0
    if until_ms > now then
      return cmsgpack.pack({ok = 0})
    end
  end
  redis.call('HSET', ROBOTS_LOCK, h, (req.w or '') .. '|' .. (now + (tonumber(req.ttl) or 30000)))
  return cmsgpack.pack({ok = 1})
elseif req.op == 'robots_store' then
  redis.call('HSET', ROBOTS, h, cmsgpack.pack({status = tonumber(req.status) or 0,
                                              body = req.body or '', at = now}))
  local cd = tonumber(req.cd) or -1
  if cd >= 0 then
    redis.call('HSET', CRAWLDELAY, h, cd)
    -- robots.txt was a request too: the scout that made this fetch waits a Crawl-delay
    -- (in the worker), and the following request one more
    local tat = tonumber(redis.call('HGET', TAT, h)) or 0
    if tat < now + 2 * cd then redis.call('HSET', TAT, h, now + 2 * cd) end
  else
    redis.call('HDEL', CRAWLDELAY, h)
  end
  local hold = tonumber(req.hold) or 0
  if hold > 0 then
    hold_until(now + hold)
  end
  redis.call('HDEL', ROBOTS_LOCK, h)
  return cmsgpack.pack({now = now})
end
return redis.error_reply('ERR fleet: unknown politeness op ' .. req.op)
