-- step_ack.lua: acknowledgements of finished requests, each with its links (req.p entries of
-- group k: the links of the k-th acknowledgement).  Defines one local, step_ack.
--
-- The links of a finished request are pushed with its acknowledgement (lua/step_push.lua's
-- c.push), at most max(room + 1, 1) of them (the + 1 is the request's own slot, which it gives
-- up when it is done; the same holds for its host's count).  When some new links are left
-- over, the request is *parked*: it leaves the size and its host's count, and waits in the
-- compact K.parked list (one msgpack record [id, score, host, payload] per request, no other
-- key) until there is room; then it returns to the queue, is fetched again, and pushes the
-- rest of its links.  Every fetch thus either completes its request or discovers at least one
-- new page, so a bounded crawl always ends, with at most twice the fetches of an unbounded
-- one.  When no link could be pushed (every link's host is full), the request is deferred
-- (K.deferred, for c.defer_ms).  An acknowledgement whose lease was lost (stale token) is
-- reported in out.lost: another worker fetches the request again.  An acknowledgement may
-- carry a third element, the failure record of a request that failed for good ("" for
-- none): recorded with it (lua/failed.lua, req.fm the records' cap); and a fourth, the
-- failure records of requests its callback yielded that the worker could not encode
-- (codec/...): recorded under "<entry id>/<n>" with the acknowledged request as their
-- request (a retry fetches it again, to yield them again), counted in failed and
-- unstorable.  req.u: records of such requests without a parent, recorded under "u<seq>"
-- without a request (they cannot be retried).
-- Partitions (docs/partitions.md): an acknowledgement whose fifth element is 1 is deferred
-- (as above) without pushing its links: a link of it for another partition was refused there.
-- A sixth, the recrawl record (lua/step_revisit.lua).
-- Keys (of K): data, parked, deferred, failed, failed_at, failed_by, seq, and the queue's, the
-- state's and the filter's.  Writes: those, and the counters of the call.
-- Work per call: one pass over the acknowledgements and their links; one RPUSH and one ZADD
-- per 4000 parked / deferred; resumes parked requests once (lua/step_push.lua); the filter's
-- and the queue's writes are flushed here.

local function step_ack(c)
  local K, req, st, qw, out, count = c.K, c.req, c.st, c.qw, c.out, c.count
  local queue_max, now = c.queue_max, c.now
  local parked_recs, deferred_members = {}, {}
  for k, a in ipairs(req.a) do
    local score = st.holds(a[1], a[2])
    if not score then
      -- the lease was lost: another worker fetches this request again and pushes its links
      out.lost[#out.lost + 1] = a[1]
      count('stale_acks', 1)
    else
      local allowed = 1e15
      if queue_max > 0 then
        allowed = math.max(queue_max - c.size + 1, 1)
      end
      local _, _, _, own_host = st.parse_lease(st.lease_value(a[1]))
      local _, own = st.drop_lease(a[1])
      own_host = own_host or own
      -- the request's place in its own host's count is given up too: one link of that host
      -- may take it even when the host is full
      local own_slot = own_host ~= ''
      local pushed, left_over = 0, false
      local defer = a[5] == 1  -- (partitions: a foreign link was refused)
      if defer then left_over = true end
      for _, i in ipairs(defer and {} or c.groups[k]) do
        local p = req.p[i]
        local use_own = own_slot and p[5] == own_host and c.host_full(p[5])
        if pushed >= allowed or (c.host_full(p[5]) and not use_own) then
          if not left_over and not c.seen_before(p, i) then left_over = true end
        else
          if c.push(p, i) then
            pushed = pushed + 1
            if use_own then own_slot = false end
          end
        end
      end
      if not left_over then
        if (a[3] and a[3] ~= '') or a[4] then
          -- failed for good: recorded with its acknowledgement (lua/failed.lua)
          local data = redis.call('HGET', K.data, a[1])
          if a[3] and a[3] ~= '' then
            local _, trimmed = failed_record(K, a[1], a[3], data, now, tonumber(req.fm) or 0)
            count('failed', 1)
            count('failed_trimmed', trimmed)
          end
          for j, raw in ipairs(a[4] or {}) do  -- links it yielded that could not be stored
            local _, trimmed = failed_record(K, a[1] .. '/' .. j, raw, data, now,
                                             tonumber(req.fm) or 0)
            count('failed', 1)
            count('unstorable', 1)
            count('failed_trimmed', trimmed)
          end
        end
        st.leave(a[1], own_host)
        c.size = c.size - 1
        out.acked = out.acked + 1
        revisit_ack(c, a)  -- recrawl (issue 22): tracked / rescheduled / dropped
      elseif pushed > 0 then
        -- park: out of the size and of its host's count, back in the queue when there is room
        local data = redis.call('HGET', K.data, a[1]) or ''
        parked_recs[#parked_recs + 1] = cmsgpack.pack({a[1], tonumber(score) or 0, own_host,
                                                       data})
        st.forget(a[1], own_host)
        out.parked = out.parked + 1
        c.size = c.size - 1
      else
        -- nothing could be pushed (every link's host is full): fetch it again later
        deferred_members[#deferred_members + 1] = now + c.defer_ms
        deferred_members[#deferred_members + 1] = a[1] .. '|' .. score .. '|' .. own_host
        out.deferred = out.deferred + 1
        if own_host == STAGE_HOST then st.stage_deferred(a[1], 1) end
      end
    end
  end
  -- requests without a parent the worker could not encode: recorded without a request
  for _, raw in ipairs(req.u or {}) do
    local id = 'u' .. string.format('%015d', redis.call('INCR', K.seq))
    local _, trimmed = failed_record(K, id, raw, '', now, tonumber(req.fm) or 0)
    count('failed', 1)
    count('unstorable', 1)
    count('failed_trimmed', trimmed)
  end
  if #parked_recs > 0 then call_many('RPUSH', K.parked, parked_recs, 4000) end
  if #deferred_members > 0 then
    call_many('ZADD', K.deferred, deferred_members, 4000)
    due_at(c, now + c.defer_ms)
  end
  c.resume_parked(100)  -- the slots freed above (and any room found now) go to parked ones first
  if c.bloom ~= nil then
    bloom_flush(c.bloom)
    out.bg = c.bloom.gen
  end
  revisit_lastmod_step(c)  -- sitemap <lastmod> (issue 22): known URLs made due at once
  qw.flush()
  revisit_flush(c)  -- recrawl (issue 22)
  st.settle_slots()
  count('acked', out.acked)
  count('pushed', out.new)
  count('duplicates', out.dup + c.local_dups)
  count('parked', out.parked)
  count('deferred', out.deferred)
  count('resumed', out.resumed)
  count('refused', out.refused)
end
