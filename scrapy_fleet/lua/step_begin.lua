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
-- worker, K.leases scored by expiry, at most req.rc) and c.recover (the leases of dead
-- workers, lua/step_recover.lua, within the same limit), all only when K.next_due (read with
-- the call's first MGET, c.head[6]) is missing or not after now; it returns false when the
-- call has nothing for its steps (lua/frontier_steps.lua): none of these, nothing named by
-- the worker (acks, releases, dead, extends, downloads over, pushes, links left out as known
-- duplicates: counted by lua/step_ack.lua, unstorable records),
-- take 0, no parked request (K.parked: every call with work resumes them while there is
-- room), and no revisit due (K.revisit_index, looked at when K.revisit_count, read with the
-- call's head, is not 0).  Such a call runs no step and creates none of their closures: its
-- reply and writes are those the steps would give, since each of them does nothing without
-- one of these.
--
-- K.next_due (ms) is a lower bound of every score in K.deferred and K.leases, and of the
-- time the first lease holder may be dead (lua/step_recover.lua): nothing can be due,
-- expired or recovered before it.  A step that adds a score (a lease, an extension, a deferral, a
-- push with a delay; lua/push_lean.lua likewise) tells due_at(c, ms); keep_next_due(c), run
-- after the steps, writes the bound back: when it had passed, the lower of both sets' first
-- scores after now (read with what is due; read again after the steps for a set with more
-- entries due than peeked at: some may remain due, past the limits, and then the new bound
-- is not after now) and of the scores the call added; else the lowest score the call added,
-- when that is before it.  Scores that only
-- move later (entries removed, leases extended past the bound) leave it a lower bound, so it
-- is recomputed only once it passes.  A missing or unreadable bound is read as passed (a new
-- crawl, a key deleted by hand).
-- Keys (of K): marker, layout (SET once, with the marker: the crawl's first push or first
-- worker call; frontier/layout.py refuses a crawl of another layout at start), deferred,
-- leases, parked, revisit_index, next_due, and lua/step_recover.lua's (holders, held).
-- Writes: marker and layout, once per crawl;
-- next_due.
-- Work per call: 1 command (TIME), and a read (LLEN) when the call names nothing; when the
-- bound passed, 2 reads (ZRANGE of each set's first DUE_PEEK entries), per set with more due
-- a ZRANGEBYSCORE and, after the steps, its first entry again, and a SET of the new bound;
-- a SET when the call added a score before the bound.

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

-- What is due in the sorted set *key* at *now* (at most *limit* members, in score order, as
-- ZRANGEBYSCORE -inf now LIMIT 0 limit gives them) and its floor: the first score after now
-- (NEXT_DUE_NONE: none; the first one left due past the limit), or nil when that is not
-- known (the first DUE_PEEK members are all due: read again after the steps).  One command
-- when fewer than DUE_PEEK are due.
local DUE_PEEK = 4
local function due_in(key, now, limit)
  local first = redis.call('ZRANGE', key, 0, DUE_PEEK - 1, 'WITHSCORES')
  local due = {}
  for i = 1, #first, 2 do
    -- (past the limit, a due member's score is the floor: it stays due)
    local score = tonumber(first[i + 1])
    if score > now or #due == limit then return due, score end
    due[#due + 1] = first[i]
  end
  if #first < 2 * DUE_PEEK then return due, NEXT_DUE_NONE end
  return redis.call('ZRANGEBYSCORE', key, '-inf', now, 'LIMIT', 0, limit), nil
end

local function call_has_work(c)
  local K, req = c.K, c.req
  c.next_due = tonumber(c.head[6])
  c.lowest_added = NEXT_DUE_NONE
  c.due, c.expired, c.recover = {}, {}, {}
  if not c.next_due or c.now >= c.next_due then
    -- the bound passed: what is due, and each set's floor for the next bound
    c.floors = {}
    c.due, c.floors[1] = due_in(K.deferred, c.now, 100)
    c.expired, c.floors[2] = due_in(K.leases, c.now, tonumber(req.rc) or 100)
    -- the leases of dead workers (lua/step_recover.lua), within the same reclaim limit
    c.floors[3] = recover_due(c, (tonumber(req.rc) or 100) - #c.expired)
  end
  recover_predecessor(c, (tonumber(req.rc) or 100) - #c.expired - #c.recover)
  if #c.due > 0 or #c.expired > 0 or #c.recover > 0 or c.take > 0 or #req.a > 0 or #req.r > 0 or #req.d > 0
      or #req.x > 0 or #req.s > 0 or #req.p > 0 or c.local_dups > 0
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

-- The first score of the sorted set *key* (NEXT_DUE_NONE when it is empty).
local function first_score(key)
  local first = redis.call('ZRANGE', key, 0, 0, 'WITHSCORES')
  return tonumber(first[2]) or NEXT_DUE_NONE
end

local function keep_next_due(c)
  local K, floors = c.K, c.floors
  local bound = c.lowest_added
  if floors then
    -- (a set with more entries due than peeked at: its first score after the steps)
    floors[1] = floors[1] or first_score(K.deferred)
    floors[2] = floors[2] or first_score(K.leases)
    floors[3] = floors[3] or recover_floor(c)
    bound = math.min(bound, floors[1], floors[2], floors[3])
    if bound == c.next_due then return end
  elseif bound >= c.next_due then
    return
  end
  redis.call('SET', K.next_due, string.format('%d', math.floor(bound)))
end
