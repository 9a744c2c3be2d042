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
-- ARGV[1]: msgpack map (see client.py, _arg):
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
-- Reply: msgpack map (see client.py, SyncResult.from_reply): leased [[id, token, payload,
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
-- (client.RECLAIM_LIMIT: 50) expired leases reclaimed, 100 deferred entries
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
local bad_failure = failed_check_acks(req.a)
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
local function host_policy(h) return host_policy_ctx(ctx, h) end
local function host_blocked_until(h, T, tau, cap)
  return host_blocked_until_ctx(ctx, h, T, tau, cap, true)
end
local function host_take_token(h, T) return host_take_token_ctx(ctx, h, T) end

local out = {leased = {}, lost = {}, pf = {}, rf = {}, pd = {}, new = 0, dup = 0, acked = 0,
             released = 0, reclaimed = 0, dead = 0, parked = 0, deferred = 0, resumed = 0,
             refused = 0, full = false, now = now, mk = marker or ''}
local counters = {}
local function count(name, n)
  counters[name] = (counters[name] or 0) + n
end

-- Commands with many arguments, sent in chunks (Lua's unpack stops near 8000 values).
local function call_many(cmd, key, args, per)
  for from = 1, #args, per do
    redis.call(cmd, key, unpack(args, from, math.min(#args, from + per - 1)))
  end
end

-- Legacy (previous format) per-entry host field: read only when the key exists at all.
local legacy = nil
local function legacy_host(id)
  if legacy == nil then legacy = redis.call('EXISTS', EHOST) == 1 end
  if not legacy then return nil end
  local host = redis.call('HGET', EHOST, id)
  if host then redis.call('HDEL', EHOST, id) end
  return host or nil
end

-- A lease value: token, score, host, worker (worker "!..." once the download is over).
-- Leases of the previous format ("token|score|worker") get their host from `ehost`.
local lease_cache = {}  -- id -> value read in this call (false: none)
local function lease_value(id)
  local v = lease_cache[id]
  if v == nil then
    v = redis.call('HGET', LEASE, id)
    lease_cache[id] = v
  end
  return v
end
-- (a call parses the same lease values several times: each value's parts are kept)
local parsed_leases = {}
local function parse_lease(v)
  if not v then return nil end
  local p = parsed_leases[v]
  if p == nil then
    local tok, score, rest = string.match(v, '^(%d+)|([^|]*)|(.*)$')
    if not tok then
      p = false
    else
      local host, who = string.match(rest, '^([^\t]*)\t(.*)$')
      if host == nil then
        p = {tok, score, rest, nil}  -- previous format: host not in the value
      else
        p = {tok, score, who, host}
      end
    end
    parsed_leases[v] = p
  end
  if not p then return nil end
  return p[1], p[2], p[3], p[4]
end
local function lease_string(tok, score, host, who)
  return tok .. '|' .. score .. '|' .. host .. '\t' .. who
end

local batch = {}  -- batched reads and writes (one local: Lua allows 200 per function)
-- Batched reads: the fields a call will look at are read with one HMGET per hash (chunks of
-- 1000), not one HGET each.  into(field, value) keeps each value (false when missing).
function batch.read_fields(key, fields, into)
  for from = 1, #fields, 1000 do
    local part = {unpack(fields, from, math.min(#fields, from + 999))}
    local vals = redis.call('HMGET', key, unpack(part))
    for i, f in ipairs(part) do into(f, vals[i]) end
  end
end
-- The leases of ids (a list of ids, or of lists whose first element is an id) not read yet.
function batch.prefetch_leases(list)
  local ids, seen = {}, {}
  for _, e in ipairs(list) do
    local id = type(e) == 'table' and e[1] or e
    if (type(id) == 'string' or type(id) == 'number') and lease_cache[id] == nil
        and not seen[id] then
      seen[id] = true
      ids[#ids + 1] = id
    end
  end
  batch.read_fields(LEASE, ids, function(id, v) lease_cache[id] = v end)
end
-- The distinct items of list that memo (item -> value) has no value of yet.
function batch.unread(list, memo)
  local want, seen = {}, {}
  for _, x in ipairs(list) do
    if memo[x] == nil and not seen[x] then
      seen[x] = true
      want[#want + 1] = x
    end
  end
  return want
end
-- The per-host fields of key (a hash of lua/hosts.lua's ctx) for hosts, into ctx's memo.
function batch.prefetch_ctx(key, hosts)
  if ctx.empty[key] then return end
  local m = ctx.memo[key]
  if m == nil then
    m = {}
    ctx.memo[key] = m
  end
  batch.read_fields(key, batch.unread(hosts, m), function(h, v) m[h] = v end)
end
-- Fields (field -> value, false: delete it) written with one HSET and one HDEL.
function batch.write_fields(key, values)
  local sets, dels = {}, {}
  for f, v in pairs(values) do
    if v then
      sets[#sets + 1] = f
      sets[#sets + 1] = v
    else
      dels[#dels + 1] = f
    end
  end
  if #sets > 0 then call_many('HSET', key, sets, 4000) end
  if #dels > 0 then call_many('HDEL', key, dels, 4000) end
end
-- Counts (field -> number): those at 0 or below are deleted.
function batch.write_counts(key, values)
  local fields = {}
  for f, v in pairs(values) do fields[f] = v > 0 and string.format('%d', v) end
  batch.write_fields(key, fields)
end

-- Slot changes (hostlive, wlive) are summed per host and written by flush_slots at the end
-- of the call, once per host (a host whose download ended and which got a new lease in the
-- same call writes nothing); the memo (ctx) sees them at once.
local live_delta, wlive_delta = {}, {}
local function live_now(h)
  return tonumber(ctx_get(ctx, HOSTLIVE, h)) or 0
end
local function live_add(h, n)
  ctx_put(ctx, HOSTLIVE, h, live_now(h) + n)
  live_delta[h] = (live_delta[h] or 0) + n
end
local wlive_memo = {}
local function wlive_now(field)
  local v = wlive_memo[field]
  if v == nil then
    v = tonumber(redis.call('HGET', WLIVE, field)) or 0
    wlive_memo[field] = v
  end
  return v
end
local function wlive_add(field, n)
  wlive_memo[field] = wlive_now(field) + n
  wlive_delta[field] = (wlive_delta[field] or 0) + n
end
function batch.prefetch_wlive(fields)
  batch.read_fields(WLIVE, batch.unread(fields, wlive_memo),
                    function(f, v) wlive_memo[f] = tonumber(v) or 0 end)
end
local freed_hosts = {}
-- Mid-call: the hosts whose slot was freed and which waited for one (at FAR in `ready`) may be
-- leased from now (step 7 reads `ready`); a count that went below 0 (a slot freed twice: an
-- entry of the previous format) reads as 0, as once written.
local function settle_slots()
  local freed = {}
  for h in pairs(freed_hosts) do freed[#freed + 1] = h end
  for from = 1, #freed, 1000 do
    local part = {unpack(freed, from, math.min(#freed, from + 999))}
    local at = redis.call('ZMSCORE', READY, unpack(part))
    local wake = {}
    for i, h in ipairs(part) do
      local ready_at = tonumber(at[i])
      if ready_at and ready_at >= FAR then  -- it was waiting for a slot
        wake[#wake + 1] = now
        wake[#wake + 1] = h
      end
    end
    if #wake > 0 then redis.call('ZADD', READY, unpack(wake)) end
  end
  freed_hosts = {}
  for h in pairs(live_delta) do
    if live_now(h) < 0 then ctx_put(ctx, HOSTLIVE, h, 0) end
  end
  for f in pairs(wlive_delta) do
    if wlive_memo[f] < 0 then wlive_memo[f] = 0 end
  end
end
-- (the memo holds each count as read plus this call's changes: written as it is)
local function flush_slots()
  settle_slots()
  local lives, wlives = {}, {}
  for h, n in pairs(live_delta) do
    if n ~= 0 then lives[h] = live_now(h) end
  end
  for f, n in pairs(wlive_delta) do
    if n ~= 0 then wlives[f] = wlive_memo[f] end
  end
  batch.write_counts(HOSTLIVE, lives)
  batch.write_counts(WLIVE, wlives)
  live_delta, wlive_delta = {}, {}
end

-- A lease holds its host's concurrency slot from the lease until its download is over
-- (the worker says so: `s`) or, when it never says, until the lease ends.
local function free_slot(host, who)
  live_add(host, -1)
  if who and who ~= '' then wlive_add(who .. '|' .. host, -1) end
  freed_hosts[host] = true
end

-- Queue writes are collected per bucket and sent in few commands by flush_queue (before
-- anything reads the queue again: the leases, step 7).  A new entry goes to its bucket's tail;
-- one that comes back (reclaimed, released, deferred, parked) to its head, as the oldest: its
-- request was pushed before every entry behind it.  Its encoded request, unless given, is
-- read from `data` (where a leased or deferred entry keeps it) and deleted there.
local q_tail, q_head, q_need, ready_add = {}, {}, {}, {}
local function enqueue(id, score, host, payload, back)
  local b = bucket_name(host, score)
  local t = back and q_head or q_tail
  local l = t[b]
  if not l then
    l = {}
    t[b] = l
  end
  local e = {id, payload, host}
  l[#l + 1] = e
  if payload == nil then q_need[#q_need + 1] = e end
  ready_add[host] = true
end
-- The buckets' index (host -> its buckets' priority keys, lua/hosts.lua), as read or written
-- by this call (false: the host has none).
batch.qi = {}
function batch.prefetch_index(hosts)
  batch.read_fields(QIDX, batch.unread(hosts, batch.qi), function(h, v) batch.qi[h] = v end)
end
-- Buckets (names "<host>\t<priority key>") that hold entries and that were emptied: their
-- hosts' index values (written only where they change).
function batch.index_update(filled, emptied)
  local hosts, changes = {}, {}
  for _, list in ipairs({{filled, true}, {emptied, false}}) do
    for _, b in ipairs(list[1]) do
      local tab = string.find(b, '\t', 1, true)
      local h = string.sub(b, 1, tab - 1)
      hosts[#hosts + 1] = h
      changes[#changes + 1] = {h, string.sub(b, tab + 1), list[2]}
    end
  end
  if #changes == 0 then return end
  batch.prefetch_index(hosts)
  local touched = {}
  for _, c in ipairs(changes) do
    local was = batch.qi[c[1]] or nil
    local v
    if c[3] then v = index_with(was, c[2]) else v = index_without(was, c[2]) end
    batch.qi[c[1]] = v or false
    if v ~= was then touched[c[1]] = batch.qi[c[1]] end
  end
  batch.write_fields(QIDX, touched)
end
local data_add = {}
local data_del, exp_del, lease_del, leases_del = {}, {}, {}, {}
local function flush_queue()
  if #q_need > 0 then
    local ids, of = {}, {}
    for _, e in ipairs(q_need) do
      if of[e[1]] == nil then
        of[e[1]] = e
        ids[#ids + 1] = e[1]
      end
    end
    batch.read_fields(DATA, ids, function(id, v) of[id][2] = v end)
    for _, e in ipairs(q_need) do
      if e[2] then
        data_del[#data_del + 1] = e[1]  -- the request moves into the bucket's entry
      else
        batch.to_dead(e[1], 'entry has no data', e[3])  -- (its deletes are the ones below)
      end
    end
    q_need = {}
  end
  -- deletes first: a request parked by this call may come back (resumed) in the same call
  if #data_del > 0 then call_many('HDEL', DATA, data_del, 4000) end
  if #exp_del > 0 then call_many('HDEL', EXPIRIES, exp_del, 4000) end
  if #lease_del > 0 then call_many('HDEL', LEASE, lease_del, 4000) end
  if #leases_del > 0 then call_many('ZREM', LEASES, leases_del, 4000) end
  if #data_add > 0 then call_many('HSET', DATA, data_add, 2000) end
  local added, pushed_to = 0, {}
  for _, side in ipairs({{q_tail, false}, {q_head, true}}) do
    for b, l in pairs(side[1]) do
      -- at the head: oldest (lowest id) first, so pushed there in the reverse order
      if side[2] then table.sort(l, function(x, y) return x[1] > y[1] end) end
      local items = {}
      for _, e in ipairs(l) do
        if e[2] then items[#items + 1] = e[1] .. '\t' .. e[2] end
      end
      for from = 1, #items, 2000 do
        -- (each command named in full: acl.py reads the scripts' commands from their source)
        if side[2] then
          redis.call('LPUSH', QB .. b, unpack(items, from, math.min(#items, from + 1999)))
        else
          redis.call('RPUSH', QB .. b, unpack(items, from, math.min(#items, from + 1999)))
        end
      end
      added = added + #items
      -- (every bucket pushed to is made sure of in the index: one written by a call that
      -- failed half-way is indexed again)
      if #items > 0 then pushed_to[#pushed_to + 1] = b end
    end
  end
  batch.index_update(pushed_to, {})
  if added > 0 then redis.call('INCRBY', QN, added) end
  local hosts = {}
  for h in pairs(ready_add) do
    hosts[#hosts + 1] = now
    hosts[#hosts + 1] = h
  end
  if #hosts > 0 then
    table.insert(hosts, 1, 'NX')
    call_many('ZADD', READY, hosts, 4000)
  end
  q_tail, q_head, q_need, ready_add = {}, {}, {}, {}
  data_add, data_del, exp_del, lease_del, leases_del = {}, {}, {}, {}, {}
end

-- Entries queued: in the buckets, and any of the previous format not moved yet.
function batch.queued()
  return (tonumber(redis.call('GET', QN)) or 0) + redis.call('ZCARD', Q)
end

-- A leased entry leaves its lease (and its host's slot, unless it was freed already).
-- Returns its score and host.
local function drop_lease(id)
  local _, score, who, host = parse_lease(lease_value(id))
  if host == nil then host = legacy_host(id) or '' end
  leases_del[#leases_del + 1] = id
  lease_del[#lease_del + 1] = id
  lease_cache[id] = false
  if not (who and string.sub(who, 1, 1) == '!') then
    free_slot(host, who)
  end
  return tonumber(score) or 0, host
end

-- Entries per host (FLEET_HOST_QUEUE_MAX): read when a bound needs them, changes summed
-- per host and written once per host by flush_hostq, at the end of the call.
local host_counts, host_delta = {}, {}
local function host_count(host)
  if host_counts[host] == nil then
    host_counts[host] = (tonumber(redis.call('HGET', HOSTQ, host)) or 0) + (host_delta[host] or 0)
  end
  return host_counts[host]
end
local function host_add(host, n)
  if host == '' then return end
  host_delta[host] = (host_delta[host] or 0) + n
  if host_counts[host] ~= nil then host_counts[host] = math.max(host_counts[host] + n, 0) end
end
function batch.prefetch_hostq(hosts)
  local want = {}
  for _, h in ipairs(batch.unread(hosts, host_counts)) do
    if h ~= '' then want[#want + 1] = h end  -- (an entry without a host is not counted)
  end
  batch.read_fields(HOSTQ, want, function(h, v)
    host_counts[h] = (tonumber(v) or 0) + (host_delta[h] or 0)
  end)
end
local function flush_hostq()
  local changed = {}
  for host, n in pairs(host_delta) do
    if n ~= 0 then changed[#changed + 1] = host end
  end
  batch.prefetch_hostq(changed)
  local values = {}
  for _, host in ipairs(changed) do values[host] = host_counts[host] end
  batch.write_counts(HOSTQ, values)
  host_delta = {}
end

-- An entry that leaves the frontier for good (acknowledged or dead-lettered) or for the
-- parked list: forget its data and its place in its host's count.
local function forget(id, host)
  host_add(host, -1)
  if host == STAGE_HOST then
    hincrby(STATS, 'response_queue_bytes', -redis.call('HSTRLEN', DATA, id))
  end
  data_del[#data_del + 1] = id
end

local function to_dead(id, reason, host)
  local data = redis.call('HGET', DATA, id)
  redis.call('HSET', DEAD, id, cmsgpack.pack({reason = reason, at = now, data = data or ''}))
  forget(id, host)
  exp_del[#exp_del + 1] = id
  out.dead = out.dead + 1
  count('dead_lettered', 1)
end
batch.to_dead = to_dead

-- The leases this call looks at (expired ones, and those the worker names), read at once, and
-- the slot counts of their hosts.
function batch.prefetch_call_leases(expired)
  local all = {}
  for _, list in ipairs({expired, req.a, req.r, req.d, req.x, req.s}) do
    for _, e in ipairs(list) do all[#all + 1] = e end
  end
  batch.prefetch_leases(all)
  local hosts, fields = {}, {}
  for _, e in ipairs(all) do
    local id = type(e) == 'table' and e[1] or e
    local _, _, who, host = parse_lease(lease_cache[id])
    if host then
      hosts[#hosts + 1] = host
      if who and who ~= '' and string.sub(who, 1, 1) ~= '!' then
        fields[#fields + 1] = who .. '|' .. host
      end
    end
  end
  batch.prefetch_ctx(HOSTLIVE, hosts)
  batch.prefetch_wlive(fields)
end

-- Holds `token` the current lease of `id`?  Returns its score when it does.
local function holds(id, token)
  local tok, score = parse_lease(lease_value(id))
  if tok and tok == tostring(token) then
    return score
  end
  return nil
end

-- An entry that cannot be read (not written by these scripts) is kept as a dead letter with
-- its raw bytes, under a new id: never dropped.
function batch.dead_raw(reason, raw)
  redis.call('HSET', DEAD, string.format('%015d', redis.call('INCR', SEQ)),
             cmsgpack.pack({reason = reason, at = now, data = raw}))
  out.dead = out.dead + 1
  count('dead_lettered', 1)
end

-- 0. entries of the previous format (members of the `queue` ZSET, requests in `data`) move
-- into the buckets, the first 200 per call (a host's best priority first, FIFO), each to its
-- bucket's tail
if redis.call('EXISTS', Q) == 1 then
  local old = redis.call('ZRANGE', Q, 0, 199)
  for _, member in ipairs(old) do
    local host, key, id = string.match(member, '^([^\t]*)\t(%d+)\t(.+)$')
    if host then
      enqueue(id, tonumber(key) - PRIO_OFFSET, host, nil, false)
    else
      count('bad_queue_members', 1)
      batch.dead_raw('corrupt queue entry', member)
    end
  end
  call_many('ZREM', Q, old, 4000)
  flush_queue()
end

-- Stored responses deferred (their links' hosts were all full) wait for those hosts, not for a
-- parse worker: they are left out of the response queue that stops the fetch workers (out.rq),
-- or the fetch workers would stop while the hosts they must drain stay full
-- (docs/stages.md).  n = 1 when one is deferred, -1 when it is due.
function batch.stage_deferred(id, n)
  local left = hincrby(STATS, 'response_queue_deferred', n)
  local bytes = hincrby(STATS, 'response_queue_deferred_bytes',
                        n * redis.call('HSTRLEN', DATA, id))
  if left <= 0 or bytes < 0 then  -- (one deferred before these counts existed)
    redis.call('HDEL', STATS, 'response_queue_deferred', 'response_queue_deferred_bytes')
  end
end

-- 1. deferred entries whose delay is over go back to the queue
local due = redis.call('ZRANGEBYSCORE', DELAYED, '-inf', now, 'LIMIT', 0, 100)
if #due > 0 then
  for _, member in ipairs(due) do
    local id, score, host = string.match(member, '^([^|]*)|([^|]*)|?(.*)$')
    if host == '' then host = legacy_host(id) or '' end  -- previous format: "id|score"
    if host == STAGE_HOST then batch.stage_deferred(id, -1) end
    enqueue(id, tonumber(score) or 0, host, nil, true)
  end
  call_many('ZREM', DELAYED, due, 4000)
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
    local score, host = drop_lease(id)
    local n = counts[i]
    if n >= max_leases then
      to_dead(id, 'lease expired ' .. n .. ' times', host)
    else
      enqueue(id, score, host, nil, true)
      out.reclaimed = out.reclaimed + 1
    end
  end
  flush_queue()  -- before the releases below read the same leases
end
count('reclaimed', out.reclaimed)

-- 3. releases: leased but never started (worker closing); no expiry is counted
for _, r in ipairs(req.r) do
  if holds(r[1], r[2]) then
    local score, host = drop_lease(r[1])
    enqueue(r[1], score, host, nil, true)
    out.released = out.released + 1
  end
end
count('released', out.released)

-- 4. dead letters reported by the worker (entry cannot be decoded)
for _, d in ipairs(req.d) do
  if holds(d[1], d[2]) then
    local _, host = drop_lease(d[1])
    to_dead(d[1], d[3], host)
  end
end

-- 5. heartbeat: extend live leases, report lost ones
local extend = {}
for _, x in ipairs(req.x) do
  if holds(x[1], x[2]) then
    extend[#extend + 1] = now + lease_ms
    extend[#extend + 1] = x[1]
  else
    out.lost[#out.lost + 1] = x[1]
  end
end
if #extend > 0 then
  table.insert(extend, 1, 'XX')
  call_many('ZADD', LEASES, extend, 4000)
end

-- 5b. downloads over: their host's slot is free for the next request at once, while the
-- worker still parses the response (Scrapy's CONCURRENT_REQUESTS_PER_DOMAIN also counts
-- downloads only); the lease itself lasts until the acknowledgement
-- (a request acknowledged in this call too is left to its acknowledgement, which frees the
-- slot as it drops the lease: its lease is not rewritten first)
local marks, acking = {}, {}
for _, a in ipairs(req.a) do acking[a[1]] = tostring(a[2]) end
for _, sv in ipairs(req.s) do
  local tok, score, who, host = parse_lease(lease_value(sv[1]))
  if tok and tok == tostring(sv[2]) and string.sub(who, 1, 1) ~= '!'
      and acking[sv[1]] ~= tok then
    if host == nil then host = legacy_host(sv[1]) or '' end
    local v = lease_string(tok, score, host, '!' .. who)
    marks[#marks + 1] = sv[1]
    marks[#marks + 1] = v
    lease_cache[sv[1]] = v
    free_slot(host, who)
  end
end
if #marks > 0 then call_many('HSET', LEASE, marks, 4000) end
settle_slots()

-- 6. pushes and acknowledgements, within the bounds
flush_queue()
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
    local _, _, _, h = parse_lease(lease_cache[a[1]])
    if h then hosts[#hosts + 1] = h end
  end
  batch.prefetch_hostq(hosts)
end
local added = {}  -- fingerprints added by this call (two identical links: the second is seen)
local function host_full(host)
  return host_max > 0 and host ~= '' and host ~= STAGE_HOST and host_count(host) >= host_max
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
  host_add(p[5], 1)
  if p[5] == STAGE_HOST then hincrby(STATS, 'response_queue_bytes', #p[3]) end
  if p[6] and p[6] > 0 then
    data_add[#data_add + 1] = id  -- a deferred entry keeps its request in `data`
    data_add[#data_add + 1] = p[3]
    redis.call('ZADD', DELAYED, now + math.floor(p[6]), id .. '|' .. (-p[2]) .. '|' .. p[5])
  else
    enqueue(id, -p[2], p[5], p[3], false)
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
      host_add(host, 1)
      if host == STAGE_HOST then hincrby(STATS, 'response_queue_bytes', #rec[4]) end
      enqueue(id, rec[2], host, rec[4], true)
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
  local score = holds(a[1], a[2])
  if not score then
    -- the lease was lost: another worker fetches this request again and pushes its links
    out.lost[#out.lost + 1] = a[1]
    count('stale_acks', 1)
  else
    local allowed = 1e15
    if queue_max > 0 then
      allowed = math.max(queue_max - size + 1, 1)
    end
    local _, _, _, own_host = parse_lease(lease_value(a[1]))
    local _, own = drop_lease(a[1])  -- (the host of a lease of the previous format, too)
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
      if a[3] then  -- failed for good: recorded with its acknowledgement (lua/failed.lua)
        local _, trimmed = failed_record(FK, a[1], a[3], redis.call('HGET', DATA, a[1]), now,
                                         tonumber(req.fm) or 0)
        count('failed', 1)
        count('failed_trimmed', trimmed)
      end
      forget(a[1], own_host)
      exp_del[#exp_del + 1] = a[1]
      size = size - 1
      out.acked = out.acked + 1
    elseif pushed > 0 then
      -- park: out of the size and of its host's count, back in the queue when there is room
      local data = redis.call('HGET', DATA, a[1]) or ''
      parked_recs[#parked_recs + 1] = cmsgpack.pack({a[1], tonumber(score) or 0, own_host, data})
      forget(a[1], own_host)
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
if #parked_recs > 0 then call_many('RPUSH', PARKED, parked_recs, 4000) end
if #deferred_members > 0 then call_many('ZADD', DELAYED, deferred_members, 4000) end
resume_parked(100)  -- the slots freed above (and any room found now) go to parked requests first
if bloom ~= nil then
  bloom_flush(bloom)
  out.bg = bloom.gen
end
flush_queue()
settle_slots()
count('acked', out.acked)
count('pushed', out.new)
count('duplicates', out.dup + local_dups)
count('parked', out.parked)
count('deferred', out.deferred)
count('resumed', out.resumed)
count('refused', out.refused)

-- 7. lease up to `take` requests, host-aware (docs/politeness.md): among the hosts that may
-- be fetched now (not on hold, under their concurrency cap, and with a GCRA token), take the
-- best head (highest priority, then FIFO) each time; a host that may not be fetched is
-- re-marked with the time it may, and never blocks the others.  A host's queue is read a
-- few heads at a time; the lease writes go out in few commands at the end.
-- (a function: its locals have their own budget, Lua allows 200 per function)
local function lease_step()
  -- the hosts ready longest, as many as this call can use (twice take, 8 to 64 of them)
  -- (stages: ho = only this host, hx = never this one; stored responses go to parse workers)
  local except_host = (type(req.hx) == 'string' and req.hx ~= '') and req.hx or nil
  local cands
  if type(req.ho) == 'string' and req.ho ~= '' then
    local at = tonumber(redis.call('ZSCORE', READY, req.ho))
    cands = (at and at <= now) and {req.ho} or {}
  else
    cands = redis.call('ZRANGEBYSCORE', READY, '-inf', now, 'LIMIT', 0,
                       math.min(64, math.max(8, 2 * take)))
  end
  local list, heads, pos, hb, ended = {}, {}, {}, {}, {}
  local taken = 0
  -- what this call read of the buckets: each head member's request, bucket and raw entry;
  -- per bucket, its length when its end was seen, and the buckets found empty
  local lk = {payload = {}, bucket = {}, raw = {}, len = {}, empty = {}}
  -- the next head of h's queue not taken by this call (nil when there is none), as a member
  -- "<host>\t<priority key>\t<entry id>"; a read fetches the next heads of h's best bucket not
  -- read yet: 1 for the first look, then twice as many as the read before (at most what this
  -- call may still take): a host usually gives a call one lease or two (its concurrency cap is
  -- shared among the workers), so reading all the call may take from it reads entries that
  -- stay.  hb[h]: {h's bucket names (from the index), the current one's index, entries read
  -- of it, the size of the next read}
  local function head_of(h, first)
    local buf = heads[h]
    if buf and pos[h] <= #buf then return buf[pos[h]] end
    if ended[h] then return nil end
    local st = hb[h]
    if st == nil then
      batch.prefetch_index({h})
      local names = {}
      for i, key in ipairs(index_keys(batch.qi[h] or nil)) do names[i] = h .. '\t' .. key end
      st = {names, 1, 0, 1}
      hb[h] = st
    end
    local want = first and 1 or math.max(1, math.min(take - taken, st[4], 64))
    st[4] = want * 2
    buf = {}
    while #buf == 0 do
      local b = st[1][st[2]]
      if b == nil then break end
      local entries = redis.call('LRANGE', QB .. b, st[3], st[3] + want - 1)
      for i, e in ipairs(entries) do
        local id, payload = entry_parts(e)
        local m = b .. '\t' .. (id or '')
        buf[i] = m
        lk.payload[m], lk.bucket[m], lk.raw[m] = payload, b, e
      end
      st[3] = st[3] + #entries
      if #entries < want then  -- the bucket's end: the next read is of the next bucket
        lk.len[b] = st[3]
        if st[3] == 0 then lk.empty[#lk.empty + 1] = b end
        st[2], st[3] = st[2] + 1, 0
      end
    end
    if #buf == 0 then ended[h] = true end
    heads[h], pos[h] = buf, 1
    return buf[1]
  end
  local ready_del = {}
  batch.prefetch_index(cands)
  for _, h in ipairs(cands) do
    if h ~= except_host then  -- not for this worker (stored responses go to parse workers)
      if head_of(h, true) then
        list[#list + 1] = h
      else
        ready_del[#ready_del + 1] = h
      end
    end
  end
  if #ready_del > 0 then call_many('ZREM', READY, ready_del, 4000) end
  -- what the politeness checks below read of each candidate host, read at once
  batch.prefetch_ctx(HOSTLIVE, list)
  batch.prefetch_ctx(HOLD, list)
  batch.prefetch_ctx(HOSTCONF, list)
  batch.prefetch_ctx(CRAWLDELAY, list)
  if ctx.defaults[1] > 0 or not ctx.empty[HOSTCONF] or not ctx.empty[CRAWLDELAY] then
    batch.prefetch_ctx(TAT, list)
  end
  if worker ~= '' then
    local fields = {}
    for i, h in ipairs(list) do fields[i] = worker .. '|' .. h end
    batch.prefetch_wlive(fields)
  end
  -- a capped host's slots are shared among the live workers (seen in the last 10 s), so
  -- that the worker which frees a slot does not always take it back itself
  local active = math.max(1, redis.call('ZCOUNT', WORKERS, now - 10000, '+inf'))
  if worker ~= '' and not redis.call('ZSCORE', WORKERS, worker) then active = active + 1 end
  local q_del, lease_set, leases_add, ready_set, ready_gone = {}, {}, {}, {}, {}
  local tok_next, tok_last = 1, 0
  local pending = {}  -- {id, token, host} of the leases, payloads read at the end
  local keys_of = {}  -- host -> {head member, its "<priority key>\t<id>" part}
  local function head_key(h)
    local m = head_of(h)
    local c = keys_of[h]
    if c == nil or c[1] ~= m then
      c = {m, string.sub(m, #h + 2)}
      keys_of[h] = c
    end
    return c[2]
  end
  -- the candidate hosts in a binary heap by their head's key: the best head is on top
  local heap, hn = {}, 0
  local function sift_down(i)
    while true do
      local l, best = 2 * i, i
      if l <= hn and head_key(heap[l]) < head_key(heap[best]) then best = l end
      if l + 1 <= hn and head_key(heap[l + 1]) < head_key(heap[best]) then best = l + 1 end
      if best == i then return end
      heap[i], heap[best] = heap[best], heap[i]
      i = best
    end
  end
  local function pop_top()
    heap[1] = heap[hn]
    heap[hn] = nil
    hn = hn - 1
    if hn > 0 then sift_down(1) end
  end
  for _, h in ipairs(list) do
    hn = hn + 1
    heap[hn] = h
  end
  for i = math.floor(hn / 2), 1, -1 do sift_down(i) end
  while taken < take and hn > 0 do
    local h = heap[1]
    local interval, tau, cap = 0, 0, 0  -- stored responses: no politeness (not a site)
    if h ~= STAGE_HOST then interval, tau, cap = host_policy(h) end
    local wait_until = h ~= STAGE_HOST and host_blocked_until(h, interval, tau, cap) or nil
    if not wait_until and req.ro == 1 and h ~= STAGE_HOST
        and redis.call('HEXISTS', ROBOTS, h) == 0 and live_now(h) >= 1 then
      wait_until = now + 250  -- robots.txt (and its Crawl-delay) not known yet: one scout
    end
    local my_share_used = cap > 0 and worker ~= '' and
      wlive_now(worker .. '|' .. h) >= math.ceil(cap / active)
    if my_share_used and not wait_until then
      pop_top()  -- this worker has its share of the host: others may have it
    elseif wait_until then
      ready_set[#ready_set + 1] = wait_until
      ready_set[#ready_set + 1] = h
      pop_top()
    else
      local m = head_of(h)
      pos[h] = pos[h] + 1
      q_del[#q_del + 1] = m
      local score, id = member_parts(h, m)
      if not id or not lk.payload[m] then
        count('bad_queue_members', 1)  -- nothing to lease
        batch.dead_raw('corrupt queue entry', lk.raw[m] or '')
      else
        if tok_next > tok_last then
          -- a fencing token is never below the clock (ms x 10): after a failover that lost
          -- the last leases, the promoted replica's rolled-back counter could hand their
          -- tokens out again, on entry ids rolled back too (another request); from the clock
          -- it cannot (docs/deployment.md, "What a failover can lose")
          local n = take - taken
          tok_last = redis.call('INCRBY', TOKEN, n)
          tok_next = tok_last - n + 1
          if tok_next < now * 10 then
            tok_next = now * 10
            tok_last = tok_next + n - 1
            redis.call('SET', TOKEN, string.format('%d', tok_last))
          end
        end
        local tok = tok_next
        tok_next = tok_next + 1
        if legacy == nil then legacy = redis.call('EXISTS', EHOST) == 1 end
        if legacy then redis.call('HDEL', EHOST, id) end  -- previous format: host was there
        lease_set[#lease_set + 1] = id
        lease_set[#lease_set + 1] = lease_string(string.format('%d', tok), score, h, worker)
        leases_add[#leases_add + 1] = now + lease_ms
        leases_add[#leases_add + 1] = id
        live_add(h, 1)
        if worker ~= '' then wlive_add(worker .. '|' .. h, 1) end
        host_take_token(h, interval)
        pending[#pending + 1] = {id, tok, h, score, lk.payload[m]}
        taken = taken + 1
      end
      if not head_of(h) then
        ready_gone[#ready_gone + 1] = h
        pop_top()
      else
        sift_down(1)  -- its next head comes later (lower priority, or FIFO after)
      end
    end
  end
  if #q_del > 0 then
    -- the heads taken leave their buckets (LTRIM), an emptied bucket its index
    local pops, gone = {}, lk.empty
    for _, m in ipairs(q_del) do
      local b = lk.bucket[m]
      pops[b] = (pops[b] or 0) + 1
    end
    for b, n in pairs(pops) do
      redis.call('LTRIM', QB .. b, n, -1)
      if lk.len[b] and n >= lk.len[b] then gone[#gone + 1] = b end
    end
    redis.call('DECRBY', QN, #q_del)
    batch.index_update({}, gone)
  elseif #lk.empty > 0 then
    batch.index_update({}, lk.empty)
  end
  if #ready_gone > 0 then call_many('ZREM', READY, ready_gone, 4000) end
  if #ready_set > 0 then call_many('ZADD', READY, ready_set, 4000) end
  if #pending > 0 then
    local ids = {}
    for i, e in ipairs(pending) do ids[i] = e[1] end
    local exps = redis.call('HMGET', EXPIRIES, unpack(ids))
    call_many('HSET', LEASE, lease_set, 4000)
    call_many('ZADD', LEASES, leases_add, 4000)
    for i, e in ipairs(pending) do
      -- a leased entry keeps its request in `data` (acknowledged: deleted; back: moved)
      data_add[#data_add + 1] = e[1]
      data_add[#data_add + 1] = e[5]
      out.leased[#out.leased + 1] = {e[1], e[2], e[5], tonumber(exps[i]) or 0}
    end
    flush_queue()
  end
  count('leased', #out.leased)
  if #out.leased < take then
    -- the worker wanted more: when may the next host be fetched (a GCRA turn, a hold, a
    -- delay)?  It calls again then instead of at its next poll, so a host's rate is reached
    -- with one worker too (hosts waiting for a free slot, at FAR, are left out)
    local nxt = redis.call('ZRANGEBYSCORE', READY, '(' .. now, '(' .. FAR, 'WITHSCORES',
                           'LIMIT', 0, 1)
    if nxt[2] then out.nr = tonumber(nxt[2]) - now end
  end
end
if take > 0 then lease_step() end

flush_hostq()
flush_slots()

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
  out.rq = {math.max(host_count(STAGE_HOST) - (tonumber(rq[2]) or 0), 0),
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
-- lagging replica), so the worker forgets what it learnt of the filter (client.DupeCache).
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
