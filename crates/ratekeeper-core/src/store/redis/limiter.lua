-- ratekeeper limiter, state format v2: twins of ratekeeper_core::algorithm::Gcra (also the
-- leaky-bucket meter), ::FixedWindow and ::SlidingWindow, in integer µs.
--
-- KEYS[i]   one key per (policy, client key); all KEYS share one hash tag (one Cluster slot).
--           Each state records the parameter it was written under, so a changed quota reads
--           it under the parameters now in force (case B27):
--           GCRA: "<TAT>:<T>", the theoretical arrival time and emission interval in µs;
--             absent = TAT 0.
--           Fixed window: "<window>:<count>:<W>" with window = floor(t / W); absent = count 0.
--           Sliding window counter: "<window>:<current>:<previous>:<W>"; absent = both 0.
-- ARGV[1]   injected "now" in µs, or '' to read Redis TIME.
-- ARGV[2]   stale guard in Redis TIME µs, or '': a call that reaches Redis after it does
--           nothing (its caller already gave up on it). The caller computes it in the Redis
--           time domain from the server time of earlier replies, never from its own clock.
-- ARGV[3]   'check' (all-or-nothing charge), 'peek' (no write) or 'refund'.
-- ARGV[4]   least PX of a write in ms ('0': none; see RedisStoreBuilder::min_ttl).
-- ARGV[5+6(i-1) .. 10+6(i-1)]  algorithm, p1, p2, p3, cost, stamp, where algorithm 1 = GCRA
--           (p1 = T, the emission interval in µs; p2 = tau = burst * T in µs; p3 = burst) and
--           2 = fixed window and 3 = sliding window counter (p1 = W, the window in µs;
--           p2 = limit; p3 unused). stamp: for 'refund', the receipt of the charge to give
--           back (-1: none); ignored otherwise. The Rust side keeps 2 * limit * W below 2^53,
--           so every product here is an exact double.
--
-- Returns {server_now, status, rows...}: server_now is Redis TIME in µs (always, even with an
-- injected now: the caller's stale guard learns from it), status 0 = done, 1 = stale (no rows,
-- nothing written). Then five integers per key: code (0 allowed, 1 denied, 2 cannot fit),
-- remaining, reset_after (µs), retry_after (µs, 0 unless denied) and the receipt stamp of an
-- allowed charge (GCRA: TAT right after it; windows: the window index; -1: took nothing).
-- Every write sets PX to the time until the state equals "absent" (GCRA: TAT - now; fixed
-- window: until the window ends), rounded up to a ms, and at least ARGV[4] ms; a state equal
-- to "absent" is deleted.
local clock = redis.call('TIME')
local server_now = tonumber(clock[1]) * 1000000 + tonumber(clock[2])
if ARGV[2] ~= '' and server_now > tonumber(ARGV[2]) then
  return {server_now, 1}
end
local now = server_now
if ARGV[1] ~= '' then
  now = tonumber(ARGV[1])
end
local mode = ARGV[3]
local min_ttl = tonumber(ARGV[4]) or 0
local n = #KEYS

local function param(i, j)
  return tonumber(ARGV[4 + (i - 1) * 6 + j])
end
local function algo(i)
  return param(i, 1)
end
local function cost_of(i)
  return param(i, 5)
end
local function stamp_of(i)
  return param(i, 6)
end

-- GCRA state under the parameters in force: a TAT written under another emission interval
-- keeps its units in use, used = ceil((TAT - now) / T_old), re-spaced by the new T; and a
-- TAT never lies more than tau ahead ("never fuller than full").
local function gcra_in_force(i, tat, t_old)
  local t, tau = param(i, 2), param(i, 3)
  if tat > now and t_old ~= t then
    local used = math.ceil((tat - now) / t_old)
    tat = now + math.min(used * t, tau)
  end
  if tat > now + tau then
    tat = now + tau
  end
  return tat
end

-- Fixed window and counter states written under another window length: the units still
-- counted at now under the old length move into the current window of the new length
-- (clamped to the limit later), so a changed W never mixes windows and never frees units.
local function fw_in_force(i, w, c, w_old)
  local len = param(i, 2)
  if w_old == len then
    return {w, c}
  end
  if (w + 1) * w_old > now then
    return {math.floor(now / len), c}
  end
  return {0, 0}
end

local function sw_in_force(i, w, c, p, w_old)
  local len = param(i, 2)
  if w_old == len then
    return {w, c, p}
  end
  local wo = math.floor(now / w_old)
  local e = now - wo * w_old
  local est = 0
  if w == wo then
    est = p * (w_old - e) / w_old + c
  elseif w + 1 == wo then
    est = c * (w_old - e) / w_old
  end
  return {math.floor(now / len), math.ceil(est), 0}
end

