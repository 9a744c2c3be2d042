-- cookies_merge.lua: merges the cookies that one answer set (or one request's own cookies)
-- into a session's fleet cookie jar, per cookie and atomically (sessions/jar.py): each cookie
-- is its own field, so concurrent merges from several workers never lose each other's
-- cookies (no whole-jar read-modify-write).
--
-- KEYS[1]: the jar (HASH, keys.CrawlKeys.cookie_jar: "<domain>\t<path>\t<name>" ->
--   "<expiry ms or 0>\t<JSON attributes>"; expiry by the server's clock, 0: a session cookie)
-- ARGV: triples field, ttl, attributes.  ttl: "-1" a session cookie (kept until deleted or
--   replaced), a number > 0 the milliseconds it lives from now by the server's clock, "del"
--   a deletion (a Set-Cookie whose expiry has passed); attributes: the JSON the worker reads
--   back (never parsed here).
-- Reply: {stored, deleted, expired}: fields written, fields deleted on request, fields
--   dropped because their expiry passed (every merge drops them; reads never write).
-- Every triple is checked before anything is written.  Safe to repeat: the same triples write
-- the same fields.  Work: O(fields of the jar + triples).

local jar = KEYS[1]
if #ARGV % 3 ~= 0 then
  return redis.error_reply('ERR fleet: cookie merge takes field, ttl, attributes triples')
end
for i = 1, #ARGV, 3 do
  local ttl = ARGV[i + 1]
  local ms = tonumber(ttl)
  if ttl ~= 'del' and not (ms and (ms == -1 or ms > 0)) then
    return redis.error_reply('ERR fleet: bad cookie ttl ' .. tostring(ttl))
  end
end
local now = server_now_ms()
local stored, deleted, expired = 0, 0, 0
local all = redis.call('HGETALL', jar)
for i = 1, #all, 2 do
  local expiry = tonumber(string.match(all[i + 1], '^(%d+)\t'))
  if expiry and expiry > 0 and expiry <= now then
    expired = expired + redis.call('HDEL', jar, all[i])
  end
end
for i = 1, #ARGV, 3 do
  local field, ttl = ARGV[i], ARGV[i + 1]
  if ttl == 'del' then
    deleted = deleted + redis.call('HDEL', jar, field)
  else
    local ms = tonumber(ttl)
    local expiry = 0
    if ms > 0 then expiry = now + math.ceil(ms) end
    redis.call('HSET', jar, field, expiry .. '\t' .. ARGV[i + 2])
    stored = stored + 1
  end
end
return {stored, deleted, expired}
