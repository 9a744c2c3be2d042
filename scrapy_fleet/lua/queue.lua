-- queue.lua: the queue part.  The one owner of how an entry is queued and dequeued, of the
-- buckets' index and of the frontier's size, for every script that queues (the frontier
-- call, failed_retry.lua); it defines one local, Queue.
--
-- Layout: a queued entry is "<entry id>\t<encoded request>" in the LIST of its host and
-- priority (a bucket, key K.bucket_prefix .. "<host>\t<priority key>", the key -priority +
-- 10^15 zero-padded to 16 digits), FIFO; K.queue_index (HASH) gives per host the priority
-- keys of its buckets that hold entries, ascending (highest Request.priority first), so that
-- one HMGET tells the best bucket of every candidate host of a call; K.queue_count (STRING)
-- counts the entries in the buckets; K.ready (ZSET host -> ms) has every host with entries.
-- A list entry costs its bytes and ~2 more in a listpack (docs/sizing.md).
--
-- The frontier's size, which FLEET_QUEUE_MAX bounds (docs/backpressure.md): queued + leased
-- + deferred entries (Queue.size; frontier/protocol.py frontier_size is the same sum).
--
-- Keys (of K): queue_count, leases, deferred (size); writer also: queue_index, bucket_prefix,
-- ready, data, expiries, lease (the deletes of an entry that leaves its lease or `data`).
-- Writes: buckets (RPUSH new entries at the tail, LPUSH returning ones at the head, LTRIM
-- taken heads), queue_index, queue_count, ready (ZADD NX), data (HSET kept requests, HDEL
-- moved ones), expiries / lease / leases (HDEL, ZREM of entries that left their lease).
-- Work per call: Queue.writer's flush sends one command per touched bucket and per key
-- (chunks of 2000-4000 values); the index is read with one HMGET per 1000 hosts.

local Queue = {}

-- The bucket of host's entries of score (-priority): its name (the key's suffix after
-- K.bucket_prefix, and the member of the index).
function Queue.bucket_name(host, score)
  return host .. '\t' .. string.format('%016d', score + PRIO_OFFSET)
end