-- cache[key] holds the state: a number (GCRA TAT) or {window, count[, previous]}.
local cache = {}
local function load(i)
  local key = KEYS[i]
  local v = cache[key]
  if v == nil then
    local raw = redis.call('GET', key)
    if algo(i) == 2 then
      v = {0, 0}
      if raw then
        local a, b, d = string.match(raw, '^(%d+):(%d+):(%d+)$')
        if a then
          v = fw_in_force(i, tonumber(a), tonumber(b), tonumber(d))
        end
      end
    elseif algo(i) == 3 then
      v = {0, 0, 0}
      if raw then
        local a, b, d, e = string.match(raw, '^(%d+):(%d+):(%d+):(%d+)$')
        if a then
          v = sw_in_force(i, tonumber(a), tonumber(b), tonumber(d), tonumber(e))
        end
      end
    else
      v = 0
      if raw then
        local a, b = string.match(raw, '^(%d+):(%d+)$')
        if a then
          v = gcra_in_force(i, tonumber(a), tonumber(b))
        end
      end
    end
    cache[key] = v
  end
  return v
end

local function fw_current(i, st)
  local w = math.floor(now / param(i, 2))
  if st[1] == w then
    return {w, math.min(st[2], param(i, 3))}
  end
  return {w, 0}
end

local function fw_until_end(i, w)
  return (w + 1) * param(i, 2) - now
end

-- Sliding window counter: {window, current, previous}.
local function sw_current(i, st)
  local w = math.floor(now / param(i, 2))
  local cap = param(i, 3)
  if st[1] == w then
    return {w, math.min(st[2], cap), math.min(st[3], cap)}
  elseif st[1] + 1 == w then
    return {w, 0, math.min(st[2], cap)}
  end
  return {w, 0, 0}
end

local function sw_elapsed(i, st)
  return now - st[1] * param(i, 2)
end

local function sw_earliest(i, previous, current, cost)
  local room = param(i, 3) - current - cost
  if room < 0 then
    return nil
  end
  if previous == 0 then
    return 0
  end
  local w = param(i, 2)
  return math.max(w - math.floor(room * w / previous), 0)
end

local function sw_reset(i, st)
  local windows_left = 0
  if st[2] > 0 then
    windows_left = 2
  elseif st[3] > 0 then
    windows_left = 1
  end
  return math.max(windows_left * param(i, 2) - sw_elapsed(i, st), 0)
end

local function store(i, st)
  local key = KEYS[i]
  if algo(i) == 3 then
    if st[2] <= 0 and st[3] <= 0 then
      redis.call('DEL', key)
    else
      redis.call('SET', key,
        string.format('%.0f:%.0f:%.0f:%.0f', st[1], st[2], st[3], param(i, 2)), 'PX',
        string.format('%.0f', math.max(1, min_ttl, math.ceil(sw_reset(i, st) / 1000))))
    end
  elseif algo(i) == 2 then
    if st[2] <= 0 then
      redis.call('DEL', key)
    else
      redis.call('SET', key, string.format('%.0f:%.0f:%.0f', st[1], st[2], param(i, 2)), 'PX',
        string.format('%.0f', math.max(1, min_ttl, math.ceil(fw_until_end(i, st[1]) / 1000))))
    end
  elseif st <= now then
    redis.call('DEL', key)
  else
    redis.call('SET', key, string.format('%.0f:%.0f', st, param(i, 2)), 'PX',
      string.format('%.0f', math.max(min_ttl, math.ceil((st - now) / 1000))))
  end
end

-- The current state (GCRA: max(stored, now); fixed window: rolled to this window).
local function current(i)
  local st = load(i)
  if algo(i) == 2 then
    return fw_current(i, st)
  elseif algo(i) == 3 then
    return sw_current(i, st)
  end
  return math.max(st, now)
end

-- verdict for the current state: code, new state (nil = no change), retry_after
local function verdict(i, st)
  local cost = cost_of(i)
  if algo(i) == 3 then
    local limit, w = param(i, 3), param(i, 2)
    if cost > limit then
      return 2, nil, 0
    end
    if cost == 0 then
      return 0, nil, 0
    end
    local elapsed = sw_elapsed(i, st)
    if st[3] * (w - elapsed) + (st[2] + cost) * w <= limit * w then
      return 0, {st[1], st[2] + cost, st[3]}, 0
    end
    local e = sw_earliest(i, st[3], st[2], cost)
    if e then
      return 1, nil, math.max(e, elapsed) - elapsed
    end
    return 1, nil, (w - elapsed) + (sw_earliest(i, st[2], 0, cost) or w)
  end
  if algo(i) == 2 then
    local limit = param(i, 3)
    if cost > limit then
      return 2, nil, 0
    end
    if cost == 0 then
      return 0, nil, 0
    end
    if cost <= limit - st[2] then
      return 0, {st[1], st[2] + cost}, 0
    end
    return 1, nil, fw_until_end(i, st[1])
  end
  local t, tau, burst = param(i, 2), param(i, 3), param(i, 4)
  if cost > burst then
    return 2, nil, 0
  end
  if cost == 0 then
    return 0, nil, 0
  end
  local new_tat = st + cost * t
  local allow_at = new_tat - tau
  if allow_at > now then
    return 1, nil, allow_at - now
  end
  return 0, new_tat, 0
