-- step_reclaim.lua: entries whose time came, back to the queue.  Defines step_due and
-- step_reclaim.
--
-- step_due(c): deferred entries whose delay is over (c.due, read by lua/step_begin.lua: K.deferred
-- members "<id>|<score>|<host>" scored by the time they are due) go back to the head of their bucket (their request from
-- `data`); a stored response's deferred counts are given back (lua/frontier_state.lua).
-- step_reclaim(c): expired leases of any worker (c.expired, read by lua/step_begin.lua: K.leases
-- scored by expiry) and the leases of dead workers (c.recover, lua/step_recover.lua: out.recovered,
-- counted in the stats' `recovered` too) are counted in
-- K.expiries and go back to the queue, or to the dead letters after c.max_leases expiries.
-- Keys (of K): deferred, leases, expiries, held (and the state's and the queue's).  Writes:
-- deferred (ZREM), expiries (HINCRBY), the queue, the leases, dead, held (stale members).
-- Work per call: at most 100 deferred entries moved, req.rc (frontier/protocol.py
-- RECLAIM_LIMIT: 50) expired leases reclaimed; no command when there is nothing to do.

local function step_due(c)
  local K, st, qw = c.K, c.st, c.qw
  local due = c.due
  if #due == 0 then return end
  for _, member in ipairs(due) do
    local id, score, host = string.match(member, '^([^|]*)|([^|]*)|?(.*)$')
    if host == STAGE_HOST then st.stage_deferred(id, -1) end
    qw.enqueue(id, tonumber(score) or 0, host, nil, true)
  end
  call_many('ZREM', K.deferred, due, 4000)
end

-- The leases of dead holders (c.recover {{id, worker}...}, lua/step_recover.lua) still held by
-- them (not acknowledged or reclaimed since): appended to *expired*; a member of K.held whose
-- lease is gone or another's is removed.  Returns how many were appended.
local function recover_leases(c, expired)
  local st, K = c.st, c.K
  local known, stale, n = {}, {}, 0
  for _, id in ipairs(expired) do known[id] = true end
  for _, r in ipairs(c.recover) do
    local _, _, who = st.parse_lease(st.lease_value(r[1]))
    if who and string.gsub(who, '^!', '') == r[2] then
      if not known[r[1]] then
        known[r[1]] = true
        expired[#expired + 1] = r[1]
        n = n + 1
      end
    else
      stale[#stale + 1] = r[2] .. '\t' .. r[1]
    end
  end
  if #stale > 0 then call_many('ZREM', K.held, stale, 4000) end
  return n
end

local function step_reclaim(c)
  local K, st, qw, out = c.K, c.st, c.qw, c.out
  local expired = c.expired
  if #c.recover > 0 then
    local ids = {}
    for i, r in ipairs(c.recover) do ids[i] = r[1] end
    st.prefetch_leases(ids)
    expired = {unpack(expired)}
    out.recovered = recover_leases(c, expired)
    c.count('recovered', out.recovered)
  end
  st.prefetch_call_leases(expired)
  if #expired > 0 then
    local counts = {}
    for i, id in ipairs(expired) do
      counts[i] = hincrby(K.expiries, id, 1)
    end
    for i, id in ipairs(expired) do
      local score, host = st.drop_lease(id)
      local n = counts[i]
      if n >= c.max_leases then
        st.to_dead(id, 'lease expired ' .. n .. ' times', host)
      else
        qw.enqueue(id, score, host, nil, true)
        out.reclaimed = out.reclaimed + 1
      end
    end
    qw.flush()  -- before the releases read the same leases
  end
  c.count('reclaimed', out.reclaimed)
end
