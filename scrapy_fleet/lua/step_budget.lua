-- step_budget.lua: the crawl's budgets, charged by the lease step (issue 34, docs/control.md
-- "Budgets").  Defines budget_open, budget_allow, budget_unwind, budget_flush,
-- budget_close and budget_left.
--
-- A page is charged when its lease is granted (zero overshoot), once per entry: an entry
-- whose lease expired or was reclaimed (K.expiries counts it, lua/step_reclaim.lua) was
-- charged at its first grant and is granted again without a charge; a lease given back
-- unsent (lua/step_release.lua) is refunded.  Stored responses (STAGE_HOST) are not pages.
-- Budgets: the crawl's pages (K.budget `pages`, set by `scrapy fleet budget`, else req.bgp:
-- FLEET_BUDGET_PAGES; at P > 1, req.bgc, this partition's chunk of them instead: K.budget
-- `chunk` - `back`, lua/budget_part.lua), its seconds (K.budget `seconds`, else req.bgs:
-- FLEET_BUDGET_SECONDS; the deadline is K.budget `started` + seconds, `started` set at the
-- crawl's first lease on Redis's clock), the crawl's items (req.bgi: FLEET_BUDGET_ITEMS; reached, nothing more is
-- leased: the items of pages in flight overshoot it), its response bytes (req.bgb:
-- FLEET_BUDGET_BYTES, charged at download, as reported; the same overshoot), a host's pages (K.budgeth `c|<host>`, the command's, else `s|<host>`,
-- FLEET_HOST_OVERRIDES' budget_pages, else req.bgh: FLEET_HOST_BUDGET_PAGES; read only
-- when req.bgh > 0 or K.budget `hosts` is set).  0 or none: no budget.
-- A host out of budget keeps its queue and is put at FAR in K.ready (not a candidate until
-- a push, a freed slot or `scrapy fleet budget --host` makes it one again).
-- Keys (of K): budget, budgeth, expiries, ready (budget_close), stats (items_scraped, response_bytes).  Writes: budget (charged, started), budgeth (n|).
-- Work per call: nothing without a budget but one HMGET (a call that leases or releases);
-- with one, an HMGET per host leased from (host budgets), one HINCRBY per host charged, and
-- an HGET of K.expiries per head refused (a budget spent) and per lease given back.

-- c.bud: the call's budgets, read once ({on = false} without any).
local function budget_open(c)
  if c.bud then return c.bud end
  local req = c.req
  local v = redis.call('HMGET', c.K.budget, 'pages', 'seconds', 'charged', 'started', 'hosts',
                      'chunk', 'back')
  local hdef = tonumber(req.bgh) or 0
  -- req.bgc (P > 1): this partition's chunk of the crawl's page budget (lua/budget_part.lua)
  local chunked = tonumber(req.bgc) == 1
  local b = {pages = chunked and math.max(0, (tonumber(v[6]) or 0) - (tonumber(v[7]) or 0))
               or tonumber(v[1]) or tonumber(req.bgp) or 0, chunked = chunked,
             secs = tonumber(v[2]) or tonumber(req.bgs) or 0,
             charged = tonumber(v[3]) or 0, started = tonumber(v[4]),
             hdef = hdef, hosts = hdef > 0 or v[5] ~= false,
             add = 0, hostadd = {}, rows = {}, provisional = {}}
  b.on = b.pages > 0 or b.chunked or b.secs > 0 or b.hosts
  b.over = b.secs > 0 and b.started ~= nil and c.now >= b.started + b.secs * 1000
  -- FLEET_BUDGET_ITEMS (req.bgi), FLEET_BUDGET_BYTES (req.bgb): items and response bytes
  -- the workers reported (K.stats items_scraped, response_bytes: the monitoring deltas of
  -- earlier calls, lua/monitoring.lua)
  local items, bytes = tonumber(req.bgi) or 0, tonumber(req.bgb) or 0
  if items > 0 or bytes > 0 then
    b.on = true
    local got = redis.call('HMGET', c.K.stats, 'items_scraped', 'response_bytes')
    b.items_over = items > 0 and (tonumber(got[1]) or 0) >= items
    b.bytes_over = bytes > 0 and (tonumber(got[2]) or 0) >= bytes
  end
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

