-- beat.lua: a worker's sign of life, sent every FLEET_WORKER_DEAD_AFTER / 5 s from a thread of
-- its own (frontier/liveness.py) that keeps running while the worker's reactor is busy (a slow
-- callback, a long parse): the workers holding leases are told dead only when this stops
-- too (lua/step_recover.lua: the process died, was stopped, or lost Redis).
--
-- Keys (of K, keys.BEAT_CALL): workers (ZSET worker -> last sign, ms), holders (ZSET, the
-- same for workers that took leases), mon (HASH: lw, the last worker call or beat),
-- alive_from (STRING ms).
-- ARGV: 1 worker id   2 FLEET_WORKER_DEAD_AFTER in ms
-- Writes: workers and holders (ZADD XX: only a worker already there, which a frontier call
-- added, is updated; a beat never adds one), mon's lw, alive_from when no worker had reached
-- Redis for ARGV[2] ms before this beat (an outage: liveness counts from its end, so no
-- worker is dead to the others because Redis was away).
-- A worker that is not in workers (the crawl was purged, or it never made a frontier call)
-- writes nothing: a beat never brings a purged crawl's keys back.
-- Reply: the server time (ms).  Safe to repeat.  Work: 6 commands at most.

local me, dead_ms = ARGV[1], tonumber(ARGV[2])
if me == nil or me == '' or not dead_ms or dead_ms <= 0 then
  return redis.error_reply('ERR fleet: bad beat call')
end
local now = server_now_ms()
if not redis.call('ZSCORE', K.workers, me) then
  return now
end
local lw = tonumber(redis.call('HGET', K.mon, 'lw'))
if not lw or now - lw > dead_ms then
  redis.call('SET', K.alive_from, string.format('%d', now))
end
redis.call('ZADD', K.workers, 'XX', now, me)
redis.call('ZADD', K.holders, 'XX', now, me)
redis.call('HSET', K.mon, 'lw', now)
return now
