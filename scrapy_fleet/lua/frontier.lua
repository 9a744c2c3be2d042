-- frontier.lua: one round trip of a worker (or of the push helper) with the frontier.
--
-- In one atomic step it: returns the cached reply of a repeated call (op id), moves due
-- deferred entries back to the queue, reclaims expired leases (back to the queue, or to the
-- dead letters after max_leases expiries), releases unstarted requests, dead-letters corrupt
-- ones, extends live leases (heartbeat), frees the host slots of downloads over, pushes new
-- requests through the Bloom filter within the frontier's bounds, acknowledges finished
-- requests (or parks / defers them when their links do not fit), leases up to `take`
-- requests with fresh fencing tokens, tracks fleet idleness, and applies the worker's
-- monitoring.  All times are the Redis server's clock (TIME), in milliseconds.
--
-- Each step is a part of its own (lua/step_*.lua), whose header gives the keys and arguments
-- it uses, what it writes and its bound of work per call; the steps that act on entries run
-- in frontier_steps (lua/frontier_steps.lua), only when the call has work for them; lua/queue.lua owns the queue and
-- the frontier's size, lua/frontier_state.lua the call's leases, slots and per-host counts.
-- K: the call's key names (keys.FRONTIER_CALL declares them, in KEYS order; lua/__init__.py
-- binds them here).
--
-- Per entry (keys/crawl.py has the whole layout):
--   queued:   "<id>\t<payload>" in the LIST of its host and priority (lua/queue.lua)
--   leased:   leases[id] = expiry, lease[id] = "<token>|<score>|<host>\t<worker>" (worker
--             "!worker" once its download is over) + data[id]
--   deferred: `deferred` member "<id>|<score>|<host>" + data[id] (also a new entry pushed with a
--             delay: a request whose origin's robots.txt could not be fetched yet)
--   parked:   one msgpack record [id, score, host, payload] in `parked`, nothing else
--
-- ARGV[1]: msgpack map (frontier/protocol.py, call_args):
--   w worker id ("" for the push helper), lm lease ms, ml max leases, ot op ttl ms,
--   a acks [[id, token[, failure record]]...], r releases [[id, token]...], d dead [[id,
--   token, reason]...], x extends [[id, token]...], s downloads over [[id, token]...],
--   t take, bn bloom capacity, bp bloom error rate, rc reclaim limit, qm frontier size limit
--   (0 none), hm per-host limit (0 none), dd defer delay ms, pt default host interval ms, pb
--   default burst, pc default host concurrency (0 none), pr 1 when pt comes from a rate, ro 1
--   when robots.txt is obeyed, p pushes (lua/step_push.lua), ho / hx lease only from / never
--   from this host (lua/step_lease.lua), fm failed records' cap, wd ms after which a silent
--   lease holder is dead (FLEET_WORKER_DEAD_AFTER; 0 or none: never, lua/step_recover.lua),
--   nw 1 on a worker's first call (its predecessor's leases back), mk the crawl marker this
--   client saw ("" before its first call: the call fails before any write when the marker is
--   gone or another one), mc the marker to write when there is none, ld links left out as
--   known duplicates and bg the filter generation that knowledge is from (lua/step_check.lua);
--   bgp, bgs, bgi, bgb, bgh the crawl's page, seconds, item and byte budgets and every host's
--   page budget (0 or none: no budget; lua/step_budget.lua), bgc 1 at P > 1 with a page
--   budget (the partition leases against its chunk of it: lua/budget_part.lua); gi the crawl's id in its crawl
--   group and gw its weight (none: no group; lua/step_group.lua).
--   An acknowledgement's third element is a failure record ("" for none), its fourth the
--   failure records of requests its callback yielded that the worker could not encode
--   (codec/...); u: records of such requests without a parent (lua/step_ack.lua).
-- ARGV[2] (optional): heartbeat, counter deltas and sampling of lua/monitoring.lua.
-- ARGV[3] (optional): the call's constants, those of ARGV[1]'s fields that a client sends
--   unchanged call after call (lm ml ot bn bp rc qm hm dd pt pb pc ro pr ho hx fm rvm wd, the
--   budgets), as one msgpack map (protocol.py call_argv), checked once per distinct value (lua/step_check.lua);
--   a field of ARGV[1] comes first.  The clients also leave out of ARGV[1] the fields equal
--   to what the script reads for a missing one (empty lists, ld 0, mk "", and mc once mk is
--   given).
-- Reply: msgpack map (frontier/protocol.py, CallResult.from_reply): leased [[id, token,
--   payload, expiries]...], lost [id...], pf [1 new / 0 not new, per push], rf [refused push
--   indexes (0-based)], pd [indexes (0-based) of pushes found in the filter], bg filter
--   generation (when pushes were checked), counts new dup acked released reclaimed dead
--   parked deferred resumed refused, full, now, queued inflight dn (deferred entries now) size idle, holds,
--   pl 1 when the previous call's reply cache was not there, mk the crawl marker, nr ms until
--   the next host may be fetched, rq {stored responses waiting for a parse worker, bytes};
--   bx the crawl's close reason once a budget is spent and nothing is in flight
--   ('budget_pages', 'budget_seconds', 'budget_items', 'budget_bytes', 'budget_hosts');
--   bq (bgc) the pages left in the partition's chunk;
--   nc 1 when the call had no events and cached no reply (lua/step_reply.lua: the client
--   names the same previous op again; such a reply leaves out its empty lists and 0 counts).
--   A call repeated with the same op id returns its cached reply, or runs again when it
--   cached none.
--
-- Bounded work per call: the sum of its steps' bounds (each step's header).

-- (what every call reads first, in one command: its cached reply, the crawl marker, the
-- queued count, since when the fleet is idle, how many URLs are tracked for revisits,
-- before when nothing deferred or leased can be due, the oldest worker's last call, from
-- when liveness counts: lua/step_recover.lua, and the crawl control: lua/step_control.lua)
local head = redis.call('MGET', K.op, K.marker, K.queue_count, K.idle_since,
                        K.revisit_count, K.next_due, K.workers_first, K.alive_from, K.ctl)
if head[1] then
  return head[1]
end
local c, err = check_call(K, head)
if not c then return redis.error_reply(err) end
begin_call(c)
control_read(c)  -- crawl control (issue 34): a paused crawl leases nothing
recover_gap(c)
if call_has_work(c) then
  frontier_steps(c)
  c.ran = true  -- (what the steps may have changed is read again after them)
end
keep_next_due(c)
step_idle(c)
monitor_apply(c.mon, K, c.now, c.worker, c.out.acked + c.out.parked + c.out.deferred,
              c.workers_first)
control_reply(c)
return step_reply(c)
