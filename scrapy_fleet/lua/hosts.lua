-- hosts.lua: per-host politeness state, shared by the frontier call's lease step and
-- politeness.lua (it defines locals only).  docs/politeness.md describes the model.
--
-- Keys: the ctx's key names (tat, hold, hostlive, hostconf, crawldelay).  Writes: tat
-- (host_take_token_ctx).  Work per call: one HGET per host and key looked at (none twice in a
-- call with ctx.memo), one HSET per token taken.
--
-- Rate: GCRA, the Generic Cell Rate Algorithm (ATM Forum Traffic Management 4.1; ITU-T
-- I.371 "virtual scheduling"): with emission interval T (ms between requests) and burst b,
-- tolerance tau = T * (b - 1); a request may go at time t when TAT - tau <= t, and then
-- TAT = max(TAT, t) + T.  TAT (theoretical arrival time) is kept per host, t is always the
-- Redis server's TIME, never a worker's clock.
--
-- ctx: {now, tat, hold, hostlive, hostconf, crawldelay (key names),
--       defaults = {T, b, cap, rate}}: rate 1 when T comes from a rate (requests per
--       second, which may catch up on a late turn), 0 when from a delay (a minimum gap)

-- A per-host field read through ctx: remembered for the rest of the call when ctx.memo is a
-- table (frontier.lua looks at the same hosts many times per call and writes its changes
-- back with ctx_put); read each time otherwise.  A missing field is nil; so is every field
-- of a key in ctx.empty (a hash the caller found empty, e.g. no host on hold: not read).
local function ctx_get(ctx, key, host)
  local memo = ctx.memo
  if memo == nil then return redis.call('HGET', key, host) or nil end
  if ctx.empty and ctx.empty[key] then return nil end
  local m = memo[key]
  if m == nil then
    m = {}
    memo[key] = m
  end
  local v = m[host]
  if v == nil then
    v = redis.call('HGET', key, host) or false
    m[host] = v
  end
  return v or nil
end

local function ctx_put(ctx, key, host, value)
  if ctx.memo == nil then return end
  if ctx.empty then ctx.empty[key] = false end
  if ctx.memo[key] == nil then ctx.memo[key] = {} end
  ctx.memo[key][host] = value
end

-- ctx of one call: the per-host key names and the fleet defaults the client sent
-- (pt interval ms, pb burst, pc concurrency cap, pr 1 when the interval comes from a rate).
local function new_host_ctx(now, tat, hold, hostlive, hostconf, crawldelay, req)
  return {now = now, tat = tat, hold = hold, hostlive = hostlive, hostconf = hostconf,
          crawldelay = crawldelay,
          defaults = {tonumber(req.pt) or 0, tonumber(req.pb) or 1, tonumber(req.pc) or 0,
                      tonumber(req.pr) or 0}}
end

-- The configured interval T (ms), burst, concurrency cap and rate flag of a host: the
-- fleet's defaults and a per-host override ("T|b|cap", empty parts keep the default).
-- ctx.live (crawl control's `host set`, lua/step_control.lua): a second override, applied
-- after the first part by part.
local function host_conf_ctx(ctx, host)
  local T, b, cap, rate = ctx.defaults[1], ctx.defaults[2], ctx.defaults[3], ctx.defaults[4]
  for _, key in ipairs({ctx.hostconf, ctx.live}) do
    local conf = ctx_get(ctx, key, host)
    if conf then
      local ct, cb, cc, cr = string.match(conf, '^([^|]*)|([^|]*)|([^|]*)|?([^|]*)$')
      if tonumber(ct) then
        T = tonumber(ct)
        rate = tonumber(cr) or 0
      end
      b = tonumber(cb) or b
      cap = tonumber(cc) or cap
    end
  end
  return T, b, cap, rate
end

-- Interval T (ms), tolerance tau (ms) and concurrency cap (0: none) of a host: its
-- configured ones (host_conf_ctx), its adaptive controller's rate and cap when ctx.adaptive
-- names the controllers' hash (lua/adaptive.lua), and its robots.txt Crawl-delay (ms) as a
-- lower bound of T: T = max(1000 / learned rate, configured interval, Crawl-delay).
local function host_policy_ctx(ctx, host)
  local T, b, cap, rate = host_conf_ctx(ctx, host)
  if ctx.adaptive then
    -- the host's controller (lua/adaptive.lua): its learned rate, never above this ceiling
    local slowed
    T, cap, slowed = adaptive_apply(ctx_get(ctx, ctx.adaptive, host), T, cap)
    if slowed then b = 1 end
  end
  local delay = tonumber(ctx_get(ctx, ctx.crawldelay, host))
  if delay and delay >= T then
    T = delay
    b = 1
    rate = 0
  end
  if b < 1 then b = 1 end
  ctx.catchup = (rate == 1)
  return T, T * (b - 1), cap
end

-- nil when host may be fetched now; else the server time (ms) from which it may be tried
-- again (FAR: when one of its requests in flight is done).
local function host_blocked_until_ctx(ctx, host, T, tau, cap, check_cap)
  local hold = tonumber(ctx_get(ctx, ctx.hold, host)) or 0
  if hold > ctx.now then
    return hold
  end
  if check_cap and cap > 0 and (tonumber(ctx_get(ctx, ctx.hostlive, host)) or 0) >= cap then
    return FAR
  end
  if T > 0 then
    local tat = tonumber(ctx_get(ctx, ctx.tat, host)) or 0
    if tat - tau > ctx.now then
      return tat - tau
    end
  end
  return nil
end

-- A rate's token taken less than one interval late keeps up to half an interval of its
-- lateness (TAT + T, or now - T/2 + T when later than T/2) instead of restarting the
-- schedule from now (max(TAT, now) + T): the workers' reaction time (tens of ms) is then not
-- lost on every request, and two turns are never closer than T/2, so that the requests of any
-- 1-s window stay within rate + 1 even when they leave their workers a little unevenly.
-- After a longer pause the schedule restarts from now, so an idle host gains no extra burst.
-- A delay (DOWNLOAD_DELAY, Crawl-delay) is a minimum gap and never catches up.
local function host_take_token_ctx(ctx, host, T)
  if T > 0 then
    local tat = tonumber(ctx_get(ctx, ctx.tat, host)) or 0
    local base = math.max(tat, ctx.now)
    if ctx.catchup and tat < ctx.now and ctx.now - tat < T then
      base = math.max(tat, ctx.now - T / 2)
    end
    redis.call('HSET', ctx.tat, host, base + T)
    ctx_put(ctx, ctx.tat, host, base + T)
  end
end
