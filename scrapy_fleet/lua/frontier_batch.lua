-- frontier_batch.lua: the state of one frontier.lua call, read once and written in few
-- commands (library part: lua/__init__.py prepends it to frontier.lua; it defines one local,
-- frontier_batch_new).
--
-- What it holds: the leases the call looks at (read with one HMGET, each value parsed once),
-- the slot counts of hosts and workers (hostlive, wlive: summed per host, written once by
-- flush_slots), the queue writes (collected per bucket, sent by flush_queue with the `data`,
-- `expiries` and `lease` deletes and the buckets' index), the entries per host (hostq:
-- written once by flush_hostq) and the dead letters.  Frontier.lua's header gives each
-- key's layout; docs/architecture.md ("Cost of a call") the reason.
--
-- What it needs, passed by frontier.lua (never its locals: this file comes before it):
--   k    the call's key names: {q, data, lease, leases, expiries, dead, seq, stats, ehost,
--        ready, hostlive, wlive, hostq, qidx, qn, qb} (KEYS of frontier.lua)
--   req  the call's argument map (a r d x s: the leases prefetch_call_leases reads)
--   now  the Redis server's time of the call, ms
--   ctx  lua/hosts.lua's per-host context of the call, with its memo and empty tables
--   out  the call's reply map (out.dead counts the dead letters)
--   count(name, n)  adds to the call's counters (stats)
-- and, from the libraries before it: hincrby (common.lua), FAR, STAGE_HOST, ctx_get,
-- ctx_put, bucket_name, index_with, index_without (hosts.lua).
--
-- Returns `batch`: the batch.* functions below, and the call's helpers as fields of the same
-- names (call_many, legacy_host, legacy_forget, lease_value, parse_lease, lease_string,
-- live_now, live_add, wlive_now, wlive_add, settle_slots, flush_slots, free_slot, enqueue,
-- keep_data, flush_queue, drop_lease, host_count, host_add, flush_hostq, forget, leave,
-- to_dead, holds) and lease_cache (id -> lease value read by this call, false: none).

