-- frontier_lease.lua: step 7 of frontier.lua, the leases (library part: lua/__init__.py
-- prepends it to frontier.lua; it defines one local, lease_step).
--
-- Lease up to `take` requests, host-aware (docs/politeness.md): among the hosts that may
-- be fetched now (not on hold, under their concurrency cap, and with a GCRA token), take the
-- best head (highest priority, then FIFO) each time; a host that may not be fetched is
-- re-marked with the time it may, and never blocks the others.  A host's queue is read a
-- few heads at a time; the lease writes go out in few commands at the end.
--
-- lease_step(call) needs, passed by frontier.lua (never its locals: this file comes before it),
-- call = {req, now, take, worker, lease_ms, ctx, batch, out, count, keys}:
--   req       the call's argument map (ho, hx, ro: docs/stages.md, docs/politeness.md)
--   now       the Redis server's time of the call, ms
--   take      how many requests to lease; worker: the worker id ("" for the push helper)
--   lease_ms  how long a lease lasts, ms
--   ctx       lua/hosts.lua's per-host context of the call (memo, empty, defaults)
--   batch     the call's state (lua/frontier_batch.lua): its queue writes are flushed
--   out       the reply map: out.leased [[id, token, payload, expiries]...] and out.nr are set
--   count(name, n)  the call's counters (stats)
--   keys      the call's key names: ready qb qn token workers robots hostlive hold hostconf
--             crawldelay tat expiries lease leases (frontier.lua's header has their layout)
-- and, from lua/hosts.lua: FAR, STAGE_HOST, index_keys, entry_parts, member_parts,
-- host_policy_ctx, host_blocked_until_ctx, host_take_token_ctx.
-- (a function: its locals have their own budget, Lua allows 200 per function)

local function lease_step(call)
  local req, now, take, worker = call.req, call.now, call.take, call.worker
  local lease_ms, ctx, batch, out, count = call.lease_ms, call.ctx, call.batch, call.out, call.count
  local k = call.keys
  local READY, QB, QN, TOKEN, WORKERS, ROBOTS = k.ready, k.qb, k.qn, k.token, k.workers, k.robots
  local HOSTLIVE, HOLD, HOSTCONF = k.hostlive, k.hold, k.hostconf
  local CRAWLDELAY, TAT = k.crawldelay, k.tat
  local EXPIRIES, LEASE, LEASES = k.expiries, k.lease, k.leases
  local call_many, flush_queue, keep_data = batch.call_many, batch.flush_queue, batch.keep_data
  local live_now, live_add = batch.live_now, batch.live_add
  local wlive_now, wlive_add = batch.wlive_now, batch.wlive_add
  local lease_string, legacy_forget = batch.lease_string, batch.legacy_forget
  -- the hosts ready longest, as many as this call can use (twice take, 8 to 64 of them)
  -- (stages: ho = only this host, hx = never this one; stored responses go to parse workers)
  local except_host = (type(req.hx) == 'string' and req.hx ~= '') and req.hx or nil
  local cands
  if type(req.ho) == 'string' and req.ho ~= '' then
    local at = tonumber(redis.call('ZSCORE', READY, req.ho))
    cands = (at and at <= now) and {req.ho} or {}
  else
    cands = redis.call('ZRANGEBYSCORE', READY, '-inf', now, 'LIMIT', 0,
                       math.min(64, math.max(8, 2 * take)))
  end
  local list, heads, pos, hb, ended = {}, {}, {}, {}, {}
  local taken = 0
  -- what this call read of the buckets: each head member's request, bucket and raw entry;
  -- per bucket, its length when its end was seen, and the buckets found empty
  local lk = {payload = {}, bucket = {}, raw = {}, len = {}, empty = {}}
  -- the next head of h's queue not taken by this call (nil when there is none), as a member
  -- "<host>\t<priority key>\t<entry id>"; a read fetches the next heads of h's best bucket not
  -- read yet: 1 for the first look, then twice as many as the read before (at most what this
  -- call may still take): a host usually gives a call one lease or two (its concurrency cap is
  -- shared among the workers), so reading all the call may take from it reads entries that
  -- stay.  hb[h]: {h's bucket names (from the index), the current one's index, entries read
  -- of it, the size of the next read}
  local function head_of(h, first)
    local buf = heads[h]
    if buf and pos[h] <= #buf then return buf[pos[h]] end
    if ended[h] then return nil end
    local st = hb[h]
    if st == nil then
      -- (the candidates' index values are read at once below, before any first look)
      if batch.qi[h] == nil then batch.prefetch_index({h}) end
      local names = {}
      for i, key in ipairs(index_keys(batch.qi[h] or nil)) do names[i] = h .. '\t' .. key end
      st = {names, 1, 0, 1}
      hb[h] = st
    end
    local want = first and 1 or math.max(1, math.min(take - taken, st[4], 64))
    st[4] = want * 2
    buf = {}
    while #buf == 0 do
      local b = st[1][st[2]]
      if b == nil then break end
      local entries = redis.call('LRANGE', QB .. b, st[3], st[3] + want - 1)
      for i, e in ipairs(entries) do
        local id, payload = entry_parts(e)
        local m = b .. '\t' .. (id or '')
        buf[i] = m
        lk.payload[m], lk.bucket[m], lk.raw[m] = payload, b, e
      end
      st[3] = st[3] + #entries
      if #entries < want then  -- the bucket's end: the next read is of the next bucket
        lk.len[b] = st[3]
        if st[3] == 0 then lk.empty[#lk.empty + 1] = b end
        st[2], st[3] = st[2] + 1, 0
      end
    end
    if #buf == 0 then ended[h] = true end
    heads[h], pos[h] = buf, 1
    return buf[1]
  end
  local ready_del = {}
  batch.prefetch_index(cands)
  for _, h in ipairs(cands) do
    if h ~= except_host then  -- not for this worker (stored responses go to parse workers)
      if head_of(h, true) then
        list[#list + 1] = h
      else
        ready_del[#ready_del + 1] = h
      end
    end
  end
  if #ready_del > 0 then call_many('ZREM', READY, ready_del, 4000) end
  -- what the politeness checks below read of each candidate host, read at once
  batch.prefetch_ctx(HOSTLIVE, list)
  batch.prefetch_ctx(HOLD, list)
  batch.prefetch_ctx(HOSTCONF, list)
  batch.prefetch_ctx(CRAWLDELAY, list)
  if ctx.defaults[1] > 0 or not ctx.empty[HOSTCONF] or not ctx.empty[CRAWLDELAY] then
    batch.prefetch_ctx(TAT, list)
  end
  if worker ~= '' then
    local fields = {}
    for i, h in ipairs(list) do fields[i] = worker .. '|' .. h end
    batch.prefetch_wlive(fields)
  end
  -- a capped host's slots are shared among the live workers (seen in the last 10 s), so
  -- that the worker which frees a slot does not always take it back itself
  local active = math.max(1, redis.call('ZCOUNT', WORKERS, now - 10000, '+inf'))
  if worker ~= '' and not redis.call('ZSCORE', WORKERS, worker) then active = active + 1 end
  local q_del, lease_set, leases_add, ready_set, ready_gone = {}, {}, {}, {}, {}
  local tok_next, tok_last = 1, 0
  local pending = {}  -- {id, token, host} of the leases, payloads read at the end
  local keys_of = {}  -- host -> {head member, its "<priority key>\t<id>" part}
  local function head_key(h)
    local m = head_of(h)
    local c = keys_of[h]
    if c == nil or c[1] ~= m then
      c = {m, string.sub(m, #h + 2)}
      keys_of[h] = c
    end
    return c[2]
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
    if not wait_until and req.ro == 1 and h ~= STAGE_HOST
        and redis.call('HEXISTS', ROBOTS, h) == 0 and live_now(h) >= 1 then
      wait_until = now + 250  -- robots.txt (and its Crawl-delay) not known yet: one scout
    end
    local my_share_used = cap > 0 and worker ~= '' and
      wlive_now(worker .. '|' .. h) >= math.ceil(cap / active)
    if my_share_used and not wait_until then
      pop_top()  -- this worker has its share of the host: others may have it
    elseif wait_until then
      ready_set[#ready_set + 1] = wait_until
      ready_set[#ready_set + 1] = h
      pop_top()
    else
      local m = head_of(h)
      pos[h] = pos[h] + 1
      q_del[#q_del + 1] = m
      local score, id = member_parts(h, m)
      if not id or not lk.payload[m] then
        count('bad_queue_members', 1)  -- nothing to lease
        batch.dead_raw('corrupt queue entry', lk.raw[m] or '')
      else
        if tok_next > tok_last then
          -- a fencing token is never below the clock (ms x 10): after a failover that lost
          -- the last leases, the promoted replica's rolled-back counter could hand their
          -- tokens out again, on entry ids rolled back too (another request); from the clock
          -- it cannot (docs/deployment.md, "What a failover can lose")
          local n = take - taken
          tok_last = redis.call('INCRBY', TOKEN, n)
          tok_next = tok_last - n + 1
          if tok_next < now * 10 then
            tok_next = now * 10
            tok_last = tok_next + n - 1
            redis.call('SET', TOKEN, string.format('%d', tok_last))
          end
        end
        local tok = tok_next
        tok_next = tok_next + 1
        legacy_forget(id)  -- previous format: the host was in `ehost`
        lease_set[#lease_set + 1] = id
        lease_set[#lease_set + 1] = lease_string(string.format('%d', tok), score, h, worker)
        leases_add[#leases_add + 1] = now + lease_ms
        leases_add[#leases_add + 1] = id
        live_add(h, 1)
        if worker ~= '' then wlive_add(worker .. '|' .. h, 1) end
        host_take_token_ctx(ctx, h, interval)
        pending[#pending + 1] = {id, tok, h, score, lk.payload[m]}
        taken = taken + 1
      end
      if not head_of(h) then
        ready_gone[#ready_gone + 1] = h
        pop_top()
      else
        sift_down(1)  -- its next head comes later (lower priority, or FIFO after)
      end
    end
  end
  if #q_del > 0 then
    -- the heads taken leave their buckets (LTRIM), an emptied bucket its index
    local pops, gone = {}, lk.empty
    for _, m in ipairs(q_del) do
      local b = lk.bucket[m]
      pops[b] = (pops[b] or 0) + 1
    end
    for b, n in pairs(pops) do
      redis.call('LTRIM', QB .. b, n, -1)
      if lk.len[b] and n >= lk.len[b] then gone[#gone + 1] = b end
    end
    redis.call('DECRBY', QN, #q_del)
    batch.index_update({}, gone)
  elseif #lk.empty > 0 then
    batch.index_update({}, lk.empty)
  end
  if #ready_gone > 0 then call_many('ZREM', READY, ready_gone, 4000) end
  if #ready_set > 0 then call_many('ZADD', READY, ready_set, 4000) end
  if #pending > 0 then
    local ids = {}
    for i, e in ipairs(pending) do ids[i] = e[1] end
    local exps = redis.call('HMGET', EXPIRIES, unpack(ids))
    call_many('HSET', LEASE, lease_set, 4000)
    call_many('ZADD', LEASES, leases_add, 4000)
    for i, e in ipairs(pending) do
      -- a leased entry keeps its request in `data` (acknowledged: deleted; back: moved)
      keep_data(e[1], e[5])
      out.leased[#out.leased + 1] = {e[1], e[2], e[5], tonumber(exps[i]) or 0}
    end
    flush_queue()
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
