-- step_idle.lua: the frontier's state after the call, for the reply and the fleet's
-- idleness.  Defines one local, step_idle.
--
-- out.queued (c.queued: as read by lua/step_begin.lua, or after lua/frontier_steps.lua's
-- steps), out.inflight, out.dn (deferred entries), out.size (queued + leased + deferred:
-- lua/queue.lua); out.idle: ms since the fleet became idle (nothing queued, leased, deferred,
-- parked or scheduled for a revisit: out.rv, lua/step_revisit.lua; K.idle_since holds since
-- when), -1 when busy; out.rq: stored responses waiting for a parse worker, count and bytes
-- (those deferred until their links' hosts have room left out: fetch workers stop leasing
-- when the response queue is full); out.holds: hosts on hold now (429/503/failures) with the
-- ms left, for a worker (checked locally before each download of a request leased earlier);
-- the worker's entry in K.workers (its last call); c.workers_first, the bound of the scores
-- in K.workers as read with the call's head (K.workers_first), nil when this call's entry is
-- before it (lua/monitoring.lua recomputes it then).
-- out.bq (req.bgc, P > 1): the pages left in this partition's chunk of the crawl's budget.
-- out.bx: 'budget_pages' / 'budget_seconds' when the crawl's budget is spent and nothing is
-- leased, 'budget_hosts' when every host with queued entries is out of its budget (a call
-- asking for leases only; lua/step_budget.lua).
-- Keys (of K): budget, revisit_index, revisit_count, queue_count, queue_index, leases, deferred,
-- parked, idle_since, stats, hold, workers, hostq, holders.  Writes: idle_since, queue_count (0
-- when no bucket holds an entry), workers, holders (ZADD XX, a call with work).
-- Work per call: about 7 commands (6 without steps; 1 or 2 more for a crawl with tracked
-- revisits); HGETALL of hold when it has at most 1000 hosts.

local function step_idle(c)
  local K, st, out, now, worker = c.K, c.st, c.out, c.now, c.worker
  out.queued = c.queued  -- (K.queue_count: read when the call began, then its changes)
  if st and out.queued ~= 0 and redis.call('HLEN', K.queue_index) == 0 then
    -- no bucket holds an entry: the count is 0 (entries written into a bucket by hand, and
    -- dead-lettered as corrupt, were taken off a count that never had them; only the steps'
    -- queue writes can find such entries: a call without steps leaves the count as the last
    -- call with steps left it, checked)
    redis.call('SET', K.queue_count, 0)
    out.queued = 0
  end
  out.inflight = redis.call('ZCARD', K.leases)
  out.dn = redis.call('ZCARD', K.deferred)
  -- budgets (issue 34): the crawl's close reason once a budget is spent and nothing is in
  -- flight, told to a worker asking for leases (lua/step_budget.lua)
  if c.take > 0 then out.bx = budget_close(c, out.inflight, out.dn, out.queued) end
  if tonumber(c.req.bgc) == 1 then out.bq = budget_left(c) end  -- (P > 1: the chunk left)
  out.size = out.queued + out.inflight + out.dn
  -- (K.idle_since as read when the call began: no step before this one writes it)
  local idle_since = c.head[4]
  -- (the parked count as read by call_has_work when no step ran: none wrote it since)
  out.rv = revisit_state(c)  -- recrawl (issue 22): {tracked, ms to the next due slot}
  -- (a paused crawl is not idle: no worker closes, nothing is finished; lua/step_control.lua)
  if out.size == 0 and not control_paused(c)
      and (c.parked_len or redis.call('LLEN', K.parked)) == 0 and out.rv[2] < 0 then
    local since = tonumber(idle_since)
    if not since then
      redis.call('SET', K.idle_since, now)
      since = now
    end
    out.idle = now - since
  else
    if idle_since then redis.call('DEL', K.idle_since) end
    out.idle = -1
  end
  local rq = redis.call('HMGET', K.stats, 'response_queue_bytes', 'response_queue_deferred',
                        'response_queue_deferred_bytes')
  -- (the steps' count of stored responses, as they wrote it; else as stored)
  local staged = st and st.host_count(STAGE_HOST)
    or tonumber(redis.call('HGET', K.hostq, STAGE_HOST)) or 0
  out.rq = {math.max(staged - (tonumber(rq[2]) or 0), 0),
            math.max((tonumber(rq[1]) or 0) - (tonumber(rq[3]) or 0), 0)}
  out.holds = {}
  local on_hold = worker ~= '' and redis.call('HLEN', K.hold) or 0  -- (0: no hash)
  if on_hold > 0 and on_hold <= 1000 then
    local all = redis.call('HGETALL', K.hold)
    for i = 1, #all, 2 do
      local left = (tonumber(all[i + 1]) or 0) - now
      if left > 0 then out.holds[#out.holds + 1] = {all[i], left} end
    end
  end
  c.workers_first = tonumber(c.head[7])  -- (K.workers_first: for lua/monitoring.lua)
  if worker ~= '' then
    redis.call('ZADD', K.workers, now, worker)
    -- a call with work is a lease holder's sign of life too (lua/step_recover.lua; its beat,
    -- lua/beat.lua, is the other)
    if c.ran then redis.call('ZADD', K.holders, 'XX', now, worker) end
    -- an earlier score than the bound (an empty set's, or the clock went back): unknown,
    -- recomputed by monitor_apply
    if c.workers_first and now < c.workers_first then c.workers_first = nil end
  end
end
