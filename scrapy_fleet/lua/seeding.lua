-- seeding.lua: who consumes the spider's start requests (FLEET_START_REQUESTS = "once"), as a
-- lease that another worker takes over when its holder stops renewing it.
--
-- Keys (of K, keys.SEEDING_CALL): seeding (HASH: holder, until (server ms), progress, done)
-- ARGV: 1 op: "claim" | "renew" | "done" | "release"   2 worker id   3 lease ms
--   4 progress (renew, done, release)
-- Reply: {status, value}:
--   claim: {"done", progress} | {"busy", holder} | {"won", progress}  (progress: start
--          requests handed on to the frontier by earlier holders, which the new holder skips)
--   renew, done, release: {"ok", progress} | {"lost", holder or ""}
--   release (a holder that stops before the end: Ctrl-C, close): writes its progress and
--   gives the lease up, so another worker takes the rest over at once
-- Every op is safe to repeat: claiming what one holds, renewing and marking done again
-- change nothing more.  Times are the Redis server's clock.

local op, me, lease_ms = ARGV[1], ARGV[2], tonumber(ARGV[3])
local progress = tonumber(ARGV[4]) or 0
if (op ~= 'claim' and op ~= 'renew' and op ~= 'done' and op ~= 'release') or me == nil
    or me == ''
    or not lease_ms or lease_ms <= 0 then
  return redis.error_reply('ERR fleet: bad seeding call')
end
local now = server_now_ms()
local state = redis.call('HMGET', K.seeding, 'holder', 'until', 'progress', 'done')
local holder, until_ms = state[1], tonumber(state[2]) or 0
local stored = tonumber(state[3]) or 0
if op == 'claim' then
  if state[4] == '1' then return {'done', stored} end
  if holder and holder ~= me and until_ms > now then return {'busy', holder} end
  redis.call('HSET', K.seeding, 'holder', me, 'until', now + lease_ms, 'progress', stored)
  return {'won', stored}
end
if holder ~= me then return {'lost', holder or ''} end
progress = math.max(progress, stored)
if op == 'release' then
  redis.call('HSET', K.seeding, 'until', 0, 'progress', progress)
  redis.call('HDEL', K.seeding, 'holder')
  return {'ok', progress}
end
redis.call('HSET', K.seeding, 'until', now + lease_ms, 'progress', progress)
if op == 'done' then redis.call('HSET', K.seeding, 'done', '1') end
return {'ok', progress}
