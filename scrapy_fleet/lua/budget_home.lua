-- budget_home.lua: the crawl's page budget at P > 1 partitions (issue 34, docs/control.md
-- "Budgets"; frontier/budgetchunks.py): the budget lives at its home, the crawl's own
-- K.budget (the key `scrapy fleet budget` writes), and each partition reserves chunks of it;
-- a partition leases only against what it reserved (lua/step_budget.lua, req.bgc), so the
-- lease step stays in one slot.
--
-- The home's counts are cumulative and only grow, so a reply lost and a call sent again
-- lose nothing and never grant twice what a partition can use: `g|<p>` pages granted to
-- partition p so far, `b|<p>` pages p gave back so far (as p last reported: its K.budget
-- `back`, lua/budget_part.lua), `granted` and `returned` their sums.  Pages left at the
-- home = pages - granted + returned; every partition's allowance is its chunk (at most
-- g|p) minus its back (at least b|p), so the sum of the partitions' leases never exceeds
-- the budget.
--
-- Keys (of K, keys/calls.py BUDGET_HOME_CALL): budget.
-- ARGV: [1] p, the partition; [2] P, the partitions; [3] FLEET_BUDGET_PAGES (the home's
--   `pages`, set by the command, is above it); [4] the chunk's cap (pages); [5] "1" to
--   reserve a chunk, "0" only to report [6]; [6] the partition's `back` (cumulative pages
--   it gave back; 0: none), at most g|p.
-- Chunk: min(cap, ceil(left / P)), at most what is left (0 when nothing is).
-- Reply: {g|p after the call, pages left at the home, the budget (pages), pages granted by
--   this call}.
-- Writes: budget (granted, returned, g|p, b|p).  Bound of work per call: 3 commands.

local p = ARGV[1]
local parts = math.max(1, tonumber(ARGV[2]) or 1)
local cap = math.max(1, tonumber(ARGV[4]) or 64)
local v = redis.call('HMGET', K.budget, 'pages', 'granted', 'returned', 'g|' .. p, 'b|' .. p)
local pages = tonumber(v[1]) or tonumber(ARGV[3]) or 0
local granted, returned = tonumber(v[2]) or 0, tonumber(v[3]) or 0
local gp, bp = tonumber(v[4]) or 0, tonumber(v[5]) or 0
local back = math.min(tonumber(ARGV[6]) or 0, gp)  -- (a partition gives back what it got)
if back > bp then
  returned = returned + back - bp
  bp = back
  redis.call('HSET', K.budget, 'returned', returned, 'b|' .. p, bp)
end
local left = math.max(0, pages - granted + returned)
local n = 0
if ARGV[5] == '1' and left > 0 then
  n = math.min(cap, left, math.ceil(left / parts))
  gp, granted, left = gp + n, granted + n, left - n
  redis.call('HSET', K.budget, 'granted', granted, 'g|' .. p, gp)
end
return {gp, left, pages, n}
