-- Scalable Bloom filter on plain Redis strings (no module needed).
--
-- A part of the scripts that use it (frontier.lua, bloom_add.lua; lua/__init__.py puts it
-- before them, with lua/bloom_write.lua, the adds); it defines locals only.  Keys: the
-- caller's meta key and slice keys (bloom_open).  Writes: nothing (bloom_write.lua writes).
--
-- Follows P. S. Almeida, C. Baquero, N. Preguica, D. Hutchison, "Scalable Bloom Filters",
-- Information Processing Letters 101 (2007): slice i holds n0 * 2^i fingerprints at error
-- rate p * 2^-i (growth s = 2, tightening r = 1/2), so the compound false-positive rate is
-- p while slice 0 is not full and stays below p / (1 - r) = 2p however far the filter grows.
-- Hash functions k = ceil(-log2 p) (the optimum for a classic Bloom filter).
--
-- Two bit layouts (field v of the metadata hash):
-- * v 2, blocked (every filter created now): a slice is an array of blocks of BLOCK_BITS
--   (4096) bits; a fingerprint's k bits all lie in one block, (h1 + h2) mod blocks (both
--   halves: a key that is not uniform, e.g. a counter, still spreads), at the first
--   BLOCK_PRIME (4093) bits of it, by triple hashing (P. C. Dillinger, P. Manolios, "Bloom
--   Filters in Probabilistic Verification", FMCAD 2004): x = h2 mod P, y = 1 + floor(h2 / P)
--   mod (P - 1), z = floor(h1 / blocks) mod P; position x, then x += y, y += z (mod P).  (Plain
--   double hashing in 2048-bit blocks measured 0.136 % instead of 0.1 % in a simulation.)
--   One GETRANGE of the block (512 bytes) reads all k bits:
--   the classic layout's k random bits cost k BITFIELD_RO GETs, whose arguments and replies
--   are most of a lookup's time inside a script.  Blocks make the filter's load uneven, which
--   raises the false-positive rate of the same memory (F. Putze, P. Sanders, J. Singler,
--   "Cache-, Hash- and Space-Efficient Bloom Filters", WEA 2007): BLOCK_SPARE (2 %) more
--   bits than the classic m = ceil(-n ln p / ln(2)^2) bring it back to p (bench/bench_bloom.py
--   measures it).  For n0 = 1,000,000 that is 3,583 blocks, 1,834,496 bytes: still the
--   allocator's 1.75 MiB size class that the classic 1,797,199 bytes take.
-- * v 1 (absent field), classic: bit positions by double hashing h1 + i*h2 mod m over the
--   whole slice (Kirsch & Mitzenmacher, "Less Hashing, Same Performance", 2006).  A filter
--   written before the blocked layout keeps this one until a purge.
--
-- A fingerprint argument is 12 bytes of a uniform hash (the client hashes Scrapy's request
-- fingerprint with BLAKE2b); h1 and h2 are its two 48-bit halves, so every product below
-- stays under 2^53 and double arithmetic is exact.
--
-- Metadata hash (KEY meta): n0, p, slices, v (layout), c0..cN (fingerprints added to each
-- slice), g (the filter's generation id: set when the filter is created, so a worker that
-- caches which fingerprints are in the filter knows when a purge made a new one).
--
-- Cost per call: one HMGET, then per slice one GETRANGE per fingerprint not found yet (v 2;
-- v 1: one BITFIELD_RO for all of them), one BITFIELD for all the adds (writes), and one
-- HINCRBY of the count: bloom_lookup, bloom_mark (adds), bloom_flush (writes): this file's
-- work per call is the lookups'.

-- ln(2)^2 written out: a Functions library's parts are defined without the math library
-- (lua/__init__.py, library)
local LN2SQ = 0.4804530139182014
-- BITFIELD subcommands per command (GET takes 3 arguments, SET 4; Lua's unpack stops near
-- 8000 values)
local BITFIELD_CHUNK = 1500
local BLOCK_BITS = 4096
local BLOCK_BYTES = BLOCK_BITS / 8
local BLOCK_PRIME = 4093  -- bits used of a block: double hashing works best modulo a prime
local BLOCK_SPARE = 1.02
local LAYOUT = 2  -- the layout of a filter created now

-- n (capacity), m (bits), k (hashes) and, for the blocked layout, the number of blocks of
-- slice i (frontier/bloom.py, slice_params, computes the same).
local function bloom_slice_params(n0, p, i, v)
  local n = n0 * (2 ^ i)
  local pi = p * (0.5 ^ i)
  local m = math.ceil(-n * math.log(pi) / LN2SQ)
  local k = math.ceil(-math.log(pi) / math.log(2))
  if v == 2 then
    local blocks = math.ceil(m * BLOCK_SPARE / BLOCK_PRIME)
    return n, blocks * BLOCK_BITS, k, blocks
  end
  return n, m, k, 0
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
    state.v = LAYOUT
  end
  return state
end

local function bloom_params(state, s)
  local pr = state.params[s]
  if pr == nil then
    local n, m, k, blocks = bloom_slice_params(state.n0, state.p, s, state.v)
    pr = {n, m, k, blocks}
    state.params[s] = pr
  end
  return pr
end

-- Bit offsets of fp in slice s, appended to out from index at + 1 (returns the new last
-- index): double hashing h1 + i*h2 mod m with the 48-bit halves of fp, so every product
-- stays under 2^53 and double arithmetic is exact.  With prefix (e.g. {'GET', 'u1'}) each
-- offset is preceded by its items: the arguments of a BITFIELD command.
local function bloom_halves(fp)
  local a, b, c, d, e, f = string.byte(fp, 1, 6)
  local h1 = ((((a * 256 + b) * 256 + c) * 256 + d) * 256 + e) * 256 + f
  a, b, c, d, e, f = string.byte(fp, 7, 12)
  return h1, ((((a * 256 + b) * 256 + c) * 256 + d) * 256 + e) * 256 + f
end

-- Blocked layout: fp's block (0-based), its first position, step and step increment in the
-- block (triple hashing, see the top).
local function bloom_block(pr, fp)
  local h1, h2 = bloom_halves(fp)
  local blocks = pr[4]
  -- (floor(a / b) as (a - a mod b) / b: an exact quotient, without a call)
  local x = h2 % BLOCK_PRIME
  local b1 = h1 % blocks
  return (b1 + h2 % blocks) % blocks, x, 1 + ((h2 - x) / BLOCK_PRIME) % (BLOCK_PRIME - 1),
         ((h1 - b1) / blocks) % BLOCK_PRIME
end

local function bloom_offsets(state, fp, s, out, at, prefix, suffix)
  local pr = state.params[s] or bloom_params(state, s)
  local m, k = pr[2], pr[3]
  local base, x, step, inc = 0, 0, 0, 0
  if state.v == 2 then
    local block
    block, x, step, inc = bloom_block(pr, fp)
    base, m = block * BLOCK_BITS, BLOCK_PRIME
  else
    local h1, h2 = bloom_halves(fp)
    x, step = h1 % m, h2 % m
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
    step = step + inc
    if step >= m then step = step - m end
  end
  return at
end

local GET_U1 = {'GET', 'u1'}
local POW2 = {[0] = 1, 2, 4, 8, 16, 32, 64, 128}
local SET_U1 = {'SET', 'u1'}

-- Which of fps (a list of 12-byte strings) are in the filter (as it was before this call's
-- adds)?  Returns a list of booleans.  Blocked layout: one GETRANGE per fingerprint and slice;
-- classic layout: all the bits one slice needs for the whole list are read with BITFIELD_RO
-- GETs, BITFIELD_CHUNK per command.  A fingerprint found in a slice is not looked up in the
-- next ones.
local function bloom_lookup(state, fps)
  local present = {}
  local n = #fps
  for i = 1, n do present[i] = false end
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
    if state.v == 2 then
      -- one GETRANGE of the fingerprint's block; its k bits tested here (bit 0 of a block
      -- is the most significant bit of its first byte, as SETBIT and BITFIELD number them)
      local pr, key = bloom_params(state, s), state.keys[s + 1]
      for j = 1, nt do
        local block, x, step, inc = bloom_block(pr, fps[todo[j]])
        local start = block * BLOCK_BYTES
        local bytes = redis.call('GETRANGE', key, start, start + BLOCK_BYTES - 1)
        local all = true
        for _ = 1, k do
          -- bit x: byte (x - x mod 8) / 8 + 1, mask 2^(7 - x mod 8); set when byte mod 2*mask
          -- >= mask (exact integer arithmetic in doubles, no math.floor call)
          -- (a slice larger than PREALLOC_MAX grows: bytes past its end are zeros)
          local q = x % 8
          local mask = POW2[7 - q]
          if (string.byte(bytes, (x - q) / 8 + 1) or 0) % (mask + mask) < mask then
            all = false
            break
          end
          -- (bloom_offsets' triple-hashing step, inline: the lookup stops at the first clear
          -- bit, without building the offsets it would not test)
          x = x + step
          if x >= BLOCK_PRIME then x = x - BLOCK_PRIME end
          step = step + inc
          if step >= BLOCK_PRIME then step = step - BLOCK_PRIME end
        end
        if all then present[todo[j]] = true end
      end
      nt = 0
    end
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
