-- proxies.lua: the fleet's proxy pool (docs/proxies.md).  Every key carries the POOL's hash
-- tag {proxypool:NAME}, never a crawl's: a pool shared by crawls lives in one Redis Cluster
-- slot of its own, and this script touches no other key (the per-site politeness check stays
-- in frontier.lua, keyed by site).  Its first part, lua/proxies_pool.lua, holds the pool's
-- state and the reports; this file the ops.
--
-- KEYS (keys.ProxyPoolKeys.script_keys, then the per-call keys):
--   1 proxies  HASH id -> proxy URL (whole URL, credentials included; id = short hash of it)
--   2 exits    HASH id -> "status|streak|dead_until|probe"  status a (active), d (draining),
--              x (dead fleet-wide); streak = proxy_dead verdicts in a row (any site);
--              dead_until = ms of the next re-check; probe = ticket of the re-check in flight
--   3 removed  HASH id -> ms   removed by a command: FLEET_PROXIES does not bring it back
--   4 live     HASH id -> requests in flight through the exit (tickets not yet reported)
--   5 tat      HASH id -> GCRA theoretical arrival time (ms) of the exit's rate cap
--   6 tickets  ZSET ticket -> expiry (ms): requests in flight (leases on live slots, probes)
--   7 ticket   HASH ticket -> "id|site|kind"  kind 0 plain, 1 site probe, 2 dead re-check
--   8 seq      STRING ticket counter
--   9 sites    HASH site -> last choice (ms)   the sites the pool has served
--  10 stats    HASH pool-wide verdict counters
--  11..       per call: site hashes "site:<site>" (HASH id -> state, below), site orders
--              "order:<site>" (ZSET id -> ms * 1000 + ticket mod 1000 of its last choice, or of
--              the time it may go again: least recently used first) and session keys (STRING
--              id, with a TTL), named by index in ARGV
--
-- Per (exit, site) state, one field per exit in the site's hash:
--   "ok|ban|rl|dead|serr|resp|last|until|pen|probe|fb|lt"
--   counts of each verdict, responses, last choice (ms), cool-down until (ms; 0 none),
--   penalty (exponent of the back-off), probe ticket (0 none), first ban (ms; 0 none), ticket
--   of the last choice (orders choices within one ms).
--
-- ARGV[1]: msgpack map {op, ...}; times are the Redis server's (TIME), in ms.
--   choose  site, sk / ok (KEYS indexes of the site hash and order), ss (session key, 0 none),
--           sttl (session TTL ms), rate (ms between requests per exit, 0 none), conc (in
--           flight per exit, 0 none), ttl (ticket ms), ex (ids of exits that banned or failed
--           this request: chosen only when no other is eligible), only (an exit id: a fleet
--           session's bound exit, issue 32 item 3: that exit or none), rep (reports, applied
--           first), and the report parameters.  Reply {id, url, t (ticket), kind, rebound
--           (old id or '')} or {wait (ms), why ('empty'|'cooling'|'probe'|'caps'|'dead')}, or
--           with `only`, {gone = 'exit_banned'|'exit_dead'|'exit_drained'} when that exit can
--           no longer carry the session's requests to the site: banned for it (a cool-down, or
--           a probe not yet passed; 'exit_dead' when its last verdicts were proxy_dead), dead
--           fleet-wide, drained or removed.  Its caps (concurrency, rate) are a wait.
--   report  rep = list of {t, id, sk, v (ok|ban|rl|dead|serr, or rel: no verdict, only free
--           the ticket), r (1: a response), j (jitter
--           in [0, 1) chosen by the client)}; base / cap (cool-down ms), dead_after (proxy_dead
--           verdicts in a row that mark the exit dead), recheck (ms).  Reply {applied}.
--           Cool-down after a ban or proxy_dead: until = now + j * min(cap, base * 2^pen)
--           ("full jitter", Brooker, AWS Architecture Blog, 2015), pen + 1; an ok lowers pen.
--   seed    add = list of {id, url}, force (1: an admin add, which undoes a remove,
--           re-activates a drained exit and puts it first in the site orders oks).  Reply
--           {added}.
--   remove, drain   ids.  Reply {changed}.
--   reset   ids (empty: all), sks / oks (KEYS indexes of the site hashes to clear and of the
--           site orders to put them first in).  Reply {changed}.
-- No call is retried by the client (redis_client builds clients without retries): a lost
-- choice leaves a ticket that expires; a report is never sent twice.

if req.op == 'report' then
  return cmsgpack.pack({applied = apply_reports(req.rep)})
