-- step_budget.lua: the crawl's budgets, charged by the lease step (issue 34, docs/control.md
-- "Budgets").  Defines budget_open, budget_allow, budget_unwind, budget_flush and
-- budget_close.
--
-- A page is charged when its lease is granted (zero overshoot), once per entry: an entry
-- whose lease expired or was reclaimed (K.expiries counts it, lua/step_reclaim.lua) was
-- charged at its first grant and is granted again without a charge; a lease given back
-- unsent (lua/step_release.lua) is refunded.  Stored responses (STAGE_HOST) are not pages.
-- Budgets: the crawl's pages (K.budget `pages`, set by `scrapy fleet budget`, else req.bgp:
-- FLEET_BUDGET_PAGES), its seconds (K.budget `seconds`, else req.bgs: FLEET_BUDGET_SECONDS;
-- the deadline is K.budget `started` + seconds, `started` set at the crawl's first lease on
-- Redis's clock), a host's pages (K.budgeth `c|<host>`, the command's, else `s|<host>`,
-- FLEET_HOST_OVERRIDES' budget_pages, else req.bgh: FLEET_HOST_BUDGET_PAGES; read only
-- when req.bgh > 0 or K.budget `hosts` is set).  0 or none: no budget.
-- A host out of budget keeps its queue and is put at FAR in K.ready (not a candidate until
-- a push, a freed slot or `scrapy fleet budget --host` makes it one again).
-- Keys (of K): budget, budgeth, expiries, ready (budget_close).  Writes: budget (charged, started), budgeth (n|).
-- Work per call: nothing without a budget but one HMGET (a call that leases or releases);
-- with one, an HGET of K.expiries per lease granted or refused, an HMGET per host leased
-- from, and one HINCRBY per host charged.

-- c.bud: the call's budgets, read once ({on = false} without any).
local function budget_open(c)
  if c.bud then return c.bud end
  local req = c.req
  local v = redis.call('HMGET', c.K.budget, 'pages', 'seconds', 'charged', 'started', 'hosts')
  local hdef = tonumber(req.bgh) or 0
  local b = {pages = tonumber(v[1]) or tonumber(req.bgp) or 0,
             secs = tonumber(v[2]) or tonumber(req.bgs) or 0,
             charged = tonumber(v[3]) or 0, started = tonumber(v[4]),
             hdef = hdef, hosts = hdef > 0 or v[5] ~= false,
             add = 0, hostadd = {}, rows = {}}
  b.on = b.pages > 0 or b.secs > 0 or b.hosts
  b.over = b.secs > 0 and b.started ~= nil and c.now >= b.started + b.secs * 1000
  c.bud = b
  return b
end

-- {limit, charged} of host *h* (read once per call).
local function budget_row(c, b, h)
  local row = b.rows[h]
  if not row then
    local v = redis.call('HMGET', c.K.budgeth, 'c|' .. h, 's|' .. h, 'n|' .. h)
    row = {tonumber(v[1]) or tonumber(v[2]) or b.hdef, tonumber(v[3]) or 0}
    b.rows[h] = row
  end
  return row
end

-- Whether entry *id* of host *h* may be leased now; charges it when it may and was not
-- charged before.  Returns true, or false and 'crawl' / 'host' (whose budget is spent).
local function budget_allow(c, h, id)
  local b = c.bud
  if h == STAGE_HOST then return true end
  if (tonumber(redis.call('HGET', c.K.expiries, id)) or 0) > 0 then
    return true  -- charged at its first grant
  end
  if b.pages > 0 and b.charged + b.add >= b.pages then return false, 'crawl' end
  if b.hosts then
    local row = budget_row(c, b, h)
    if row[1] > 0 and row[2] >= row[1] then return false, 'host' end
    row[2] = row[2] + 1
    b.hostadd[h] = (b.hostadd[h] or 0) + 1
  end
  b.add = b.add + 1
  return true
end

-- Refund the charge of entry *id* of host *h*: leased in this call and not used (a corrupt
-- entry), or given back unsent (*check*: only when it was charged by its last grant, i.e.
-- no expiry counted since).
local function budget_unwind(c, h, id, check)
  local b = budget_open(c)
  if not b.on or h == STAGE_HOST then return end
  if check and (tonumber(redis.call('HGET', c.K.expiries, id)) or 0) > 0 then return end
  b.add = b.add - 1
  if b.hosts then
    local row = budget_row(c, b, h)
    row[2] = row[2] - 1
    b.hostadd[h] = (b.hostadd[h] or 0) - 1
  end
end

-- Write the call's charges and refunds (and the time budget's start at the first lease).
local function budget_flush(c, leased)
  local b = c.bud
  if not b or not b.on then return end
  if b.add ~= 0 then redis.call('HINCRBY', c.K.budget, 'charged', b.add) end
  for h, n in pairs(b.hostadd) do
    if n ~= 0 then redis.call('HINCRBY', c.K.budgeth, 'n|' .. h, n) end
  end
  b.charged, b.add, b.hostadd = b.charged + b.add, 0, {}
  if leased > 0 and b.secs > 0 and not b.started then
    redis.call('HSET', c.K.budget, 'started', c.now)
    b.started = c.now
  end
end

-- The close reason of a crawl whose budget is spent, once nothing is in flight
-- (*inflight*: leases held) or deferred (*deferred*): 'budget_seconds', 'budget_pages',
-- 'budget_hosts' (entries are queued, *queued*, and every host holding them is out of its
-- budget: none is in K.ready before FAR), or nil.
local function budget_close(c, inflight, deferred, queued)
  if inflight > 0 then return nil end
  local b = budget_open(c)
  if not b.on then return nil end
  if b.over then return 'budget_seconds' end
  if b.pages > 0 and b.charged + b.add >= b.pages then return 'budget_pages' end
  if b.hosts and deferred == 0 and queued > 0
      and #redis.call('ZRANGEBYSCORE', c.K.ready, '-inf', '(' .. FAR, 'LIMIT', 0, 1) == 0 then
    return 'budget_hosts'
  end
  return nil
end
