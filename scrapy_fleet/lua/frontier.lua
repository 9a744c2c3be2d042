-- frontier.lua: one round trip of a worker (or of the push helper) with the frontier.
--
-- In one atomic step it: returns the cached reply of a repeated call (op id), moves due
-- deferred entries back to the queue, reclaims expired leases (back to the queue, or to the
-- dead letters after max_leases expiries), releases unstarted requests, dead-letters corrupt
-- ones, extends live leases (heartbeat), pushes new requests through the Bloom filter within
-- the frontier's bounds, acknowledges finished requests (or parks / defers them when their
-- links do not fit), leases up to `take` requests with fresh fencing tokens, and tracks
-- fleet idleness.  All times are the Redis server's clock (TIME), in milliseconds.
--
-- Its parts (library files that lua/__init__.py prepends, each given what it needs by this
-- file, explicitly): lua/frontier_batch.lua holds the call's state (the leases it looks at,
-- slot and per-host counts, queue writes: read once, written in few commands, `batch`) and
-- lua/frontier_lease.lua the lease step (7, lease_step); lua/hosts.lua the buckets and the
-- politeness, lua/bloom.lua the filter, lua/failed.lua the failure records and the crawl
-- marker, lua/monitoring.lua ARGV[2].
--
-- Bounds (docs/backpressure.md): the frontier's size is queued + leased + deferred entries.
-- A push without a parent (push helper, start requests, redirects) is refused when the size
-- has reached `qm` or its host has `hm` entries.  The links of a finished request are pushed
-- with its acknowledgement, at most max(room + 1, 1) of them (the + 1 is the request's own
-- slot, which it gives up when it is done; the same holds for its host's count).  When some
-- new links are left over, the request is *parked*: it leaves the size and its host's count,
-- and waits in the compact `parked` list (one msgpack record per request, no other key)
-- until there is room; then it returns to the queue, is fetched again, and pushes the rest of
-- its links.  Every fetch thus either completes its request or discovers at least one new
-- page, so a bounded crawl always ends, with at most twice the fetches of an unbounded one.
--
-- KEYS (built by keys.CrawlKeys.frontier_keys, never here):
--   1 queue (previous format: read and emptied, never written)  2 data  3 leases  4 lease  5 expiries  6 dead  7 seq  8 token  9 stats
--   10 idle_since  11 workers  12 op (this call)  13 op (previous call of this client)
--   14 delayed  15 parked  16 hostq  17 ehost (previous format only: read, never written)
--   18 ready  19 tat  20 hold  21 hostlive  22 hostconf  23 crawldelay  24 wlive  25 robots
--   26 failed  27 failed_at  28 failed_by  29 marker  (lua/failed.lua)
--   30 qidx (the buckets' index: host -> priority keys)  31 qn (queued count)  32 the buckets' key prefix (each
--   bucket's key is this prefix and its name: the same hash tag, so the same cluster slot)
--   33 bloom meta  34.. bloom slices, then the MON_NKEYS keys of lua/monitoring.lua (last)
--
-- Per entry (keys.py has the whole layout):
--   queued:   "<id>\t<payload>" in the LIST of its host and priority (lua/hosts.lua), nothing
--             else (the previous format: queue member "<host>\t<priority key>\t<id>" +
--             data[id], moved into the buckets 200 per call, in order, step 0)
--   leased:   leases[id] = expiry, lease[id] = "<token>|<score>|<host>\t<worker>" (worker
--             "!worker" once its download is over) + data[id]
--   deferred: delayed member "<id>|<score>|<host>" + data[id] (also a new entry pushed with a
--             delay: a request whose origin's robots.txt could not be fetched yet)
--   parked:   one msgpack record [id, score, host, payload] in `parked`, nothing else
-- The entry's host is thus always in the one structure that holds the entry: there is no
-- per-entry host field any more.  Entries of the previous format (lease "<token>|<score>|
-- <worker>", delayed "<id>|<score>", host in `ehost`) are still read: their host comes from
-- `ehost`, whose field is deleted when the entry leaves.
--
-- ARGV[1]: msgpack map (see frontier/protocol.py, _arg):
--   w worker id ("" for the push helper), lm lease ms, ml max leases, ot op ttl ms,
--   a acks [[id, token]...], r releases [[id, token]...], d dead [[id, token, reason]...],
--   x extends [[id, token]...], s downloads over [[id, token]...] (their host's slot is
--   free), t take, bn bloom capacity, bp bloom error rate,
--   rc reclaim limit, qm frontier size limit (0 none), hm per-host limit (0 none),
--   dd defer delay ms, pt default host interval ms, pb default burst, pc default host
--   concurrency (0 none), ro 1 when robots.txt is obeyed (a host whose robots.txt is not
--   known yet gets one request in flight, the scout, until it is),
--   p pushes [[fp12 or "", priority, payload, group, host, delay]...]: group 0 = no parent,
--     group k = a link of the k-th acknowledgement; delay (optional, ms): the new entry waits
--     in `delayed` that long before it is queued (a request whose origin's robots.txt could
--     not be fetched yet, docs/politeness.md),
--   ho lease only from this host, hx never lease from this host (stages: fetch workers
--     send hx = "~parse", parse workers ho = "~parse"; docs/stages.md)
--   an acknowledgement may carry a third element, the failure record of a request that
--     failed for good (lua/failed.lua): recorded with the acknowledgement, fm = their cap
--     ("" for none), and a fourth, the failure records of requests its callback yielded
--     that the worker could not encode (reason codec/...): recorded with the acknowledgement
--     under "<entry id>/<n>", with the acknowledged request as their request (a retry
--     fetches it again, to yield them again), counted in `failed` and `unstorable`
--   u failure records of requests without a parent the worker could not encode: recorded
--     under "u<seq>" without a request (they cannot be retried), counted the same
--   mk the crawl marker this client saw ("" before its first call): the call fails before
--     any write when the marker is gone or another one; mc the marker to write when there is
--     none (first push / first worker call)
--   ld links the worker left out because it knows they are in the Bloom filter (its local
--     cache; counted as duplicates), bg the filter generation that knowledge is from: when
--     ld > 0 and the filter's generation is another one (a purge made a new filter), or the
--     reply cache of the client's previous call (KEYS[13]) is gone (a failover lost that
--     call's writes), the call fails before any write with "ERR fleet: stale filter
--     generation" and the worker sends the call again with those links
-- ARGV[2] (optional): heartbeat, counter deltas and sampling of lua/monitoring.lua.
-- Reply: msgpack map (see frontier/protocol.py, SyncResult.from_reply): leased [[id, token, payload,
--   expiries]...], lost [id...], pf [1 new / 0 not new, per push], rf [refused push
--   indexes (0-based)], pd [indexes (0-based) of pushes found in the filter], bg filter
--   generation (when pushes were checked), counts new dup acked released reclaimed dead
--   parked deferred resumed refused, full, now, queued inflight delayed size idle, holds,
--   pl 1 when the previous call's reply cache (KEYS[13]) was not there,
--   mk the crawl marker, nr ms until the next host may be fetched (when this call leased
--   fewer than `take`), rq {stored responses waiting for a parse worker, their bytes} (those
--   deferred until their links' hosts have room left out).
--
-- Bounded work per call: at most 200 entries of the previous format moved, rc
-- (protocol.RECLAIM_LIMIT: 50) expired leases reclaimed, 100 deferred entries
-- moved back, 100 parked records looked at (16 rotated), 8 to 64 candidate hosts for the
-- leases (twice `take`).

local cached = redis.call('GET', KEYS[12])
if cached then
  return cached
end

local Q, DATA, LEASES, LEASE, EXPIRIES, DEAD = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local SEQ, TOKEN, STATS, IDLE, WORKERS = KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11]
local DELAYED, PARKED, HOSTQ, EHOST = KEYS[14], KEYS[15], KEYS[16], KEYS[17]
local READY, TAT, HOLD, HOSTLIVE = KEYS[18], KEYS[19], KEYS[20], KEYS[21]
local HOSTCONF, CRAWLDELAY, WLIVE, ROBOTS = KEYS[22], KEYS[23], KEYS[24], KEYS[25]
local QIDX, QN, QB = KEYS[30], KEYS[31], KEYS[32]
local BLOOM_META = KEYS[33]

local ok, req = pcall(cmsgpack.unpack, ARGV[1])
if not ok or type(req) ~= 'table' then
  return redis.error_reply('ERR fleet: bad frontier call argument')
end
-- Validate every list before the first write (a runtime error after a write keeps the
-- earlier writes; OOM is only checked before the first write).
for _, name in ipairs({'a', 'r', 'd', 'x', 'p', 's'}) do
  if req[name] == nil then req[name] = {} end
  if type(req[name]) ~= 'table' then
    return redis.error_reply('ERR fleet: field ' .. name .. ' must be a list')
  end
end
-- monitoring (lua/monitoring.lua): checked here, applied at the end
local mon, mon_err = monitor_parse(ARGV[2], #KEYS - MON_NKEYS + 1)
if not mon then return redis.error_reply('ERR fleet: ' .. mon_err) end
local n_acks = #req.a
local FK = {failed = KEYS[26], failed_at = KEYS[27], failed_by = KEYS[28], marker = KEYS[29]}
local bad_failure = failed_check_acks(req.a, req.u)
if bad_failure then return redis.error_reply('ERR fleet: ' .. bad_failure) end
local marker_error, marker = failed_check_marker(FK.marker, req.mk)
if marker_error then return redis.error_reply(marker_error) end
for _, p in ipairs(req.p) do
  if type(p) ~= 'table' or type(p[1]) ~= 'string' or type(p[2]) ~= 'number'
      or p[2] ~= p[2] or math.abs(p[2]) > PRIORITY_LIMIT
      or type(p[3]) ~= 'string' or (p[1] ~= '' and #p[1] ~= 12)
      or type(p[4]) ~= 'number' or p[4] < 0 or p[4] > n_acks or type(p[5]) ~= 'string'
      or (p[6] ~= nil and (type(p[6]) ~= 'number' or p[6] ~= p[6] or p[6] < 0)) then
    return redis.error_reply('ERR fleet: bad push entry')
  end
end
local local_dups = tonumber(req.ld) or 0
if local_dups > 0 then
  -- the worker's knowledge holds only for this filter (generation g) in a state that has
  -- every write of the worker's previous call (KEYS[13], its reply cache, still there): a
  -- failover to a replica that lacked that call's writes rolled the filter back, and
  -- replication is in order, so that key is the one to look at (an expired one, after 5 min
  -- without a call, only costs a full call)
  local gen = redis.call('HGET', BLOOM_META, 'g')
  if not gen or gen ~= tostring(req.bg) or redis.call('EXISTS', KEYS[13]) == 0 then
    return redis.error_reply('ERR fleet: stale filter generation')
  end
end
local take = tonumber(req.t) or 0
local lease_ms = tonumber(req.lm) or 30000
local max_leases = tonumber(req.ml) or 3
local queue_max = tonumber(req.qm) or 0
local host_max = tonumber(req.hm) or 0
local defer_ms = tonumber(req.dd) or 10000
local worker = req.w or ''

local now = server_now_ms()
marker = failed_ensure_marker(FK.marker, marker, req.mc)
local ctx = new_host_ctx(now, TAT, HOLD, HOSTLIVE, HOSTCONF, CRAWLDELAY, req)
ctx.memo = {}  -- per-host fields read once per call (hosts.lua, ctx_get)
ctx.empty = {}  -- per-host hashes without any field: not read per host (a write clears it)
for _, key in ipairs({HOSTCONF, CRAWLDELAY, HOLD}) do
  if redis.call('EXISTS', key) == 0 then ctx.empty[key] = true end
end

local out = {leased = {}, lost = {}, pf = {}, rf = {}, pd = {}, new = 0, dup = 0, acked = 0,
             released = 0, reclaimed = 0, dead = 0, parked = 0, deferred = 0, resumed = 0,
             refused = 0, full = false, now = now, mk = marker or ''}
local counters = {}
local function count(name, n)
  counters[name] = (counters[name] or 0) + n
end

-- The call's state, read once and written in few commands (lua/frontier_batch.lua); its
-- helpers are fields of `batch`, not locals (this chunk's main function, libraries included,
-- may have 200 locals).
local K = {q = Q, data = DATA, lease = LEASE, leases = LEASES, expiries = EXPIRIES, dead = DEAD,
           seq = SEQ, token = TOKEN, stats = STATS, ehost = EHOST, ready = READY, tat = TAT,
           hold = HOLD, hostlive = HOSTLIVE, hostconf = HOSTCONF, crawldelay = CRAWLDELAY,
           wlive = WLIVE, robots = ROBOTS, workers = WORKERS, hostq = HOSTQ, qidx = QIDX,
           qn = QN, qb = QB}
local batch = frontier_batch_new(K, req, now, ctx, out, count)

-- 0. entries of the previous format (members of the `queue` ZSET, requests in `data`) move
-- into the buckets, the first 200 per call (a host's best priority first, FIFO), each to its
-- bucket's tail
if redis.call('EXISTS', Q) == 1 then
  local old = redis.call('ZRANGE', Q, 0, 199)
  for _, member in ipairs(old) do
    local host, key, id = string.match(member, '^([^\t]*)\t(%d+)\t(.+)$')
    if host then
      batch.enqueue(id, tonumber(key) - PRIO_OFFSET, host, nil, false)
    else
      count('bad_queue_members', 1)
      batch.dead_raw('corrupt queue entry', member)
    end
  end
  batch.call_many('ZREM', Q, old, 4000)
  batch.flush_queue()
end

-- 1. deferred entries whose delay is over go back to the queue
local due = redis.call('ZRANGEBYSCORE', DELAYED, '-inf', now, 'LIMIT', 0, 100)
if #due > 0 then
  for _, member in ipairs(due) do
    local id, score, host = string.match(member, '^([^|]*)|([^|]*)|?(.*)$')
    if host == '' then host = batch.legacy_host(id) or '' end  -- previous format: "id|score"
    if host == STAGE_HOST then batch.stage_deferred(id, -1) end
    batch.enqueue(id, tonumber(score) or 0, host, nil, true)
  end
  batch.call_many('ZREM', DELAYED, due, 4000)
end

-- 2. reclaim expired leases (of any worker), a bounded number per call
local expired = redis.call('ZRANGEBYSCORE', LEASES, '-inf', now, 'LIMIT', 0, tonumber(req.rc) or 100)
batch.prefetch_call_leases(expired)
if #expired > 0 then
  local counts = {}
  for i, id in ipairs(expired) do
    counts[i] = hincrby(EXPIRIES, id, 1)
  end
  for i, id in ipairs(expired) do
    local score, host = batch.drop_lease(id)
    local n = counts[i]
    if n >= max_leases then
      batch.to_dead(id, 'lease expired ' .. n .. ' times', host)
    else
      batch.enqueue(id, score, host, nil, true)
      out.reclaimed = out.reclaimed + 1
    end
  end
  batch.flush_queue()  -- before the releases below read the same leases
end
count('reclaimed', out.reclaimed)

-- 3. releases: leased but never started (worker closing); no expiry is counted
for _, r in ipairs(req.r) do
  if batch.holds(r[1], r[2]) then
    local score, host = batch.drop_lease(r[1])
    batch.enqueue(r[1], score, host, nil, true)
    out.released = out.released + 1
  end
end
count('released', out.released)

-- 4. dead letters reported by the worker (entry cannot be decoded)
for _, d in ipairs(req.d) do
  if batch.holds(d[1], d[2]) then
    local _, host = batch.drop_lease(d[1])
    batch.to_dead(d[1], d[3], host)
  end
end

-- 5. heartbeat: extend live leases, report lost ones
local extend = {}
for _, x in ipairs(req.x) do
  if batch.holds(x[1], x[2]) then
    extend[#extend + 1] = now + lease_ms
    extend[#extend + 1] = x[1]
  else
    out.lost[#out.lost + 1] = x[1]
  end
end
if #extend > 0 then
  table.insert(extend, 1, 'XX')
  batch.call_many('ZADD', LEASES, extend, 4000)
end

-- 5b. downloads over: their host's slot is free for the next request at once, while the
-- worker still parses the response (Scrapy's CONCURRENT_REQUESTS_PER_DOMAIN also counts
-- downloads only); the lease itself lasts until the acknowledgement
-- (a request acknowledged in this call too is left to its acknowledgement, which frees the
-- slot as it drops the lease: its lease is not rewritten first)
local marks, acking = {}, {}
for _, a in ipairs(req.a) do acking[a[1]] = tostring(a[2]) end
for _, sv in ipairs(req.s) do
  local tok, score, who, host = batch.parse_lease(batch.lease_value(sv[1]))
  if tok and tok == tostring(sv[2]) and string.sub(who, 1, 1) ~= '!'
      and acking[sv[1]] ~= tok then
    if host == nil then host = batch.legacy_host(sv[1]) or '' end
    local v = batch.lease_string(tok, score, host, '!' .. who)
    marks[#marks + 1] = sv[1]
    marks[#marks + 1] = v
    batch.lease_cache[sv[1]] = v
    batch.free_slot(host, who)
  end
end
if #marks > 0 then batch.call_many('HSET', LEASE, marks, 4000) end
batch.settle_slots()

-- 6. pushes and acknowledgements, within the bounds
batch.flush_queue()
-- (the size matters only to the bounds: not read without one)
local size = 0
if queue_max > 0 then
  size = batch.queued() + redis.call('ZCARD', LEASES) + redis.call('ZCARD', DELAYED)
end

-- 6.0 the Bloom filter: every fingerprint of the call looked up at once (bloom.lua)
local bloom, present = nil, {}
if #req.p > 0 then
  local fps, where = {}, {}
  for i, p in ipairs(req.p) do
    if p[1] ~= '' then
      fps[#fps + 1] = p[1]
      where[#fps] = i
    end
  end
  if #fps > 0 then
    local slice_keys = {}
    for i = 34, #KEYS - MON_NKEYS do slice_keys[#slice_keys + 1] = KEYS[i] end
    bloom = bloom_open(BLOOM_META, slice_keys, tonumber(req.bn), tonumber(req.bp))
    local found = bloom_lookup(bloom, fps)
    for j, i in ipairs(where) do present[i] = found[j] end
  end
end
if host_max > 0 and #req.p > 0 then
  local hosts = {}
  for i, p in ipairs(req.p) do hosts[i] = p[5] end
  for _, a in ipairs(req.a) do
    local _, _, _, h = batch.parse_lease(batch.lease_cache[a[1]])
    if h then hosts[#hosts + 1] = h end
  end
  batch.prefetch_hostq(hosts)
end
local added = {}  -- fingerprints added by this call (two identical links: the second is seen)
local function host_full(host)
  return host_max > 0 and host ~= '' and host ~= STAGE_HOST and batch.host_count(host) >= host_max
end
local function seen_before(p, i)
  return p[1] ~= '' and (present[i] or added[p[1]] ~= nil)
end
-- Entry ids: one INCRBY per call for all of its new entries (unused ids are skipped: ids
-- only need to be unique and increasing).
local id_next, id_last = 1, 0
local function new_id()
  if id_next > id_last then
    local n = math.max(#req.p, 1)
    id_last = redis.call('INCRBY', SEQ, n)
    id_next = id_last - n + 1
  end
  local id = string.format('%015d', id_next)
  id_next = id_next + 1
  return id
end
-- Check-and-add p; when new, store it as a queued entry.  Returns its id or nil (seen).
local function push(p, index)
  if p[1] ~= '' then
    if seen_before(p, index) then
      out.dup = out.dup + 1
      out.pf[index] = 0
      out.pd[#out.pd + 1] = index - 1
      return nil
    end
    local _, full = bloom_mark(bloom, p[1])
    added[p[1]] = true
    if full then out.full = true end
  end
  local id = new_id()
  batch.host_add(p[5], 1)
  if p[5] == STAGE_HOST then hincrby(STATS, 'response_queue_bytes', #p[3]) end
  if p[6] and p[6] > 0 then
    batch.keep_data(id, p[3])  -- a deferred entry keeps its request in `data`
    redis.call('ZADD', DELAYED, now + math.floor(p[6]), id .. '|' .. (-p[2]) .. '|' .. p[5])
  else
    batch.enqueue(id, -p[2], p[5], p[3], false)
  end
  size = size + 1
  out.new = out.new + 1
  out.pf[index] = 1
  return id
end

-- Parked requests go back to the queue, oldest first, while the frontier (and the request's
-- host) has room; at most `limit` records are looked at per call, and at most 16 of them
-- (whose host is full) moved to the tail.  A record that cannot be read is dead-lettered,
-- never dropped.
local function resume_parked(limit)
  local n = math.min(limit, redis.call('LLEN', PARKED))
  local rotated = 0
  for _ = 1, n do
    if rotated >= 16 then return end
    if queue_max > 0 and size >= queue_max then return end
    local raw = redis.call('LPOP', PARKED)
    if not raw then return end
    local ok, rec = pcall(cmsgpack.unpack, raw)
    if not ok or type(rec) ~= 'table' or type(rec[1]) ~= 'string' or type(rec[2]) ~= 'number'
        or type(rec[3]) ~= 'string' or type(rec[4]) ~= 'string' then
      batch.dead_raw('corrupt parked record', raw)
    elseif host_full(rec[3]) then
      redis.call('RPUSH', PARKED, raw)  -- its host is full: the next one may go
      rotated = rotated + 1
    else
      local id, host = rec[1], rec[3]
      batch.host_add(host, 1)
      if host == STAGE_HOST then hincrby(STATS, 'response_queue_bytes', #rec[4]) end
      batch.enqueue(id, rec[2], host, rec[4], true)
      size = size + 1
      out.resumed = out.resumed + 1
    end
  end
end

local groups = {}
local orphans = false
for i = 1, n_acks do groups[i] = {} end
for i, p in ipairs(req.p) do
  out.pf[i] = 0
  if p[4] == 0 then
    orphans = true
  else
    local g = groups[p[4]]
    g[#g + 1] = i
  end
end

-- 6a. pushes without a parent: refused (not even checked) when the frontier or the host is
-- full; parked requests, which wait for room already, come first
if orphans then resume_parked(100) end
for i, p in ipairs(req.p) do
  if p[4] == 0 then
    if (queue_max > 0 and size >= queue_max) or host_full(p[5]) then
      out.rf[#out.rf + 1] = i - 1
      out.refused = out.refused + 1
    else
      push(p, i)
    end
  end
end

-- 6b. each acknowledgement with its links
local parked_recs, deferred_members = {}, {}
for k, a in ipairs(req.a) do
  local score = batch.holds(a[1], a[2])
  if not score then
    -- the lease was lost: another worker fetches this request again and pushes its links
    out.lost[#out.lost + 1] = a[1]
    count('stale_acks', 1)
  else
    local allowed = 1e15
    if queue_max > 0 then
      allowed = math.max(queue_max - size + 1, 1)
    end
    local _, _, _, own_host = batch.parse_lease(batch.lease_value(a[1]))
    local _, own = batch.drop_lease(a[1])  -- (the host of a lease of the previous format, too)
    own_host = own_host or own
    -- the request's place in its own host's count is given up too: one link of that host
    -- may take it even when the host is full
    local own_slot = own_host ~= ''
    local pushed, left_over = 0, false
    for _, i in ipairs(groups[k]) do
      local p = req.p[i]
      local use_own = own_slot and p[5] == own_host and host_full(p[5])
      if pushed >= allowed or (host_full(p[5]) and not use_own) then
        if not left_over and not seen_before(p, i) then left_over = true end
      else
        if push(p, i) then
          pushed = pushed + 1
          if use_own then own_slot = false end
        end
      end
    end
    if not left_over then
      if (a[3] and a[3] ~= '') or a[4] then
        -- failed for good: recorded with its acknowledgement (lua/failed.lua)
        local data = redis.call('HGET', DATA, a[1])
        if a[3] and a[3] ~= '' then
          local _, trimmed = failed_record(FK, a[1], a[3], data, now, tonumber(req.fm) or 0)
          count('failed', 1)
          count('failed_trimmed', trimmed)
        end
        for j, raw in ipairs(a[4] or {}) do
          local _, trimmed = failed_record(FK, a[1] .. '/' .. j, raw, data, now,
                                           tonumber(req.fm) or 0)
          count('failed', 1)
          count('unstorable', 1)
          count('failed_trimmed', trimmed)
        end
      end
      batch.leave(a[1], own_host)
      size = size - 1
      out.acked = out.acked + 1
    elseif pushed > 0 then
      -- park: out of the size and of its host's count, back in the queue when there is room
      local data = redis.call('HGET', DATA, a[1]) or ''
      parked_recs[#parked_recs + 1] = cmsgpack.pack({a[1], tonumber(score) or 0, own_host, data})
      batch.forget(a[1], own_host)
      out.parked = out.parked + 1
      size = size - 1
    else
      -- nothing could be pushed (every link's host is full): fetch it again later
      deferred_members[#deferred_members + 1] = now + defer_ms
      deferred_members[#deferred_members + 1] = a[1] .. '|' .. score .. '|' .. own_host
      out.deferred = out.deferred + 1
      if own_host == STAGE_HOST then batch.stage_deferred(a[1], 1) end
    end
  end
end
-- requests without a parent the worker could not encode: recorded without a request
for _, raw in ipairs(req.u or {}) do
  local id = 'u' .. string.format('%015d', redis.call('INCR', SEQ))
  local _, trimmed = failed_record(FK, id, raw, '', now, tonumber(req.fm) or 0)
  count('failed', 1)
  count('unstorable', 1)
  count('failed_trimmed', trimmed)
end
if #parked_recs > 0 then batch.call_many('RPUSH', PARKED, parked_recs, 4000) end
if #deferred_members > 0 then batch.call_many('ZADD', DELAYED, deferred_members, 4000) end
resume_parked(100)  -- the slots freed above (and any room found now) go to parked requests first
if bloom ~= nil then
  bloom_flush(bloom)
  out.bg = bloom.gen
end
batch.flush_queue()
batch.settle_slots()
count('acked', out.acked)
count('pushed', out.new)
count('duplicates', out.dup + local_dups)
count('parked', out.parked)
count('deferred', out.deferred)
count('resumed', out.resumed)
count('refused', out.refused)

-- 7. lease up to `take` requests, host-aware (lua/frontier_lease.lua)
if take > 0 then
  lease_step({req = req, now = now, take = take, worker = worker, lease_ms = lease_ms, ctx = ctx,
              batch = batch, out = out, count = count, keys = K})
end

batch.flush_hostq()
batch.flush_slots()

-- 8. fleet idleness: nothing queued, leased, deferred or parked, since when?
out.queued = batch.queued()
if out.queued ~= 0 and redis.call('HLEN', QIDX) == 0 and redis.call('EXISTS', Q) == 0 then
  -- no bucket holds an entry: the count is 0 (entries written into a bucket by hand, and
  -- dead-lettered as corrupt, were taken off a count that never had them)
  redis.call('SET', QN, 0)
  out.queued = 0
end
out.inflight = redis.call('ZCARD', LEASES)
out.delayed = redis.call('ZCARD', DELAYED)
out.size = out.queued + out.inflight + out.delayed
if out.size == 0 and redis.call('LLEN', PARKED) == 0 then
  local since = tonumber(redis.call('GET', IDLE))
  if not since then
    redis.call('SET', IDLE, now)
    since = now
  end
  out.idle = now - since
else
  if redis.call('EXISTS', IDLE) == 1 then redis.call('DEL', IDLE) end
  out.idle = -1
end

-- stored responses waiting for a parse worker: count and bytes (fetch workers stop leasing
-- when the response queue is full)
do
  local rq = redis.call('HMGET', STATS, 'response_queue_bytes', 'response_queue_deferred',
                        'response_queue_deferred_bytes')
  out.rq = {math.max(batch.host_count(STAGE_HOST) - (tonumber(rq[2]) or 0), 0),
            math.max((tonumber(rq[1]) or 0) - (tonumber(rq[3]) or 0), 0)}
end

-- hosts on hold now (429/503/failures), with the ms left: workers check them locally before
-- each download of a request leased earlier
out.holds = {}
if worker ~= '' and not ctx.empty[HOLD] and redis.call('HLEN', HOLD) <= 1000 then
  local all = redis.call('HGETALL', HOLD)
  for i = 1, #all, 2 do
    local left = (tonumber(all[i + 1]) or 0) - now
    if left > 0 then out.holds[#out.holds + 1] = {all[i], left} end
  end
end

if worker ~= '' then
  redis.call('ZADD', WORKERS, now, worker)
end
-- monitoring: heartbeat, counter deltas, forgetting departed workers, time series
monitor_apply(mon, #KEYS - MON_NKEYS + 1, now, worker,
              {stats = STATS, workers = WORKERS, q = Q, qn = QN, leases = LEASES, delayed = DELAYED,
               parked = PARKED, dead = DEAD}, out.acked + out.parked + out.deferred)
for name, n in pairs(counters) do
  if n > 0 then hincrby(STATS, name, n) end
end

-- The previous call's reply cache is gone (pl): its writes may be lost (a failover to a
-- lagging replica), so the worker forgets what it learnt of the filter (frontier/dupecache.py, DupeCache).
if KEYS[13] ~= KEYS[12] and redis.call('DEL', KEYS[13]) == 0 then out.pl = 1 end

-- Cache a reply without payloads: a repeated call rebuilds them from DATA (the entries are
-- still leased with these tokens, since the client has not seen the first reply).
local reply = cmsgpack.pack(out)
local stored = reply
if #out.leased > 0 then
  local light = {}
  for i, e in ipairs(out.leased) do light[i] = {e[1], e[2], '', e[4]} end
  out.leased = light
  stored = cmsgpack.pack(out)
end
redis.call('SET', KEYS[12], stored, 'PX', tonumber(req.ot) or 300000)
return reply
