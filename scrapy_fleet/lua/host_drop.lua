-- host_drop.lua: one bounded slice of `scrapy fleet host drop CRAWL HOST` (commands/host.py):
-- removes at most ARGV[2] queued entries of one host from the head of its best bucket, in one
-- atomic step, and keeps every count exact: the queue's count (K.queue_count), the host's
-- count in the frontier (K.hostq), the buckets' index (K.queue_index, lua/queue.lua's
-- layout) and K.ready (the host leaves it with its last queued entry).  Leased and deferred
-- entries of the host are not touched (they come back to the queue, or are acknowledged).
-- The command calls it until it reports nothing left; a lease step running between two calls
-- sees the queue as the last call left it, so no entry is both leased and dropped.
--
-- ARGV[1]: the host key; ARGV[2]: entries per call (1..10000); ARGV[3]: "1": each entry goes
--   to the dead letters (K.dead, {reason = "dropped", at, data}, counted dead_lettered),
--   "0": deleted (counted in K.stats `dropped`).
-- Keys (of K, keys.DROP_CALL): queue_index, queue_count, bucket_prefix, hostq, ready, dead,
--   stats, seq (a new id for a bucket member not written by these scripts).
-- Reply: {entries removed by this call, entries of the host still queued}.
-- Work per call: one HGET, one LRANGE (dead letters) or LLEN, one LTRIM of the slice, one HSET
--   of up to ARGV[2] dead letters, a few counter writes.

local host, per, to_dead = ARGV[1], tonumber(ARGV[2]), ARGV[3] == '1'
if host == nil or host == '' or host == STAGE_HOST or not per or per < 1 or per > 10000 then
  return redis.error_reply('ERR fleet: bad host drop call')
end
local index = redis.call('HGET', K.queue_index, host)
local keys = Queue.index_keys(index or nil)
if #keys == 0 then
  redis.call('ZREM', K.ready, host)
  return {0, 0}
end
local bucket = K.bucket_prefix .. host .. '\t' .. keys[1]
local n
if to_dead then
  local entries = redis.call('LRANGE', bucket, 0, per - 1)
  n = #entries
  if n > 0 then
    local now = server_now_ms()
    local letters = {}
    for i, e in ipairs(entries) do
      local id, payload = Queue.entry_parts(e)
      if not id then  -- not an entry of these scripts: kept whole, under a new id
        id, payload = string.format('%015d', redis.call('INCR', K.seq)), e
      end
      letters[2 * i - 1] = id
      letters[2 * i] = cmsgpack.pack({reason = 'dropped', at = now, data = payload})
    end
    call_many('HSET', K.dead, letters, 2000)
    hincrby(K.stats, 'dead_lettered', n)
  end
else
  n = math.min(per, redis.call('LLEN', bucket))
  hincrby(K.stats, 'dropped', n)
end
local left_in_bucket = redis.call('LLEN', bucket) - n
redis.call('LTRIM', bucket, n, -1)  -- (an emptied LIST is deleted by Redis)
if n > 0 then
  redis.call('DECRBY', K.queue_count, n)
  local count = (tonumber(redis.call('HGET', K.hostq, host)) or 0) - n
  if count > 0 then
    redis.call('HSET', K.hostq, host, count)
  else
    redis.call('HDEL', K.hostq, host)
  end
end
if left_in_bucket <= 0 then
  index = Queue.index_without(index, keys[1])
  if index then
    redis.call('HSET', K.queue_index, host, index)
  else
    redis.call('HDEL', K.queue_index, host)
    redis.call('ZREM', K.ready, host)
  end
end
local left = 0
for _, key in ipairs(Queue.index_keys(index or nil)) do
  left = left + redis.call('LLEN', K.bucket_prefix .. host .. '\t' .. key)
end
return {n, left}
