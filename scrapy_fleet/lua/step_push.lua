-- step_push.lua: new requests into the frontier, within its bounds (docs/backpressure.md).
-- Defines one local, Push: Push.prepare(c) sets up what step_push and lua/step_ack.lua share
-- (c.size, c.push, c.host_full, c.seen_before, c.resume_parked, c.groups); step_push(c)
-- pushes the requests without a parent.
--
-- Bounds: the frontier's size (lua/queue.lua, Queue.size) against c.queue_max (qm, 0 none)
-- and each host's entries (K.hostq) against c.host_max (hm, 0 none).  A push without a parent
-- (push helper, start requests, redirects: group 0) is refused when the size has reached qm or
-- its host has hm entries, unless the filter has it (a duplicate takes no room: counted as a
-- duplicate, so that a push into a full frontier says which lines were there already);
-- parked requests, which wait for room already, come first.  req.p [[fp12 or "", priority, payload, group, host, delay, lastmod]
-- ...]: group k = a link of the k-th acknowledgement (lua/step_ack.lua); delay (ms): the new
-- entry waits in `deferred` that long before it is queued (a request whose origin's robots.txt
-- could not be fetched yet, docs/politeness.md); lastmod (s, 0 none): a sitemap's <lastmod>:
-- one the filter has goes to c.lastmods {fp12, lastmod} (c.lastmod_seen: any push had one),
-- made due by lua/step_revisit.lua's revisit_lastmod_step (step_ack calls it).
-- Every fingerprint of the call is looked up in the Bloom filter at once (lua/bloom.lua); two
-- identical links in one call make one entry.
-- Keys (of K): bloom_meta, bloom_slices, seq (INCRBY: one per call for all its new ids),
-- deferred (a push with a delay), parked (LPOP / RPUSH), stats (stored responses' bytes), and the
-- queue's and the state's.  Writes: the filter, seq, the queue, deferred, parked, hostq.
-- Work per call: the filter's (lua/bloom.lua); at most 100 parked records looked at per
-- resume (16 rotated), 2 resumes per call; no command when the call has no push and no ack.

local Push = {}

function Push.prepare(c)
  local K, req, st, qw, out = c.K, c.req, c.st, c.qw, c.out
  local queue_max, host_max = c.queue_max, c.host_max
  qw.flush()
  -- (the size matters only to the bounds: not read without one)
  c.size = 0
  if queue_max > 0 then c.size = Queue.size(K, qw.queued) end
  local bloom, present = nil, {}
  if #req.p > 0 then
    local fps, where = {}, {}
    for i, p in ipairs(req.p) do
      if p[1] ~= '' then
        fps[#fps + 1] = p[1]
        where[#fps] = i
      end
    end
    if #fps > 0 then
      bloom = bloom_open(K.bloom_meta, K.bloom_slices, tonumber(req.bn), tonumber(req.bp))
      local found = bloom_lookup(bloom, fps)
      for j, i in ipairs(where) do present[i] = found[j] end
    end
  end
  c.bloom = bloom
  c.lastmods, c.lastmod_seen = {}, false  -- (sitemap <lastmod>: lua/step_revisit.lua)
  for i, p in ipairs(req.p) do  -- (one the filter has: a known URL)
    if (p[7] or 0) > 0 then c.lastmod_seen = true end
    if (p[7] or 0) > 0 and present[i] then c.lastmods[#c.lastmods + 1] = {p[1], p[7]} end
  end
  if host_max > 0 and #req.p > 0 then
    local hosts = {}
    for i, p in ipairs(req.p) do hosts[i] = p[5] end
    for _, a in ipairs(req.a) do
      local _, _, _, h = st.parse_lease(st.lease_cache[a[1]])
      if h then hosts[#hosts + 1] = h end
    end
    st.prefetch_hostq(hosts)
  end
  local added = {}  -- fingerprints added by this call (two identical links: the second is seen)
  function c.host_full(host)
    return host_max > 0 and host ~= '' and host ~= STAGE_HOST and st.host_count(host) >= host_max
  end
  function c.seen_before(p, i)
    return p[1] ~= '' and (present[i] or added[p[1]] ~= nil)
  end
  -- Entry ids: one INCRBY per call for all of its new entries (unused ids are skipped: ids
  -- only need to be unique and increasing).
  local id_next, id_last = 1, 0
  local function new_id()
    if id_next > id_last then
      local n = math.max(#req.p, 1)
      id_last = redis.call('INCRBY', K.seq, n)
      id_next = id_last - n + 1
    end
    local id = string.format('%015d', id_next)
    id_next = id_next + 1
    return id
  end
  -- Check-and-add p; when new, store it as a queued entry.  Returns its id or nil (seen).
  function c.push(p, index)
    if p[1] ~= '' then
      if c.seen_before(p, index) then
        out.dup = out.dup + 1
        out.pf[index] = 0
        out.pd[#out.pd + 1] = index - 1
        return nil
      end
      local _, full = bloom_mark(bloom, p[1])
      added[p[1]] = true
      if full then out.full = true end
    end
    local id = new_id()
    st.host_add(p[5], 1)
    if p[5] == STAGE_HOST then hincrby(K.stats, 'response_queue_bytes', #p[3]) end
    if p[6] and p[6] > 0 then
      qw.keep_data(id, p[3])  -- a deferred entry keeps its request in `data`
      redis.call('ZADD', K.deferred, c.now + math.floor(p[6]), id .. '|' .. (-p[2]) .. '|' .. p[5])
      due_at(c, c.now + math.floor(p[6]))
    else
      qw.enqueue(id, -p[2], p[5], p[3], false)
    end
    c.size = c.size + 1
    out.new = out.new + 1
    out.pf[index] = 1
    return id
  end
  -- Parked requests go back to the queue, oldest first, while the frontier (and the request's
  -- host) has room; at most `limit` records are looked at per call, and at most 16 of them
  -- (whose host is full) moved to the tail.  A record that cannot be read is dead-lettered,
  -- never dropped.
  function c.resume_parked(limit)
    local n = math.min(limit, redis.call('LLEN', K.parked))
    local rotated = 0
    for _ = 1, n do
      if rotated >= 16 then return end
      if queue_max > 0 and c.size >= queue_max then return end
      local raw = redis.call('LPOP', K.parked)
      if not raw then return end
      local ok, rec = pcall(cmsgpack.unpack, raw)
      if not ok or type(rec) ~= 'table' or type(rec[1]) ~= 'string' or type(rec[2]) ~= 'number'
          or type(rec[3]) ~= 'string' or type(rec[4]) ~= 'string' then
        st.dead_raw('corrupt parked record', raw)
      elseif c.host_full(rec[3]) then
        redis.call('RPUSH', K.parked, raw)  -- its host is full: the next one may go
        rotated = rotated + 1
      else
        local id, host = rec[1], rec[3]
        st.host_add(host, 1)
        if host == STAGE_HOST then hincrby(K.stats, 'response_queue_bytes', #rec[4]) end
        qw.enqueue(id, rec[2], host, rec[4], true)
        c.size = c.size + 1
        out.resumed = out.resumed + 1
      end
    end
  end
  local groups = {}
  c.orphans = false
  for i = 1, #req.a do groups[i] = {} end
  for i, p in ipairs(req.p) do
    out.pf[i] = 0
    if p[4] == 0 then
      c.orphans = true
    else
      local g = groups[p[4]]
      g[#g + 1] = i
    end
  end
  c.groups = groups
end

local function step_push(c)
  Push.prepare(c)
  local out = c.out
  if c.orphans then c.resume_parked(100) end
  for i, p in ipairs(c.req.p) do
    if p[4] == 0 then
      if c.seen_before(p, i) then
        c.push(p, i)  -- a duplicate takes no room: counted as one, never refused
      elseif (c.queue_max > 0 and c.size >= c.queue_max) or c.host_full(p[5]) then
        out.rf[#out.rf + 1] = i - 1
        out.refused = out.refused + 1
      else
        c.push(p, i)
      end
    end
  end
end
