-- sessions.lua: session records and pools (issue 32 item 2 and 4, sessions/pool.py,
-- docs/sessions.md).  One entry, several operations (ARGV[1]); every one is atomic.
--
-- KEYS[1] pools (SET of pool names), KEYS[2] the pool (ZSET session id -> uses, the drawable
--   sessions), KEYS[3] the pool's counters (HASH: next, created, logins, check_failed,
--   retired:<reason>), KEYS[4] the record of the session the operation is about (HASH, see
--   keys/crawl.py; draw: any key of the crawl, unused), KEYS[5] that session's cookie jar (claim
--   deletes it: a new login starts from an empty jar; else unused), KEYS[6] that session's
--   slots (ZSET ticket -> expiry ms: its requests in flight; take/give, else unused).
-- Records of the sessions a draw creates or looks at are named ARGV[4] .. id (keys/crawl.py
--   CrawlKeys.session_prefix: the same hash tag as KEYS).
-- State of a record: new (never logged in), relogin (its login is no longer valid), active,
--   retired (never drawn again: it left the pool's ZSET).  Without a login (ARGV login 0)
--   a session is created active at generation 1; with one, new at generation 0, and each
--   login that succeeds makes it active at the next generation.
--
-- Operations (ARGV after the name) and replies:
-- Slot arguments (SLOT below: politeness per session, issue 32 item 5), six ARGV that draw,
--   pin and take end with so that one call also does the slot work of the request:
--   slots_prefix (the slot ZSET of session ID is slots_prefix .. ID, keys.py
--   CrawlKeys.session_slots_prefix: the same hash tag as KEYS), gives (slots to free first,
--   "<id>|<ticket>" separated by spaces: the answers this worker got since its last call),
--   ticket ("" none: nothing taken), concurrency, delay_ms, ttl_ms (see take).  Absent:
--   nothing freed or taken.
--
--   draw pool pool_part prefix size max_uses max_age_ms login max_idle_ms [SLOT]
--     fills the pool up to `size` drawable sessions, then takes the least used one (ties:
--     the smallest id) and counts one use -> {id, state, generation, exit, slot, wait_ms}:
--     slot 'taken' (the session is active and its slot is the ticket's), 'wait' (it is
--     active and its slot is not free: wait_ms, as take's) or '' (no ticket, or not
--     active: nothing taken).  The one taken is
--     retired and replaced first when it is past max_uses uses, max_age_ms of age or
--     max_idle_ms since its last use (or its creation; 0: no limit), so a session past a limit is retired when it comes up (a pinned one: at once).
--     Work: O(1) records, O(size) when sessions are created or retired.
--   pin id max_uses max_age_ms max_idle_ms [SLOT] -> {state, generation, exit, slot, wait_ms}
--     of session `id` (one use counted, and with SLOT a slot taken as draw's; unless it is
--     retired, or retired now by the limits: {'retired', generation}), {'unknown', 0} when
--     there is no record.
--   state id -> {state, generation, owner alive 0/1, exit} (read-only).
--   claim id worker lease_ms -> {'claimed', generation} when the session needs a login
--     (new/relogin) and nobody holds a live claim on it: the caller runs it (single flight:
--     the claim lasts lease_ms, a dead claimer's claim runs out); {'wait', g} while another
--     holds it (the caller too: a worker runs one login of a session at a time); {state, g}
--     otherwise.
--   done id worker ok reason -> the claimer's login is over: ok 1 makes the session active
--     at generation + 1 (counts a login) -> {'active', generation, exit}; ok 0 retires it
--     with `reason`.  {'lost', g} when
--     the caller no longer holds the claim (it ran out and was taken): nothing written.
--   relogin id generation max_errors -> a response of `generation` failed the validity check:
--     if that is still the session's generation and it is active, it needs a login again
--     (errors + 1, check_failed + 1; retired with reason 'check' at max_errors errors, 0: no
--     limit).  -> {state, generation} after.  An older generation changes nothing.
--   ok id generation -> a response of the current generation passed the check: errors = 0.
--   retire id reason -> retires the session (once: a retired one is left as it is) -> 1/0.
--   take id ticket concurrency delay_ms ttl_ms [slots_prefix gives] -> a slot for one
--     request of the session (the slots in `gives` freed first)
--     (issue 32 item 5): {'taken', generation} when fewer than `concurrency` (0: no cap) of
--     its tickets are live and its delay allows (GCRA with a burst of one, as in hosts.lua:
--     ATM Forum Traffic Management 4.1; tat = max(tat, now) + delay); the ticket
--     lives ttl_ms (a dead worker's runs out: lease loss).  {'wait', ms} (a hint: until its
--     delay allows, or the first ticket runs out) or {state, generation} for a retired or
--     unknown session: nothing taken.
--   give id ticket -> the ticket's slot is free again -> 1/0 (it had run out or was given).
--   gives slots_prefix gives -> frees the slots in `gives` (as SLOT's) -> how many were held.
--   bind id exit -> binds the session to proxy exit `exit` (issue 32 item 3) unless it is
--     bound already: the first binding wins and is never changed (a session whose exit can
--     no longer carry it is retired, exit_banned/exit_dead/exit_drained, not re-bound)
--     -> {state, generation, the exit it is bound to}; a retired session is not bound.

local op = ARGV[1]
local pools, pool, info, rec, jar = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local now = server_now_ms()

local function retire(key, id, reason)
  if redis.call('HGET', key, 'state') == 'retired' then return 0 end
  redis.call('HSET', key, 'state', 'retired', 'reason', reason, 'retired_at', now,
             'owner', '', 'owner_until', 0)
  redis.call('ZREM', pool, id)
  redis.call('HINCRBY', info, 'retired:' .. reason, 1)
  return 1
end

-- retires session `id` (record `key`) if it is past a limit; 1 when it did
-- the limit session `id` (HMGET uses, created, last_used: r) is past, or nil
local function limit_of(r, max_uses, max_age, max_idle)
  if max_uses > 0 and (tonumber(r[1]) or 0) >= max_uses then return 'uses' end
  local created = tonumber(r[2]) or now
  if max_age > 0 and created + max_age <= now then return 'age' end
  local last = tonumber(r[3]) or 0
  if max_idle > 0 and math.max(last, created) + max_idle <= now then return 'idle' end
  return nil
end

local function past_limits(key, id, max_uses, max_age, max_idle)
  local reason = limit_of(redis.call('HMGET', key, 'uses', 'created', 'last_used'), max_uses,
                          max_age, max_idle)
  if reason then return retire(key, id, reason) end
  return 0
end

-- frees the slots named in `list` ("<id>|<ticket>" separated by spaces) -> how many were
-- held (the others had run out or were freed before)
local function give_all(prefix, list)
  local n = 0
  for slot in string.gmatch(list or '', '%S+') do
    local sid, ticket = string.match(slot, '^([^|]+)|(.+)$')
    if sid then n = n + redis.call('ZREM', prefix .. sid, ticket) end
  end
  return n
end

-- takes a slot of session record `key` (slots ZSET `slots`) for `ticket` (see take) ->
-- 'taken', 0 or 'wait', ms.  Expired tickets (a dead worker's) are dropped when they would
-- stand in the way: the ZSET holds at most `conc` of them, and no key TTL is needed (the
-- ZSET is gone when its last ticket is given back; purge deletes a dead worker's leftover
-- with the crawl's records).  Without a cap (conc 0) no ticket is kept.
local function take_slot(key, slots, ticket, conc, delay, ttl)
  if conc > 0 and redis.call('ZCARD', slots) >= conc then
    redis.call('ZREMRANGEBYSCORE', slots, '-inf', now)
    if redis.call('ZCARD', slots) >= conc then
      local first = redis.call('ZRANGE', slots, 0, 0, 'WITHSCORES')
      return 'wait', math.max(1, math.min(tonumber(first[2]) - now, 1000))
    end
  end
  if delay > 0 then
    local tat = tonumber(redis.call('HGET', key, 'tat')) or 0
    if tat > now then return 'wait', tat - now end
    redis.call('HSET', key, 'tat', now + delay)
  end
  if conc > 0 then
    redis.call('ZADD', slots, now + ttl, ticket)
  end
  return 'taken', 0
end

local function use(key, id)
  redis.call('ZINCRBY', pool, 1, id)
  redis.call('HINCRBY', key, 'uses', 1)
  redis.call('HSET', key, 'last_used', now)
end

if op == 'draw' then
  local name, part, prefix = ARGV[2], ARGV[3], ARGV[4]
  local size, max_uses, max_age = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
  local login, max_idle = ARGV[8] == '1', tonumber(ARGV[9]) or 0
  if not (size and size >= 1 and max_uses and max_age) then
    return redis.error_reply('ERR fleet: bad session draw arguments')
  end
  local function create()
    local id = part .. '-' .. redis.call('HINCRBY', info, 'next', 1)
    redis.call('HSET', prefix .. id, 'pool', name, 'state', login and 'new' or 'active',
               'reason', '', 'uses', 0, 'errors', 0, 'created', now, 'last_used', 0,
               'generation', login and 0 or 1, 'exit', '', 'owner', '', 'owner_until', 0)
    redis.call('ZADD', pool, 0, id)
    redis.call('HINCRBY', info, 'created', 1)
  end
  if ARGV[10] then give_all(ARGV[10], ARGV[11]) end
  local have = redis.call('ZCARD', pool)
  if have < size then
    redis.call('SADD', pools, name)
    for _ = have + 1, size do create() end
  end
  -- the least used; one past a limit is retired and replaced, and the next least used
  -- looked at (a pool of `size` holds at most `size` such sessions)
  for _ = 0, size do
    local id = redis.call('ZRANGE', pool, 0, 0)[1]
    local key = prefix .. id
    local r = redis.call('HMGET', key, 'state', 'generation', 'uses', 'created', 'exit',
                         'last_used')
    local reason = limit_of({r[3], r[4], r[6]}, max_uses, max_age, max_idle)
    if not reason then
      use(key, id)
      local slot, wait = '', 0
      if ARGV[10] and ARGV[12] ~= '' and r[1] == 'active' then
        slot, wait = take_slot(key, ARGV[10] .. id, ARGV[12], tonumber(ARGV[13]) or 1,
                               tonumber(ARGV[14]) or 0, tonumber(ARGV[15]) or 240000)
      end
      return {id, r[1], tonumber(r[2]), r[5] or '', slot, wait}
    end
    retire(key, id, reason)
    create()
  end
  return redis.error_reply('ERR fleet: no session to draw')
end

if op == 'gives' then return give_all(ARGV[2], ARGV[3]) end

local id = ARGV[2]
if op == 'take' and ARGV[7] then give_all(ARGV[7], ARGV[8]) end
if op == 'pin' and ARGV[6] then give_all(ARGV[6], ARGV[7]) end
local r = redis.call('HMGET', rec, 'state', 'generation', 'owner', 'owner_until', 'exit')
local state, gen, bound = r[1], tonumber(r[2]) or 0, r[5] or ''
if not state then return {'unknown', 0} end

if op == 'pin' then
  if state ~= 'retired' and past_limits(rec, id, tonumber(ARGV[3]), tonumber(ARGV[4]),
                                       tonumber(ARGV[5]) or 0) == 0 then
    use(rec, id)
    local slot, wait = '', 0
    if ARGV[6] and ARGV[8] ~= '' and state == 'active' then
      slot, wait = take_slot(rec, ARGV[6] .. id, ARGV[8], tonumber(ARGV[9]) or 1,
                             tonumber(ARGV[10]) or 0, tonumber(ARGV[11]) or 240000)
    end
    return {state, gen, bound, slot, wait}
  end
  return {'retired', gen}
elseif op == 'state' then
  return {state, gen, (r[3] ~= '' and (tonumber(r[4]) or 0) > now) and 1 or 0, bound}
elseif op == 'claim' then
  if state ~= 'new' and state ~= 'relogin' then return {state, gen} end
  if r[3] ~= '' and (tonumber(r[4]) or 0) > now then return {'wait', gen} end
  redis.call('HSET', rec, 'owner', ARGV[3], 'owner_until', now + tonumber(ARGV[4]))
  redis.call('DEL', jar)
  return {'claimed', gen}
elseif op == 'done' then
  if r[3] ~= ARGV[3] or state == 'retired' then return {'lost', gen} end
  if ARGV[4] == '1' then
    redis.call('HSET', rec, 'state', 'active', 'generation', gen + 1, 'owner', '',
               'owner_until', 0, 'last_login', now)
    redis.call('HINCRBY', info, 'logins', 1)
    return {'active', gen + 1, bound}
  end
  retire(rec, id, ARGV[5])
  return {'retired', gen}
elseif op == 'relogin' then
  if state ~= 'active' or gen ~= tonumber(ARGV[3]) then return {state, gen} end
  local errors = redis.call('HINCRBY', rec, 'errors', 1)
  redis.call('HINCRBY', info, 'check_failed', 1)
  local max_errors = tonumber(ARGV[4]) or 0
  if max_errors > 0 and errors >= max_errors then
    retire(rec, id, 'check')
    return {'retired', gen}
  end
  redis.call('HSET', rec, 'state', 'relogin')
  return {'relogin', gen}
elseif op == 'ok' then
  if gen ~= tonumber(ARGV[3]) then return 0 end
  redis.call('HSET', rec, 'errors', 0)
  return 1
elseif op == 'retire' then
  return retire(rec, id, ARGV[3])
elseif op == 'take' then
  if state == 'retired' then return {state, gen} end
  local slot, wait = take_slot(rec, KEYS[6], ARGV[3], tonumber(ARGV[4]) or 1,
                              tonumber(ARGV[5]) or 0, tonumber(ARGV[6]) or 240000)
  if slot == 'wait' then return {'wait', wait} end
  return {'taken', gen}
elseif op == 'give' then
  return redis.call('ZREM', KEYS[6], ARGV[3])
elseif op == 'bind' then
  if state == 'retired' or bound ~= '' then return {state, gen, bound} end
  if (ARGV[3] or '') == '' then return redis.error_reply('ERR fleet: bind needs an exit') end
  redis.call('HSET', rec, 'exit', ARGV[3], 'bound_at', now)
  return {state, gen, ARGV[3]}
end
return redis.error_reply('ERR fleet: unknown sessions operation ' .. tostring(op))
