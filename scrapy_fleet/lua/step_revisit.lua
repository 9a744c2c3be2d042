-- step_revisit.lua: the recrawl schedule (docs/recrawl.md): tracked pages, written with the
-- acknowledgement of their fetch, come back into the queue when due.  Defines two locals,
-- revisit_ack (called by step_ack for each acknowledged request) and step_revisit_due, and
-- revisit_state (for step_idle).
--
-- Layout (keys/crawl.py): a tracked URL waiting for its next fetch is one record
-- "<host>\t<score>\t<encoded request>" (the request's meta holds its validators, signature
-- and history: scrapy_fleet/recrawl/schedule.py) in the LIST of its due time's slot,
-- K.revisit_prefix .. "<e>:<n>" (slot n of width 2^e ms, e from the interval: about 1/16
-- of it, 2^8 to 2^26 ms); K.revisit_index (ZSET) has each slot with the time it is due (its
-- end: a revisit is never early, late by at most 1/16 of its interval); K.revisit_count
-- (STRING) counts the tracked URLs (in the schedule, or in the frontier as a revisit).  A
-- record costs its bytes and ~2 more (a list entry), the slot keys are few.
-- A revisit entry's id starts with "r" (it bypasses the Bloom filter: it was fetched before),
-- so its acknowledgement knows it: with a record (a[6], {interval ms, host, score, payload})
-- it is scheduled again; without one (404/410 repeated, opted out, redirected, retried as
-- another entry) it leaves the schedule (counted: revisit_dropped).  Any other entry
-- acknowledged with a record is tracked, while K.revisit_count < req.rvm (0: no bound; past
-- it: revisit_untracked, the page is not revisited).  A revisit entry dead-lettered (its lease
-- expired max_leases times, its worker dead-lettered it, its data is gone) leaves the schedule
-- too: revisit_dead (lua/frontier_state.lua's st.to_dead) counts it down at once.
-- Sitemap <lastmod> (docs/recrawl.md): K.revisit_popped (HASH slot -> records LPOPped from it
-- so far) makes a record's place in its slot absolute (popped + index); once K.revisit_lastmod
-- is set (a push carried a lastmod), each record written whose rec[5] is its 12-byte Bloom key
-- is indexed: K.revisit_place_prefix .. hex(key[1..2]) (HASH), field key[3..8], value
-- struct '>BI5I4I4' {e, n, position, last fetch (s, rec[6])}.  An entry is checked when read
-- (its slot's popped count, the record there): a record that left (due: LPOP; dropped;
-- dead-lettered) leaves a stale entry, overwritten when the URL is scheduled again, deleted by
-- the drop of a revisit acknowledged with its key (a[6], 12 bytes) and by any lookup that
-- finds it stale.  revisit_lastmod_due: a known URL pushed with a lastmod newer than its last
-- fetch + 1 s: its record leaves its slot (LSET "": a tombstone the due step skips) for the
-- queue at once, as a revisit ("r" id), its entry deleted.
-- Keys (of K): revisit_index, revisit_prefix, revisit_count, revisit_popped,
-- revisit_place_prefix, revisit_lastmod, seq, and the queue's.  Writes: those (RPUSH / LPOP /
-- LSET of slots, ZADD / ZREM of the index, INCRBY / DECRBY of the count, HINCRBY / HDEL of
-- popped counts, HSET / HDEL of places, SET of the lastmod flag).
-- Work per call: one RPUSH per slot written and one ZADD; with the flag set a GET of it, one
-- HGET per slot written and one HSET per record (a crawl without a lastmod: one GET per call
-- that schedules records); due: one ZRANGEBYSCORE, at most 4 slots and REVISIT_DUE_MAX
-- records moved, one HINCRBY or HDEL per slot popped, one INCRBY for their ids; lastmod: per
-- known URL pushed with one, an HGET, and for a newer one an HGET, an LINDEX and an LSET
-- (O(its index in the slot)); state: a GET (and a ZRANGE when URLs are tracked).

local REVISIT_DUE_MAX = 100
local PLACE_FORMAT = '>BI5I4I4'  -- e, n, position in the slot, last fetch (s)

local function revisit_slot(due, interval)
  local e = math.floor(math.log(math.max(interval, 1) / 16) / math.log(2))
  e = math.min(math.max(e, 8), 26)
  local width = 2 ^ e
  local n = math.floor(due / width)
  return e .. ':' .. string.format('%d', n), (n + 1) * width, e, n
end

-- The HASH and field of a 12-byte Bloom key's place entry.
local function revisit_place_of(K, fp)
  return K.revisit_place_prefix .. string.format('%02x%02x', string.byte(fp, 1, 2)),
    string.sub(fp, 3, 8)
end