elseif req.op == 'choose' then
  reap()
  apply_reports(req.rep)
  local site = req.site
  local skey, okey = KEYS[tonumber(req.sk) or 0], KEYS[tonumber(req.ok) or 0]
  if type(site) ~= 'string' or not skey or not okey then
    return redis.error_reply('ERR fleet: choose needs site, sk and ok')
  end
  local rate, conc = tonumber(req.rate) or 0, tonumber(req.conc) or 0
  local n_pool = redis.call('HLEN', PROXIES)
  if n_pool == 0 then
    return cmsgpack.pack({wait = 1000, why = 'empty'})
  end
  -- the site's order holds every exit of the pool (synced after the pool changed)
  if redis.call('ZCARD', okey) ~= n_pool then
    for _, id in ipairs(redis.call('HKEYS', PROXIES)) do
      redis.call('ZADD', okey, 'NX', 0, id)
    end
    for _, id in ipairs(redis.call('ZRANGE', okey, 0, -1)) do
      if redis.call('HEXISTS', PROXIES, id) == 0 then redis.call('ZREM', okey, id) end
    end
  end
  -- eligibility of exit id for this site: kind (0 plain, 1 probe, 2 dead re-check), or nil,
  -- the time (ms) it may become eligible (nil: unknown) and why not
  local function eligible(id)
    local e = split(redis.call('HGET', EXITS, id), 4)
    local status = e[1] or 'a'
    local kind = 0
    if status == 'd' then return nil, now + 3600000, 'empty' end
    if status == 'x' then
      local due = tonumber(e[3]) or 0
      if due > now then return nil, due, 'dead' end
      if ticket_live(tonumber(e[4]) or 0) then return nil, now + 1000, 'dead' end
      kind = 2
    end
    local p = split(redis.call('HGET', skey, id), NFIELDS)
    local until_ms, probe = tonumber(p[UNTIL]) or 0, tonumber(p[PROBE]) or 0
    if until_ms > now then return nil, until_ms, 'cooling' end
    if until_ms > 0 and kind == 0 then
      if ticket_live(probe) then
        return nil, tonumber(redis.call('ZSCORE', TICKETS, probe)), 'probe'
      end
      kind = 1
    end
    if conc > 0 and (tonumber(redis.call('HGET', LIVE, id)) or 0) >= conc then
      return nil, now + 100, 'caps'
    end
    if rate > 0 then
      local tat = tonumber(redis.call('HGET', TAT, id)) or 0
      if tat > now then return nil, tat, 'caps' end
    end
    return kind
  end
  local pick, pick_kind, rebound = nil, 0, ''
  if type(req.only) == 'string' then
    local id = req.only
    if redis.call('HEXISTS', PROXIES, id) == 0 then return cmsgpack.pack({gone = 'exit_drained'}) end
    local e = split(redis.call('HGET', EXITS, id), 4)
    if e[1] == 'd' then return cmsgpack.pack({gone = 'exit_drained'}) end
    if e[1] == 'x' then return cmsgpack.pack({gone = 'exit_dead'}) end
    if (tonumber(split(redis.call('HGET', skey, id), NFIELDS)[UNTIL]) or 0) > 0 then
      return cmsgpack.pack({gone = (tonumber(e[2]) or 0) > 0 and 'exit_dead' or 'exit_banned'})
    end
    local kind, when, why = eligible(id)
    if kind == nil then
      return cmsgpack.pack({wait = math.max(1, (when or now + 100) - now), why = why})
    end
    pick, pick_kind = id, kind
  end
  -- a sticky session keeps its exit while the exit is eligible for the site
  local sesskey = KEYS[tonumber(req.ss) or 0]
  if sesskey and not pick then
    local bound = redis.call('GET', sesskey)
    if bound then
      if redis.call('HEXISTS', PROXIES, bound) == 1 then
        local kind, when, why = eligible(bound)
        if kind ~= nil then
          pick, pick_kind = bound, kind
        elseif why == 'caps' then
          return cmsgpack.pack({wait = math.max(1, (when or now + 100) - now), why = 'caps'})
        end
      end
      if not pick then rebound = bound end
    end
  end
  local wait_until, why = nil, 'empty'
  if not pick then
    -- least recently used first: the order's score is the last choice (ms * 1000 + ticket
    -- mod 1000), or the time an exit that could not go may go again (pushed back lazily, so
    -- a choice visits few exits whatever the pool's size); exits that banned or failed this
    -- request (ex) only when no other is eligible.  Each exit that cannot go is moved behind
    -- once, so the visits of a choice are few on average (exits at their caps stay put)
    local excluded = {}
    for _, id in ipairs(type(req.ex) == 'table' and req.ex or {}) do excluded[id] = true end
    local fallback, fallback_kind = nil, 0
    local pushback, stale = {}, {}
    local rank = 0
    while not pick do
      local batch = redis.call('ZRANGE', okey, rank, rank + 15, 'WITHSCORES')
      if #batch == 0 then break end
      for j = 1, #batch, 2 do
        local id, score = batch[j], tonumber(batch[j + 1])
        local kind, when, reason = nil, nil, nil
        if redis.call('HEXISTS', PROXIES, id) == 0 then
          stale[#stale + 1] = id  -- removed: out of the order (and synced next call)
        else
          kind, when, reason = eligible(id)
        end
        if kind ~= nil then
          if not excluded[id] then
            pick, pick_kind = id, kind
            break
          elseif not fallback then
            fallback, fallback_kind = id, kind
          end
        elseif when ~= nil then
          if wait_until == nil or when < wait_until then
            wait_until, why = when, reason
          end
          if reason ~= 'caps' and reason ~= 'probe' and when * 1000 > score then
            pushback[#pushback + 1] = {when * 1000, id}
          end
        end
      end
      rank = rank + 16
    end
    for _, pb in ipairs(pushback) do redis.call('ZADD', okey, pb[1], pb[2]) end
    for _, id in ipairs(stale) do redis.call('ZREM', okey, id) end
    if not pick and fallback then pick, pick_kind = fallback, fallback_kind end
  end
  if not pick then
    local wait = wait_until and math.max(1, wait_until - now) or 1000
    return cmsgpack.pack({wait = wait, why = why})
  end
  local id = pick
  local t = redis.call('INCR', SEQ)
  redis.call('ZADD', TICKETS, now + (tonumber(req.ttl) or 240000), t)
  redis.call('HSET', TICKET, t, id .. '|' .. site .. '|' .. pick_kind)
  redis.call('HINCRBY', LIVE, id, 1)
  if rate > 0 then
    local tat = tonumber(redis.call('HGET', TAT, id)) or 0
    redis.call('HSET', TAT, id, math.max(tat, now) + rate)
  end
  redis.call('ZADD', okey, now * 1000 + (t % 1000), id)
  local s = site_state(skey, id)
  s[LAST] = now
  s[LT] = t
  if pick_kind == 1 then s[PROBE] = t; hincrby(STATS, 'probes', 1) end
  site_store(skey, id, s)
  if pick_kind == 2 then
    local e = exit_state(id)
    e[4] = t
    exit_store(id, e)
    hincrby(STATS, 'rechecks', 1)
  end
  redis.call('HSET', SITES, site, now)
  if sesskey then
    redis.call('SET', sesskey, id, 'PX', tonumber(req.sttl) or 600000)
    if rebound ~= '' then hincrby(STATS, 'rebound', 1) end
  end
  return cmsgpack.pack({id = id, url = redis.call('HGET', PROXIES, id), t = t, kind = pick_kind,
                        rebound = rebound})
elseif req.op == 'seed' then
  local added = 0
  for _, pair in ipairs(req.add or {}) do
    local id, url = pair[1], pair[2]
    if type(id) == 'string' and type(url) == 'string' then
      if tonumber(req.force) == 1 then
        redis.call('HDEL', REMOVED, id)
        for _, ix in ipairs(req.oks or {}) do
          local okey = KEYS[tonumber(ix) or 0]
          if okey then redis.call('ZADD', okey, 0, id) end
        end
        local e = exit_state(id)
        if e and e[1] == 'd' then e[1] = 'a'; exit_store(id, e); added = added + 1 end
      end
      if redis.call('HEXISTS', REMOVED, id) == 0 and redis.call('HSETNX', PROXIES, id, url) == 1 then
        redis.call('HSETNX', EXITS, id, 'a|0|0|0')
        added = added + 1
      end
    end
  end
  return cmsgpack.pack({added = added})
elseif req.op == 'remove' or req.op == 'drain' then
  local changed = 0
  for _, id in ipairs(req.ids or {}) do
    if redis.call('HEXISTS', PROXIES, id) == 1 then
      changed = changed + 1
      if req.op == 'remove' then
        redis.call('HDEL', PROXIES, id)
        redis.call('HDEL', EXITS, id)
        redis.call('HDEL', TAT, id)
        redis.call('HSET', REMOVED, id, now)
      else
        local e = exit_state(id) or {'a', 0, 0, 0}
        e[1] = 'd'
        exit_store(id, e)
      end
    end
  end
  return cmsgpack.pack({changed = changed})
elseif req.op == 'reset' then
  local ids = req.ids
  if type(ids) ~= 'table' or #ids == 0 then ids = redis.call('HKEYS', PROXIES) end
  local changed = 0
  for _, id in ipairs(ids) do
    if redis.call('HEXISTS', PROXIES, id) == 1 then
      changed = changed + 1
      redis.call('HSET', EXITS, id, 'a|0|0|0')
      for _, ix in ipairs(req.sks or {}) do
        local key = KEYS[tonumber(ix) or 0]
        if key then redis.call('HDEL', key, id) end
      end
      for _, ix in ipairs(req.oks or {}) do
        local okey = KEYS[tonumber(ix) or 0]
        if okey then redis.call('ZADD', okey, 0, id) end
      end
    end
  end
  return cmsgpack.pack({changed = changed})
end
return redis.error_reply('ERR fleet: unknown proxy pool op ' .. req.op)
