-- push_lean.lua: a push-only call into one partition of a partitioned crawl (FLEET_PARTITIONS
-- > 1, docs/partitions.md): the links a worker found for hosts of another partition than its
-- page's, pushed there before the page is acknowledged (frontier/partitions.py), and the
-- push helper's batches.  It does what lua/step_push.lua does for a push without a parent,
-- and nothing else (no lease, no ack, no reclaim, no monitoring), so that its fixed part is
-- a few commands (bench/bench_push_lean.py measures it beside the frontier call).
--
-- Keys (of K, keys.PUSH_LEAN_CALL): op (this call's reply cache: a call repeated with the
--   same op id gets the first reply back and writes nothing), prev_op (the reply cache of the
--   same client's previous lean call to this partition: deleted; its absence is the evidence
--   that the partition may have lost that call's writes), marker and layout (checked;
--   written once when the partition has none), stats (counters pushed, duplicates,
--   refused, response_queue_bytes: a stored response of lua/step_push.lua's), seq, data and deferred (a push with a delay), next_due (lowered by a push with
--   a delay due before it: lua/step_begin.lua), leases and deferred (the size),
--   parked (not resumed here: the partition's own frontier calls do that), hostq (entries per
--   host), idle_since (deleted when an entry is added: the partition is busy), the queue's
--   (lua/queue.lua: queue_index, queue_count, bucket_prefix, ready), bloom_meta and
--   bloom_slices (lua/bloom.lua); revisit_prefix, revisit_popped, revisit_place_prefix,
--   revisit_lastmod (a sitemap <lastmod>: lua/step_revisit.lua, revisit_lastmod_due);
--   stored_from_prefix (the bitmaps sf:<p> of the stored responses queued per entry of p).
-- ARGV[1]: msgpack map: p [[fp12 or "", priority, payload, host, delay ms, lastmod s (0
--   none: a known URL pushed with a newer one is made due at once, as in the frontier call)[,
--   p, n: a stored response of entry n of partition p (docs/stages.md): queued only if none
--   of that entry was (bit n of sf:<p>), else dropped, counted in sa and not refused]] ...],
--   bn bloom capacity, bp bloom error rate, qm frontier size limit (0 none), hm per-host limit (0
--   none), ot op ttl ms, mk the partition's marker this client saw ("" none: not checked), mc
--   the marker to write when there is none; lo (optional) the links the client left out as
--   known duplicates of this partition's filter (frontier/lean.py LeanDestination), bg the
--   filter generation it knew them under.
-- Reply: msgpack map: pf [1 new / 0 not, per push], rf [refused indexes (0-based): the size
--   or the host's count reached its bound, and the filter does not have it], pd [indexes (0-based)
--   found in the filter], new, dup, refused, full (the filter is at its last slice), bg (the
--   filter's generation), mk (the partition's marker), size (after the call, when qm > 0),
--   rq (when a push is a stored response: [stored responses, their bytes] as the frontier
--   call reports them, lua/step_idle.lua), sa (stored responses dropped: queued before), pl 1
--   when prev_op was gone (the client forgets what it knew of this filter).
-- Writes: the filter, seq, the queue (buckets, index, count, ready), data and deferred (a push
--   with a delay; next_due when it comes before the bound), hostq, idle_since (DEL), stats, op;
--   with a lastmod: revisit_lastmod (SET), a slot's record (LSET), place entries (HDEL); a
--   stored response of an entry: its bit (BITFIELD SET), stats stored_again.
-- Errors (before any write): a bad argument; "crawl state lost" when mk is given and the
--   partition's marker is gone or another one; "stale filter generation" when lo > 0 and the
--   filter's generation is not bg or prev_op is gone (the client's cache may name keys the
--   filter lost: it is cleared and the call sent again whole), as lua/step_check.lua.
-- Bound of work per call: one pass over the pushes; the filter's lookups and writes
--   (lua/bloom.lua, lua/bloom_write.lua); one HMGET of hostq when hm > 0; the queue writer's
--   flush (one command per bucket touched); one HINCRBY per host and per counter that moved.
--   Fixed part: MGET (op, marker, queue_count, next_due), DEL prev_op, SET op; with lo > 0 an
--   HGET and an EXISTS; with pushes TIME, the filter's meta
--   read, INCRBY seq; with qm > 0 ZCARD leases and deferred; with a stored response an HMGET
--   and an HGET (rq), and a BITFIELD GET (and SET) per one naming its entry; with a lastmod a
--   SET, and per known URL pushed with one, step_revisit's.

