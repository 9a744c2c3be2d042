-- sample.lua: take the due samples of the time series (lua/monitoring.lua) without a frontier
-- call, for a monitor process watching a crawl whose workers are all gone: the series then
-- go on (depth, workers_alive 0).  At most one sample per tier step fleet-wide, as from the
-- workers' calls.
--
-- Keys (of K, keys.SAMPLE_CALL): stats, workers, leases, deferred, parked, dead, queue_count,
--   and the monitoring keys (lua/monitoring.lua; worker_info unused).
-- ARGV[1]: a worker is dead after this many ms without a call (workers_alive)
-- ARGV[2]: a worker is forgotten (left out of `workers`) after this many ms
-- Reply: 1 when a 10 s sample was written, 0 when one was taken this step already or when
-- the crawl has none of the frontier's keys above (nothing is written then).
-- Work per call: 5 commands, and a sample's (lua/monitoring.lua).

-- a crawl Redis holds nothing of (a wrong id, or not begun yet) gets no keys from a watcher
if redis.call('EXISTS', K.stats, K.workers, K.leases, K.deferred, K.parked, K.dead,
              K.queue_count) == 0 then
  return 0
end
local now = server_now_ms()
local m = {da = tonumber(ARGV[1]) or 15000, fa = tonumber(ARGV[2]) or 120000}
local bad = monitor_check_keys(K, m)
if bad then return redis.error_reply('ERR fleet: ' .. bad) end
local before = m.last[1]
monitor_apply(m, K, now, '', 0)
if redis.call('HGET', K.mon, 's1') ~= before then return 1 end
return 0
