-- step_adapt.lua: the download reports' share of adaptive politeness (issue 35,
-- lua/adaptive.lua).  Defines step_adapt and its helper step_adapt_report.
--
-- Each download over (req.s [[id, token, outcome, latency ms, reason, exit id]...]; entries
-- of two elements carry no report; exit id '' or absent: no proxy) of a lease still held
-- with that token updates its host's controller, when the call's constants turn it on
-- (req.ad = 1) and the host has a ceiling (a configured rate or delay: a host without one is
-- held on overload answers instead).  Parameters: req.ab (beta), req.as (step, fraction of
-- the ceiling), req.aw (clean window ms), req.ag (latency factor g, 0: no latency rule),
-- req.am (the slowest rate, requests/s).
-- Counters: adaptive_decreases (adaptive_latency_decreases of them by the latency rule),
-- adaptive_inflight (overload answers of requests leased before the last decrease: not
-- decreased again), adaptive_increases.
-- Keys (of K): adaptive, token (GET per decrease), and the lease (read by State).  Writes:
-- adaptive (one HSET per report that changes a host's state; with a proxy exit one HGET and
-- at most one HSET more, of the field host TAB exit).
-- Work per call: one pass over req.s; nothing when the controller is off.

-- One report sv of a lease held with token tok of host (configured interval T ms > 0,
-- concurrency cap): the host's (and its exit's) controller state, and the counters.
local function step_adapt_report(c, p, sv, host, tok, o, T, cap)
  local K, ctx = c.K, c.ctx
  local raw = ctx_get(ctx, K.adaptive, host)
  local ex = tostring(sv[6] or '')
  local xfield = ex ~= '' and host .. '\t' .. ex or nil
  local xraw = xfield and (redis.call('HGET', K.adaptive, xfield) or '') or nil
  local new, event, xnew = adaptive_report(raw, c.now, T, cap, tonumber(tok), o,
                                           tonumber(sv[4]) or -1, tostring(sv[5] or ''),
                                           p, K.token, xraw)
  if xnew and xnew ~= xraw then redis.call('HSET', K.adaptive, xfield, xnew) end
  if new then
    redis.call('HSET', K.adaptive, host, new)
    ctx_put(ctx, K.adaptive, host, new)
  end
  if event == 'dec' then
    c.count('adaptive_decreases', 1)
    if o == 0 then c.count('adaptive_latency_decreases', 1) end
  elseif event == 'inflight' then c.count('adaptive_inflight', 1)
  elseif event == 'inc' then c.count('adaptive_increases', 1) end
end

local function step_adapt(c)
  local req, st = c.req, c.st
  if req.ad ~= 1 or #req.s == 0 then return end
  local p = {tonumber(req.ab) or 0.5, tonumber(req.as) or 0.05, tonumber(req.aw) or 1000,
             tonumber(req.ag) or 2, tonumber(req.am) or 0.05}
  for _, sv in ipairs(req.s) do
    local o = tonumber(sv[3])
    local tok, _, _, host = st.parse_lease(st.lease_value(sv[1]))
    if o and tok and tok == tostring(sv[2]) and host ~= STAGE_HOST then
      -- (a host without a configured rate or delay has no ceiling to adapt under: its
      -- overload answers hold it, politeness/middlewares.py; docs/politeness.md)
      local T, _, cap = host_conf_ctx(c.ctx, host)
      if T > 0 then step_adapt_report(c, p, sv, host, tok, o, T, cap) end
    end
  end
end
