-- frontier_state.lua: what one frontier call has read and will write of leases, slots and
-- per-host counts (it defines one local, State).  State.new(c) returns the call's state `st`;
-- the steps (lua/step_*.lua) share it through the call `c` (c.st).
--
-- Keys (of c.K): lease, leases, hostlive, wlive, hostq, ready, data, dead, seq, stats.
-- What it holds: the leases the call looks at (read with one HMGET, each value parsed once),
-- the slot counts of hosts and workers (hostlive, wlive: summed per host, written once by
-- flush_slots), the entries per host (hostq: written once by flush_hostq).
-- Writes: hostlive, wlive, hostq (counts at 0 deleted), ready (a host whose slot was freed
-- while it waited for one, at FAR, is ready now), dead (dead letters), stats (stored
-- responses' bytes).  Its queue writes go through the call's queue writer (c.qw).
-- Work per call: one HMGET per 1000 leases or hosts read, one HSET and one HDEL per key
-- written, one ZMSCORE + ZADD per 1000 freed hosts.
--
-- A lease value: "<token>|<score>|<host>\t<worker>" (worker "!<worker>" once its download
-- is over, `s`): the entry's host is always in the one structure that holds the entry.

local State = {}

function State.new(c)
  local K, req, now, ctx, out, count, qw = c.K, c.req, c.now, c.ctx, c.out, c.count, c.qw
  local st = {}
  local grouped = type(req.gi) == 'string' and req.gi ~= ''  -- in a crawl group

  local lease_cache = {}  -- id -> value read in this call (false: none)
  st.lease_cache = lease_cache
  function st.lease_value(id)
    local v = lease_cache[id]
    if v == nil then
      v = redis.call('HGET', K.lease, id)
      lease_cache[id] = v
    end
    return v
  end
  -- token, score, worker, host of a lease value (nil when there is none or it cannot be read)
  local parsed_leases = {}  -- (a call parses the same values several times)
  function st.parse_lease(v)
    if not v then return nil end
    local p = parsed_leases[v]
    if p == nil then
      local tok, score, rest = string.match(v, '^(%d+)|([^|]*)|(.*)$')
      local host, who
      if tok then host, who = string.match(rest, '^([^\t]*)\t(.*)$') end
      p = host ~= nil and {tok, score, who, host} or false
      parsed_leases[v] = p
    end
    if not p then return nil end
    return p[1], p[2], p[3], p[4]
  end
  function st.lease_string(tok, score, host, who)
    return tok .. '|' .. score .. '|' .. host .. '\t' .. who
  end
  -- The leases of ids (a list of ids, or of lists whose first element is an id) not read yet.
  function st.prefetch_leases(list)
    local ids, seen = {}, {}
    for _, e in ipairs(list) do
      local id = type(e) == 'table' and e[1] or e
      if (type(id) == 'string' or type(id) == 'number') and lease_cache[id] == nil
          and not seen[id] then
        seen[id] = true
        ids[#ids + 1] = id
      end
    end
    read_fields(K.lease, ids, function(id, v) lease_cache[id] = v end)
  end
  -- The per-host fields of key (a hash of lua/hosts.lua's ctx) for hosts, into ctx's memo.
  function st.prefetch_ctx(key, hosts)
    if ctx.empty[key] then return end
    local m = ctx.memo[key]
    if m == nil then
      m = {}
      ctx.memo[key] = m
    end
    read_fields(key, unread(hosts, m), function(h, v) m[h] = v end)
  end

  -- Slot changes (hostlive, wlive) are summed per host and written by flush_slots at the end
  -- of the call, once per host (a host whose download ended and which got a new lease in the
  -- same call writes nothing); the memo (ctx) sees them at once.
  local live_delta, wlive_delta, wlive_memo, freed_hosts = {}, {}, {}, {}
  function st.live_now(h)
    return tonumber(ctx_get(ctx, K.hostlive, h)) or 0
  end
  function st.live_add(h, n)
    ctx_put(ctx, K.hostlive, h, st.live_now(h) + n)
    live_delta[h] = (live_delta[h] or 0) + n
  end
  function st.wlive_now(field)
    local v = wlive_memo[field]
    if v == nil then
      v = tonumber(redis.call('HGET', K.wlive, field)) or 0
      wlive_memo[field] = v
    end
    return v
  end
  function st.wlive_add(field, n)
    wlive_memo[field] = st.wlive_now(field) + n
    wlive_delta[field] = (wlive_delta[field] or 0) + n
  end
  function st.prefetch_wlive(fields)
    read_fields(K.wlive, unread(fields, wlive_memo),
                function(f, v) wlive_memo[f] = tonumber(v) or 0 end)
  end
  -- Mid-call: the hosts whose slot was freed and which waited for one (at FAR in `ready`) may be
  -- leased from now (the lease step reads `ready`); a count that went below 0 (a slot freed
  -- twice) reads as 0, as once written.
  function st.settle_slots()
    local freed = {}
    for h in pairs(freed_hosts) do freed[#freed + 1] = h end
    for from = 1, #freed, 1000 do
      local part = {unpack(freed, from, math.min(#freed, from + 999))}
      local at = redis.call('ZMSCORE', K.ready, unpack(part))
      local wake = {}
      for i, h in ipairs(part) do
        local ready_at = tonumber(at[i])
        -- it was waiting for a slot (a crawl group's: looking again soon, lua/step_lease.lua;
        -- woken early, the lease step checks the host's turn again)
        if ready_at and (ready_at >= FAR or (grouped and ready_at > now)) then
          wake[#wake + 1] = now
          wake[#wake + 1] = h
        end
      end
      if #wake > 0 then redis.call('ZADD', K.ready, unpack(wake)) end
    end
    freed_hosts = {}
    for h in pairs(live_delta) do
      if st.live_now(h) < 0 then ctx_put(ctx, K.hostlive, h, 0) end
    end
    for f in pairs(wlive_delta) do
      if wlive_memo[f] < 0 then wlive_memo[f] = 0 end
    end
  end
  -- (the memo holds each count as read plus this call's changes: written as it is)
  function st.flush_slots()
    st.settle_slots()
    local lives, wlives = {}, {}
    for h, n in pairs(live_delta) do
      if n ~= 0 then lives[h] = st.live_now(h) end
    end
    for f, n in pairs(wlive_delta) do
      if n ~= 0 then wlives[f] = wlive_memo[f] end
    end
    write_counts(K.hostlive, lives)
    write_counts(K.wlive, wlives)
    live_delta, wlive_delta = {}, {}
  end
  -- A lease holds its host's concurrency slot from the lease until its download is over
  -- (the worker says so: `s`) or, when it never says, until the lease ends.
  function st.free_slot(host, who)
    st.live_add(host, -1)
    if who and who ~= '' then st.wlive_add(who .. '|' .. host, -1) end
    freed_hosts[host] = true
  end

  -- A leased entry leaves its lease (and its host's slot, unless it was freed already).
  -- Returns its score and host.
  function st.drop_lease(id)
    local _, score, who, host = st.parse_lease(st.lease_value(id))
    host = host or ''
    local holder = who and string.gsub(who, '^!', '') or ''
    qw.drop_lease(id, holder ~= '' and holder .. '\t' .. id or nil)
    lease_cache[id] = false
    if not (who and string.sub(who, 1, 1) == '!') then
      st.free_slot(host, who)
    end
    return tonumber(score) or 0, host
  end
  -- Holds `token` the current lease of `id`?  Returns its score when it does.
  function st.holds(id, token)
    local tok, score = st.parse_lease(st.lease_value(id))
    if tok and tok == tostring(token) then
      return score
    end
    return nil
  end

  -- Entries per host (FLEET_HOST_QUEUE_MAX): read when a bound needs them, changes summed
  -- per host and written once per host by flush_hostq, at the end of the call.
  local host_counts, host_delta = {}, {}
  function st.host_count(host)
    if host_counts[host] == nil then
      host_counts[host] = (tonumber(redis.call('HGET', K.hostq, host)) or 0)
        + (host_delta[host] or 0)
    end
    return host_counts[host]
  end
  function st.host_add(host, n)
    if host == '' then return end
    host_delta[host] = (host_delta[host] or 0) + n
    if host_counts[host] ~= nil then host_counts[host] = math.max(host_counts[host] + n, 0) end
  end
  function st.prefetch_hostq(hosts)
    local want = {}
    for _, h in ipairs(unread(hosts, host_counts)) do
      if h ~= '' then want[#want + 1] = h end  -- (an entry without a host is not counted)
    end
    read_fields(K.hostq, want, function(h, v)
      host_counts[h] = (tonumber(v) or 0) + (host_delta[h] or 0)
    end)
  end
  function st.flush_hostq()
    local changed = {}
    for host, n in pairs(host_delta) do
      if n ~= 0 then changed[#changed + 1] = host end
    end
    st.prefetch_hostq(changed)
    local values = {}
    for _, host in ipairs(changed) do values[host] = host_counts[host] end
    write_counts(K.hostq, values)
    host_delta = {}
  end

  -- An entry that leaves the frontier for good (acknowledged or dead-lettered) or for the
  -- parked list: forget its data and its place in its host's count.
  function st.forget(id, host)
    st.host_add(host, -1)
    if host == STAGE_HOST then
      hincrby(K.stats, 'response_queue_bytes', -redis.call('HSTRLEN', K.data, id))
    end
    qw.drop_data(id)
  end
  -- (for good: its expiry count too)
  function st.leave(id, host)
    st.forget(id, host)
    qw.drop_expiries(id)
  end
  function st.to_dead(id, reason, host)
    local data = redis.call('HGET', K.data, id)
    redis.call('HSET', K.dead, id, cmsgpack.pack({reason = reason, at = now, data = data or ''}))
    st.leave(id, host)
    out.dead = out.dead + 1
    count('dead_lettered', 1)
    revisit_dead(c, id)  -- recrawl (issue 22): a revisit leaves the schedule
  end
  -- An entry that cannot be read (not written by these scripts) is kept as a dead letter with
  -- its raw bytes, under a new id: never dropped.
  function st.dead_raw(reason, raw)
    redis.call('HSET', K.dead, string.format('%015d', redis.call('INCR', K.seq)),
               cmsgpack.pack({reason = reason, at = now, data = raw}))
    out.dead = out.dead + 1
    count('dead_lettered', 1)
  end

  -- The leases this call looks at (expired ones, and those the worker names), read at once,
  -- and the slot counts of their hosts.
  function st.prefetch_call_leases(expired)
    local all = {}
    for _, list in ipairs({expired, req.a, req.r, req.d, req.x, req.s}) do
      for _, e in ipairs(list) do all[#all + 1] = e end
    end
    st.prefetch_leases(all)
    local hosts, fields = {}, {}
    for _, e in ipairs(all) do
      local id = type(e) == 'table' and e[1] or e
      local _, _, who, host = st.parse_lease(lease_cache[id])
      if host then
        hosts[#hosts + 1] = host
        if who and who ~= '' and string.sub(who, 1, 1) ~= '!' then
          fields[#fields + 1] = who .. '|' .. host
        end
      end
    end
    st.prefetch_ctx(K.hostlive, hosts)
    st.prefetch_wlive(fields)
  end

  -- Stored responses deferred (their links' hosts were all full) wait for those hosts, not for a
  -- parse worker: they are left out of the response queue that stops the fetch workers (out.rq),
  -- or the fetch workers would stop while the hosts they must drain stay full
  -- (docs/stages.md).  n = 1 when one is deferred, -1 when it is due.
  function st.stage_deferred(id, n)
    local left = hincrby(K.stats, 'response_queue_deferred', n)
    local bytes = hincrby(K.stats, 'response_queue_deferred_bytes',
                          n * redis.call('HSTRLEN', K.data, id))
    if left <= 0 or bytes < 0 then  -- (one deferred before these counts existed)
      redis.call('HDEL', K.stats, 'response_queue_deferred', 'response_queue_deferred_bytes')
    end
  end
  return st
end
