-- failed_retry.lua: put failed requests (or dead letters) back into the frontier, once each.
--
-- Each named record that still exists is removed and, in the same atomic step, its request is
-- queued as a new entry (lua/queue.lua): not through the Bloom filter (it was seen), at the
-- head of its bucket (its entry id starts with "!"), the named records in their order.
-- A record already gone (retried by an earlier or a concurrent run) pushes nothing, so the
-- call is safe to repeat.  The frontier's size bound (qm, lua/queue.lua's Queue.size) is
-- respected: the records past it stay, counted in the reply.  All times are the Redis
-- server's clock.
--
-- Keys (of K, keys.RETRY_CALL): failed, failed_at, failed_by, dead, hostq, stats, seq, and the
--   queue's (lua/queue.lua).
-- ARGV[1]: msgpack map: src "failed" | "dead", qm frontier size limit (0 none),
--   e [[record id, host key, priority, encoded request]...]; for src "failed" the encoded
--   request may be "": a record whose request is the one of a record named before in this
--   run (the records of the links a page yielded that could not be stored, and the page's
--   own: docs/failures.md): it is forgotten, nothing pushed (that page is fetched once)
-- Reply: msgpack map {retried = n, gone = records no longer there, full = left at the bound,
--   merged = records forgotten with a request pushed for another}
-- Writes: the records' keys, hostq, seq, stats (retried, pushed), the queue.
-- Work per call: 3 commands per record, one per bucket written.

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
local queued = Queue.queued(K)
local size = Queue.size(K, queued)
local out = {retried = 0, gone = 0, full = 0, merged = 0}
local qw = Queue.writer(K, now, nil, queued)  -- (every request is given, none read from `data`)
for _, e in ipairs(req.e) do
  local id, host, priority, data = e[1], e[2], e[3], e[4]
  local present
  if req.src == 'failed' then
    present = redis.call('HEXISTS', K.failed, id) == 1
  else
    present = redis.call('HEXISTS', K.dead, id) == 1
  end
  if not present then
    out.gone = out.gone + 1
  elseif data == '' then
    failed_forget(K, id)
    out.merged = out.merged + 1
  elseif queue_max > 0 and size >= queue_max then
    out.full = out.full + 1
  else
    if req.src == 'failed' then failed_forget(K, id) else redis.call('HDEL', K.dead, id) end
    local new_id = '!' .. string.format('%015d', redis.call('INCR', K.seq))
    if host ~= '' then hincrby(K.hostq, host, 1) end
    qw.enqueue(new_id, -priority, host, data, true)  -- at the head, in the order given
    size = size + 1
    out.retried = out.retried + 1
  end
end
qw.flush()
if out.retried > 0 then
  hincrby(K.stats, 'retried', out.retried)
  hincrby(K.stats, 'pushed', out.retried)  -- new entries: pushed == acked + dead_lettered holds
end
return cmsgpack.pack(out)
