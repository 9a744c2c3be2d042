-- step_begin.lua: the frontier call's start, after its checks: the server's time, the crawl
-- marker (and the layout version with it), the reply, the call's counters, whether the call
-- has work for its steps, and the bound that spares a call the reads of what cannot be due.
-- Defines four locals: begin_call, call_has_work, due_at and keep_next_due.
--
-- begin_call(c) sets c.now (the Redis server's TIME, ms: the only clock of every step),
-- c.out (the reply map), c.count(name, n) (the call's counters, added to stats by
-- step_reply) and c.queued (the queued count as read when the call began, K.queue_count).
-- call_has_work(c) reads what is due: c.due (deferred entries whose delay is over,
-- K.deferred scored by when they are due, at most 100) and c.expired (expired leases of any
-- worker, K.leases scored by expiry, at most req.rc), both only when K.next_due (read with
-- the call's first MGET, c.head[6]) is missing or not after now; it returns false when the
-- call has nothing for its steps (lua/frontier_steps.lua): none of these, nothing named by
-- the worker (acks, releases, dead, extends, downloads over, pushes, unstorable records),
-- take 0, no parked request (K.parked: every call with work resumes them while there is
-- room), and no revisit due (K.revisit_index, looked at when K.revisit_count, read with the
-- call's head, is not 0).  Such a call runs no step and creates none of their closures: its
-- reply and writes are those the steps would give, since each of them does nothing without
-- one of these.
--
-- K.next_due (ms) is a lower bound of every score in K.deferred and K.leases: nothing can be
-- due or expired before it.  A step that adds a score (a lease, an extension, a deferral, a
-- push with a delay; lua/push_lean.lua likewise) tells due_at(c, ms); keep_next_due(c), run
-- after the steps, writes the bound back: when it had passed, the lower of both sets' first
-- scores (read again after the steps for a set that had entries due: some may remain due,
-- past the limits, and then the new bound is not after now) and of the scores the call
-- added; else the lowest score the call added, when that is before it.  Scores that only
-- move later (entries removed, leases extended past the bound) leave it a lower bound, so it
-- is recomputed only once it passes.  A missing or unreadable bound is read as passed (a new
-- crawl, a key deleted by hand).
-- Keys (of K): marker, layout (SET once, with the marker: the crawl's first push or first
-- worker call; frontier/layout.py refuses a crawl of another layout at start), deferred,
-- leases, parked, revisit_index, next_due.  Writes: marker and layout, once per crawl;
-- next_due.
-- Work per call: 1 command (TIME), and a read (LLEN) when the call names nothing; when the
-- bound passed, 2 reads (ZRANGE of each set's first entry), per set with entries due a
-- ZRANGEBYSCORE and, after the steps, its first entry again, and a SET of the new bound; a
-- SET when the call added a score before the bound.

-- (the bound when both sets are empty: no entry can come due)
local NEXT_DUE_NONE = 9e15

local function begin_call(c)
  local K, req = c.K, c.req
  c.now = server_now_ms()
  local marker = failed_ensure_marker(K.marker, c.marker, req.mc)
  if marker and not c.marker then redis.call('SET', K.layout, CRAWL_LAYOUT) end
  c.out = {leased = {}, lost = {}, pf = {}, rf = {}, pd = {}, new = 0, dup = 0, acked = 0,
           released = 0, reclaimed = 0, dead = 0, parked = 0, deferred = 0, resumed = 0,
           refused = 0, full = false, now = c.now, mk = marker or ''}
  local counters = {}
  c.counters = counters
  function c.count(name, n)
    counters[name] = (counters[name] or 0) + n
  end
  c.queued = tonumber(c.head[3]) or 0
end

-- The first score of the sorted set *key* (NEXT_DUE_NONE when it is empty).
local function first_score(key)
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  return tonumber(first[2]) or NEXT_DUE_NONE
end

local function call_has_work(c)
  local K, req = c.K, c.req
  c.next_due = tonumber(c.head[6])
  c.lowest_added = NEXT_DUE_NONE
  c.due, c.expired = {}, {}
  if not c.next_due or c.now >= c.next_due then
    -- the bound passed: each set's first score tells whether it has anything due (and is
    -- its part of the next bound, unless entries are due: then read again after the steps)
    c.floors = {first_score(K.deferred), first_score(K.leases)}
    if c.floors[1] <= c.now then
      c.due = redis.call('ZRANGEBYSCORE', K.deferred, '-inf', c.now, 'LIMIT', 0, 100)
    end
    if c.floors[2] <= c.now then
      c.expired = redis.call('ZRANGEBYSCORE', K.leases, '-inf', c.now, 'LIMIT', 0,
                             tonumber(req.rc) or 100)
    end
  end
  if #c.due > 0 or #c.expired > 0 or c.take > 0 or #req.a > 0 or #req.r > 0 or #req.d > 0
      or #req.x > 0 or #req.s > 0 or #req.p > 0
      or (type(req.u) == 'table' and #req.u > 0) then
    return true
  end
  -- a revisit due (lua/step_revisit.lua; only a crawl with tracked URLs looks)
  if (tonumber(c.head[5]) or 0) > 0 and #redis.call('ZRANGEBYSCORE', K.revisit_index, '-inf',
                                                    c.now, 'LIMIT', 0, 1) > 0 then
    return true
  end
  c.parked_len = redis.call('LLEN', K.parked)
  return c.parked_len > 0
end

-- A step added a score (ms) to K.deferred or K.leases.
local function due_at(c, ms)
  if ms < c.lowest_added then c.lowest_added = ms end
end

local function keep_next_due(c)
  local K, floors = c.K, c.floors
  local bound = c.lowest_added
  if floors then
    -- (a set that had entries due: its first score after the steps took them)
    if floors[1] <= c.now then floors[1] = first_score(K.deferred) end
    if floors[2] <= c.now then floors[2] = first_score(K.leases) end
    bound = math.min(bound, floors[1], floors[2])
    if bound == c.next_due then return end
  elseif bound >= c.next_due then
    return
  end
  redis.call('SET', K.next_due, string.format('%d', math.floor(bound)))
end