-- Charge (*n* = 1) or refund (*n* = -1) one page of host *h*: the crawl's count and, with
-- host budgets on, the host's (written by budget_flush).
local function budget_charge(c, b, h, n)
  b.add = b.add + n
  if b.hosts then
    local row = budget_row(c, b, h)
    row[2] = row[2] + n
    b.hostadd[h] = (b.hostadd[h] or 0) + n
  end
end

-- Whether entry *id* of host *h* may be leased now; charges it when it may.  Returns true,
-- or false and 'crawl' / 'host' (whose budget is spent).  An entry charged at an earlier
-- grant (its lease expired or was reclaimed: K.expiries counts it) is not charged again:
-- looked up here only when a budget is spent; else it is charged provisionally and
-- budget_settle takes the charge back (from the expiries the lease step reads anyway).
local function budget_allow(c, h, id)
  local b = c.bud
  if h == STAGE_HOST then return true end
  local why = (b.pages > 0 or b.chunked) and b.charged + b.add >= b.pages and 'crawl' or nil
  local row = b.hosts and budget_row(c, b, h) or nil
  if not why and row and row[1] > 0 and row[2] >= row[1] then why = 'host' end
  if why then
    if (tonumber(redis.call('HGET', c.K.expiries, id)) or 0) > 0 then
      return true  -- charged at its first grant
    end
    return false, why
  end
  budget_charge(c, b, h, 1)
  b.provisional[id] = h
  return true
end

-- The call's leases *ids* and their expiry counts *exps* (HMGET K.expiries): a lease
-- charged provisionally whose entry has an expiry counted was charged by its first grant,
-- and its charge is taken back.
local function budget_settle(c, ids, exps)
  local b = c.bud
  for i, id in ipairs(ids) do
    local h = b.provisional[id]
    if h and (tonumber(exps[i]) or 0) > 0 then
      budget_charge(c, b, h, -1)
    end
  end
end

-- Refund the charge of entry *id* of host *h*: leased in this call and not used (a corrupt
-- entry), or given back unsent (*check*: only when it was charged by its last grant, i.e.
-- no expiry counted since).
local function budget_unwind(c, h, id, check)
  local b = budget_open(c)
  if not b.on or h == STAGE_HOST then return end
  if check and (tonumber(redis.call('HGET', c.K.expiries, id)) or 0) > 0 then return end
  budget_charge(c, b, h, -1)
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
-- (*inflight*: leases held) or deferred (*deferred*): 'budget_seconds', 'budget_items',
-- 'budget_bytes', 'budget_pages',
-- 'budget_hosts' (entries are queued, *queued*, and every host holding them is out of its
-- budget: none is in K.ready before FAR), or nil.
local function budget_close(c, inflight, deferred, queued)
  if inflight > 0 then return nil end
  local b = budget_open(c)
  if not b.on then return nil end
  if b.over then return 'budget_seconds' end
  if b.items_over then return 'budget_items' end
  if b.bytes_over then return 'budget_bytes' end
  -- (a partition's chunk spent is not the crawl's budget: the worker asks the home,
  -- frontier/budgetchunks.py)
  if b.pages > 0 and not b.chunked and b.charged + b.add >= b.pages then
    return 'budget_pages'
  end
  if b.hosts and deferred == 0 and queued > 0
      and #redis.call('ZRANGEBYSCORE', c.K.ready, '-inf', '(' .. FAR, 'LIMIT', 0, 1) == 0 then
    return 'budget_hosts'
  end
  return nil
end

-- The pages left in this partition's chunk after the call (req.bgc: P > 1), for the worker
-- (out.bq: it reserves another chunk at the home when none is left).
local function budget_left(c)
  local b = budget_open(c)
  return math.max(0, b.pages - b.charged - b.add)
end