end

-- The receipt of a charge that wrote `next_state`: GCRA the TAT right after it, windows the
-- index of the window it counted in.
local function receipt(i, next_state)
  if algo(i) == 1 then
    return next_state
  end
  return next_state[1]
end

local function report(out, i, code, st, retry, stamp)
  local remaining, reset
  if algo(i) == 3 then
    local limit, w = param(i, 3), param(i, 2)
    local budget = math.floor(math.max(limit * w - st[3] * (w - sw_elapsed(i, st)), 0) / w)
    remaining = math.max(budget - st[2], 0)
    reset = sw_reset(i, st)
  elseif algo(i) == 2 then
    remaining = math.max(param(i, 3) - st[2], 0)
    reset = 0
    if st[2] > 0 then
      reset = fw_until_end(i, st[1])
    end
  else
    local t, tau, burst = param(i, 2), param(i, 3), param(i, 4)
    local room = now + tau - st
    remaining = 0
    if room > 0 then
      remaining = math.min(math.floor(room / t), burst)
    end
    reset = math.max(st - now, 0)
  end
  out[#out + 1] = code
  out[#out + 1] = remaining
  out[#out + 1] = reset
  out[#out + 1] = retry
  out[#out + 1] = stamp
end

local function peek_all()
  local out = {server_now, 0}
  for i = 1, n do
    local st = current(i)
    local code, _, retry = verdict(i, st)
    report(out, i, code, st, retry, -1)
  end
  return out
end

-- A refund gives back only what the charge with this receipt still holds (case B26).
-- GCRA (stamp s = the TAT right after the charge, st = the stored TAT):
--   st <= now                : the bucket drained the charge: nothing;
--   st == s                  : the charge is the latest: TAT = s - cost * T;
--   st - tau > now           : a later reservation still waits for its slot: nothing;
--   otherwise                : min(cost * T, max(min(s, st) - now, 0)) off the top, so a
--                              charge never gives back time already drained, nor more than
--                              is outstanding.
--   Never below now (a TAT in the past is "absent": deleted).
-- Fixed window: only in the window the charge counted in. Sliding window counter: from the
-- current count in that window, from the previous count in the next one, later nothing.
local function refund(i)
  local cost, s = cost_of(i), stamp_of(i)
  if s < 0 or cost <= 0 then
    return
  end
  if algo(i) == 1 then
    local st = load(i)
    local t, tau = param(i, 2), param(i, 3)
    local give = 0
    if st > now then
      if st == s then
        give = cost * t
      elseif st - tau <= now then
        give = math.min(cost * t, math.max(math.min(s, st) - now, 0))
      end
    end
    if give > 0 then
      st = math.max(st - give, now)
      cache[KEYS[i]] = st
      store(i, st)
    end
    return
  end
  local st = current(i)
  local changed = false
  if algo(i) == 2 then
    if st[1] == s and st[2] > 0 then
      st = {st[1], math.max(st[2] - cost, 0)}
      changed = true
    end
  elseif st[1] == s and st[2] > 0 then
    st = {st[1], math.max(st[2] - cost, 0), st[3]}
    changed = true
  elseif st[1] == s + 1 and st[3] > 0 then
    st = {st[1], st[2], math.max(st[3] - cost, 0)}
    changed = true
  end
  if changed then
    cache[KEYS[i]] = st
    store(i, st)
  end
end

if mode == 'refund' then
  for i = 1, n do
    refund(i)
  end
  return peek_all()
end

if mode == 'peek' then
  return peek_all()
end

local out = {server_now, 0}
local writes = {}
local denied = false
for i = 1, n do
  local st = current(i)
  local code, next_state, retry = verdict(i, st)
  if code ~= 0 then
    denied = true
    break
  end
  if next_state then
    cache[KEYS[i]] = next_state
    writes[i] = next_state
    report(out, i, code, next_state, retry, receipt(i, next_state))
  else
    report(out, i, code, st, retry, -1)
  end
end

if denied then
  -- All-or-nothing: nothing was written; report every policy's state as it is.
  cache = {}
  return peek_all()
end
-- In charge order, so a key charged twice in one call ends with its last (cumulative) state.
for i = 1, n do
  if writes[i] then
    store(i, writes[i])
  end
end
return out
