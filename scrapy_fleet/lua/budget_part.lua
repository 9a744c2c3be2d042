-- budget_part.lua: one partition's chunk of the crawl's page budget at P > 1 (issue 34,
-- lua/budget_home.lua, frontier/budgetchunks.py), on the partition's own slot.
--
-- The partition's K.budget holds `chunk` (pages granted to it by the home so far: the
-- largest g|p a worker brought, so a stale or repeated one changes nothing), `back` (pages
-- it gave back so far) and `charged` (pages its lease step charged: lua/step_budget.lua
-- leases only while charged < chunk - back).  Giving back (ARGV[2] = "1") hands the unused
-- pages (chunk - back - charged) back, only when nothing is queued or deferred here (this
-- partition has no use for them; another may); the worker then reports `back` to the home.
--
-- Keys (of K, keys/calls.py BUDGET_PART_CALL): budget, queue_count, leases, deferred.
-- ARGV: [1] g|p as the home last answered (0: none); [2] "1" to give the unused pages back.
-- Reply: {chunk, back, charged, unused, queued, leased, deferred}.
-- Writes: budget (chunk, back).  Bound of work per call: 5 commands.

local v = redis.call('HMGET', K.budget, 'chunk', 'back', 'charged')
local chunk, back, charged = tonumber(v[1]) or 0, tonumber(v[2]) or 0, tonumber(v[3]) or 0
local g = tonumber(ARGV[1]) or 0
if g > chunk then
  chunk = g
  redis.call('HSET', K.budget, 'chunk', chunk)
end
local queued = tonumber(redis.call('GET', K.queue_count)) or 0
local leased = redis.call('ZCARD', K.leases)
local deferred = redis.call('ZCARD', K.deferred)
local unused = math.max(0, chunk - back - charged)
if ARGV[2] == '1' and unused > 0 and queued + deferred == 0 then
  back = back + unused
  unused = 0
  redis.call('HSET', K.budget, 'back', back)
end
return {chunk, back, charged, unused, queued, leased, deferred}
