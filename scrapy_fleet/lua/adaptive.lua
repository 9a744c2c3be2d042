-- adaptive.lua: the adaptive politeness controller, one per host for the whole fleet (issue 35,
-- docs/politeness.md "Adaptive politeness").  Defines locals only: adaptive_parse,
-- adaptive_apply (read by lua/hosts.lua's host_policy_ctx) and adaptive_report (run by
-- lua/step_adapt.lua for each download report).
--
-- State: K.adaptive, host -> "r|ls|lm|lmt|dt|dk|why|ct|cap|cc|n":
--   r    learned rate (requests/s), never above the ceiling C = 1000 / T (the host's
--        configured interval T ms: FLEET_HOST_RATE, FLEET_HOST_DELAY or its override)
--   ls   short latency average (ms; EWMA, weight 0.3 of each new sample)
--   lm   long-window minimum latency (ms), lmt when it was taken (a minimum older than
--        LONG_WINDOW_MS is replaced by the next sample)
--   dt   time of the last decrease (ms, Redis's clock); dk the lease-token counter (K.token)
--        then: a request whose token is <= dk was leased before that decrease, and its
--        overload answer does not decrease the rate again (one decrease per overload event)
--   why  reason of the last decrease (the status "429", "503", "error", "latency")
--   ct   start of the current clean window (ms)
--   cap  learned capacity: the rate at which the last overload happened (0: none yet)
--   cc   concurrency cap set by the latency rule (0: none), n decreases so far
-- and, for a request through a proxy exit, host .. '\t' .. exit id -> "ls|lm|lmt": the short
-- average and long minimum latency through that exit (the latency rule reads these instead)
-- Rules (AIMD, Jacobson's congestion avoidance, RFC 5681 section 3.1, per host; the latency
-- rule after TCP Vegas's expected/actual comparison): an overload answer of a request leased
-- after the last decrease multiplies r by beta; a clean answer after a full clean window adds
-- step x C, or follows the cubic curve to cap once one is learned (adaptive_increase); when ls > g x lm (lm read as at least
-- LATENCY_FLOOR_MS), r is multiplied by g x lm / ls and cc set to ceil(r x g x lm / 1000)
-- (requests in flight at rate r and the acceptable latency), lifted at the first increase
-- once ls is back under g x lm.
-- Keys: K.adaptive (HSET per report that changes the state), K.token (GET per decrease).

local LONG_WINDOW_MS = 300000
local LATENCY_WEIGHT = 0.3
-- ms: the long minimum is read as at least this, so that the jitter of answers of a few ms
-- (a nearby server, a busy worker's event loop) is not taken for a queue growing at the site
local LATENCY_FLOOR_MS = 25
-- clean windows from a decrease to the learned capacity on the increase's cubic curve
local PLATEAU_WINDOWS = 15

-- The state of a host from its stored string (nil when none or unreadable).
local function adaptive_parse(raw)
  if not raw then return nil end
  local f = {}
  for part in string.gmatch(raw, '([^|]*)|?') do f[#f + 1] = part end
  local r = tonumber(f[1])
  if not r or r <= 0 then return nil end
  return {r = r, ls = tonumber(f[2]) or 0, lm = tonumber(f[3]) or 0, lmt = tonumber(f[4]) or 0,
          dt = tonumber(f[5]) or 0, dk = tonumber(f[6]) or 0, why = f[7] or '',
          ct = tonumber(f[8]) or 0, cap = tonumber(f[9]) or 0, cc = tonumber(f[10]) or 0,
          n = tonumber(f[11]) or 0}
end

local function adaptive_pack(s)
  return string.format('%.6g|%.6g|%.6g|%d|%d|%d|%s|%d|%.6g|%d|%d', s.r, s.ls, s.lm, s.lmt,
                       s.dt, s.dk, s.why, s.ct, s.cap, s.cc, s.n)
end

-- The ceiling (requests/s) of a host without a configured rate or delay (T = 0): what its
-- concurrency cap allows at its long minimum latency, cap x 1000 / lm (cap 0: Scrapy's
-- default 8 per domain; lm read as at least LATENCY_FLOOR_MS, so 320/s at most by default).
local function adaptive_free_ceiling(s, cap)
  local lm = s and s.lm or 0
  return (cap > 0 and cap or 8) * 1000 / math.max(lm, LATENCY_FLOOR_MS)
end

-- The ceiling C (requests/s) of a host of configured interval T (ms) and concurrency cap,
-- whose stored state is raw: 1000 / T, or, without T, adaptive_free_ceiling.
local function adaptive_ceiling(raw, T, cap)
  if T > 0 then return 1000 / T end
  return adaptive_free_ceiling(adaptive_parse(raw), cap)
end

-- The interval T (ms) and concurrency cap of a host as its controller sets them: T =
-- max(T, 1000 / r), cap = min(cap, cc); raw is the host's stored state (nil: unchanged).  A
-- host without a configured interval (T = 0) gets 1000 / r once its rate was ever lowered.
local function adaptive_apply(raw, T, cap)
  local s = adaptive_parse(raw)
  if not s or (T <= 0 and s.n == 0 and s.cc == 0) then return T, cap, false end
  local slowed = false
  if T <= 0 then
    T = 1000 / s.r
    slowed = true
  elseif s.r < 1000 / T then
    T = 1000 / s.r
    slowed = true
  end
  if s.cc > 0 and (cap == 0 or s.cc < cap) then cap = s.cc end
  return T, cap, slowed
end

-- The rate after a clean window: r + step x C without a learned capacity; with one (cap,
-- the rate of the last overload, at time dt) the cubic curve of TCP CUBIC (RFC 9438 section
-- 4.2, W(t) = cap + cap x (1 - beta) x ((t - K) / K)^3, here with K = PLATEAU_WINDOWS clean
-- windows, and twice as fast past t = K): it rises fast from the decrease, flattens within a
-- few per cent of cap for about K (a limit that recurs at about the same rate is approached
-- slowly), then probes beyond it ever faster; never more than step x C per window, never
-- above C, never down.
local function adaptive_increase(s, now, C, p)
  local r = s.r + p[2] * C
  if s.cap > 0 then
    local K = PLATEAU_WINDOWS * p[3]
    local x = (now - s.dt - K) / K
    if x > 0 then x = 2 * x end  -- beyond cap: probe twice as fast as the approach
    r = math.min(r, math.max(s.r, s.cap + s.cap * (1 - p[1]) * x * x * x))
  end
  return math.min(C, r)
end

-- The state of a host that a crawl has not adapted yet, seeded from the capacity cap
-- (requests/s) that an earlier crawl learned (politeness/memory.py): rate min(cap, C), on
-- the cubic curve's plateau (as if cap had been refused K ago), so that it probes above cap
-- slowly; nil when cap is not a positive number.
local function adaptive_seed(now, C, cap, window_ms)
  cap = tonumber(cap)
  if not cap or cap <= 0 or C <= 0 then return nil end
  local dt = now - PLATEAU_WINDOWS * window_ms
  return adaptive_pack({r = math.min(cap, C), ls = 0, lm = 0, lmt = 0, dt = dt, dk = 0,
                        why = '', ct = now, cap = cap, cc = 0, n = 0})
end

-- One download report of a request to a host of configured interval T (ms; 0: none) and
-- concurrency cap (its ceiling C: 1000 / T, or adaptive_free_ceiling) leased with token
-- tok: outcome o (0 clean, 1 overload, 2 neither: a ban, another error), latency lat (ms,
-- -1 unknown), reason why of an overload; p = {beta, step, window ms, g, slowest rate
-- requests/s}.  xraw: the request went through a proxy exit, whose latency to the host
-- ("ls|lm|lmt", '' when new) the latency rule reads instead of the host's, so that a slow
-- exit is not taken for a slow host.  Returns the new state string (nil: unchanged), what
-- happened ('dec', 'inflight', 'inc' or nil) and the exit's new latency string (nil: none).
local function adaptive_report(raw, now, T, cap, tok, o, lat, why, p, token_key, xraw)
  local s = adaptive_parse(raw) or {r = math.huge, ls = 0, lm = 0, lmt = 0, dt = 0, dk = 0,
                                    why = '', ct = now, cap = 0, cc = 0, n = 0}
  local x  -- through a proxy exit: that exit's latency to the host, {ls, lm, lmt}
  if xraw then
    local ls, lm, lmt = string.match(xraw, '^([^|]*)|([^|]*)|([^|]*)$')
    x = {ls = tonumber(ls) or 0, lm = tonumber(lm) or 0, lmt = tonumber(lmt) or 0}
  end
  if s.lm <= 0 and o == 0 and lat >= 0 then s.lm, s.lmt = lat, now end  -- (a first sample)
  local C = T > 0 and 1000 / T or adaptive_free_ceiling(s, cap)
  if s.r > C then s.r = C end  -- (a new state, or the ceiling was lowered since)
  local event
  local function decrease(factor, reason)
    -- (the learned capacity is the rate an overload answer refused; a latency decrease
    -- keeps it: a queue's latency says nothing of what the site refuses)
    if reason ~= 'latency' then s.cap = s.r end
    s.r = math.max(math.min(p[5], C), s.r * factor)
    s.dt, s.why, s.ct, s.n = now, reason, now, s.n + 1
    s.dk = tonumber(redis.call('GET', token_key)) or 0
    event = 'dec'
  end
  if o == 1 then
    if tok > s.dk then decrease(p[1], why) else event = 'inflight' end
    s.ct = now  -- no increase before a whole clean window
  elseif o == 0 then
    local L = x or s  -- the latency of the host, or of the host through one proxy exit
    if lat >= 0 then
      L.ls = L.ls > 0 and (1 - LATENCY_WEIGHT) * L.ls + LATENCY_WEIGHT * lat or lat
      if L.lm <= 0 or lat <= L.lm or now - L.lmt > LONG_WINDOW_MS then L.lm, L.lmt = lat, now end
    end
    local g, lm = p[4], math.max(L.lm, LATENCY_FLOOR_MS)
    -- (the latency rule only under a configured ceiling, T > 0, as step_adapt reports only
    -- such hosts: without one, a fast 404 beside 300 ms pages sent a host to the slowest
    -- rate for good)
    -- (and at most one latency decrease per clean window: the short average stays high for
    -- several answers after a queue is gone, and at the lowered rate every next request is
    -- leased after the decrease, so each such answer decreased again, down to the slowest
    -- rate: bench/README.md, latency mode)
    if T > 0 and g > 0 and L.lm > 0 and L.ls > g * lm and tok > s.dk
        and now - s.dt >= p[3] then
      decrease(g * lm / L.ls, 'latency')
      s.cc = math.max(1, math.ceil(s.r * g * lm / 1000))
    elseif now - s.ct >= p[3] and s.r < C then
      if s.cc > 0 and L.ls <= g * lm then s.cc = 0 end  -- the latency is back: no cap
      s.r = adaptive_increase(s, now, C, p)
      s.ct = now
      if s.cc > 0 then s.cc = s.cc + 1 end  -- (still slow: one more in flight per window)
      event = 'inc'
    elseif s.r >= C then
      s.cc = 0
    end
  else
    return nil, nil
  end
  local xnew = x and string.format('%.6g|%.6g|%d', x.ls, x.lm, x.lmt) or nil
  return adaptive_pack(s), event, xnew
end
