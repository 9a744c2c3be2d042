-- step_release.lua: what a worker says of the leases it holds.  Defines step_release and
-- step_extend.
--
-- step_release(c): releases (req.r [[id, token]...]: leased but never started, a worker
-- closing; no expiry is counted) go back to the head of their bucket; dead letters the worker
-- reports (req.d [[id, token, reason]...]: an entry it cannot decode) go to K.dead.
-- step_extend(c): the heartbeat of live leases (req.x [[id, token]...]: their expiry is now +
-- c.lease_ms; one whose token is stale is reported lost, out.lost); downloads over (req.s
-- [[id, token]...]): their host's slot is free for the next request at once, while the worker
-- still parses the response (Scrapy's CONCURRENT_REQUESTS_PER_DOMAIN also counts downloads
-- only); the lease itself lasts until the acknowledgement (a request acknowledged in this call
-- too is left to its acknowledgement, which frees the slot as it drops the lease).
-- Only a lease held with the token named is touched.
-- A release refunds the budgets it was charged to (lua/step_budget.lua).
-- Keys (of K): leases (ZADD XX), lease (HSET "!<worker>"), and the state's.
-- Work per call: one command per 2000 leases named (they were read by step_reclaim's
-- prefetch); none when the lists are empty.

local function step_release(c)
  local st, qw, out = c.st, c.qw, c.out
  for _, r in ipairs(c.req.r) do
    if st.holds(r[1], r[2]) then
      local score, host = st.drop_lease(r[1])
      budget_unwind(c, host, r[1], true)  -- given back unsent: refunded (lua/step_budget.lua)
      qw.enqueue(r[1], score, host, nil, true)
      out.released = out.released + 1
    end
  end
  c.count('released', out.released)
  if out.released > 0 then budget_flush(c, 0) end
  for _, d in ipairs(c.req.d) do
    if st.holds(d[1], d[2]) then
      local _, host = st.drop_lease(d[1])
      st.to_dead(d[1], d[3], host)
    end
  end
end

local function step_extend(c)
  local K, st, out, req = c.K, c.st, c.out, c.req
  local extend = {}
  for _, x in ipairs(req.x) do
    if st.holds(x[1], x[2]) then
      extend[#extend + 1] = c.now + c.lease_ms
      extend[#extend + 1] = x[1]
    else
      out.lost[#out.lost + 1] = x[1]
    end
  end
  if #extend > 0 then
    table.insert(extend, 1, 'XX')
    due_at(c, c.now + c.lease_ms)  -- (earlier than the lease's expiry with a shorter lm)
    call_many('ZADD', K.leases, extend, 4000)
  end
  local marks, acking = {}, {}
  for _, a in ipairs(req.a) do acking[a[1]] = tostring(a[2]) end
  for _, sv in ipairs(req.s) do
    local tok, score, who, host = st.parse_lease(st.lease_value(sv[1]))
    if tok and tok == tostring(sv[2]) and string.sub(who, 1, 1) ~= '!'
        and acking[sv[1]] ~= tok then
      local v = st.lease_string(tok, score, host, '!' .. who)
      marks[#marks + 1] = sv[1]
      marks[#marks + 1] = v
      st.lease_cache[sv[1]] = v
      st.free_slot(host, who)
    end
  end
  if #marks > 0 then call_many('HSET', K.lease, marks, 4000) end
  st.settle_slots()
end
