-- partition_probe.lua: the state of one partition of a partitioned crawl (docs/partitions.md),
-- for the idle sweep of a worker (frontier/partitions.py) and for `status`: how long the
-- partition has been idle (nothing queued, leased, deferred or parked, no revisit scheduled:
-- lua/step_revisit.lua) by its server's clock.
--
-- Keys (of K, keys.PROBE_CALL): queue_count, leases, deferred, parked, idle_since, marker,
-- revisit_index.
-- ARGV[1]: "1" to start the partition's idle clock (SET idle_since now) when it is idle and
--   has none (a partition no frontier call has touched yet), "0" for a read-only probe.
-- Reply: {idle ms (-1: busy; 0 for an idle partition without a clock in a read-only probe),
--   queued, leased, deferred, parked, marker or "", server time ms}.
-- Writes: idle_since, only as said.  Bound of work per call: 8 commands.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local queued = tonumber(redis.call('GET', K.queue_count)) or 0
local leased = redis.call('ZCARD', K.leases)
local deferred = redis.call('ZCARD', K.deferred)
local parked = redis.call('LLEN', K.parked)
local idle = -1
if queued + leased + deferred + parked == 0 and redis.call('EXISTS', K.revisit_index) == 0 then
  local since = tonumber(redis.call('GET', K.idle_since))
  if not since then
    since = now
    if ARGV[1] == '1' then redis.call('SET', K.idle_since, now) end
  end
  idle = now - since
end
return {idle, queued, leased, deferred, parked, redis.call('GET', K.marker) or '', now}
