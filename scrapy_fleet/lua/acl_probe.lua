-- Permission probe (scrapy_fleet/acl.py): which of the given commands may the calling ACL
-- user NOT run on the crawl's keys?  Reads and writes nothing.
--
-- KEYS[1]  any key of the crawl (routes the call to the crawl's node on a cluster; the
--          commands are checked against this key name, so the user's key patterns count)
-- ARGV[i]  a command line, words separated by spaces, "@K" standing for KEYS[1]
--          ("hset @K f v", "config get maxmemory")
-- Reply:   the ARGV entries the user may not run (an unknown command counts as denied)
local denied = {}
for i = 1, #ARGV do
  local words = {}
  for word in string.gmatch(ARGV[i], "%S+") do
    if word == "@K" then word = KEYS[1] end
    words[#words + 1] = word
  end
  local ok, allowed = pcall(redis.acl_check_cmd, unpack(words))
  if not ok or not allowed then denied[#denied + 1] = ARGV[i] end
end
return denied
