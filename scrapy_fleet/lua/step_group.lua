-- step_group.lua: how the crawls of a crawl group share a host's leases (issue 34,
-- docs/control.md "Crawl groups").  Defines group_open, group_turn, group_took and group_left,
-- used by step_lease.
--
-- The crawls of a group (FLEET_CRAWL_GROUP) share each host's politeness keys (keys/crawl.py:
-- the tag {group:<name>}), so the host's rate, concurrency cap, holds and robots.txt hold
-- for all of them together.  Which crawl takes the host's next turn while several want it
-- is stride scheduling (C. A. Waldspurger, W. E. Weihl, "Stride Scheduling: Deterministic
-- Proportional-Share Resource Management", MIT/LCS/TM-528, 1995): each crawl has a pass,
-- raised by 1 / weight (FLEET_CRAWL_WEIGHT) at each lease it takes from the host; a crawl
-- may take a turn while its pass is at most one stride above the lowest pass of the other
-- crawls that want the host (one stride of slack: a turn is not lost while the crawl whose
-- turn it is has no call in flight, and the lag stays bounded, so leases are shared in the
-- ratio of the weights).  A crawl wants a host when its lease step looks at it with a
-- request to lease (not paused, this worker under its share of the cap), whether or not the
-- host's politeness lets a request go now; a want older than the window W = max(2000, 4 x
-- the host's interval) ms is forgotten (that crawl stopped), a crawl that leased its last
-- queued request of the host wants it no more at once (group_left), and a
-- crawl that comes back is lifted to the lowest pass of those still there (no credit banked
-- while away).
-- State: K.group_share_prefix .. host, a HASH p|<crawl> pass, t|<crawl> last want (ms),
-- w|<crawl> weight.  Arguments: req.gi (the crawl's id in its group, "" or none: no group),
-- req.gw (its weight, > 0).
-- Work per call: nothing without a group; with one, an HGETALL per host leased from or
-- refused a turn (the HASH holds 3 fields per crawl of the group), an HSET per turn asked
-- and one per lease.

-- c.grp: the crawl's group share state for this call, or nil without a group.
local function group_open(c)
  local gi = c.req.gi
  if type(gi) ~= 'string' or gi == '' then return nil end
  if not c.grp then
    c.grp = {me = gi, w = math.max(tonumber(c.req.gw) or 1, 1e-6), hosts = {}}
  end
  return c.grp
end

local function group_state(c, g, h)
  local s = g.hosts[h]
  if s then return s end
  s = {key = c.K.group_share_prefix .. h, p = {}, t = {}}
  local raw = redis.call('HGETALL', s.key)
  for i = 1, #raw, 2 do
    local kind, crawl = string.match(raw[i], '^(%a)|(.*)$')
    if kind == 'p' then s.p[crawl] = tonumber(raw[i + 1]) or 0
    elseif kind == 't' then s.t[crawl] = tonumber(raw[i + 1]) or 0 end
  end
  g.hosts[h] = s
  return s
end

-- May this crawl take host h's turn now (interval: the host's T, ms)?  Records the want
-- (and a lift of the pass); group_took records the lease.
local function group_turn(c, g, h, interval)
  local s, now, me = group_state(c, g, h), c.now, g.me
  local since = now - math.max(2000, 4 * (tonumber(interval) or 0))
  local low  -- the lowest pass of the other crawls that want h
  for crawl, t in pairs(s.t) do
    if crawl ~= me and t >= since and s.p[crawl] and (not low or s.p[crawl] < low) then
      low = s.p[crawl]
    end
  end
  local mine = s.p[me] or 0
  if (s.t[me] or 0) < since and low and mine < low then mine = low end  -- back: no credit
  s.p[me], s.t[me] = mine, now
  redis.call('HSET', s.key, 'p|' .. me, string.format('%.17g', mine), 't|' .. me, now,
             'w|' .. me, string.format('%.17g', g.w))
  return not low or mine <= low + 1 / g.w
end

-- This crawl took a lease of host h (after group_turn said yes): its pass goes up one stride.
local function group_took(g, h)
  local s = g.hosts[h]
  s.p[g.me] = s.p[g.me] + 1 / g.w
  redis.call('HSET', s.key, 'p|' .. g.me, string.format('%.17g', s.p[g.me]))
end

-- This crawl's queue of host h is empty (its last entry leased): it wants h no more, so the
-- others need not wait for its want to age out.
local function group_left(g, h)
  local s = g.hosts[h]
  if not s then return end
  s.t[g.me] = 0
  redis.call('HSET', s.key, 't|' .. g.me, 0)
end
