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
--   1 queue  2 data  3 leases  4 lease  5 expiries  6 dead  7 seq  8 token  9 stats
--   10 idle_since  11 workers  12 op (this call)  13 op (previous call of this client)
--   14 delayed  15 parked  16 hostq  17 ehost  18 ready  19 tat  20 hold  21 hostlive
--   22 hostconf  23 crawldelay  24 wlive  25 robots
--   26 failed  27 failed_at  28 failed_by  29 marker  (lua/failed.lua)
--   30 bloom meta  31.. bloom slices, then the MON_NKEYS keys of lua/monitoring.lua (last)
-- ARGV[1]: msgpack map (see frontier.py, _arg):
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
-- ARGV[2] (optional): heartbeat, counter deltas and sampling of lua/monitoring.lua.
-- Reply: msgpack map (see frontier.py, SyncResult.from_reply); mk: the crawl marker; nr: ms
--   until the next host may be fetched, when this call leased fewer than `take`.

local cached = redis.call('GET', KEYS[12])
if cached then
  return cached
end

local Q, DATA, LEASES, LEASE, EXPIRIES, DEAD = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local SEQ, TOKEN, STATS, IDLE, WORKERS = KEYS[7], KEYS[8], KEYS[9], KEYS[10], KEYS[11]
local DELAYED, PARKED, HOSTQ, EHOST = KEYS[14], KEYS[15], KEYS[16], KEYS[17]
local READY, TAT, HOLD, HOSTLIVE = KEYS[18], KEYS[19], KEYS[20], KEYS[21]
local HOSTCONF, CRAWLDELAY, WLIVE, ROBOTS = KEYS[22], KEYS[23], KEYS[24], KEYS[25]

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
local function host_policy(h) return host_policy_ctx(ctx, h) end
local function host_blocked_until(h, T, tau, cap)
  return host_blocked_until_ctx(ctx, h, T, tau, cap, true)
end
local function host_take_token(h, T) return host_take_token_ctx(ctx, h, T) end

local out = {leased = {}, lost = {}, pf = {}, rf = {}, new = 0, dup = 0, acked = 0,
             released = 0, reclaimed = 0, dead = 0, parked = 0, deferred = 0, resumed = 0,
             refused = 0, full = false, now = now, mk = marker or ''}
local counters = {}
local function count(name, n)
  counters[name] = (counters[name] or 0) + n
end

local function parse_lease(v)
  if not v then return nil end
  local tok, score, who = string.match(v, '^(%d+)|([^|]*)|(.*)$')
  return tok, score, who
end

-- A lease holds its host's concurrency slot from the lease until its download is over
-- (the worker says so: `s`) or, when it never says, until the lease ends.  A lease whose slot
-- is free has its worker written "!worker".
local function free_slot(id, who)
  local host = redis.call('HGET', EHOST, id) or ''
  if hincrby(HOSTLIVE, host, -1) <= 0 then
    redis.call('HDEL', HOSTLIVE, host)
  end
  if who and who ~= '' then
    local field = who .. '|' .. host
    if hincrby(WLIVE, field, -1) <= 0 then redis.call('HDEL', WLIVE, field) end
  end
  local ready_at = tonumber(redis.call('ZSCORE', READY, host))
  if ready_at and ready_at >= FAR then
    redis.call('ZADD', READY, now, host)  -- it was waiting for a slot
  end
end

