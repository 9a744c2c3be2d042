-- cookies_read.lua: the live cookies of one session's fleet cookie jar (sessions/jar.py),
-- read before each request of the session is sent.
--
-- KEYS[1]: the jar (HASH, keys.CrawlKeys.cookie_jar: "<domain>\t<path>\t<name>" ->
--   "<expiry ms or 0>\t<JSON attributes>"; expiry by the server's clock, 0: a session cookie)
-- ARGV: none
-- Reply: flat {attributes, ms left, attributes, ms left, ...} of the cookies whose expiry has
--   not passed by the server's clock (ms left -1: a session cookie).  Read-only: expired
--   fields are dropped by the next merge (lua/cookies_merge.lua).  Work: O(fields of the jar).

local jar = KEYS[1]
local now = server_now_ms()
local out = {}
local all = redis.call('HGETALL', jar)
for i = 1, #all, 2 do
  local expiry, attrs = string.match(all[i + 1], '^(%d+)\t(.*)$')
  expiry = tonumber(expiry)
  if expiry and (expiry == 0 or expiry > now) then
    out[#out + 1] = attrs
    out[#out + 1] = expiry == 0 and -1 or expiry - now
  end
end
return out
