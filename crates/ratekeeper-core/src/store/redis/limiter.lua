-- ratekeeper limiter, state format v2: twins of ratekeeper_core::algorithm::Gcra (also the
-- leaky-bucket meter), ::FixedWindow and ::SlidingWindow, in integer µs.
--
-- KEYS      every key the script reads or writes, all with one hash tag (one Cluster slot):
--           KEYS[1..n] the states, one per charge (policy, client key); in the 'refund',
--           'correct' and 'reset' modes KEYS[n+1..2n] their reset fences, "<state>#reset"
--           in the same order (see `fenced`); then the ban keys (see "Bans" below).
-- KEYS[i]   the state of charge i.
--           Each state records the parameter it was written under, so a changed quota reads
--           it under the parameters now in force (a quota changed between deploys):
--           GCRA: "<TAT>:<T>:<tau>", the theoretical arrival time, emission interval and
--             tolerance in µs ("<TAT>:<T>" from earlier deploys reads as another tau);
--             absent = TAT 0.
--           Fixed window: "<window>:<count>:<W>" with window = floor(t / W); absent = count 0.
--           Sliding window counter: "<window>:<current>:<previous>:<W>"; absent = both 0.
--           Window counts are the units charged, read as stored: a count above the limit
--           (a correction's debt, or units charged under a higher limit) counts whole, as
--           in the memory store.
--           Sliding log: a sorted set, one member "<ts>:<units>:<end>" per log entry
--             (end = running total of units through it), scored by its timestamp ts (µs);
--             absent = empty. Entries are counted under the window in
--             force: an entry counts while ts + W > now.
-- ARGV[1]   injected "now" in µs, or '' to read Redis TIME.
-- ARGV[2]   stale guard in Redis TIME µs, or '': a call that reaches Redis after it does
--           nothing (its caller already gave up on it). The caller computes it in the Redis
--           time domain from the server time of earlier replies, never from its own clock.
-- ARGV[3]   'check' (all-or-nothing charge), 'peek' (no write), 'refund', 'correct' (see
--           below), 'reset' (forget the keys and fence their receipts; see below), 'inspect'
--           ('peek' with the bans in force), or 'reserve:<max_wait µs>' (all-or-nothing
--           reservation for the Delay mode; see below).
-- ARGV[4]   least PX of a write in ms ('0': none; see RedisStoreBuilder::min_ttl).
-- ARGV[5+6(i-1) .. 10+6(i-1)]  algorithm, p1, p2, p3, cost, stamp, where algorithm 1 = GCRA
--           (p1 = T, the emission interval in µs; p2 = tau = burst * T in µs; p3 = burst) and
--           2 = fixed window, 3 = sliding window counter and 4 = sliding log (p1 = W, the
--           window in µs; p2 = limit; p3 unused). stamp: for 'refund', the receipt of the
--           charge to give back (-1: none); for 'reserve', how this policy reserves (1 = GCRA
--           reservation, 2 = leaky-bucket shaper, -1 = it cannot: a check); ignored otherwise. The Rust side keeps 2 * limit * W below 2^53,
--           so every product here is an exact double.
--
-- Returns {server_now, status, rows...}: server_now is Redis TIME in µs (always, even with an
-- injected now: the caller's stale guard learns from it), status 0 = done, 1 = stale (no rows,
-- nothing written). Then seven integers per key: code (0 allowed, 1 denied, 2 cannot fit),
-- remaining, reset_after (µs), retry_after (µs, 0 unless denied), ns to take off
-- retry_after (0..999: the sliding window counter's wait to the ns), the receipt stamp of an
-- allowed charge (GCRA: TAT right after it; windows: the window index; sliding log: the
-- timestamp of the entry it added to; -1: took nothing) and the hold (µs the row's fields
-- change only with elapsed time, -1: unbounded; see hold_of). Charges of one key in one call
-- are cumulative (see `judge`). A 'reserve' call appends two
-- integers after the rows: the delay in µs (allowed) and 1 when a denial is final (a policy
-- that reserves exactly, or a cost that can never fit, denied), else 0.
-- Every write sets PX to the time until the state equals "absent" (GCRA: TAT - now; fixed
-- window: until the window ends), rounded up to a ms, and at least ARGV[4] ms; a state equal
-- to "absent" is deleted.
--
-- Bans (ratekeeper_core::Ban; see `bans` below): an optional tail after the charges'
-- parameters, sent only when some policy of the call has a ban: per ban four values (the
-- position i of its charge, refusals, within µs, duration µs), then the number of bans b;
-- its ban keys are the last b KEYS, in the same order ("<until>:<first>:<count>" µs, PX =
-- until the ban ends and the count runs out). With k keys per charge (2 in the modes that
-- send fences, else 1), a call without the tail has #KEYS = k * n and #ARGV = 4 + 6 * n;
-- with it, #KEYS = k * n + b and #ARGV = 4 + 6n + 4b + 1, never 4 + 6 * #KEYS / k. Rows of
-- a ban carry code 3 (refused by a ban in force) or 4 (this refusal started a ban).
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
-- Keys per charge: the state, and its reset fence in the modes that read or write fences.
local per_charge = 1
if mode == 'refund' or mode == 'correct' or mode == 'reset' then
  per_charge = 2
end
local n = #KEYS / per_charge

-- Bans: ban_of[i] = {key, after, within, duration} for a charge i whose policy has one.
local ban_of = {}
if #ARGV ~= 4 + 6 * n then
  local b = tonumber(ARGV[#ARGV])
  n = (#KEYS - b) / per_charge
  for j = 1, b do
    local at = 4 + 6 * n + 4 * (j - 1)
    ban_of[tonumber(ARGV[at + 1])] = {key = KEYS[per_charge * n + j],
      after = tonumber(ARGV[at + 2]), within = tonumber(ARGV[at + 3]),
      duration = tonumber(ARGV[at + 4])}
  end
end

-- The reset fence of charge i (only in the modes that send fences).
local function fence_key(i)
  return KEYS[n + i]
end

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
-- keeps its units in use, used = ceil((TAT - now) / T_old), re-spaced by the new T; a TAT
-- written under another tau (or by a deploy that did not record it) lies at most tau ahead
-- ("never fuller than full"). Under unchanged parameters the TAT is read as stored: beyond
-- now + tau it is turns that Delay-mode reservations already booked, which neither a check
-- nor a reservation may take (as the memory store reads its state).
local function gcra_in_force(i, tat, t_old, tau_old)
  local t, tau = param(i, 2), param(i, 3)
  if tat > now and t_old ~= t then
    local used = math.ceil((tat - now) / t_old)
    tat = now + math.min(used * t, tau)
  end
  if tau_old ~= tau and tat > now + tau then
    tat = now + tau
  end
  return tat
end

-- Sliding log (running totals, as the memory store's SlidingLogState): each member is
-- "<ts>:<units>:<end>", end = the running total of units through this entry, so the units
-- of the live entries are one subtraction and a denial's entry is a binary search by rank;
-- a check reads O(log e) members, not the whole log. The state of a call is
-- {first = oldest live entry, newest = newest entry, rank = rank of first, count = members,
-- used = live units}; entries are {ts, units, end}.
local function sl_parse(m)
  if not m then
    return nil
  end
  local a, b, c = string.match(m, '^(%d+):(%d+):(%d+)$')
  if a then
    return {tonumber(a), tonumber(b), tonumber(c)}
  end
  return nil
end

local function sl_member(e)
  return string.format('%.0f:%.0f:%.0f', e[1], e[2], e[3])
end

local function sl_load(i)
  local key, w = KEYS[i], param(i, 2)
  local first = sl_parse(redis.call('ZRANGEBYSCORE', key, '(' .. string.format('%.0f', now - w),
    '+inf', 'LIMIT', 0, 1)[1])
  if not first then
    return {used = 0}
  end
  local newest = sl_parse(redis.call('ZRANGE', key, -1, -1)[1])
  -- The oldest live entry's rank: the number of expired members before it.
  local rank = redis.call('ZCOUNT', key, '-inf', string.format('%.0f', now - w))
  local count = redis.call('ZCARD', key)
  return {first = first, newest = newest, rank = rank, count = count,
    used = newest[3] - (first[3] - first[2])}
end

-- How long until the entry stamped ts stops counting (at most W: an entry stamped in the
-- future is read as leaving W from now).
local function sl_expires_in(i, ts)
  local w = param(i, 2)
  return math.min(math.max(ts + w - now, 0), w)
end

-- The entry at `rank` (a ZRANGE by rank: O(log e)).
local function sl_at(i, rank)
  return sl_parse(redis.call('ZRANGE', KEYS[i], rank, rank)[1])
end

-- Writes the newest entry of a charge: drops the expired members, rewrites the entry
-- stamped e[1], and sets PX to the time until it expires (it is the newest).
local function sl_write_newest(i, e)
  local key, w = KEYS[i], param(i, 2)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%.0f', now - w))
  local fts = string.format('%.0f', e[1])
  redis.call('ZREMRANGEBYSCORE', key, fts, fts)
  redis.call('ZADD', key, fts, sl_member(e))
  redis.call('PEXPIRE', key,
    string.format('%.0f', math.max(1, min_ttl, math.ceil((e[1] + w - now) / 1000))))
end

-- Fixed window and counter states written under another window length: the units still
-- counted at now under the old length move into the current window of the new length, so
-- a changed W never mixes windows and never frees units.
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
    local raw = nil
    if algo(i) ~= 4 then
      raw = redis.call('GET', key)
    end
    if algo(i) == 4 then
      v = sl_load(i)
    elseif algo(i) == 2 then
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
        local a, b, c = string.match(raw, '^(%d+):(%d+):?(%d*)$')
        if a then
          v = gcra_in_force(i, tonumber(a), tonumber(b), tonumber(c) or -1)
        end
      end
    end
    cache[key] = v
  end
  return v
end

-- Fixed window: {window, count}, rolled to the window of now (counts as stored).
local function fw_current(i, st)
  local w = math.floor(now / param(i, 2))
  if st[1] == w then
    return {w, st[2]}
  end
  return {w, 0}
end

local function fw_until_end(i, w)
  return (w + 1) * param(i, 2) - now
end

-- Sliding window counter: {window, current, previous}, rolled to the window of now (counts
-- as stored).
local function sw_current(i, st)
  local w = math.floor(now / param(i, 2))
  if st[1] == w then
    return {w, st[2], st[3]}
  elseif st[1] + 1 == w then
    return {w, 0, st[2]}
  end
  return {w, 0, 0}
end

local function sw_elapsed(i, st)
  return now - st[1] * param(i, 2)
end

-- The smallest elapsed e in [0, W] at which previous * (W - e) + (current + cost) * W <=
-- limit * W, to the ns like the memory store: e (µs) and `less` (ns, 0..999), meaning
-- e * 1000 - less ns; nil when current + cost > limit. floor(room * W * 1000 / previous) is
-- q * 1000 + floor(r * 1000 / previous) with room * W = q * previous + r, so every
-- intermediate stays below 2^53 (the Rust side keeps 2 * limit * W there; r < previous, so
-- r * 1000 too while a count, a debt included, is below 2^43) and is exact.
local function sw_earliest(i, previous, current, cost)
  local room = param(i, 3) - current - cost
  if room < 0 then
    return nil, 0
  end
  if previous == 0 then
    return 0, 0
  end
  local w = param(i, 2)
  local a = room * w
  local q = math.floor(a / previous)
  local f = math.floor((a - q * previous) * 1000 / previous)
  if q >= w then
    return 0, 0
  end
  return w - q, f
end

-- The units the estimate leaves for the current window, floor((limit * W - previous *
-- (W - elapsed)) / W), at least 0; exact whatever the previous count (a debt too): the
-- product is only taken when it is at most limit * W.
local function sw_budget(i, st)
  local limit, w = param(i, 3), param(i, 2)
  local left = w - sw_elapsed(i, st)
  if st[3] > 0 and left > math.floor(limit * w / st[3]) then
    return 0
  end
  return math.floor((limit * w - st[3] * left) / w)
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
  if algo(i) == 4 then
    -- A charge always changes (or adds) the newest entry.
    if st.newest then
      sl_write_newest(i, st.newest)
    end
  elseif algo(i) == 3 then
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
    redis.call('SET', key, string.format('%.0f:%.0f:%.0f', st, param(i, 2), param(i, 3)), 'PX',
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
  elseif algo(i) == 4 then
    return st
  end
  return math.max(st, now)
end

-- verdict for the current state: code, new state (nil = no change), retry_after
local function verdict(i, st)
  local cost = cost_of(i)
  if algo(i) == 4 then
    -- Sliding log: used = units of the live entries; allowed when used + n <= limit (then
    -- merged into the newest entry when it is stamped now or later, else appended);
    -- denied: retry_after = the expiry of the first entry (oldest first) at which the units
    -- expired so far reach used + n - limit (a binary search over the running totals).
    local limit = param(i, 3)
    if cost > limit then
      return 2, nil, 0
    end
    if cost == 0 then
      return 0, nil, 0
    end
    if cost <= limit - st.used then
      local newest
      local last = st.newest
      if st.first and last[1] >= now then
        newest = {last[1], last[2] + cost, last[3] + cost}
      else
        local total = 0
        if last then
          total = last[3]
        end
        newest = {now, cost, total + cost}
      end
      local first = st.first or newest
      return 0, {first = first, newest = newest, rank = st.rank, count = st.count,
        used = st.used + cost}, 0
    end
    local need = st.used + cost - limit
    local before = st.first[3] - st.first[2]
    local lo, hi = st.rank, st.count - 1
    while lo < hi do
      local mid = math.floor((lo + hi) / 2)
      local e = sl_at(i, mid)
      if e[3] - before >= need then
        hi = mid
      else
        lo = mid + 1
      end
    end
    local k = sl_at(i, lo) or st.newest
    return 1, nil, sl_expires_in(i, k[1])
  end
  if algo(i) == 3 then
    local limit, w = param(i, 3), param(i, 2)
    if cost > limit then
      return 2, nil, 0
    end
    if cost == 0 then
      return 0, nil, 0
    end
    -- Allowed when previous * (W - elapsed) + (current + n) * W <= limit * W, that is
    -- from the earliest elapsed on (sw_earliest: exact whatever the counts, a debt too).
    local elapsed = sw_elapsed(i, st)
    local e, less = sw_earliest(i, st[3], st[2], cost)
    if e and e <= elapsed then
      return 0, {st[1], st[2] + cost, st[3]}, 0
    end
    -- retry_after = the µs value minus `less` ns (see sw_earliest).
    if e then
      return 1, nil, e - elapsed, less
    end
    e, less = sw_earliest(i, st[2], 0, cost)
    if not e then
      e, less = w, 0
    end
    return 1, nil, (w - elapsed) + e, less
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
  elseif algo(i) == 4 then
    return next_state.newest[1]
  end
  return next_state[1]
end

-- How long (µs) the row's fields change only with elapsed time (retry_after and reset_after
-- shrinking one for one, remaining constant, or for GCRA following from reset_after), so a
-- remembered answer stays exact that long; -1: as long as the key's state is not written.
-- Fixed window: until the window ends. Sliding window counter: until the window ends or the
-- estimate frees one more whole unit of remaining. Sliding log: until its oldest live entry
-- expires.
local function hold_of(i, st, remaining)
  if algo(i) == 4 then
    if st.first then
      return sl_expires_in(i, st.first[1])
    end
    return -1
  elseif algo(i) == 3 then
    local w = param(i, 2)
    local elapsed = sw_elapsed(i, st)
    local hold = w - elapsed
    local target = remaining + st[2] + 1
    if st[3] > 0 and target <= param(i, 3) then
      -- The budget floor((limit * W - previous * (W - e)) / W) reaches `target` when
      -- previous * (W - e) <= (limit - target) * W: the earliest e of a cost of `target`
      -- on an empty current window; rounded down to a whole µs.
      local e, less = sw_earliest(i, st[3], 0, target)
      if e then
        if less > 0 then
          e = e - 1
        end
        hold = math.min(hold, math.max(e - elapsed, 0))
      end
    end
    return hold
  elseif algo(i) == 2 then
    return fw_until_end(i, st[1])
  end
  return -1
end

-- One row: code, remaining, reset_after µs, retry_after µs, ns to take off retry_after
-- (`less`, sliding window counter), receipt stamp, hold µs (see hold_of).
local function report(out, i, code, st, retry, stamp, less)
  local remaining, reset
  if algo(i) == 4 then
    remaining = math.max(param(i, 3) - st.used, 0)
    reset = 0
    if st.first then
      reset = sl_expires_in(i, st.newest[1])
    end
  elseif algo(i) == 3 then
    remaining = math.max(sw_budget(i, st) - st[2], 0)
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
  out[#out + 1] = less or 0
  out[#out + 1] = stamp
  out[#out + 1] = hold_of(i, st, remaining)
end

-- Every policy's state as it is now (nothing written). `denied` (optional) is the charge
-- that refused a check, with its code and retry_after: it keeps them, since it was judged
-- together with the call's earlier charges of the same key (a duplicate charge), while its
-- remaining and reset_after are the state as it is.
local function peek_all(denied, denied_code, denied_retry, denied_less)
  local out = {server_now, 0}
  for i = 1, n do
    local st = current(i)
    local code, _, retry, less = verdict(i, st)
    if i == denied then
      code, retry, less = denied_code, denied_retry, denied_less
    end
    report(out, i, code, st, retry, -1, less)
  end
  return out
end

-- The largest cost that can ever fit: burst for GCRA, limit for the windows and the log.
local function capacity(i)
  if algo(i) == 1 then
    return param(i, 4)
  end
  return param(i, 3)
end

-- Charges of one call on the same key (a duplicate charge: one policy and client key
-- charged twice) are cumulative, as in the memory store: each is judged on the state the
-- earlier ones left, and a total above the capacity can never fit (code 2), whatever each
-- cost alone. `spent[key]` is the total so far in this call.
local spent = {}
local function judge(i, st)
  local total = (spent[KEYS[i]] or 0) + cost_of(i)
  spent[KEYS[i]] = total
  if total > capacity(i) then
    return 2, nil, 0, 0
  end
  return verdict(i, st)
end

-- Reset fences (see the 'reset' block): a receipt stamped at or below the fence of its key
-- was handed out before a reset of the key, so its refund gives back nothing. The fence is
-- a key of its own, "<state key>#reset" (policy names never hold '#'), in the state key's
-- hash tag, so it lives in the same Cluster slot; it is declared in KEYS (fence_key).
local function fenced(i, s)
  local f = tonumber(redis.call('GET', fence_key(i)))
  return f ~= nil and s <= f
end

-- Gives back `cost` units of the charge with receipt stamp s: only what that charge still
-- holds. One rule for a refund and for a correction's give-back but for the turns
-- already booked beyond now + tau (GCRA), which `pays_debt` decides: a refund (false) keeps
-- a later reservation's turn, a correction (true) reads them as a debt and pays it off.
-- GCRA (stamp s = the TAT right after the charge, st = the stored TAT):
--   st <= now                : the bucket drained the charge: nothing;
--   st == s                  : the charge is the latest: TAT = s - cost * T;
--   st - tau > now           : a refund: a later reservation still waits for its slot,
--                              nothing; a give-back: as the next rule;
--   otherwise                : min(cost * T, max(min(s, st) - now, 0)) off the top, so a
--                              charge never gives back time already drained, nor more than
--                              is outstanding.
--   Never below now (a TAT in the past is "absent": deleted).
-- Fixed window: only in the window the charge counted in. Sliding window counter: from the
-- current count in that window, from the previous count in the next one, later nothing.
-- Sliding log: from the entry stamped s while it counts. Window counts are read as stored
-- (a debt whole), by a refund and a give-back alike.
local function give_back(i, pays_debt)
  local cost, s = cost_of(i), stamp_of(i)
  if s < 0 or cost <= 0 then
    return
  end
  if fenced(i, s) then
    return
  end
  if algo(i) == 4 then
    -- Sliding log: at most cost units off the entry stamped s, while s + W > now; the
    -- running totals of the entries from it on drop by what comes back (O(entries after
    -- it), usually none: the refunded charge is mostly the newest).
    local key, w = KEYS[i], param(i, 2)
    if s + w <= now then
      return
    end
    local fs = string.format('%.0f', s)
    local e = sl_parse(redis.call('ZRANGEBYSCORE', key, fs, fs)[1])
    if not e then
      return
    end
    local back = math.min(cost, e[2])
    local later = redis.call('ZRANGEBYSCORE', key, '(' .. fs, '+inf')
    redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%.0f', now - w))
    redis.call('ZREMRANGEBYSCORE', key, fs, '+inf')
    if e[2] > back then
      redis.call('ZADD', key, fs, sl_member({e[1], e[2] - back, e[3] - back}))
    end
    for _, m in ipairs(later) do
      local x = sl_parse(m)
      if x then
        redis.call('ZADD', key, string.format('%.0f', x[1]), sl_member({x[1], x[2], x[3] - back}))
      end
    end
    -- Emptying the set deleted the key (and its TTL): PX again from the newest entry left.
    local newest = sl_parse(redis.call('ZRANGE', key, -1, -1)[1])
    if newest then
      redis.call('PEXPIRE', key,
        string.format('%.0f', math.max(1, min_ttl, math.ceil((newest[1] + w - now) / 1000))))
    end
    cache[key] = nil
    return
  end
  if algo(i) == 1 then
    local st = load(i)
    if st <= now then
      return
    end
    if st ~= s and st - param(i, 3) > now and not pays_debt then
      return
    end
    local give = cost * param(i, 2)
    if st ~= s then
      give = math.min(give, math.max(math.min(s, st) - now, 0))
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
  -- Latest charge first, as the memory store gives back: a request that charged one key
  -- twice gets both back (its later charge is the latest booking).
  for i = n, 1, -1 do
    give_back(i, false)
  end
  return peek_all()
end

-- 'correct': settles charges whose true cost is now known (Store::correct), latest first
-- like 'refund'. Per key, the stamp says what to do with `cost` units:
--   stamp >= 0 (or -1: none): give back `cost` units of the charge with that receipt, by the
--     refund rules with pays_debt (see give_back): a GCRA TAT beyond now + tau is a debt
--     left by extra charges, paid off (no "a later reservation waits" rule);
--   stamp -2 ('debit'): charge `cost` units at now without refusing, the twin of the
--     algorithms' `debited`: GCRA TAT = max(TAT, now) + cost * T; windows: count += cost in
--     the window of now; sliding log: cost units in an entry stamped now (merged into the
--     newest when it is stamped now or later). The state may go beyond the capacity; PX
--     follows it as for any write.
local function debit(i)
  local cost = cost_of(i)
  if cost <= 0 then
    return
  end
  local st
  if algo(i) == 1 then
    st = math.max(load(i), now) + cost * param(i, 2)
  elseif algo(i) == 4 then
    local log = load(i)
    local last = log.newest
    local newest
    if log.first and last[1] >= now then
      newest = {last[1], last[2] + cost, last[3] + cost}
    else
      local total = 0
      if last then
        total = last[3]
      end
      newest = {now, cost, total + cost}
    end
    -- Written, then read again from the set (its ranks changed).
    store(i, {newest = newest})
    cache[KEYS[i]] = nil
    return
  else
    st = current(i)
    st[2] = st[2] + cost
  end
  cache[KEYS[i]] = st
  store(i, st)
end

if mode == 'correct' then
  for i = n, 1, -1 do
    if stamp_of(i) == -2 then
      debit(i)
    else
      give_back(i, true)
    end
  end
  return peek_all()
end

if mode == 'peek' then
  return peek_all()
end

-- Bans, the twin of the memory store's (MemoryStore::with_bans): a ban in force refuses
-- the whole call before anything is charged; after a denial that refuses the request,
-- every denied charge whose policy has a ban counts one refusal (each key once): the count
-- starts at the first refusal and runs `within`; the `after`-th refusal within it starts a
-- ban of `duration` (the count back at 0). Refusals during a ban count nothing.
local function ban_state(ban)
  if not ban.state then
    ban.state = {0, 0, 0}
    local raw = redis.call('GET', ban.key)
    if raw then
      local u, f, c = string.match(raw, '^(%d+):(%d+):(%d+)$')
      if u then
        ban.state = {tonumber(u), tonumber(f), tonumber(c)}
      end
    end
  end
  return ban.state
end

-- µs until the ban of charge i ends, or nil (no ban in force).
local function ban_ends_in(i)
  local ban = ban_of[i]
  if not ban then
    return nil
  end
  local st = ban_state(ban)
  if st[1] > now then
    return st[1] - now
  end
  return nil
end

-- Counts one refusal of charge i; true when it starts a ban.
local function ban_refuse(i)
  local ban = ban_of[i]
  local st = ban_state(ban)
  if st[1] > now then
    return false
  end
  local first, count = st[2], st[3]
  if count == 0 or first + ban.within <= now then
    first, count = now, 0
  end
  count = count + 1
  local started = count >= ban.after
  local until_ = st[1]
  if started then
    until_, count = now + ban.duration, 0
  end
  ban.state = {until_, first, count}
  local live = math.max(until_ - now, 0)
  if count > 0 then
    live = math.max(live, first + ban.within - now)
  end
  redis.call('SET', ban.key, string.format('%.0f:%.0f:%.0f', until_, first, count), 'PX',
    string.format('%.0f', math.max(1, min_ttl, math.ceil(live / 1000))))
  return started
end

-- The row of charge i in `out` (after server_now and status) set to a ban's: code, 0
-- remaining, reset_after = retry_after = `wait` µs (`less` ns off), no receipt, no hold.
local function ban_row(out, i, code, wait, less)
  local at = 2 + (i - 1) * 7
  out[at + 1] = code
  out[at + 2] = 0
  out[at + 3] = wait
  out[at + 4] = wait
  out[at + 5] = less
  out[at + 6] = -1
  out[at + 7] = -1
end

-- A ban in force for any charge refuses the call: nothing charged, every policy reports its
-- state, the ban ending last reports the ban; a reservation's refusal is final when the ban
-- ends after max_wait.
local function ban_precheck()
  if next(ban_of) == nil then
    return nil
  end
  local banned, longest = nil, 0
  for i = 1, n do
    local ends = ban_ends_in(i)
    if ends and ends > longest then
      banned, longest = i, ends
    end
  end
  if not banned then
    return nil
  end
  local out = peek_all()
  ban_row(out, banned, 3, longest, 0)
  if string.sub(mode, 1, 8) == 'reserve:' then
    out[#out + 1] = 0
    if longest > tonumber(string.sub(mode, 9)) then
      out[#out + 1] = 1
    else
      out[#out + 1] = 0
    end
  end
  return out
end

-- After a denial answered in `out` (a 'check' when max_wait is nil, else a 'reserve' whose
-- last value says whether the denial is final): counts the refusals (see above) and marks
-- a refusal that starts a ban: retry_after = the longer of the ban and the quota's wait.
local function ban_count(out, max_wait)
  if next(ban_of) == nil then
    return out
  end
  local rows = 2
  local is_final = false
  if max_wait then
    is_final = out[#out] == 1
  end
  -- A reservation's denial refuses when it is final or its retry_after (µs, less 0..999
  -- ns: longer than max_wait exactly when the µs are) is longer than max_wait.
  local longest = 0
  for i = 1, n do
    local at = rows + (i - 1) * 7
    if out[at + 1] == 1 then
      longest = math.max(longest, out[at + 4])
    end
  end
  if max_wait and not is_final and longest <= max_wait then
    return out
  end
  local seen = {}
  for i = 1, n do
    local at = rows + (i - 1) * 7
    if ban_of[i] and out[at + 1] == 1 and not seen[KEYS[i]] then
      seen[KEYS[i]] = true
      if ban_refuse(i) then
        local wait, less = out[at + 4], out[at + 5]
        if ban_of[i].duration >= wait then
          wait, less = ban_of[i].duration, 0
        end
        ban_row(out, i, 4, wait, less)
        if max_wait and wait > max_wait then
          out[#out] = 1
        end
      end
    end
  end
  return out
end

-- 'reset': forgets every KEYS[i] (its next request sees the whole burst) and fences it, so
-- that no receipt handed out before gives anything back after (see `fenced`). The fence is
-- the largest stamp a charge before the reset can hold: GCRA max(stored TAT, now + tau)
-- (a stamp is the TAT right after its charge: at most now + tau, or a booked turn, which
-- the stored TAT covers); the windows the current window index; the sliding log
-- max(newest entry's ts, now). It never moves down (an earlier reset's fence is kept if
-- higher) and lives (PX) until every such stamp is stale: GCRA until the fence, the fixed
-- window until its window ends, the sliding window counter until the next window ends (a
-- refund reaches one window back), the sliding log until fence + W. A charge made after
-- the reset with a stamp at or below the fence (the same window, or within about tau)
-- gives back nothing either: a refund may come back short, never more than was charged
-- since. A ban of the key under a reset policy (and its count of refusals) is deleted too.
-- Returns the rows of peek_all (the state after: absent).
if mode == 'reset' then
  for i = 1, n do
    local key, a = KEYS[i], algo(i)
    local fence, span
    if a == 1 then
      local tat = 0
      local raw = redis.call('GET', key)
      if raw then
        tat = tonumber(string.match(raw, '^(%d+)')) or 0
      end
      fence = math.max(tat, now + param(i, 3))
      span = fence - now
    elseif a == 4 then
      local newest = sl_parse(redis.call('ZRANGE', key, -1, -1)[1])
      fence = now
      if newest then
        fence = math.max(newest[1], now)
      end
      span = fence + param(i, 2) - now
    else
      local w = param(i, 2)
      fence = math.floor(now / w)
      local windows = 1
      if a == 3 then
        windows = 2
      end
      span = (fence + windows) * w - now
    end
    local fkey = fence_key(i)
    local ttl = math.max(1, min_ttl, math.ceil(span / 1000))
    local old = tonumber(redis.call('GET', fkey))
    if old and old > fence then
      fence = old
      ttl = math.max(ttl, redis.call('PTTL', fkey))
    end
    redis.call('DEL', key)
    if ban_of[i] then
      redis.call('DEL', ban_of[i].key)
    end
    redis.call('SET', fkey, string.format('%.0f', fence), 'PX', string.format('%.0f', ttl))
  end
  cache = {}
  return peek_all()
end

-- 'inspect': peek_all with the bans in force (an operator's peek): a charge whose key is
-- banned reports the ban (code 3, retry_after and reset_after = the time until it ends).
-- Writes nothing.
if mode == 'inspect' then
  local out = peek_all()
  for i = 1, n do
    local ends = ban_ends_in(i)
    if ends then
      ban_row(out, i, 3, ends, 0)
    end
  end
  return out
end

if mode == 'check' or string.sub(mode, 1, 8) == 'reserve:' then
  local banned = ban_precheck()
  if banned then
    return banned
  end
end

-- 'reserve:<max_wait>': the Delay mode's reservation, all-or-nothing like 'check'.
--   GCRA (kind 1, the twin of Gcra::reserve): tat = max(stored, now) read as stored (turns
--     already booked included); new_tat = tat + n * T; wait = max(new_tat - tau - now, 0);
--     reserved when wait <= max_wait (TAT := new_tat, delay = wait), else denied with
--     retry_after = wait - max_wait, final.
--   Leaky-bucket shaper (kind 2, the twin of LeakyBucket::shape): tat = the state in force;
--     delay = tat - now; queued when the meter allows and delay <= max_wait, else denied with
--     retry_after = max(the meter's retry_after, delay - max_wait), final.
--   Other algorithms (kind -1) check; their denials are not final (check-and-retry).
--   The delay of the request is the longest of its policies'.
-- The state the leaky-bucket shaper reads (LeakyBucket::shape), and whether it is a debt:
-- the state in force, at most tau ahead; the shaper never queues beyond tau, so a TAT
-- beyond now + tau is a correction's debt, which a charge that can fit (0 < cost <= burst)
-- reads as stored, and waits out (as the memory store's shaper).
local function shaper_state(i, cost)
  local st, horizon = current(i), now + param(i, 3)
  if st <= horizon then
    return st, false
  end
  if cost > 0 and cost <= param(i, 4) then
    return st, true
  end
  return horizon, false
end

local max_wait = nil
if string.sub(mode, 1, 8) == 'reserve:' then
  max_wait = tonumber(string.sub(mode, 9))
end
if max_wait then
  local out = {server_now, 0}
  local writes = {}
  local delay = 0
  for i = 1, n do
    local kind = stamp_of(i)
    local cost = cost_of(i)
    local code, next_state, retry, wait, shown, less = 0, nil, 0, 0, nil, 0
    local total = (spent[KEYS[i]] or 0) + cost
    spent[KEYS[i]] = total
    if kind ~= 1 and total > capacity(i) then
      -- With the call's earlier charges of this key, it can never fit (see `judge`). GCRA
      -- reservations book one turn per charge, so their total may exceed the burst.
      code = 2
    elseif kind == 1 then
      local t, tau, burst = param(i, 2), param(i, 3), param(i, 4)
      local tat = math.max(load(i), now)
      shown = tat
      if cost > burst then
        code = 2
      elseif cost > 0 then
        local new_tat = tat + cost * t
        local w = math.max(new_tat - tau - now, 0)
        if w <= max_wait then
          next_state, shown, wait = new_tat, new_tat, w
        else
          code, retry = 1, w - max_wait
        end
      end
    elseif kind == 2 then
      local st, in_debt = shaper_state(i, cost)
      shown = st
      if in_debt then
        -- Waits the debt out: until the charge fits the bucket and the queue max_wait.
        local tau = param(i, 3)
        code, retry = 1, math.max(st + cost * param(i, 2) - tau - now, st - now - max_wait)
      elseif cost > 0 then
        local d = st - now
        local c, ns, r = verdict(i, st)
        if c == 0 and d <= max_wait then
          next_state, shown, wait = ns, ns, d
        elseif c == 2 then
          code = 2
        else
          code, retry = 1, math.max(r, d - math.min(max_wait, d))
        end
      end
    else
      local st = current(i)
      code, next_state, retry, less = verdict(i, st)
      shown = next_state or st
    end
    if code ~= 0 then
      -- Nothing written: this policy reports its refusal, every policy its state as is
      -- (the refused one's too: the state the call's earlier charges of its key would have
      -- left was never written).
      cache = {}
      if kind == 1 then
        shown = math.max(load(i), now)
      elseif kind == 2 then
        shown = shaper_state(i, cost)
      else
        shown = current(i)
      end
      local denied_out = {server_now, 0}
      for j = 1, n do
        if j == i then
          report(denied_out, i, code, shown, retry, -1, less)
        else
          local sj = current(j)
          local cj, _, rj, lj = verdict(j, sj)
          report(denied_out, j, cj, sj, rj, -1, lj)
        end
      end
      local final = 0
      if kind > 0 or code == 2 then
        final = 1
      end
      denied_out[#denied_out + 1] = 0
      denied_out[#denied_out + 1] = final
      return ban_count(denied_out, max_wait)
    end
    if next_state then
      cache[KEYS[i]] = next_state
      writes[i] = next_state
      report(out, i, 0, next_state, 0, receipt(i, next_state))
    else
      report(out, i, 0, shown, 0, -1)
    end
    delay = math.max(delay, wait)
  end
  for i = 1, n do
    if writes[i] then
      store(i, writes[i])
    end
  end
  out[#out + 1] = delay
  out[#out + 1] = 0
  return out
end

local out = {server_now, 0}
local writes = {}
local denied = nil
local denied_code, denied_retry, denied_less = 0, 0, 0
for i = 1, n do
  local st = current(i)
  local code, next_state, retry, less = judge(i, st)
  if code ~= 0 then
    denied, denied_code, denied_retry, denied_less = i, code, retry, less
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
  return ban_count(peek_all(denied, denied_code, denied_retry, denied_less), nil)
end
-- In charge order, so a key charged twice in one call ends with its last (cumulative) state.
for i = 1, n do
  if writes[i] then
    store(i, writes[i])
  end
end
return out