-- The writes of one call, flushed by revisit_flush (step_ack calls it).  places[name]: {e, n,
-- {index in the slot's list, key, fetched}...} of records that may be indexed.
local function revisit_new_out()
  return {lists = {}, index = {}, places = {}, unindex = {}, tracked = 0, dropped = 0}
end
local revisit_out = revisit_new_out()

local function revisit_schedule(c, rec)
  local interval = tonumber(rec[1]) or 0
  local host, score, payload = rec[2], tonumber(rec[3]), rec[4]
  if interval <= 0 or type(host) ~= 'string' or not score or type(payload) ~= 'string'
      or payload == '' or string.find(host, '\t', 1, true) then
    c.count('revisit_bad_records', 1)
    return false
  end
  local name, at, e, n = revisit_slot(c.now + interval, interval)
  local l = revisit_out.lists[name]
  if not l then
    l = {}
    revisit_out.lists[name] = l
    revisit_out.index[#revisit_out.index + 1] = at
    revisit_out.index[#revisit_out.index + 1] = name
  end
  l[#l + 1] = host .. '\t' .. string.format('%d', score) .. '\t' .. payload
  if type(rec[5]) == 'string' and #rec[5] == 12 then
    local pl = revisit_out.places[name]
    if not pl then
      pl = {e, n}
      revisit_out.places[name] = pl
    end
    local fetched = tonumber(rec[6]) or math.floor(c.now / 1000)
    pl[#pl + 1] = {#l, rec[5], math.max(math.floor(fetched), 0)}
  end
  return true
end

-- The acknowledgement a (acknowledged, not parked or deferred) of entry a[1].
local function revisit_ack(c, a)
  local rec = a[6]
  local is_revisit = string.sub(a[1], 1, 1) == 'r'
  if type(rec) == 'table' then
    if is_revisit then
      if revisit_schedule(c, rec) then
        c.count('revisit_rescheduled', 1)
      else
        revisit_out.dropped = revisit_out.dropped + 1
      end
      return
    end
    local max = tonumber(c.req.rvm) or 0
    if max > 0 then
      if c.revisit_n == nil then
        c.revisit_n = tonumber(redis.call('GET', c.K.revisit_count)) or 0
      end
      if c.revisit_n + revisit_out.tracked >= max then
        c.count('revisit_untracked', 1)
        return
      end
    end
    if revisit_schedule(c, rec) then
      revisit_out.tracked = revisit_out.tracked + 1
    end
  elseif is_revisit then
    revisit_out.dropped = revisit_out.dropped + 1
    -- (its Bloom key, when the worker sends it: its place entry goes at once)
    if type(rec) == 'string' and #rec == 12 then
      revisit_out.unindex[#revisit_out.unindex + 1] = rec
    end
  end
end

-- Entry id dead-lettered (st.to_dead): a revisit ("r...") leaves the schedule (one DECRBY:
-- rare; at once, since a dead letter may come after revisit_flush, in step_lease).  Its place
-- entry, if any, is stale: found so by the next lookup.
local function revisit_dead(c, id)
  if string.sub(id, 1, 1) ~= 'r' then return end
  local n = redis.call('DECRBY', c.K.revisit_count, 1)
  if n < 0 then redis.call('SET', c.K.revisit_count, 0) end
  c.count('revisit_dropped', 1)
end

local function revisit_flush(c)
  local K = c.K
  local indexed = next(revisit_out.places) ~= nil
    and redis.call('GET', K.revisit_lastmod) ~= false
  local sets = {}
  for name, l in pairs(revisit_out.lists) do
    local len = 0
    for from = 1, #l, 2000 do
      len = redis.call('RPUSH', K.revisit_prefix .. name, unpack(l, from, math.min(#l, from + 1999)))
    end
    local pl = revisit_out.places[name]
    if indexed and pl then
      -- the list's first record of this call is at absolute position popped + len - #l
      local base = (tonumber(redis.call('HGET', K.revisit_popped, name)) or 0) + len - #l
      for j = 3, #pl do
        local key, field = revisit_place_of(K, pl[j][2])
        local s = sets[key]
        if not s then
          s = {}
          sets[key] = s
        end
        s[#s + 1] = field
        s[#s + 1] = struct.pack(PLACE_FORMAT, pl[1], pl[2], base + pl[j][1] - 1, pl[j][3])
      end
    end
  end
  for key, s in pairs(sets) do call_many('HSET', key, s, 4000) end
  for _, fp in ipairs(revisit_out.unindex) do
    local key, field = revisit_place_of(K, fp)
    redis.call('HDEL', key, field)
  end
  if #revisit_out.index > 0 then call_many('ZADD', K.revisit_index, revisit_out.index, 4000) end
  local delta = revisit_out.tracked - revisit_out.dropped
  if delta ~= 0 then
    local n = redis.call('INCRBY', K.revisit_count, delta)
    if n < 0 then redis.call('SET', K.revisit_count, 0) end
  end
  c.count('revisit_tracked', revisit_out.tracked)
  c.count('revisit_dropped', revisit_out.dropped)
  revisit_out = revisit_new_out()
end

-- Due records go to the queue (tail of their bucket, as new entries: the same politeness as
-- a first visit), within the frontier's bound; what a slot has left stays for the next call.
local function step_revisit_due(c)
  local K, now, qw = c.K, c.now, c.qw
  local room = REVISIT_DUE_MAX
  if c.queue_max > 0 then
    if c.size == nil then c.size = Queue.size(K, qw.queued) end
    room = math.min(room, c.queue_max - c.size)
  end
  if room <= 0 then return end
  local slots = redis.call('ZRANGEBYSCORE', K.revisit_index, '-inf', now, 'LIMIT', 0, 4)
  if #slots == 0 then return end
  local recs, gone = {}, {}
  for _, name in ipairs(slots) do
    if room - #recs <= 0 then break end
    local want = room - #recs
    local got = redis.call('LPOP', K.revisit_prefix .. name, want)
    if not got then got = {} end
    for _, r in ipairs(got) do
      if r ~= '' then recs[#recs + 1] = r end  -- ("": a record made due by a lastmod)
    end
    if #got < want then
      gone[#gone + 1] = name
      redis.call('HDEL', K.revisit_popped, name)
    else
      hincrby(K.revisit_popped, name, #got)
    end
  end
  if #gone > 0 then call_many('ZREM', K.revisit_index, gone, 4000) end
  if #recs == 0 then return end
  local last = redis.call('INCRBY', K.seq, #recs)
  local moved = 0
  for i, r in ipairs(recs) do
    local host, score, payload = string.match(r, '^([^\t]*)\t(%-?%d+)\t(.+)$')
    if not host then
      c.count('revisit_bad_records', 1)
      c.st.dead_raw('corrupt revisit record', r)
    else
      local id = 'r' .. string.format('%015d', last - #recs + i)
      c.st.host_add(host, 1)
      qw.enqueue(id, tonumber(score), host, payload, false)
      moved = moved + 1
    end
  end
  if c.queue_max > 0 then c.size = c.size + moved end
  qw.flush()
  c.count('revisit_due', moved)
end

-- Sitemap <lastmod>: cands {{12-byte Bloom key, lastmod (s)}...} of known URLs pushed with one.
-- enqueue(host, score, payload) queues a record as a revisit (false: no room, it stays).
-- Returns {due = moved, older = not newer, unknown = not found in the schedule}.
local function revisit_lastmod_due(K, cands, enqueue)
  local out = {due = 0, older = 0, unknown = 0}
  for _, cand in ipairs(cands) do
    local key, field = revisit_place_of(K, cand[1])
    local v = redis.call('HGET', key, field)
    local ok, e, n, pos, fetched = false, nil, nil, nil, nil
    if v and #v == 14 then ok, e, n, pos, fetched = pcall(struct.unpack, PLACE_FORMAT, v) end
    if not ok then
      if v then redis.call('HDEL', key, field) end
      out.unknown = out.unknown + 1
    elseif cand[2] <= fetched + 1 then
      out.older = out.older + 1
    else
      local name = e .. ':' .. string.format('%d', n)
      local at = pos - (tonumber(redis.call('HGET', K.revisit_popped, name)) or 0)
      local r = at >= 0 and redis.call('LINDEX', K.revisit_prefix .. name, at) or false
      local host, score, payload = false, nil, nil
      if r then host, score, payload = string.match(r, '^([^\t]*)\t(%-?%d+)\t(.+)$') end
      if not host then  -- the record left (due, dropped, dead-lettered): a stale entry
        redis.call('HDEL', key, field)
        out.unknown = out.unknown + 1
      elseif enqueue(host, tonumber(score), payload) then
        redis.call('LSET', K.revisit_prefix .. name, at, '')
        redis.call('HDEL', key, field)
        out.due = out.due + 1
      end
    end
  end
  return out
end

-- The frontier call's lastmods (lua/step_push.lua collects c.lastmods, c.lastmod_seen): the
-- flag set, the known URLs made due within the frontier's bound (step_ack calls it).
local function revisit_lastmod_step(c)
  if not c.lastmod_seen then return end
  redis.call('SET', c.K.revisit_lastmod, '1')
  if #c.lastmods == 0 then return end
  local got = revisit_lastmod_due(c.K, c.lastmods, function(host, score, payload)
    if c.queue_max > 0 and c.size >= c.queue_max then return false end
    local id = 'r' .. string.format('%015d', redis.call('INCR', c.K.seq))  -- (rare: one each)
    c.st.host_add(host, 1)
    c.qw.enqueue(id, score, host, payload, false)
    c.size = c.size + 1
    return true
  end)
  c.count('revisit_lastmod_due', got.due)
  c.count('revisit_lastmod_older', got.older)
  c.count('revisit_lastmod_unknown', got.unknown)
end

-- {tracked URLs, ms until the next slot is due (0: due now; -1: none)} for the reply.
-- (K.revisit_count as read with the call's head when no step ran, else read again: a crawl
-- without a recrawl pays no command for it when no step ran, one GET when steps ran)
local function revisit_state(c)
  local K = c.K
  local n = tonumber(c.ran and redis.call('GET', K.revisit_count) or c.head[5]) or 0
  if n <= 0 then return {0, -1} end
  local first = redis.call('ZRANGE', K.revisit_index, 0, 0, 'WITHSCORES')
  if not first[2] then return {n, -1} end
  return {n, math.max(tonumber(first[2]) - c.now, 0)}
end