-- The index's value of a host: the priority keys of its buckets, ascending (best first),
-- space-separated.  index_with / index_without return it with / without key (nil when empty).
function Queue.index_keys(value)
  local keys = {}
  for key in string.gmatch(value or '', '%d+') do keys[#keys + 1] = key end
  return keys
end
function Queue.index_with(value, key)
  local keys = Queue.index_keys(value)
  for _, k in ipairs(keys) do
    if k == key then return value end
  end
  keys[#keys + 1] = key
  table.sort(keys)
  return table.concat(keys, ' ')
end
function Queue.index_without(value, key)
  local keep = {}
  for _, k in ipairs(Queue.index_keys(value)) do
    if k ~= key then keep[#keep + 1] = k end
  end
  if #keep == 0 then return nil end
  return table.concat(keep, ' ')
end

-- id and encoded request of a bucket's entry (nil when it is not of that form: not written by
-- these scripts)
function Queue.entry_parts(entry)
  local tab = string.find(entry, '\t', 1, true)
  if not tab or tab == 1 then return nil, nil end
  return string.sub(entry, 1, tab - 1), string.sub(entry, tab + 1)
end

-- (score, id) of a head member "<host>\t<priority key>\t<id>" of host's queue (nil when the
-- member is not of that form: it was not written by these scripts)
function Queue.member_parts(host, member)
  local key, id = string.match(string.sub(member, #host + 2), '^(%d+)\t(.+)$')
  if not key then return nil, nil end
  return tonumber(key) - PRIO_OFFSET, id
end

-- Entries queued (in the buckets).
function Queue.queued(K)
  return tonumber(redis.call('GET', K.queue_count)) or 0
end

-- The frontier's size: queued + leased + deferred entries (`queued`: the count when the
-- caller knows it, else it is read).
function Queue.size(K, queued)
  return (queued or Queue.queued(K)) + redis.call('ZCARD', K.leases)
    + redis.call('ZCARD', K.deferred)
end

-- A writer: the queue writes of one call, collected and sent in few commands by flush
-- (before anything reads the queue again).  A new entry goes to its bucket's tail; one that
-- comes back (reclaimed, released, deferred, parked, retried) to its head, as the oldest: its
-- request was pushed before every entry behind it.  Its encoded request, unless given, is
-- read from `data` (where a leased or deferred entry keeps it) and deleted there; one that
-- has none goes to on_missing(id, host) (the caller dead-letters it).  w.queued: the count of
-- queued entries (K.queue_count) as this call changes it, from `queued`, its value when the
-- call began (read then, with other keys, by the frontier call; nil: read here).
function Queue.writer(K, now, on_missing, queued)
  local w = {qi = {}}  -- qi: the index as read or written by this call (false: no bucket)
  w.queued = queued or Queue.queued(K)
  local q_tail, q_head, q_need, ready_add = {}, {}, {}, {}
  local data_add, data_del, exp_del, lease_del, leases_del = {}, {}, {}, {}, {}
  local held_del = {}

  function w.enqueue(id, score, host, payload, back)
    local b = Queue.bucket_name(host, score)
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
  -- A leased or deferred entry keeps its request in `data`.
  function w.keep_data(id, payload)
    data_add[#data_add + 1] = id
    data_add[#data_add + 1] = payload
  end
  -- An entry's request leaves `data`; its expiry count (for good); its lease.
  function w.drop_data(id) data_del[#data_del + 1] = id end
  function w.drop_expiries(id) exp_del[#exp_del + 1] = id end
  -- (*held*: its member of K.held, "<holder>\t<id>": lua/step_recover.lua)
  function w.drop_lease(id, held)
    leases_del[#leases_del + 1] = id
    lease_del[#lease_del + 1] = id
    if held then held_del[#held_del + 1] = held end
  end

  function w.prefetch_index(hosts)
    read_fields(K.queue_index, unread(hosts, w.qi), function(h, v) w.qi[h] = v end)
  end
  -- Buckets that hold entries and that were emptied: their hosts' index values (written only
  -- where they change).
  function w.index_update(filled, emptied)
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
    w.prefetch_index(hosts)
    local touched = {}
    for _, c in ipairs(changes) do
      local was = w.qi[c[1]] or nil
      local v
      if c[3] then v = Queue.index_with(was, c[2]) else v = Queue.index_without(was, c[2]) end
      w.qi[c[1]] = v or false
      if v ~= was then touched[c[1]] = w.qi[c[1]] end
    end
    write_fields(K.queue_index, touched)
  end

  function w.flush()
    if #q_need > 0 then
      local ids, of = {}, {}
      for _, e in ipairs(q_need) do
        if of[e[1]] == nil then
          of[e[1]] = e
          ids[#ids + 1] = e[1]
        end
      end
      read_fields(K.data, ids, function(id, v) of[id][2] = v end)
      for _, e in ipairs(q_need) do
        if e[2] then
          data_del[#data_del + 1] = e[1]  -- the request moves into the bucket's entry
        else
          on_missing(e[1], e[3])  -- (its deletes are the ones below)
        end
      end
      q_need = {}
    end
    -- deletes first: a request parked by this call may come back (resumed) in the same call
    if #data_del > 0 then call_many('HDEL', K.data, data_del, 4000) end
    if #exp_del > 0 then call_many('HDEL', K.expiries, exp_del, 4000) end
    if #lease_del > 0 then call_many('HDEL', K.lease, lease_del, 4000) end
    if #held_del > 0 then call_many('ZREM', K.held, held_del, 4000) end
    if #leases_del > 0 then call_many('ZREM', K.leases, leases_del, 4000) end
    if #data_add > 0 then call_many('HSET', K.data, data_add, 2000) end
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
            redis.call('LPUSH', K.bucket_prefix .. b,
                       unpack(items, from, math.min(#items, from + 1999)))
          else
            redis.call('RPUSH', K.bucket_prefix .. b,
                       unpack(items, from, math.min(#items, from + 1999)))
          end
        end
        added = added + #items
        -- (every bucket pushed to is made sure of in the index: one written by a call that
        -- failed half-way is indexed again)
        if #items > 0 then pushed_to[#pushed_to + 1] = b end
      end
    end
    w.index_update(pushed_to, {})
    if added > 0 then w.queued = redis.call('INCRBY', K.queue_count, added) end
    local hosts = {}
    for h in pairs(ready_add) do
      hosts[#hosts + 1] = now
      hosts[#hosts + 1] = h
    end
    -- (NX in every chunk, and chunks of whole score/member pairs: one NX put before the
    -- list and cut by call_many made a push of over 2,000 new hosts a syntax error)
    for from = 1, #hosts, 4000 do
      redis.call('ZADD', K.ready, 'NX', unpack(hosts, from, math.min(#hosts, from + 3999)))
    end
    q_tail, q_head, q_need, ready_add = {}, {}, {}, {}
    data_add, data_del, exp_del, lease_del, leases_del = {}, {}, {}, {}, {}
    held_del = {}
  end

  -- Dequeue: the heads a call took (`taken`: head members, `bucket_of` their buckets) leave
  -- their buckets (one LTRIM each); a bucket taken to its end (`len` of it, as read), or found
  -- empty (`empty`), leaves its host's index value.
  function w.take_heads(taken, bucket_of, len, empty)
    if #taken > 0 then
      local pops, gone = {}, empty
      for _, m in ipairs(taken) do
        local b = bucket_of[m]
        pops[b] = (pops[b] or 0) + 1
      end
      for b, n in pairs(pops) do
        redis.call('LTRIM', K.bucket_prefix .. b, n, -1)
        if len[b] and n >= len[b] then gone[#gone + 1] = b end
      end
      w.queued = redis.call('DECRBY', K.queue_count, #taken)
      w.index_update({}, gone)
    elseif #empty > 0 then
      w.index_update({}, empty)
    end
  end
  return w
end

-- A reader of host heads for a lease step that may take `take` entries: head(h, first,
-- room) is the next head of h's queue not taken by this call (nil when there is none), as a
-- member "<host>\t<priority key>\t<entry id>"; advance(h) moves past it.  A read fetches the
-- next heads of h's best bucket not read yet: 1 for the first look, then twice as many as the
-- read before (at most `room`, what the call may still take, and 64): a host usually gives a
-- call one lease or two (its concurrency cap is shared among the workers), so reading all the
-- call may take from it reads entries that stay.  r.payload, r.bucket, r.raw: per member, its
-- request, bucket and raw entry; r.len: per bucket, its length when its end was seen;
-- r.empty: the buckets found empty.
function Queue.reader(K, w)
  local r = {payload = {}, bucket = {}, raw = {}, len = {}, empty = {}}
  local heads, pos, hb, ended = {}, {}, {}, {}
  function r.head(h, first, room)
    local buf = heads[h]
    if buf and pos[h] <= #buf then return buf[pos[h]] end
    if ended[h] then return nil end
    local st = hb[h]  -- {h's bucket names, the current one's index, entries read, next read}
    if st == nil then
      -- (the candidates' index values are read at once by the caller, before any first look)
      if w.qi[h] == nil then w.prefetch_index({h}) end
      local names = {}
      for i, key in ipairs(Queue.index_keys(w.qi[h] or nil)) do names[i] = h .. '\t' .. key end
      st = {names, 1, 0, 1}
      hb[h] = st
    end
    local want = first and 1 or math.max(1, math.min(room, st[4], 64))
    st[4] = want * 2
    buf = {}
    while #buf == 0 do
      local b = st[1][st[2]]
      if b == nil then break end
      local entries = redis.call('LRANGE', K.bucket_prefix .. b, st[3], st[3] + want - 1)
      for i, e in ipairs(entries) do
        local id, payload = Queue.entry_parts(e)
        local m = b .. '\t' .. (id or '')
        buf[i] = m
        r.payload[m], r.bucket[m], r.raw[m] = payload, b, e
      end
      st[3] = st[3] + #entries
      if #entries < want then  -- the bucket's end: the next read is of the next bucket
        r.len[b] = st[3]
        if st[3] == 0 then r.empty[#r.empty + 1] = b end
        st[2], st[3] = st[2] + 1, 0
      end
    end
    if #buf == 0 then ended[h] = true end
    heads[h], pos[h] = buf, 1
    return buf[1]
  end
  function r.advance(h) pos[h] = pos[h] + 1 end
  return r
end
