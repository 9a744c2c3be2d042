-- failed_retry.lua: put failed requests (or dead letters) back into the frontier, once each.
--
-- Each named record that still exists is removed and, in the same atomic step, its request is
-- queued as a new entry: not through the Bloom filter (it was seen), at the head of its
-- bucket (host and priority, lua/hosts.lua; its entry id starts with "!"), the named records
-- in their order.
-- A record already gone (retried by an earlier or a concurrent run) pushes nothing, so the
-- call is safe to repeat.  The frontier's size bound (qm) is respected: the records past it
-- stay, counted in the reply.  All times are the Redis server's clock.
--
-- KEYS (keys.CrawlKeys.retry_keys): 1 failed  2 failed_at  3 failed_by  4 dead
--   5 queue (previous format: counted, never written)  6 data (unused)  7 ehost (unused)
--   8 hostq  9 ready  10 stats  11 seq  12 leases  13 delayed  14 qidx (the buckets' index)
--   15 qn
--   16 the buckets' key prefix
-- ARGV[1]: msgpack map: src "failed" | "dead", qm frontier size limit (0 none),
--   e [[record id, host key, priority, encoded request]...]; for src "failed" the encoded
--   request may be "": a record whose request is the one of a record named before in this
--   run (the records of the links a page yielded that could not be stored, and the page's
--   own: docs/failures.md): it is forgotten, nothing pushed (that page is fetched once)
-- Reply: msgpack map {retried = n, gone = records no longer there, full = left at the bound,
--   merged = records forgotten with a request pushed for another}

local FK = {failed = KEYS[1], failed_at = KEYS[2], failed_by = KEYS[3]}
local DEAD, Q, DATA, HOSTQ, READY = KEYS[4], KEYS[5], KEYS[6], KEYS[8], KEYS[9]
local STATS, SEQ, LEASES, DELAYED = KEYS[10], KEYS[11], KEYS[12], KEYS[13]
local QIDX, QN, QB = KEYS[14], KEYS[15], KEYS[16]

local ok, req = pcall(cmsgpack.unpack, ARGV[1])
if not ok or type(req) ~= 'table' or (req.src ~= 'failed' and req.src ~= 'dead')
    or type(req.e) ~= 'table' then
  return redis.error_reply('ERR fleet: bad retry call argument')
end
for _, e in ipairs(req.e) do
  if type(e) ~= 'table' or type(e[1]) ~= 'string' or type(e[2]) ~= 'string'
      or type(e[3]) ~= 'number' or e[3] ~= e[3] or math.abs(e[3]) > PRIORITY_LIMIT
      or type(e[4]) ~= 'string' or (e[4] == '' and req.src ~= 'failed') then
    return redis.error_reply('ERR fleet: bad retry entry')
  end
end
local queue_max = tonumber(req.qm) or 0
local now = server_now_ms()
local size = (tonumber(redis.call('GET', QN)) or 0) + redis.call('ZCARD', Q)
  + redis.call('ZCARD', LEASES) + redis.call('ZCARD', DELAYED)
local out = {retried = 0, gone = 0, full = 0, merged = 0}
local back = {}  -- {host, score, bucket entry} of the requests queued again
for _, e in ipairs(req.e) do
  local id, host, priority, data = e[1], e[2], e[3], e[4]
  local present
  if req.src == 'failed' then
    present = redis.call('HEXISTS', FK.failed, id) == 1
  else
    present = redis.call('HEXISTS', DEAD, id) == 1
  end
  if not present then
    out.gone = out.gone + 1
  elseif data == '' then
    failed_forget(FK, id)
    out.merged = out.merged + 1
  elseif queue_max > 0 and size >= queue_max then
    out.full = out.full + 1
  else
    if req.src == 'failed' then failed_forget(FK, id) else redis.call('HDEL', DEAD, id) end
    local new_id = '!' .. string.format('%015d', redis.call('INCR', SEQ))
    if host ~= '' then hincrby(HOSTQ, host, 1) end
    back[#back + 1] = {host, -priority, new_id .. '\t' .. data}
    redis.call('ZADD', READY, 'NX', now, host)
    size = size + 1
    out.retried = out.retried + 1
  end
end
-- at the heads of their buckets, in the order given (pushed there in the reverse order)
for i = #back, 1, -1 do
  local host, score, item = back[i][1], back[i][2], back[i][3]
  redis.call('LPUSH', QB .. bucket_name(host, score), item)
  local key = string.format('%016d', score + PRIO_OFFSET)
  local was = redis.call('HGET', QIDX, host)
  local now_value = index_with(was, key)
  if now_value ~= was then redis.call('HSET', QIDX, host, now_value) end
end
if #back > 0 then redis.call('INCRBY', QN, #back) end
if out.retried > 0 then
  hincrby(STATS, 'retried', out.retried)
  hincrby(STATS, 'pushed', out.retried)  -- new entries: pushed == acked + dead_lettered holds
end
return cmsgpack.pack(out)
