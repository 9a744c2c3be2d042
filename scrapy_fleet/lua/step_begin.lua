-- step_begin.lua: the frontier call's start, after its checks: the server's time, the crawl
-- marker (and the layout version with it), the reply, the call's counters, and whether the
-- call has work for its steps.  Defines two locals, begin_call and call_has_work.
--
-- begin_call(c) sets c.now (the Redis server's TIME, ms: the only clock of every step),
-- c.out (the reply map), c.count(name, n) (the call's counters, added to stats by
-- step_reply) and c.queued (the queued count as read when the call began, K.queue_count).
-- call_has_work(c) reads what is due: c.due (deferred entries whose delay is over, K.delayed
-- scored by when they are due, at most 100) and c.expired (expired leases of any worker,
-- K.leases scored by expiry, at most req.rc); it returns false when the call has nothing for
-- its steps (lua/frontier_steps.lua): none of these, nothing named by the worker (acks,
-- releases, dead, extends, downloads over, pushes, unstorable records), take 0, and no parked
-- request (K.parked: every call with work resumes them while there is room), no revisit due
-- (K.revisit_index, looked at when K.revisit_count, read with the call's head, is not 0).  Such a call
-- runs no step and creates none of their closures: its reply and writes are those the steps
-- would give, since each of them does nothing without one of these.
-- Keys (of K): marker, layout (SET once, with the marker: the crawl's first push or first
-- worker call; frontier/layout.py refuses a crawl of another layout at start), delayed,
-- leases, parked, revisit_index.  Writes: marker and layout, once per crawl.
-- Work per call: 1 command (TIME), and 2 or 3 reads (ZRANGEBYSCORE x2, LLEN).

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

local function call_has_work(c)
  local K, req = c.K, c.req
  c.due = redis.call('ZRANGEBYSCORE', K.delayed, '-inf', c.now, 'LIMIT', 0, 100)
  c.expired = redis.call('ZRANGEBYSCORE', K.leases, '-inf', c.now, 'LIMIT', 0,
                         tonumber(req.rc) or 100)
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
