-- step_lease.lua: lease up to c.take requests, host-aware (docs/politeness.md).  Defines one
-- local, step_lease.
--
-- Among the hosts that may be fetched now (not on hold, under their concurrency cap, and with
-- a GCRA token), take the best head (highest priority, then FIFO) each time; a host that may
-- not be fetched is re-marked in K.ready with the time it may, and never blocks the others.
-- A host's queue is read a few heads at a time (lua/queue.lua, Queue.reader); the lease writes
-- go out in few commands at the end.  Stages: req.ho = lease only from this host, req.hx =
-- never from this one (docs/stages.md); req.ro = 1: a host whose robots.txt is not known yet
-- gets one request in flight, the scout.  A capped host's slots are shared among the live
-- workers (seen in the last 10 s in K.workers).  A fencing token is never below the clock
-- (ms x 10).  out.leased [[id, token, payload, expiries]...]; out.nr: ms until the next host
-- may be fetched, when fewer than c.take were leased.
-- Keys (of K): ctlhosts (paused hosts: lua/step_control.lua), ready, token, workers,
-- robots, hostlive, hold, hostconf, crawldelay, tat, expiries, lease, leases, and the queue's.  Writes: ready, token (INCRBY), lease, leases,
-- tat, data (the leased requests), the buckets (LTRIM), the index, hostlive and wlive; held
-- and holders (each lease under its worker: lua/step_recover.lua).
-- Budgets (issue 34, lua/step_budget.lua): each lease is charged when granted; nothing is
-- leased after the time budget's deadline; a host out of budget goes to FAR in K.ready.
-- Crawl groups (issue 34, lua/step_group.lua): a host's turn that another crawl of the group
-- has (by weight) is not taken: the host is looked at again half an interval later.
-- Work per call: 8 to 64 candidate hosts (twice take), heads read 1, 2, 4 ... at a time;
-- nothing when c.take is 0.

