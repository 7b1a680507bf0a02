-- ratekeeper lease, state format v2 (the same keys and layout as limiter.lua): charge a batch
-- of units on one (policy, client key) state atomically and return how many were granted,
-- for the tiered store (`store::tiered`), which spends them locally.
--
-- KEYS[1]   the state key (GCRA "<TAT>:<T>:<tau>", fixed window "<window>:<count>:<W>", µs).
-- KEYS[2]   the key's lease record, "<state>#leased": "<units>:<back_by>" (µs), the units
--           granted ahead of a request (taken to be spent later) by leases that may still hold
--           them, and when the last of those leases gives its unspent units back at the latest.
--           An upper bound: units spent or given back meanwhile are not taken off it. Read as
--           absent once back_by has passed; PX until back_by.
-- ARGV[1]   injected "now" in µs, or '' to read Redis TIME.
-- ARGV[2]   stale guard in Redis TIME µs, or '' (as in limiter.lua: a call that reaches Redis
--           after it does nothing).
-- ARGV[3]   least PX of a write in ms ('0': none).
-- ARGV[4..7] algorithm, p1, p2, p3: 1 = GCRA (p1 = T, the emission interval in µs; p2 = tau =
--           burst * T in µs; p3 = burst), 2 = fixed window (p1 = W in µs; p2 = limit).
-- ARGV[8]   need: the least grant worth having (the request's cost; 0 for a background
--           renewal); fewer available is a denial and writes nothing.
-- ARGV[9]   want: the most to grant (at least need).
-- ARGV[10]  back_within: how long after this call a lease's unspent units are back in Redis
--           at the latest (µs: lease TTL, sweeper period, the give-back's allowance).
--
-- Grant: with `room` units free now and `reserve` = ceil(capacity / 2) (GCRA: the burst;
-- fixed window: the limit), grant = min(want, max(need, room - reserve)) when room >= need.
-- Units beyond `need` (taken ahead, to be spent later) only ever come from the upper half of
-- the bucket or window: in the lower half a lease takes exactly the request's cost, so near
-- the limit no unit the client is still owed sits unspent on one instance while the client
-- talks to another. (This also caps a grant at half of what is left: room - reserve <=
-- ceil(room / 2) for room <= capacity.) A background renewal sends need = 0. A grant of
-- nothing writes nothing: the state stays as it is, a fixed window's count above the limit
-- (a correction's debt) included.
--
-- Returns {server_now, status, granted, code, remaining, reset_after, retry_after, stamp,
-- out_units, out_for}: status 0 = done, 1 = stale (nothing else, nothing written); code 0
-- allowed (granted >= need),
-- 1 denied, 2 cannot fit (need > capacity); remaining after the grant; reset_after and
-- retry_after in µs; stamp the receipt of the whole grant (GCRA: the TAT right after it;
-- fixed window: the window index; -1: nothing granted); out_units and out_for the lease
-- record after the call (units that may come back, and in how many µs at the latest; 0 0
-- without one). retry_after is the state's alone: the caller bounds it by the record. A
-- call with need = want = 0 writes nothing and reads the state and the record. A refund of
-- unused units is
-- limiter.lua's 'refund' mode with this stamp. Every write sets PX (GCRA: until the TAT;
-- fixed window: until the window ends; rounded up to a ms, at least ARGV[3]).
local clock = redis.call('TIME')
local server_now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
if ARGV[2] ~= '' and server_now > tonumber(ARGV[2]) then
  return {server_now, 1}
end
local now = server_now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
end
local min_ttl = tonumber(ARGV[3]) or 0
local algo = tonumber(ARGV[4])
local p1, p2, p3 = tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
local need, want = tonumber(ARGV[8]), tonumber(ARGV[9])
local key = KEYS[1]
local raw = redis.call('GET', key)
local back_within = tonumber(ARGV[10])

-- The lease record: units granted ahead that may still come back, until back_by.
local out_units, out_by = 0, 0
local rec = redis.call('GET', KEYS[2])
if rec then
  local u, b = string.match(rec, '^(%d+):(%d+)$')
  if u and tonumber(b) > now then
    out_units, out_by = tonumber(u), tonumber(b)
  end
end
-- Adds `ahead` units that come back by now + back_within, or by `last` if sooner (a fixed
-- window's end: units given back after it no longer count, so a record never outlives the
-- window its units were charged in).
local function record(ahead, last)
  if ahead > 0 then
    out_units = out_units + ahead
    out_by = math.max(out_by, math.min(now + back_within, last))
    redis.call('SET', KEYS[2], string.format('%.0f:%.0f', out_units, out_by), 'PX',
      string.format('%.0f', math.max(1, min_ttl, math.ceil((out_by - now) / 1000))))
  end
end
local function out_for()
  if out_units > 0 then
    return out_by - now
  end
  return 0
end

local function grant_of(room, capacity)
  return math.min(want, math.max(need, room - math.ceil(capacity / 2)))
end

if algo == 2 then
  local len, limit = p1, p2
  local w = math.floor(now / len)
  local count = 0
  if raw then
    local a, b, d = string.match(raw, '^(%d+):(%d+):(%d+)$')
    if a then
      a, b, d = tonumber(a), tonumber(b), tonumber(d)
      -- The count as stored, as limiter.lua reads it: above the limit it is a debt (a
      -- correction's extra charge), kept whole.
      if d == len then
        if a == w then
          count = b
        end
      elseif (a + 1) * d > now then
        -- written under another window length: its units still count, in this window
        count = b
      end
    end
  end
  local until_end = (w + 1) * len - now
  local reset = 0
  if count > 0 then
    reset = until_end
  end
  local room = math.max(limit - count, 0)
  if need > limit then
    return {server_now, 0, 0, 2, room, reset, 0, -1, out_units, out_for()}
  end
  if room < need then
    return {server_now, 0, 0, 1, room, reset, until_end, -1, out_units, out_for()}
  end
  local grant = grant_of(room, limit)
  if grant > 0 then
    count = count + grant
    redis.call('SET', key, string.format('%.0f:%.0f:%.0f', w, count, len), 'PX',
      string.format('%.0f', math.max(1, min_ttl, math.ceil(until_end / 1000))))
  end
  record(grant - need, (w + 1) * len)
  return {server_now, 0, grant, 0, room - grant, until_end, 0, w, out_units, out_for()}
end

-- GCRA
local t, tau, burst = p1, p2, p3
local tat = 0
if raw then
  -- "<TAT>:<T>:<tau>" ("<TAT>:<T>" from earlier deploys reads as another tau), read under
  -- the parameters in force exactly as limiter.lua's gcra_in_force: a TAT written under
  -- another T keeps its units, re-spaced by T; one written under another tau lies at most
  -- tau ahead; under unchanged parameters a TAT beyond now + tau is turns that Delay-mode
  -- reservations booked, which a lease must not take.
  local a, b, c = string.match(raw, '^(%d+):(%d+):?(%d*)$')
  if a then
    tat = tonumber(a)
    local t_old, tau_old = tonumber(b), tonumber(c) or -1
    if tat > now and t_old ~= t then
      local used = math.ceil((tat - now) / t_old)
      tat = now + math.min(used * t, tau)
    end
    if tau_old ~= tau and tat > now + tau then
      tat = now + tau
    end
  end
end
tat = math.max(tat, now)
local function remaining_at(st)
  local room = now + tau - st
  if room <= 0 then
    return 0
  end
  return math.min(math.floor(room / t), burst)
end
if need > burst then
  return {server_now, 0, 0, 2, remaining_at(tat), tat - now, 0, -1, out_units, out_for()}
end
local room = math.floor((now + tau - tat) / t)
if room < need then
  return {server_now, 0, 0, 1, remaining_at(tat), tat - now, tat + need * t - tau - now, -1,
    out_units, out_for()}
end
local grant = grant_of(room, burst)
local new_tat = tat + grant * t
if grant > 0 then
  redis.call('SET', key, string.format('%.0f:%.0f:%.0f', new_tat, t, tau), 'PX',
    string.format('%.0f', math.max(1, min_ttl, math.ceil((new_tat - now) / 1000))))
end
record(grant - need, now + back_within)
return {server_now, 0, grant, 0, remaining_at(new_tat), new_tat - now, 0, new_tat, out_units,
  out_for()}
