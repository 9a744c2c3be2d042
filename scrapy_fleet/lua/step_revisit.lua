-- step_revisit.lua: the recrawl schedule (docs/recrawl.md): tracked pages, written with the
-- acknowledgement of their fetch, come back into the queue when due.  Defines two locals,
-- revisit_ack (called by step_ack for each acknowledged request) and step_revisit_due, and
-- revisit_state (for step_idle).
--
-- Layout (keys.py): a tracked URL waiting for its next fetch is one record
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
-- Keys (of K): revisit_index, revisit_prefix, revisit_count, seq, and the queue's.  Writes:
-- those (RPUSH / LPOP of slots, ZADD / ZREM of the index, INCRBY / DECRBY of the count).
-- Work per call: one RPUSH per slot written and one ZADD; due: one ZRANGEBYSCORE, at most 4
-- slots and REVISIT_DUE_MAX records moved, one INCRBY for their ids; state: a GET (and a
-- ZRANGE when URLs are tracked).

local REVISIT_DUE_MAX = 100

local function revisit_slot(due, interval)
  local e = math.floor(math.log(math.max(interval, 1) / 16) / math.log(2))
  e = math.min(math.max(e, 8), 26)
  local width = 2 ^ e
  local n = math.floor(due / width)
  return e .. ':' .. string.format('%d', n), (n + 1) * width
end

-- The writes of one call, flushed by revisit_flush (step_ack calls it).
local revisit_out = {lists = {}, index = {}, tracked = 0, dropped = 0}

local function revisit_schedule(c, rec)
  local interval = tonumber(rec[1]) or 0
  local host, score, payload = rec[2], tonumber(rec[3]), rec[4]
  if interval <= 0 or type(host) ~= 'string' or not score or type(payload) ~= 'string'
      or payload == '' or string.find(host, '\t', 1, true) then
    c.count('revisit_bad_records', 1)
    return false
  end
  local name, at = revisit_slot(c.now + interval, interval)
  local l = revisit_out.lists[name]
  if not l then
    l = {}
    revisit_out.lists[name] = l
    revisit_out.index[#revisit_out.index + 1] = at
    revisit_out.index[#revisit_out.index + 1] = name
  end
  l[#l + 1] = host .. '\t' .. string.format('%d', score) .. '\t' .. payload
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
  end
end

-- Entry id dead-lettered (st.to_dead): a revisit ("r...") leaves the schedule (one DECRBY:
-- rare; at once, since a dead letter may come after revisit_flush, in step_lease).
local function revisit_dead(c, id)
  if string.sub(id, 1, 1) ~= 'r' then return end
  local n = redis.call('DECRBY', c.K.revisit_count, 1)
  if n < 0 then redis.call('SET', c.K.revisit_count, 0) end
  c.count('revisit_dropped', 1)
end

local function revisit_flush(c)
  local K = c.K
  for name, l in pairs(revisit_out.lists) do
    call_many('RPUSH', K.revisit_prefix .. name, l, 2000)
  end
  if #revisit_out.index > 0 then call_many('ZADD', K.revisit_index, revisit_out.index, 4000) end
  local delta = revisit_out.tracked - revisit_out.dropped
  if delta ~= 0 then
    local n = redis.call('INCRBY', K.revisit_count, delta)
    if n < 0 then redis.call('SET', K.revisit_count, 0) end
  end
  c.count('revisit_tracked', revisit_out.tracked)
  c.count('revisit_dropped', revisit_out.dropped)
  revisit_out = {lists = {}, index = {}, tracked = 0, dropped = 0}
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
    for _, r in ipairs(got) do recs[#recs + 1] = r end
    if #got < want then gone[#gone + 1] = name end
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