local function frontier_batch_new(k, req, now, ctx, out, count)
  local Q, DATA, LEASE, LEASES, EXPIRIES = k.q, k.data, k.lease, k.leases, k.expiries
  local DEAD, SEQ, STATS, EHOST, READY = k.dead, k.seq, k.stats, k.ehost, k.ready
  local HOSTLIVE, WLIVE, HOSTQ, QIDX, QN, QB = k.hostlive, k.wlive, k.hostq, k.qidx, k.qn, k.qb

  -- Commands with many arguments, sent in chunks (Lua's unpack stops near 8000 values).
  local function call_many(cmd, key, args, per)
    for from = 1, #args, per do
      redis.call(cmd, key, unpack(args, from, math.min(#args, from + per - 1)))
    end
  end

  -- Legacy (previous format) per-entry host field: read only when the key exists at all.
  local legacy = nil
  local function has_legacy()
    if legacy == nil then legacy = redis.call('EXISTS', EHOST) == 1 end
    return legacy
  end
  local function legacy_host(id)
    if not has_legacy() then return nil end
    local host = redis.call('HGET', EHOST, id)
    if host then redis.call('HDEL', EHOST, id) end
    return host or nil
  end
  -- (an entry leased: its field, if any, deleted unread)
  local function legacy_forget(id)
    if has_legacy() then redis.call('HDEL', EHOST, id) end  -- previous format: host was there
  end

  -- A lease value: token, score, host, worker (worker "!..." once the download is over).
  -- Leases of the previous format ("token|score|worker") get their host from `ehost`.
  local lease_cache = {}  -- id -> value read in this call (false: none)
  local function lease_value(id)
    local v = lease_cache[id]
    if v == nil then
      v = redis.call('HGET', LEASE, id)
      lease_cache[id] = v
    end
    return v
  end
  -- (a call parses the same lease values several times: each value's parts are kept)
  local parsed_leases = {}
  local function parse_lease(v)
    if not v then return nil end
    local p = parsed_leases[v]
    if p == nil then
      local tok, score, rest = string.match(v, '^(%d+)|([^|]*)|(.*)$')
      if not tok then
        p = false
      else
        local host, who = string.match(rest, '^([^\t]*)\t(.*)$')
        if host == nil then
          p = {tok, score, rest, nil}  -- previous format: host not in the value
        else
          p = {tok, score, who, host}
        end
      end
      parsed_leases[v] = p
    end
    if not p then return nil end
    return p[1], p[2], p[3], p[4]
  end
  local function lease_string(tok, score, host, who)
    return tok .. '|' .. score .. '|' .. host .. '\t' .. who
  end

  local batch = {}  -- what this returns (the batched reads and writes are its fields)
  -- Batched reads: the fields a call will look at are read with one HMGET per hash (chunks of
  -- 1000), not one HGET each.  into(field, value) keeps each value (false when missing).
  function batch.read_fields(key, fields, into)
    for from = 1, #fields, 1000 do
      local part = {unpack(fields, from, math.min(#fields, from + 999))}
      local vals = redis.call('HMGET', key, unpack(part))
      for i, f in ipairs(part) do into(f, vals[i]) end
    end
  end
  -- The leases of ids (a list of ids, or of lists whose first element is an id) not read yet.
  function batch.prefetch_leases(list)
    local ids, seen = {}, {}
    for _, e in ipairs(list) do
      local id = type(e) == 'table' and e[1] or e
      if (type(id) == 'string' or type(id) == 'number') and lease_cache[id] == nil
          and not seen[id] then
        seen[id] = true
        ids[#ids + 1] = id
      end
    end
    batch.read_fields(LEASE, ids, function(id, v) lease_cache[id] = v end)
  end
  -- The distinct items of list that memo (item -> value) has no value of yet.
  function batch.unread(list, memo)
    local want, seen = {}, {}
    for _, x in ipairs(list) do
      if memo[x] == nil and not seen[x] then
        seen[x] = true
        want[#want + 1] = x
      end
    end
    return want
  end
  -- The per-host fields of key (a hash of lua/hosts.lua's ctx) for hosts, into ctx's memo.
  function batch.prefetch_ctx(key, hosts)
    if ctx.empty[key] then return end
    local m = ctx.memo[key]
    if m == nil then
      m = {}
      ctx.memo[key] = m
    end
    batch.read_fields(key, batch.unread(hosts, m), function(h, v) m[h] = v end)
  end
  -- Fields (field -> value, false: delete it) written with one HSET and one HDEL.
  function batch.write_fields(key, values)
    local sets, dels = {}, {}
    for f, v in pairs(values) do
      if v then
        sets[#sets + 1] = f
        sets[#sets + 1] = v
      else
        dels[#dels + 1] = f
      end
    end
    if #sets > 0 then call_many('HSET', key, sets, 4000) end
    if #dels > 0 then call_many('HDEL', key, dels, 4000) end
  end
  -- Counts (field -> number): those at 0 or below are deleted.
  function batch.write_counts(key, values)
    local fields = {}
    for f, v in pairs(values) do fields[f] = v > 0 and string.format('%d', v) end
    batch.write_fields(key, fields)
  end

  -- Slot changes (hostlive, wlive) are summed per host and written by flush_slots at the end
  -- of the call, once per host (a host whose download ended and which got a new lease in the
  -- same call writes nothing); the memo (ctx) sees them at once.
  local live_delta, wlive_delta = {}, {}
  local function live_now(h)
    return tonumber(ctx_get(ctx, HOSTLIVE, h)) or 0
  end
  local function live_add(h, n)
    ctx_put(ctx, HOSTLIVE, h, live_now(h) + n)
    live_delta[h] = (live_delta[h] or 0) + n
  end
  local wlive_memo = {}
  local function wlive_now(field)
    local v = wlive_memo[field]
    if v == nil then
      v = tonumber(redis.call('HGET', WLIVE, field)) or 0
      wlive_memo[field] = v
    end
    return v
  end
  local function wlive_add(field, n)
    wlive_memo[field] = wlive_now(field) + n
    wlive_delta[field] = (wlive_delta[field] or 0) + n
  end
  function batch.prefetch_wlive(fields)
    batch.read_fields(WLIVE, batch.unread(fields, wlive_memo),
                      function(f, v) wlive_memo[f] = tonumber(v) or 0 end)
  end
  local freed_hosts = {}
  -- Mid-call: the hosts whose slot was freed and which waited for one (at FAR in `ready`) may be
  -- leased from now (the lease step reads `ready`); a count that went below 0 (a slot freed
  -- twice: an entry of the previous format) reads as 0, as once written.
  local function settle_slots()
    local freed = {}
    for h in pairs(freed_hosts) do freed[#freed + 1] = h end
    for from = 1, #freed, 1000 do
      local part = {unpack(freed, from, math.min(#freed, from + 999))}
      local at = redis.call('ZMSCORE', READY, unpack(part))
      local wake = {}
      for i, h in ipairs(part) do
        local ready_at = tonumber(at[i])
        if ready_at and ready_at >= FAR then  -- it was waiting for a slot
          wake[#wake + 1] = now
          wake[#wake + 1] = h
        end
      end
      if #wake > 0 then redis.call('ZADD', READY, unpack(wake)) end
    end
    freed_hosts = {}
    for h in pairs(live_delta) do
      if live_now(h) < 0 then ctx_put(ctx, HOSTLIVE, h, 0) end
    end
    for f in pairs(wlive_delta) do
      if wlive_memo[f] < 0 then wlive_memo[f] = 0 end
    end
  end
  -- (the memo holds each count as read plus this call's changes: written as it is)
  local function flush_slots()
    settle_slots()
    local lives, wlives = {}, {}
    for h, n in pairs(live_delta) do
      if n ~= 0 then lives[h] = live_now(h) end
    end
    for f, n in pairs(wlive_delta) do
      if n ~= 0 then wlives[f] = wlive_memo[f] end
    end
    batch.write_counts(HOSTLIVE, lives)
    batch.write_counts(WLIVE, wlives)
    live_delta, wlive_delta = {}, {}
  end

  -- A lease holds its host's concurrency slot from the lease until its download is over
  -- (the worker says so: `s`) or, when it never says, until the lease ends.
  local function free_slot(host, who)
    live_add(host, -1)
    if who and who ~= '' then wlive_add(who .. '|' .. host, -1) end
    freed_hosts[host] = true
  end

  -- Queue writes are collected per bucket and sent in few commands by flush_queue (before
  -- anything reads the queue again: the lease step).  A new entry goes to its bucket's tail;
  -- one that comes back (reclaimed, released, deferred, parked) to its head, as the oldest: its
  -- request was pushed before every entry behind it.  Its encoded request, unless given, is
  -- read from `data` (where a leased or deferred entry keeps it) and deleted there.
  local q_tail, q_head, q_need, ready_add = {}, {}, {}, {}
  local function enqueue(id, score, host, payload, back)
    local b = bucket_name(host, score)
    local t = back and q_head or q_tail
    local l = t[b]
    if not l then
      l = {}
      t[b] = l
    end
    local e = {id, payload, host}
    l[#l + 1] = e
    if payload == nil then q_need[#q_need + 1] = e end
    ready_add[host] = true
  end
  -- The buckets' index (host -> its buckets' priority keys, lua/hosts.lua), as read or written
  -- by this call (false: the host has none).
  batch.qi = {}
  function batch.prefetch_index(hosts)
    batch.read_fields(QIDX, batch.unread(hosts, batch.qi), function(h, v) batch.qi[h] = v end)
  end
  -- Buckets (names "<host>\t<priority key>") that hold entries and that were emptied: their
  -- hosts' index values (written only where they change).
  function batch.index_update(filled, emptied)
    local hosts, changes = {}, {}
    for _, list in ipairs({{filled, true}, {emptied, false}}) do
      for _, b in ipairs(list[1]) do
        local tab = string.find(b, '\t', 1, true)
        local h = string.sub(b, 1, tab - 1)
        hosts[#hosts + 1] = h
        changes[#changes + 1] = {h, string.sub(b, tab + 1), list[2]}
      end
    end
    if #changes == 0 then return end
    batch.prefetch_index(hosts)
    local touched = {}
    for _, c in ipairs(changes) do
      local was = batch.qi[c[1]] or nil
      local v
      if c[3] then v = index_with(was, c[2]) else v = index_without(was, c[2]) end
      batch.qi[c[1]] = v or false
      if v ~= was then touched[c[1]] = batch.qi[c[1]] end
    end
    batch.write_fields(QIDX, touched)
  end
  local data_add = {}
  local data_del, exp_del, lease_del, leases_del = {}, {}, {}, {}
  -- A leased or deferred entry keeps its request in `data` (written by flush_queue).
  local function keep_data(id, payload)
    data_add[#data_add + 1] = id
    data_add[#data_add + 1] = payload
  end
  local function flush_queue()
    if #q_need > 0 then
      local ids, of = {}, {}
      for _, e in ipairs(q_need) do
        if of[e[1]] == nil then
          of[e[1]] = e
          ids[#ids + 1] = e[1]
        end
      end
      batch.read_fields(DATA, ids, function(id, v) of[id][2] = v end)
      for _, e in ipairs(q_need) do
        if e[2] then
          data_del[#data_del + 1] = e[1]  -- the request moves into the bucket's entry
        else
          batch.to_dead(e[1], 'entry has no data', e[3])  -- (its deletes are the ones below)
        end
      end
      q_need = {}
    end
    -- deletes first: a request parked by this call may come back (resumed) in the same call
    if #data_del > 0 then call_many('HDEL', DATA, data_del, 4000) end
    if #exp_del > 0 then call_many('HDEL', EXPIRIES, exp_del, 4000) end
    if #lease_del > 0 then call_many('HDEL', LEASE, lease_del, 4000) end
    if #leases_del > 0 then call_many('ZREM', LEASES, leases_del, 4000) end
    if #data_add > 0 then call_many('HSET', DATA, data_add, 2000) end
    local added, pushed_to = 0, {}
    for _, side in ipairs({{q_tail, false}, {q_head, true}}) do
      for b, l in pairs(side[1]) do
        -- at the head: oldest (lowest id) first, so pushed there in the reverse order
        if side[2] then table.sort(l, function(x, y) return x[1] > y[1] end) end
        local items = {}
        for _, e in ipairs(l) do
          if e[2] then items[#items + 1] = e[1] .. '\t' .. e[2] end
        end
        for from = 1, #items, 2000 do
          -- (each command named in full: acl.py reads the scripts' commands from their source)
          if side[2] then
            redis.call('LPUSH', QB .. b, unpack(items, from, math.min(#items, from + 1999)))
          else
            redis.call('RPUSH', QB .. b, unpack(items, from, math.min(#items, from + 1999)))
          end
        end
        added = added + #items
        -- (every bucket pushed to is made sure of in the index: one written by a call that
        -- failed half-way is indexed again)
        if #items > 0 then pushed_to[#pushed_to + 1] = b end
      end
    end
    batch.index_update(pushed_to, {})
    if added > 0 then redis.call('INCRBY', QN, added) end
    local hosts = {}
    for h in pairs(ready_add) do
      hosts[#hosts + 1] = now
      hosts[#hosts + 1] = h
    end
    if #hosts > 0 then
      table.insert(hosts, 1, 'NX')
      call_many('ZADD', READY, hosts, 4000)
    end
    q_tail, q_head, q_need, ready_add = {}, {}, {}, {}
    data_add, data_del, exp_del, lease_del, leases_del = {}, {}, {}, {}, {}
  end

  -- Entries queued: in the buckets, and any of the previous format not moved yet.
  function batch.queued()
    return (tonumber(redis.call('GET', QN)) or 0) + redis.call('ZCARD', Q)
  end

  -- A leased entry leaves its lease (and its host's slot, unless it was freed already).
  -- Returns its score and host.
  local function drop_lease(id)
    local _, score, who, host = parse_lease(lease_value(id))
    if host == nil then host = legacy_host(id) or '' end
    leases_del[#leases_del + 1] = id
    lease_del[#lease_del + 1] = id
    lease_cache[id] = false
    if not (who and string.sub(who, 1, 1) == '!') then
      free_slot(host, who)
    end
    return tonumber(score) or 0, host
  end

  -- Entries per host (FLEET_HOST_QUEUE_MAX): read when a bound needs them, changes summed
  -- per host and written once per host by flush_hostq, at the end of the call.
  local host_counts, host_delta = {}, {}
  local function host_count(host)
    if host_counts[host] == nil then
      host_counts[host] = (tonumber(redis.call('HGET', HOSTQ, host)) or 0) + (host_delta[host] or 0)
    end
    return host_counts[host]
  end
  local function host_add(host, n)
    if host == '' then return end
    host_delta[host] = (host_delta[host] or 0) + n
    if host_counts[host] ~= nil then host_counts[host] = math.max(host_counts[host] + n, 0) end
  end
  function batch.prefetch_hostq(hosts)
    local want = {}
    for _, h in ipairs(batch.unread(hosts, host_counts)) do
      if h ~= '' then want[#want + 1] = h end  -- (an entry without a host is not counted)
    end
    batch.read_fields(HOSTQ, want, function(h, v)
      host_counts[h] = (tonumber(v) or 0) + (host_delta[h] or 0)
    end)
  end
  local function flush_hostq()
    local changed = {}
    for host, n in pairs(host_delta) do
      if n ~= 0 then changed[#changed + 1] = host end
    end
    batch.prefetch_hostq(changed)
    local values = {}
    for _, host in ipairs(changed) do values[host] = host_counts[host] end
    batch.write_counts(HOSTQ, values)
    host_delta = {}
  end

  -- An entry that leaves the frontier for good (acknowledged or dead-lettered) or for the
  -- parked list: forget its data and its place in its host's count.
  local function forget(id, host)
    host_add(host, -1)
    if host == STAGE_HOST then
      hincrby(STATS, 'response_queue_bytes', -redis.call('HSTRLEN', DATA, id))
    end
    data_del[#data_del + 1] = id
  end
  -- (for good: its expiry count too)
  local function leave(id, host)
    forget(id, host)
    exp_del[#exp_del + 1] = id
  end

  local function to_dead(id, reason, host)
    local data = redis.call('HGET', DATA, id)
    redis.call('HSET', DEAD, id, cmsgpack.pack({reason = reason, at = now, data = data or ''}))
    leave(id, host)
    out.dead = out.dead + 1
    count('dead_lettered', 1)
  end
  batch.to_dead = to_dead

  -- The leases this call looks at (expired ones, and those the worker names), read at once, and
  -- the slot counts of their hosts.
  function batch.prefetch_call_leases(expired)
    local all = {}
    for _, list in ipairs({expired, req.a, req.r, req.d, req.x, req.s}) do
      for _, e in ipairs(list) do all[#all + 1] = e end
    end
    batch.prefetch_leases(all)
    local hosts, fields = {}, {}
    for _, e in ipairs(all) do
      local id = type(e) == 'table' and e[1] or e
      local _, _, who, host = parse_lease(lease_cache[id])
      if host then
        hosts[#hosts + 1] = host
        if who and who ~= '' and string.sub(who, 1, 1) ~= '!' then
          fields[#fields + 1] = who .. '|' .. host
        end
      end
    end
    batch.prefetch_ctx(HOSTLIVE, hosts)
    batch.prefetch_wlive(fields)
  end

  -- Holds `token` the current lease of `id`?  Returns its score when it does.
  local function holds(id, token)
    local tok, score = parse_lease(lease_value(id))
    if tok and tok == tostring(token) then
      return score
    end
    return nil
  end

  -- An entry that cannot be read (not written by these scripts) is kept as a dead letter with
  -- its raw bytes, under a new id: never dropped.
  function batch.dead_raw(reason, raw)
    redis.call('HSET', DEAD, string.format('%015d', redis.call('INCR', SEQ)),
               cmsgpack.pack({reason = reason, at = now, data = raw}))
    out.dead = out.dead + 1
    count('dead_lettered', 1)
  end

  -- Stored responses deferred (their links' hosts were all full) wait for those hosts, not for a
  -- parse worker: they are left out of the response queue that stops the fetch workers (out.rq),
  -- or the fetch workers would stop while the hosts they must drain stay full
  -- (docs/stages.md).  n = 1 when one is deferred, -1 when it is due.
  function batch.stage_deferred(id, n)
    local left = hincrby(STATS, 'response_queue_deferred', n)
    local bytes = hincrby(STATS, 'response_queue_deferred_bytes',
                          n * redis.call('HSTRLEN', DATA, id))
    if left <= 0 or bytes < 0 then  -- (one deferred before these counts existed)
      redis.call('HDEL', STATS, 'response_queue_deferred', 'response_queue_deferred_bytes')
    end
  end

  batch.call_many, batch.legacy_host, batch.legacy_forget = call_many, legacy_host, legacy_forget
  batch.lease_cache, batch.lease_value, batch.parse_lease = lease_cache, lease_value, parse_lease
  batch.lease_string = lease_string
  batch.live_now, batch.live_add = live_now, live_add
  batch.wlive_now, batch.wlive_add = wlive_now, wlive_add
  batch.settle_slots, batch.flush_slots, batch.free_slot = settle_slots, flush_slots, free_slot
  batch.enqueue, batch.keep_data, batch.flush_queue = enqueue, keep_data, flush_queue
  batch.drop_lease, batch.host_count, batch.host_add = drop_lease, host_count, host_add
  batch.flush_hostq, batch.forget, batch.leave, batch.holds = flush_hostq, forget, leave, holds
  return batch
end
