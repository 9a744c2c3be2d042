-- Scalable Bloom filter on plain Redis strings (no module needed).
--
-- Library part: scripts.py prepends this file to the entry scripts that use it
-- (frontier.lua, bloom_add.lua); it defines locals only.
--
-- Follows P. S. Almeida, C. Baquero, N. Preguica, D. Hutchison, "Scalable Bloom Filters",
-- Information Processing Letters 101 (2007): slice i holds n0 * 2^i fingerprints at error
-- rate p * 2^-i (growth s = 2, tightening r = 1/2), so the compound false-positive rate is
-- p while slice 0 is not full and stays below p / (1 - r) = 2p however far the filter grows.
-- Bits per slice m = ceil(-n ln p / ln(2)^2), hash functions k = ceil(-log2 p) (the optimum
-- for a classic Bloom filter), bit positions by double hashing h1 + i*h2 mod m
-- (Kirsch & Mitzenmacher, "Less Hashing, Same Performance", 2006).
--
-- A fingerprint argument is 12 bytes of a uniform hash (the client hashes Scrapy's request
-- fingerprint with BLAKE2b).  Two layouts of the k bits (meta field v):
--   v = 2 (every filter created now whose first slice has one block at least): *blocked*
--     (F. Putze, P. Sanders, J. Singler, "Cache-, Hash- and Space-Efficient Bloom Filters",
--     WEA 2007): a slice is m bits cut into floor(m / 4096) blocks of BLOCK_BITS (the last
--     m mod 4096 bits stay unused: the same memory as before), the first 48-bit half
--     of the fingerprint picks the block (h1 mod blocks), and the k bits lie in that block,
--     by double hashing in it: (a + i*b) mod 4096, a = bytes 7-9 and b = bytes 10-12 of the
--     fingerprint (mod 4096, b made odd so that the k positions differ).  One GETRANGE of
--     512 bytes reads all k bits of a fingerprint (the bit-by-bit reads cost ~0.3 µs a bit:
--     ten times that per fingerprint).  At m/n = 14.4 bits (p = 0.001, k = 10) the rate is
--     0.107 % instead of 0.100 % (Poisson over the block's load, as in Putze et al.) in the
--     same memory.
--   v = 1 or absent (filters written before): bit positions h1 + i*h2 mod m over the whole
--     slice (Kirsch & Mitzenmacher, "Less Hashing, Same Performance", 2006), h1 and h2 the two
--     48-bit halves; read with BITFIELD GETs.  Such a filter keeps its layout until purged.
-- Every product stays under 2^53: double arithmetic is exact.
--
-- Metadata hash (KEY meta): n0, p, slices, c0..cN (fingerprints added to each slice), v (the
-- layout), g (the filter's generation id: set when the filter is created, so a worker that
-- caches which fingerprints are in the filter knows when a purge made a new one).
--
-- Cost per call: one HMGET, then per fingerprint one GETRANGE per slice until found (v 2;
-- v 1: one BITFIELD_RO per slice for the whole call), one BITFIELD for all the adds of a
-- slice, and one HINCRBY of its count: bloom_lookup, bloom_mark (adds), bloom_flush (writes).

local LN2SQ = math.log(2) * math.log(2)
-- BITFIELD subcommands per command (GET takes 3 arguments, SET 4; Lua's unpack stops near
-- 8000 values)
local BITFIELD_CHUNK = 1500
local BLOCK_BITS = 4096
local BLOCK_BYTES = 512
local BIT_MASK = {128, 64, 32, 16, 8, 4, 2, 1}  -- bit j of a byte, j = 0 the first (Redis order)

local function bloom_slice_params(n0, p, i)
  local n = n0 * (2 ^ i)
  local pi = p * (0.5 ^ i)
  local m = math.ceil(-n * math.log(pi) / LN2SQ)
  local k = math.ceil(-math.log(pi) / math.log(2))
  return n, m, k
end

-- Returns a bloom state table: meta and slice keys, n0, p, count (slices in use), gen (the
-- filter's generation id, nil until the first add of a filter written before ids existed),
-- params[s] = {n, m, k} of slice s (computed once per call), and the bits to set, per slice.
-- Initialises nothing: an absent filter is created by its first add, with (n0, p); an
-- existing filter keeps its own parameters.
local function bloom_open(meta_key, slice_keys, n0, p)
  local stored = redis.call('HMGET', meta_key, 'n0', 'p', 'slices', 'g', 'v')
  local state = {meta = meta_key, keys = slice_keys, params = {}, sets = {}, adds = {},
                 counts = {}}
  if stored[1] then
    state.n0 = tonumber(stored[1])
    state.p = tonumber(stored[2])
    state.count = tonumber(stored[3])
    state.gen = stored[4] or nil
    state.v = tonumber(stored[5]) or 1
  else
    state.n0 = n0
    state.p = p
    state.count = 0
    -- blocked, unless the first slice is smaller than one block (tiny test filters)
    local _, m0 = bloom_slice_params(n0, p, 0)
    state.v = (m0 >= BLOCK_BITS) and 2 or 1
  end
  return state
end

local function bloom_params(state, s)
  local pr = state.params[s]
  if pr == nil then
    local n, m, k = bloom_slice_params(state.n0, state.p, s)
    pr = {n, m, k, math.floor(m / BLOCK_BITS)}  -- (blocks: the last m mod 4096 bits unused)
    state.params[s] = pr
  end
  return pr
end

-- Bit offsets of fp in slice s, appended to out from index at + 1 (returns the new last
-- index): double hashing h1 + i*h2 mod m with the 48-bit halves of fp, so every product
-- stays under 2^53 and double arithmetic is exact.  With prefix (e.g. {'GET', 'u1'}) each
-- offset is preceded by its items: the arguments of a BITFIELD command.
local function bloom_offsets(state, fp, s, out, at, prefix, suffix)
  local pr = state.params[s] or bloom_params(state, s)
  local m, k = pr[2], pr[3]
  local a, b, c, d, e, f = string.byte(fp, 1, 6)
  local h1 = ((((a * 256 + b) * 256 + c) * 256 + d) * 256 + e) * 256 + f
  a, b, c, d, e, f = string.byte(fp, 7, 12)
  local x, step, base
  if state.v == 2 then
    base = (h1 % pr[4]) * BLOCK_BITS
    x = ((a * 256 + b) * 256 + c) % BLOCK_BITS
    step = ((d * 256 + e) * 256 + f) % BLOCK_BITS
    if step % 2 == 0 then step = step + 1 end
    m = BLOCK_BITS
  else
    base = 0
    x = h1 % m
    step = (((((a * 256 + b) * 256 + c) * 256 + d) * 256 + e) * 256 + f) % m
  end
  for _ = 1, k do
    if prefix then
      out[at + 1] = prefix[1]
      out[at + 2] = prefix[2]
      at = at + 2
    end
    at = at + 1
    out[at] = base + x
    if suffix then
      at = at + 1
      out[at] = suffix
    end
    x = x + step
    if x >= m then x = x - m end
  end
  return at
end

local GET_U1 = {'GET', 'u1'}
local SET_U1 = {'SET', 'u1'}

-- Which of fps (a list of 12-byte strings) are in the filter (as it was before this call's
-- adds)?  Returns a list of booleans.  Blocked layout: one GETRANGE of the fingerprint's
-- block per slice.  Previous layout: all the bits one slice needs for the whole list, read
-- with BITFIELD_RO GETs, BITFIELD_CHUNK per command.  A fingerprint found in a slice is not
-- looked up in the next ones.
local function bloom_lookup_blocked(state, fps, present)
  local band = bit.band
  local floor = math.floor
  local offs = {}
  for s = 0, state.count - 1 do
    local pr = bloom_params(state, s)
    local k, key = pr[3], state.keys[s + 1]
    local any = false
    for i = 1, #fps do
      if not present[i] then
        any = true
        local at = bloom_offsets(state, fps[i], s, offs, 0)
        local first = floor(offs[1] / BLOCK_BITS) * BLOCK_BITS
        local start = first / 8
        local blk = redis.call('GETRANGE', key, start, start + BLOCK_BYTES - 1)
        local all = true
        for j = 1, at do
          local o = offs[j] - first
          local byte = string.byte(blk, floor(o / 8) + 1)
          if not byte or band(byte, BIT_MASK[o % 8 + 1]) == 0 then
            all = false
            break
          end
        end
        if all then present[i] = true end
      end
    end
    if not any then break end
  end
  return present
end

local function bloom_lookup(state, fps)
  local present = {}
  local n = #fps
  for i = 1, n do present[i] = false end
  if state.v == 2 then return bloom_lookup_blocked(state, fps, present) end
  for s = 0, state.count - 1 do
    local k = bloom_params(state, s)[3]
    local todo, nt = {}, 0
    for i = 1, n do
      if not present[i] then
        nt = nt + 1
        todo[nt] = i
      end
    end
    if nt == 0 then break end
    local per_call = math.max(1, math.floor(BITFIELD_CHUNK / k))
    for from = 1, nt, per_call do
      local to = math.min(nt, from + per_call - 1)
      local args, at = {}, 0
      for j = from, to do
        at = bloom_offsets(state, fps[todo[j]], s, args, at, GET_U1)
      end
      local bits = redis.call('BITFIELD_RO', state.keys[s + 1], unpack(args, 1, at))
      local bi = 0
      for j = from, to do
        local all = true
        for q = bi + 1, bi + k do
          if bits[q] == 0 then
            all = false
            break
          end
        end
        bi = bi + k
        if all then present[todo[j]] = true end
      end
    end
  end
  return present
end

-- Slices are created at their full size: growing a string bit by bit makes Redis
-- over-allocate (up to +1 MB, or x2 below 1 MB).  Larger slices than PREALLOC_MAX bytes are
-- left to grow (building the zero string would cost the script that much memory), and no
-- slice may pass Redis's largest bit offset, 2^32 - 1.
local PREALLOC_MAX = 64 * 1024 * 1024
local MAX_BITS = 4294967296

local function bloom_create_slice(state, s)
  local m = bloom_params(state, s)[2]
  local bytes = math.ceil(m / 8)
  if bytes <= PREALLOC_MAX and redis.call('EXISTS', state.keys[s + 1]) == 0 then
    redis.call('SET', state.keys[s + 1], string.rep('\0', bytes))
  end
end

-- A new generation id: the server's TIME in microseconds (calls never share one).
local function bloom_new_gen()
  local t = redis.call('TIME')
  return t[1] .. string.format('%06d', tonumber(t[2]))
end

-- Add fp, known to be absent (bloom_lookup, and not added earlier in this call), to the
-- current slice; its bits are written by bloom_flush.  Returns true as a second value when
-- the filter has reached its last slice.
local function bloom_mark(state, fp)
  if state.count == 0 then
    state.count = 1
    state.gen = bloom_new_gen()
    redis.call('HSET', state.meta, 'n0', state.n0, 'p', state.p, 'slices', 1, 'g', state.gen,
               'v', state.v)
    bloom_create_slice(state, 0)
  elseif state.gen == nil then
    state.gen = bloom_new_gen()  -- a filter of the previous format: give it an id now
    redis.call('HSET', state.meta, 'g', state.gen)
  end
  local s = state.count - 1
  if state.counts[s] == nil then
    state.counts[s] = tonumber(redis.call('HGET', state.meta, 'c' .. s)) or 0
  end
  local sets = state.sets[s]
  if sets == nil then
    sets = {n = 0}
    state.sets[s] = sets
  end
  sets.n = bloom_offsets(state, fp, s, sets, sets.n, SET_U1, 1)
  state.adds[s] = (state.adds[s] or 0) + 1
  local full = false
  if state.counts[s] + state.adds[s] >= bloom_params(state, s)[1] then
    local next_m = bloom_params(state, state.count)[2]
    if state.count < #state.keys and next_m <= MAX_BITS then
      state.count = state.count + 1
      redis.call('HSET', state.meta, 'slices', state.count)
      bloom_create_slice(state, state.count - 1)
    else
      full = true
    end
  end
  return 1, full
end

-- Write the bits and counts of this call's adds (one BITFIELD per BITFIELD_CHUNK bits).
local function bloom_flush(state)
  for s, args in pairs(state.sets) do
    local per = BITFIELD_CHUNK * 4
    for from = 1, args.n, per do
      redis.call('BITFIELD', state.keys[s + 1], unpack(args, from, math.min(args.n, from + per - 1)))
    end
    hincrby(state.meta, 'c' .. s, state.adds[s])
  end
  state.sets, state.adds = {}, {}
end

-- Is fp (probably) in the filter?  (One lookup; bloom_lookup checks many at once.)
local function bloom_contains(state, fp)
  return bloom_lookup(state, {fp})[1]
end