-- A leased entry leaves its lease (and its host's slot, unless it was freed already).
local function drop_lease(id)
  local _, _, who = parse_lease(redis.call('HGET', LEASE, id))
  redis.call('ZREM', LEASES, id)
  redis.call('HDEL', LEASE, id)
  if not (who and string.sub(who, 1, 1) == '!') then
    free_slot(id, who)
  end
end

-- Queue an entry (new, or back from a lease, a deferral or a parking) under its host.
local function enqueue(id, score, host)
  if host == nil then host = redis.call('HGET', EHOST, id) or '' end
  redis.call('ZADD', Q, 0, queue_member(host, score, id))
  redis.call('ZADD', READY, 'NX', now, host)
end

-- Entries per host (FLEET_HOST_QUEUE_MAX), read once per call and kept up to date here.
local host_counts = {}
local function host_count(host)
  if host_counts[host] == nil then
    host_counts[host] = tonumber(redis.call('HGET', HOSTQ, host)) or 0
  end
  return host_counts[host]
end
local function host_add(host, n)
  if host == '' then return end
  local left = hincrby(HOSTQ, host, n)
  if left <= 0 then redis.call('HDEL', HOSTQ, host) end
  host_counts[host] = math.max(left, 0)
end

-- An entry that leaves the frontier for good (acknowledged or dead-lettered) or for the
-- parked list: forget its data and its place in its host's count.
local function forget(id)
  local host = redis.call('HGET', EHOST, id)
  if host then
    host_add(host, -1)
    redis.call('HDEL', EHOST, id)
    if host == STAGE_HOST then
      hincrby(STATS, 'response_queue_bytes', -redis.call('HSTRLEN', DATA, id))
    end
  end
  redis.call('HDEL', DATA, id)
end

local function to_dead(id, reason)
  local data = redis.call('HGET', DATA, id)
  redis.call('HSET', DEAD, id, cmsgpack.pack({reason = reason, at = now, data = data or ''}))
  forget(id)
  redis.call('HDEL', EXPIRIES, id)
  out.dead = out.dead + 1
  count('dead_lettered', 1)
end

-- Holds `token` the current lease of `id`?  Returns its score when it does.
local function holds(id, token)
  local tok, score = parse_lease(redis.call('HGET', LEASE, id))
  if tok and tok == tostring(token) then
    return score
  end
  return nil
end

-- 1. deferred entries whose delay is over go back to the queue
local due = redis.call('ZRANGEBYSCORE', DELAYED, '-inf', now, 'LIMIT', 0, 100)
for _, member in ipairs(due) do
  local id, score = string.match(member, '^([^|]*)|(.*)$')
  redis.call('ZREM', DELAYED, member)
  enqueue(id, tonumber(score) or 0)
end

-- 2. reclaim expired leases (of any worker), a bounded number per call
local expired = redis.call('ZRANGEBYSCORE', LEASES, '-inf', now, 'LIMIT', 0, tonumber(req.rc) or 100)
for _, id in ipairs(expired) do
  local _, score = parse_lease(redis.call('HGET', LEASE, id))
  drop_lease(id)
  local n = hincrby(EXPIRIES, id, 1)
  if n >= max_leases then
    to_dead(id, 'lease expired ' .. n .. ' times')
  else
    enqueue(id, tonumber(score) or 0)
    out.reclaimed = out.reclaimed + 1
  end
end
count('reclaimed', out.reclaimed)

-- 3. releases: leased but never started (worker closing); no expiry is counted
for _, r in ipairs(req.r) do
  local score = holds(r[1], r[2])
  if score then
    drop_lease(r[1])
    enqueue(r[1], tonumber(score) or 0)
    out.released = out.released + 1
  end
end
count('released', out.released)

-- 4. dead letters reported by the worker (entry cannot be decoded)
for _, d in ipairs(req.d) do
  if holds(d[1], d[2]) then
    drop_lease(d[1])
    to_dead(d[1], d[3])
  end
end

-- 5. heartbeat: extend live leases, report lost ones
for _, x in ipairs(req.x) do
  if holds(x[1], x[2]) then
    redis.call('ZADD', LEASES, 'XX', now + lease_ms, x[1])
  else
    out.lost[#out.lost + 1] = x[1]
  end
end

-- 5b. downloads over: their host's slot is free for the next request at once, while the
-- worker still parses the response (Scrapy's CONCURRENT_REQUESTS_PER_DOMAIN also counts
-- downloads only); the lease itself lasts until the acknowledgement
for _, sv in ipairs(req.s) do
  local v = redis.call('HGET', LEASE, sv[1])
  local tok, score, who = parse_lease(v)
  if tok and tok == tostring(sv[2]) and string.sub(who, 1, 1) ~= '!' then
    redis.call('HSET', LEASE, sv[1], tok .. '|' .. score .. '|!' .. who)
    free_slot(sv[1], who)
  end
end

-- 6. pushes and acknowledgements, within the bounds
local size = redis.call('ZCARD', Q) + redis.call('ZCARD', LEASES) + redis.call('ZCARD', DELAYED)
local bloom = nil
local function get_bloom()
  if bloom == nil then
    local slice_keys = {}
    for i = 31, #KEYS - MON_NKEYS do slice_keys[#slice_keys + 1] = KEYS[i] end
    bloom = bloom_open(KEYS[30], slice_keys, tonumber(req.bn), tonumber(req.bp))
  end
  return bloom
end
local function host_full(host)
  return host_max > 0 and host ~= '' and host ~= STAGE_HOST and host_count(host) >= host_max
end
local function seen_before(p)
  return p[1] ~= '' and bloom_contains(get_bloom(), p[1])
end
-- Check-and-add p; when new, store it as a queued entry.  Returns its id or nil (seen).
local function push(p, index)
  if p[1] ~= '' then
    local is_new, full = bloom_add(get_bloom(), p[1])
    if full then out.full = true end
    if is_new == 0 then
      out.dup = out.dup + 1
      out.pf[index] = 0
      return nil
    end
  end
  local id = string.format('%015d', redis.call('INCR', SEQ))
  redis.call('HSET', DATA, id, p[3])
  if p[5] ~= '' then
    redis.call('HSET', EHOST, id, p[5])
    host_add(p[5], 1)
    if p[5] == STAGE_HOST then hincrby(STATS, 'response_queue_bytes', #p[3]) end
  end
  if p[6] and p[6] > 0 then
    redis.call('ZADD', DELAYED, now + math.floor(p[6]), id .. '|' .. (-p[2]))
  else
    enqueue(id, -p[2], p[5])
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
      local id = string.format('%015d', redis.call('INCR', SEQ))
      redis.call('HSET', DEAD, id, cmsgpack.pack({reason = 'corrupt parked record', at = now,
                                                   data = raw}))
      out.dead = out.dead + 1
      count('dead_lettered', 1)
    elseif host_full(rec[3]) then
      redis.call('RPUSH', PARKED, raw)  -- its host is full: the next one may go
      rotated = rotated + 1
    else
      local id, host = rec[1], rec[3]
      redis.call('HSET', DATA, id, rec[4])
      if host ~= '' then
        redis.call('HSET', EHOST, id, host)
        host_add(host, 1)
        if host == STAGE_HOST then hincrby(STATS, 'response_queue_bytes', #rec[4]) end
      end
      enqueue(id, rec[2], host)
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
    -- the request's place in its own host's count is given up too: one link of that host
    -- may take it even when the host is full
    local own_host = redis.call('HGET', EHOST, a[1]) or ''
    local own_slot = own_host ~= ''
    local pushed, left_over = 0, false
    for _, i in ipairs(groups[k]) do
      local p = req.p[i]
      local use_own = own_slot and p[5] == own_host and host_full(p[5])
      if pushed >= allowed or (host_full(p[5]) and not use_own) then
        if not left_over and not seen_before(p) then left_over = true end
      else
        if push(p, i) then
          pushed = pushed + 1
          if use_own then own_slot = false end
        end
      end
    end
    drop_lease(a[1])
    if not left_over then
      if a[3] then  -- failed for good: recorded with its acknowledgement (lua/failed.lua)
        local _, trimmed = failed_record(FK, a[1], a[3], redis.call('HGET', DATA, a[1]), now,
                                         tonumber(req.fm) or 0)
        count('failed', 1)
        count('failed_trimmed', trimmed)
      end
      forget(a[1])
      redis.call('HDEL', EXPIRIES, a[1])
      size = size - 1
      out.acked = out.acked + 1
    elseif pushed > 0 then
      -- park: out of the size and of its host's count, back in the queue when there is room
      local data = redis.call('HGET', DATA, a[1]) or ''
      redis.call('RPUSH', PARKED, cmsgpack.pack({a[1], tonumber(score) or 0, own_host, data}))
      forget(a[1])
      out.parked = out.parked + 1
      size = size - 1
    else
      -- nothing could be pushed (every link's host is full): fetch it again later
      redis.call('ZADD', DELAYED, now + defer_ms, a[1] .. '|' .. score)
      out.deferred = out.deferred + 1
    end
  end
end
resume_parked(100)  -- the slots freed above (and any room found now) go to parked requests first
count('acked', out.acked)
count('pushed', out.new)
count('duplicates', out.dup)
count('parked', out.parked)
count('deferred', out.deferred)
count('resumed', out.resumed)
count('refused', out.refused)

-- 7. lease up to `take` requests, host-aware (docs/politeness.md): among the hosts that may
-- be fetched now (not on hold, under their concurrency cap, and with a GCRA token), take the
-- best head (highest priority, then FIFO) each time; a host that may not be fetched is
-- re-marked with the time it may, and never blocks the others.
if take > 0 then
  local except_host = (type(req.hx) == 'string' and req.hx ~= '') and req.hx or nil
  local cands
  if type(req.ho) == 'string' and req.ho ~= '' then
    local at = tonumber(redis.call('ZSCORE', READY, req.ho))
    cands = (at and at <= now) and {req.ho} or {}
  else
    cands = redis.call('ZRANGEBYSCORE', READY, '-inf', now, 'LIMIT', 0, 64)
  end
  local list, heads = {}, {}
  local function head_of(h)
    return redis.call('ZRANGEBYLEX', Q, '[' .. h .. '\t', '[' .. h .. '\t\255', 'LIMIT', 0, 1)[1]
  end
  for _, h in ipairs(cands) do
    if h ~= except_host then  -- not for this worker (stored responses go to parse workers)
      local m = head_of(h)
      if m then
        list[#list + 1] = h
        heads[h] = m
      else
        redis.call('ZREM', READY, h)
      end
    end
  end
  -- a capped host's slots are shared among the live workers (seen in the last 10 s), so
  -- that the worker which frees a slot does not always take it back itself
  local active = math.max(1, redis.call('ZCOUNT', WORKERS, now - 10000, '+inf'))
  if worker ~= '' and not redis.call('ZSCORE', WORKERS, worker) then active = active + 1 end
  local taken = 0
  while taken < take and #list > 0 do
    local bi, bkey = 1, nil
    for i, h in ipairs(list) do
      local key = string.sub(heads[h], #h + 2)
      if bkey == nil or key < bkey then bi, bkey = i, key end
    end
    local h = list[bi]
    local interval, tau, cap = 0, 0, 0  -- stored responses: no politeness (not a site)
    if h ~= STAGE_HOST then interval, tau, cap = host_policy(h) end
    local wait_until = h ~= STAGE_HOST and host_blocked_until(h, interval, tau, cap) or nil
    if not wait_until and req.ro == 1 and h ~= STAGE_HOST and redis.call('HEXISTS', ROBOTS, h) == 0
        and (tonumber(redis.call('HGET', HOSTLIVE, h)) or 0) >= 1 then
      wait_until = now + 250  -- robots.txt (and its Crawl-delay) not known yet: one scout
    end
    local my_share_used = cap > 0 and worker ~= '' and
      (tonumber(redis.call('HGET', WLIVE, worker .. '|' .. h)) or 0) >= math.ceil(cap / active)
    if my_share_used and not wait_until then
      table.remove(list, bi)  -- this worker has its share of the host: others may have it
    elseif wait_until then
      redis.call('ZADD', READY, wait_until, h)
      table.remove(list, bi)
    else
      local m = heads[h]
      redis.call('ZREM', Q, m)
      local score, id = member_parts(h, m)
      local data = id and redis.call('HGET', DATA, id)
      if not id then
        count('bad_queue_members', 1)  -- not written by this script: nothing to lease
      elseif not data then
        to_dead(id, 'entry has no data')
      else
        -- a fencing token is never below the clock (ms x 10): after a failover that lost
        -- the last leases, the promoted replica's rolled-back counter could hand their
        -- tokens out again, on entry ids rolled back too (another request); from the clock
        -- it cannot (docs/deployment.md, "What a failover can lose")
        local tok = redis.call('INCR', TOKEN)
        if tok < now * 10 then
          tok = now * 10
          redis.call('SET', TOKEN, string.format('%d', tok))
        end
        redis.call('HSET', LEASE, id, string.format('%d', tok) .. '|' .. score .. '|' .. worker)
        redis.call('ZADD', LEASES, now + lease_ms, id)
        hincrby(HOSTLIVE, h, 1)
        if worker ~= '' then hincrby(WLIVE, worker .. '|' .. h, 1) end
        host_take_token(h, interval)
        local n = tonumber(redis.call('HGET', EXPIRIES, id)) or 0
        out.leased[#out.leased + 1] = {id, tok, data, n}
        taken = taken + 1
      end
      local nxt = head_of(h)
      if nxt then
        heads[h] = nxt
      else
        redis.call('ZREM', READY, h)
        table.remove(list, bi)
      end
    end
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

-- 8. fleet idleness: nothing queued, leased, deferred or parked, since when?
out.queued = redis.call('ZCARD', Q)
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
out.rq = {host_count(STAGE_HOST), tonumber(redis.call('HGET', STATS, 'response_queue_bytes')) or 0}

-- hosts on hold now (429/503/failures), with the ms left: workers check them locally before
-- each download of a request leased earlier
out.holds = {}
if worker ~= '' and redis.call('HLEN', HOLD) <= 1000 then
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
              {stats = STATS, workers = WORKERS, q = Q, leases = LEASES, delayed = DELAYED,
               parked = PARKED, dead = DEAD}, out.acked + out.parked + out.deferred)
for name, n in pairs(counters) do
  if n > 0 then hincrby(STATS, name, n) end
end

-- Cache a reply without payloads: a repeated call rebuilds them from DATA (the entries are
-- still leased with these tokens, since the client has not seen the first reply).
local reply = cmsgpack.pack(out)
local light = {}
for i, e in ipairs(out.leased) do light[i] = {e[1], e[2], '', e[4]} end
out.leased = light
redis.call('SET', KEYS[12], cmsgpack.pack(out), 'PX', tonumber(req.ot) or 300000)
if KEYS[13] ~= KEYS[12] then
  redis.call('DEL', KEYS[13])
end
return reply