-- (what the call reads first, in one command: its cached reply, the marker, the queued count,
-- the bound before which nothing is due: lua/step_begin.lua)
local head = redis.call('MGET', K.op, K.marker, K.queue_count, K.next_due)
if head[1] then return head[1] end
local ok, req = pcall(cmsgpack.unpack, ARGV[1])
if not ok or type(req) ~= 'table' or type(req.p) ~= 'table' then
  return redis.error_reply('ERR fleet: bad push argument')
end
for _, p in ipairs(req.p) do
  if type(p) ~= 'table' or type(p[1]) ~= 'string' or (p[1] ~= '' and #p[1] ~= 12)
      or type(p[2]) ~= 'number' or p[2] ~= p[2] or math.abs(p[2]) > PRIORITY_LIMIT
      or type(p[3]) ~= 'string' or type(p[4]) ~= 'string'
      or (p[5] ~= nil and (type(p[5]) ~= 'number' or p[5] ~= p[5] or p[5] < 0))
      or (p[6] ~= nil and (type(p[6]) ~= 'number' or p[6] ~= p[6] or p[6] < 0))
      or (p[7] ~= nil and (p[4] ~= STAGE_HOST or type(p[7]) ~= 'number' or p[7] % 1 ~= 0
                           or p[7] < 0 or type(p[8]) ~= 'number' or p[8] % 1 ~= 0
                           or p[8] < 0 or p[8] >= 4294967296)) then
    return redis.error_reply('ERR fleet: bad push entry')
  end
end
local marker_error, marker = failed_check_marker(K.marker, req.mk, head[2])
if marker_error then return redis.error_reply(marker_error) end
local left_out = tonumber(req.lo) or 0
if left_out > 0 then  -- (the client's knowledge of this filter, checked as lua/step_check.lua)
  local gen = redis.call('HGET', K.bloom_meta, 'g')
  if not gen or gen ~= tostring(req.bg) or redis.call('EXISTS', K.prev_op) == 0 then
    return redis.error_reply('ERR fleet: stale filter generation')
  end
end
local now = 0
if #req.p > 0 then now = server_now_ms() end  -- (no TIME for a call without a push)
-- (the first write is below: everything above only read)
if not marker and type(req.mc) == 'string' and req.mc ~= '' then
  redis.call('SET', K.marker, req.mc)
  redis.call('SET', K.layout, CRAWL_LAYOUT)
  marker = req.mc
end
local queue_max, host_max = tonumber(req.qm) or 0, tonumber(req.hm) or 0
local qw = Queue.writer(K, now, function() end, tonumber(head[3]) or 0)  -- (payloads given)
local size = 0
if queue_max > 0 then size = Queue.size(K, qw.queued) end
local out = {pf = {}, rf = {}, pd = {}, new = 0, dup = 0, refused = 0, full = false,
             mk = marker or '', sa = 0}
local host_count, host_delta = {}, {}
local stage_bytes = 0  -- (the stored responses' bytes pushed: FLEET_ROLE, docs/stages.md)
local stages = false  -- (a stored response in the call: the reply carries rq)
local lowest_added = 9e15  -- (the earliest time a push with a delay is due)
if host_max > 0 and #req.p > 0 then
  local hosts, seen = {}, {}
  for _, p in ipairs(req.p) do
    if p[4] ~= '' and not seen[p[4]] then
      seen[p[4]] = true
      hosts[#hosts + 1] = p[4]
    end
  end
  read_fields(K.hostq, hosts, function(h, v) host_count[h] = tonumber(v) or 0 end)
end
local fps, where = {}, {}
for i, p in ipairs(req.p) do
  if p[1] ~= '' then
    fps[#fps + 1] = p[1]
    where[#fps] = i
  end
end
local bloom, present = nil, {}
if #fps > 0 then
  bloom = bloom_open(K.bloom_meta, K.bloom_slices, tonumber(req.bn), tonumber(req.bp))
  local found = bloom_lookup(bloom, fps)
  for j, i in ipairs(where) do present[i] = found[j] end
end
local lastmods, lastmod_seen = {}, false  -- (known URLs pushed with a sitemap <lastmod>)
for i, p in ipairs(req.p) do
  if (p[6] or 0) > 0 then lastmod_seen = true end
  if (p[6] or 0) > 0 and present[i] then lastmods[#lastmods + 1] = {p[1], p[6]} end
end
local added = {}
local id_next, id_last = 1, 0
for i, p in ipairs(req.p) do
  local host = p[4]
  out.pf[i] = 0
  if host == STAGE_HOST then stages = true end
  -- (a stored response of an entry that has one queued already, or had: a second fetch of
  -- its page, the first worker's lease lost; dropped, so that its page may be acknowledged)
  local from = p[7] and (K.stored_from_prefix .. string.format('%d', p[7]))
  if from and redis.call('BITFIELD', from, 'GET', 'u1', p[8])[1] == 1 then
    out.sa = out.sa + 1
  elseif p[1] ~= '' and (present[i] or added[p[1]]) then
    out.dup = out.dup + 1  -- (a duplicate takes no room: counted as one, never refused)
    out.pd[#out.pd + 1] = i - 1
  elseif (queue_max > 0 and size >= queue_max)
      or (host_max > 0 and host ~= '' and (host_count[host] or 0) >= host_max) then
    out.rf[#out.rf + 1] = i - 1
    out.refused = out.refused + 1
  else
    if p[1] ~= '' then
      local _, full = bloom_mark(bloom, p[1])
      added[p[1]] = true
      if full then out.full = true end
    end
    if id_next > id_last then  -- one INCRBY for every new entry of the call
      id_last = redis.call('INCRBY', K.seq, #req.p - i + 1)
      id_next = id_last - (#req.p - i + 1) + 1
    end
    local id = string.format('%015d', id_next)
    id_next = id_next + 1
    if p[5] and p[5] > 0 then
      qw.keep_data(id, p[3])
      local due = now + math.floor(p[5])
      redis.call('ZADD', K.deferred, due, id .. '|' .. (-p[2]) .. '|' .. host)
      if due < lowest_added then lowest_added = due end
    else
      qw.enqueue(id, -p[2], host, p[3], false)
    end
    if host == STAGE_HOST then stage_bytes = stage_bytes + #p[3] end
    if from then redis.call('BITFIELD', from, 'SET', 'u1', p[8], 1) end
    if host ~= '' then
      host_count[host] = (host_count[host] or 0) + 1
      host_delta[host] = (host_delta[host] or 0) + 1
    end
    size = size + 1
    out.new = out.new + 1
    out.pf[i] = 1
  end
end
local lastmod_due = 0
if lastmod_seen then
  redis.call('SET', K.revisit_lastmod, '1')
  local got = revisit_lastmod_due(K, lastmods, function(host, score, payload)
    if queue_max > 0 and size >= queue_max then return false end
    qw.enqueue('r' .. string.format('%015d', redis.call('INCR', K.seq)), score, host, payload,
               false)
    host_delta[host] = (host_delta[host] or 0) + 1
    size = size + 1
    return true
  end)
  lastmod_due = got.due
  for name, n in pairs(got) do
    if n > 0 then hincrby(K.stats, 'revisit_lastmod_' .. name, n) end
  end
end
if bloom ~= nil then
  bloom_flush(bloom)
  out.bg = bloom.gen
end
qw.flush()
-- (a missing bound is read as passed by the frontier call: it needs no write)
local next_due = tonumber(head[4])
if next_due and lowest_added < next_due then
  redis.call('SET', K.next_due, string.format('%d', lowest_added))
end
for host, n in pairs(host_delta) do hincrby(K.hostq, host, n) end
if out.new + lastmod_due > 0 then redis.call('DEL', K.idle_since) end
if out.new > 0 then hincrby(K.stats, 'pushed', out.new) end
if out.dup + left_out > 0 then hincrby(K.stats, 'duplicates', out.dup + left_out) end
if out.refused > 0 then hincrby(K.stats, 'refused', out.refused) end
if stage_bytes > 0 then hincrby(K.stats, 'response_queue_bytes', stage_bytes) end
if out.sa > 0 then hincrby(K.stats, 'stored_again', out.sa) end
if queue_max > 0 then out.size = size end
if stages then  -- (as lua/step_idle.lua reports it, for the fetch workers' back pressure)
  local rq = redis.call('HMGET', K.stats, 'response_queue_bytes', 'response_queue_deferred',
                        'response_queue_deferred_bytes')
  local staged = tonumber(redis.call('HGET', K.hostq, STAGE_HOST)) or 0
  out.rq = {math.max(staged - (tonumber(rq[2]) or 0), 0),
            math.max((tonumber(rq[1]) or 0) - (tonumber(rq[3]) or 0), 0)}
end
if K.prev_op ~= K.op and redis.call('DEL', K.prev_op) == 0 then out.pl = 1 end
local reply = cmsgpack.pack(out)
redis.call('SET', K.op, reply, 'PX', tonumber(req.ot) or 300000)
return reply