local function step_lease(c)
  local K, req, now, take, worker = c.K, c.req, c.now, c.take, c.worker
  if take <= 0 then return end
  local lease_ms, ctx, st, qw, out, count = c.lease_ms, c.ctx, c.st, c.qw, c.out, c.count
  local bud = budget_open(c)  -- budgets (issue 34): lua/step_budget.lua
  if bud.over or bud.items_over or bud.bytes_over then return end  -- spent: no lease
  bud = bud.on and bud or nil
  local grp = group_open(c)  -- crawl groups (issue 34): lua/step_group.lua
  -- the hosts ready longest, as many as this call can use (twice take, 8 to 64 of them)
  local except_host = (type(req.hx) == 'string' and req.hx ~= '') and req.hx or nil
  local cands
  if type(req.ho) == 'string' and req.ho ~= '' then
    local at = tonumber(redis.call('ZSCORE', K.ready, req.ho))
    cands = (at and at <= now) and {req.ho} or {}
  else
    cands = redis.call('ZRANGEBYSCORE', K.ready, '-inf', now, 'LIMIT', 0,
                       math.min(64, math.max(8, 2 * take)))
  end
  local list = {}
  local taken = 0
  local rd = Queue.reader(K, qw)
  local function head_of(h, first) return rd.head(h, first, take - taken) end
  local ready_del = {}
  qw.prefetch_index(cands)
  for _, h in ipairs(cands) do
    if h ~= except_host then  -- not for this worker (stored responses go to parse workers)
      if head_of(h, true) then
        list[#list + 1] = h
      else
        ready_del[#ready_del + 1] = h
      end
    end
  end
  if #ready_del > 0 then call_many('ZREM', K.ready, ready_del, 4000) end
  -- paused or blocked hosts (lua/step_control.lua) go where a host on hold goes: back into
  -- K.ready at the time they may be leased again
  local paused = control_hosts(c, list)
  if paused then
    local kept, later = {}, {}
    for _, h in ipairs(list) do
      if paused[h] then
        later[#later + 1] = paused[h]
        later[#later + 1] = h
      else
        kept[#kept + 1] = h
      end
    end
    list = kept
    call_many('ZADD', K.ready, later, 4000)
  end
  -- what the politeness checks below read of each candidate host, read at once
  st.prefetch_ctx(K.hostlive, list)
  st.prefetch_ctx(K.hold, list)
  st.prefetch_ctx(K.hostconf, list)
  st.prefetch_ctx(K.crawldelay, list)
  if ctx.adaptive then st.prefetch_ctx(K.adaptive, list) end  -- (lua/adaptive.lua)
  if ctx.defaults[1] > 0 or not ctx.empty[K.hostconf] or not ctx.empty[K.crawldelay] then
    st.prefetch_ctx(K.tat, list)
  end
  if worker ~= '' then
    local fields = {}
    for i, h in ipairs(list) do fields[i] = worker .. '|' .. h end
    st.prefetch_wlive(fields)
  end
  local active = math.max(1, redis.call('ZCOUNT', K.workers, now - 10000, '+inf'))
  if worker ~= '' and not redis.call('ZSCORE', K.workers, worker) then active = active + 1 end
  local q_del, lease_set, leases_add, ready_set, ready_gone = {}, {}, {}, {}, {}
  local tok_next, tok_last = 1, 0
  local pending = {}  -- {id, token, host} of the leases, payloads read at the end
  local keys_of = {}  -- host -> {head member, its "<priority key>\t<id>" part}
  local function head_key(h)
    local m = head_of(h)
    local k = keys_of[h]
    if k == nil or k[1] ~= m then
      k = {m, string.sub(m, #h + 2)}
      keys_of[h] = k
    end
    return k[2]
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
    if h ~= STAGE_HOST then interval, tau, cap = host_policy_ctx(ctx, h) end
    local wait_until = h ~= STAGE_HOST and host_blocked_until_ctx(ctx, h, interval, tau, cap, true)
      or nil
    if grp and wait_until == FAR then
      -- at its cap: a slot freed by another crawl of the group wakes none of this crawl's
      -- hosts (an acknowledgement re-marks its own crawl's), so look again 250 ms on
      wait_until = now + 250
    end
    if not wait_until and req.ro == 1 and h ~= STAGE_HOST
        and redis.call('HEXISTS', K.robots, h) == 0 and st.live_now(h) >= 1 then
      wait_until = now + 250  -- robots.txt (and its Crawl-delay) not known yet: one scout
    end
    local my_share_used = cap > 0 and worker ~= '' and
      st.wlive_now(worker .. '|' .. h) >= math.ceil(cap / active)
    if grp and not my_share_used and h ~= STAGE_HOST  -- (a want, even while the host waits)
        and not group_turn(c, grp, h, interval) and not wait_until then
      -- another crawl of the group has this turn of the host: look again half an interval on
      wait_until = now + math.max(50, math.floor(interval / 2))
    end
    local spent  -- budgets: 'crawl' or 'host' when the head may not be charged
    if bud and not wait_until and not my_share_used then
      local _, hid = Queue.member_parts(h, head_of(h))
      if hid then
        local ok, why = budget_allow(c, h, hid)
        if not ok then spent = why end
      end
    end
    if my_share_used and not wait_until then
      pop_top()  -- this worker has its share of the host: others may have it
    elseif wait_until or spent == 'host' then
      ready_set[#ready_set + 1] = wait_until or FAR  -- (out of budget: kept, not served)
      ready_set[#ready_set + 1] = h
      pop_top()
    elseif spent then
      pop_top()  -- the crawl's budget is spent: only entries charged before go on
    else
      local m = head_of(h)
      rd.advance(h)
      q_del[#q_del + 1] = m
      local score, id = Queue.member_parts(h, m)
      if not id or not rd.payload[m] then
        count('bad_queue_members', 1)  -- nothing to lease
        if bud and id then budget_unwind(c, h, id, false) end
        st.dead_raw('corrupt queue entry', rd.raw[m] or '')
      else
        if tok_next > tok_last then
          -- a fencing token is never below the clock (ms x 10): after a failover that lost
          -- the last leases, the promoted replica's rolled-back counter could hand their
          -- tokens out again, on entry ids rolled back too (another request); from the clock
          -- it cannot (docs/deployment.md, "What a failover can lose")
          local n = take - taken
          tok_last = redis.call('INCRBY', K.token, n)
          tok_next = tok_last - n + 1
          if tok_next < now * 10 then
            tok_next = now * 10
            tok_last = tok_next + n - 1
            redis.call('SET', K.token, string.format('%d', tok_last))
          end
        end
        local tok = tok_next
        tok_next = tok_next + 1
        lease_set[#lease_set + 1] = id
        lease_set[#lease_set + 1] = st.lease_string(string.format('%d', tok), score, h, worker)
        leases_add[#leases_add + 1] = now + lease_ms
        leases_add[#leases_add + 1] = id
        st.live_add(h, 1)
        if worker ~= '' then st.wlive_add(worker .. '|' .. h, 1) end
        host_take_token_ctx(ctx, h, interval)
        if grp and h ~= STAGE_HOST then group_took(grp, h) end
        pending[#pending + 1] = {id, tok, h, score, rd.payload[m]}
        taken = taken + 1
      end
      if not head_of(h) then
        if grp then group_left(grp, h) end
        ready_gone[#ready_gone + 1] = h
        pop_top()
      else
        sift_down(1)  -- its next head comes later (lower priority, or FIFO after)
      end
    end
  end
  qw.take_heads(q_del, rd.bucket, rd.len, rd.empty)
  if #ready_gone > 0 then call_many('ZREM', K.ready, ready_gone, 4000) end
  if #ready_set > 0 then call_many('ZADD', K.ready, ready_set, 4000) end
  if #pending > 0 then
    local ids = {}
    for i, e in ipairs(pending) do ids[i] = e[1] end
    local exps = redis.call('HMGET', K.expiries, unpack(ids))
    if bud then budget_settle(c, ids, exps) end  -- (re-grants are not charged again)
    call_many('HSET', K.lease, lease_set, 4000)
    call_many('ZADD', K.leases, leases_add, 4000)
    due_at(c, now + lease_ms)
    if worker ~= '' then
      -- each lease under its holder, and the holder's sign of life (lua/step_recover.lua)
      local held = {}
      for _, e in ipairs(pending) do
        held[#held + 1] = 0
        held[#held + 1] = worker .. '\t' .. e[1]
      end
      call_many('ZADD', K.held, held, 4000)
      redis.call('ZADD', K.holders, now, worker)
      if c.dead_ms > 0 then due_at(c, now + c.dead_ms) end
    end
    for i, e in ipairs(pending) do
      -- a leased entry keeps its request in `data` (acknowledged: deleted; back: moved)
      qw.keep_data(e[1], e[5])
      out.leased[#out.leased + 1] = {e[1], e[2], e[5], tonumber(exps[i]) or 0}
    end
    qw.flush()
  end
  if bud then budget_flush(c, #out.leased) end
  count('leased', #out.leased)
  if #out.leased < take then
    -- the worker wanted more: when may the next host be fetched (a GCRA turn, a hold, a
    -- delay)?  It calls again then instead of at its next poll, so a host's rate is reached
    -- with one worker too (hosts waiting for a free slot, at FAR, are left out)
    local nxt = redis.call('ZRANGEBYSCORE', K.ready, '(' .. now, '(' .. FAR, 'WITHSCORES',
                           'LIMIT', 0, 1)
    if nxt[2] then out.nr = tonumber(nxt[2]) - now end
  end
end
