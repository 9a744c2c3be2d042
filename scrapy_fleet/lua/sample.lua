-- sample.lua: take the due samples of the time series (lua/monitoring.lua) without a frontier
-- call, for a monitor process watching a crawl whose workers are all gone: the series then
-- go on (depth, workers_alive 0).  At most one sample per tier step fleet-wide, as from the
-- workers' calls.
--
-- KEYS (keys.CrawlKeys.sample_keys): 1 stats  2 workers  3 queue (previous format)  4 leases
--   5 delayed  6 parked  7 dead  8 qn (queued count), then the MON_NKEYS keys of
--   lua/monitoring.lua (worker info unused)
-- ARGV[1]: a worker is dead after this many ms without a call (workers_alive)
-- ARGV[2]: a worker is forgotten (left out of `workers`) after this many ms
-- Reply: 1 when a 10 s sample was written, 0 when one was taken this step already or when
-- the crawl has none of KEYS 1-8 (nothing is written then).

-- a crawl Redis holds nothing of (a wrong id, or not begun yet) gets no keys from a watcher
if redis.call('EXISTS', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7],
              KEYS[8]) == 0 then
  return 0
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local bad = monitor_check_keys(9)
if bad then return redis.error_reply('ERR fleet: ' .. bad) end
local before = redis.call('HGET', KEYS[10], 's1')
monitor_apply({da = tonumber(ARGV[1]) or 15000, fa = tonumber(ARGV[2]) or 120000}, 9, now, '',
              {stats = KEYS[1], workers = KEYS[2], q = KEYS[3], qn = KEYS[8], leases = KEYS[4],
               delayed = KEYS[5], parked = KEYS[6], dead = KEYS[7]}, 0)
if redis.call('HGET', KEYS[10], 's1') ~= before then return 1 end
return 0
