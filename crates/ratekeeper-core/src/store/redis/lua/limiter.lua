-- The limiter: one call decides (or peeks, refunds, corrects, resets, inspects, reserves)
-- every charge of one client key, atomically. The wire layout (KEYS, ARGV, the reply) is
-- defined in `protocol.rs`, whose constants head this library.
--
-- KEYS      the states, one per charge (same hash tag: one Cluster slot); in the refund,
--           correct and reset ops their reset fences after them, "<state>#reset" in the same
--           order; then the ban keys of the bans' tail.
-- ARGV      injected now µs or '' (Redis TIME); the stale guard (Redis TIME µs) or ''; the
--           op; the least PX of a write (ms); in a reservation the most it may wait (µs);
--           then per charge its algorithm, three parameters, cost and stamp (a refund or a
--           correction: the receipt, or STAMP_NONE / STAMP_DEBIT; a reservation: how its
--           policy reserves; else ignored); then, only when some policy has a ban, the
--           bans' tail (per ban its charge, refusals, within µs, duration µs; then how many).
-- Reply     {server_now, status, rows...}: STATUS_STALE (no rows, nothing written) or
--           STATUS_DONE and one row of ROW_LEN integers per charge (see `report`); a
--           reservation adds its delay (µs) and FINAL / NOT_FINAL.
-- Every write sets PX to the time until the state equals "absent" (rounded up to a ms, at
-- least the least PX); a state equal to "absent" is deleted.

-- The states a check or a reservation writes once every charge passed, by charge (false:
-- none); one table for every call, its first n entries set by each.
local pending = {}

-- The reset fence of charge i (only in the ops that send fences).
local function fence_key(i)
  return K[n + i]
end

-- Reset fences (see `op_reset`): a receipt stamped at or below the fence of its key was
-- handed out before a reset of the key, so its refund gives back nothing. The fence is a
-- key of its own, "<state key>#reset" (policy names never hold '#'), in the state key's
-- hash tag, so it lives in the same Cluster slot; it is declared in KEYS.
local function fenced(i, s)
  local f = tonumber(redis.call('GET', fence_key(i)))
  return f ~= nil and s <= f
end

-- Gives back COST[i] units of the charge with receipt STAMP[i]: only what that charge still
-- holds (each algorithm's `give_back`). A refund (pays_debt false) keeps a later
-- reservation's GCRA turn, a correction (true) reads it as a debt and pays it off.
local function give_back(i, pays_debt)
  local s = STAMP[i]
  if s < 0 or COST[i] <= 0 or fenced(i, s) then
    return
  end
  algorithm(i).give_back(i, s, pays_debt, load)
end

-- A refund: latest charge first, as the memory store gives back (a request that charged one
-- key twice gets both back: its later charge is the latest booking).
local function op_refund()
  for i = n, 1, -1 do
    give_back(i, false)
  end
  return peek_all()
end

-- A correction settles charges whose true cost is now known (Store::correct), latest first
-- like a refund. Per key, the stamp says what to do with COST[i] units: a receipt (or
-- STAMP_NONE): give them back by the refund rules with pays_debt; STAMP_DEBIT: charge them
-- at now without refusing (each algorithm's `debit`, the twin of the algorithms'
-- `debited`). The state may go beyond the capacity; PX follows it as for any write.
local function op_correct()
  for i = n, 1, -1 do
    if STAMP[i] == STAMP_DEBIT then
      if COST[i] > 0 then
        local st = algorithm(i).debit(i, load(i))
        if st ~= nil then
          store(i, st)
        end
      end
    else
      give_back(i, true)
    end
  end
  return peek_all()
end

-- A reset forgets every key (its next request sees the whole burst) and fences it, so that
-- no receipt handed out before gives anything back after (see `fenced`). The fence is the
-- largest stamp a charge before the reset can hold, and lives until every such stamp is
-- stale (each algorithm's `fence`). It never moves down (an earlier reset's fence is kept
-- if higher). A charge made after the reset with a stamp at or below the fence gives back
-- nothing either: a refund may come back short, never more than was charged since. A ban
-- of the key under a reset policy (and its count of refusals) is deleted too. Returns the
-- rows of peek_all (the state after: absent).
local function op_reset()
  for i = 1, n do
    local fence, span = algorithm(i).fence(i)
    local fkey = fence_key(i)
    local ttl = math.max(1, min_ttl, math.ceil(span / 1000))
    local old = tonumber(redis.call('GET', fkey))
    if old and old > fence then
      fence = old
      ttl = math.max(ttl, redis.call('PTTL', fkey))
    end
    redis.call('DEL', K[i])
    if ban_of[i] then
      redis.call('DEL', ban_of[i].key)
    end
    redis.call('SET', fkey, string.format('%d', fence), 'PX', string.format('%d', ttl))
  end
  cache = {}
  return peek_all()
end

-- An operator's peek: peek_all with the bans in force (a charge whose key is banned reports
-- the ban: retry_after and reset_after = the time until it ends). Writes nothing.
local function op_inspect()
  local out = peek_all()
  for i = 1, n do
    local ends = ban_ends_in(i)
    if ends then
      ban_row(out, i, CODE_BANNED, ends, 0)
    end
  end
  return out
end

-- A reservation for a request that may wait up to max_wait µs (see `shaper.lua`); the
-- request's delay is the longest of its policies'.
local function op_reserve(max_wait)
  local out = reply_table()
  local delay = 0
  for i = 1, n do
    local kind, cost = STAMP[i], COST[i]
    local code, next_state, retry, wait, shown, less = CODE_ALLOWED, nil, 0, 0, nil, 0
    local total = earlier(i) + cost
    if kind ~= RESERVE_GCRA and total > capacity(i) then
      -- With the call's earlier charges of this key, it can never fit (see `judge`). GCRA
      -- reservations book one turn per charge, so their total may exceed the burst.
      code = CODE_CANNOT_FIT
    elseif kind == RESERVE_GCRA then
      code, next_state, retry, wait, shown = reserve_gcra(i, cost, max_wait)
    elseif kind == RESERVE_SHAPER then
      code, next_state, retry, wait, shown = reserve_shaper(i, cost, max_wait)
    else
      local st = current(i)
      code, next_state, retry, less = verdict(i, st)
      shown = next_state or st
    end
    if code ~= CODE_ALLOWED then
      -- Nothing written: this policy reports its refusal, every policy its state as is
      -- (the refused one's too: the state the call's earlier charges of its key would have
      -- left was never written).
      cache = {}
      shown = reserve_shown(i, kind, cost)
      local denied_out = reply_table()
      for j = 1, n do
        if j == i then
          report(denied_out, i, code, shown, retry, STAMP_NONE, less)
        else
          local sj = current(j)
          local cj, _, rj, lj = verdict(j, sj)
          report(denied_out, j, cj, sj, rj, STAMP_NONE, lj)
        end
      end
      local final = NOT_FINAL
      if kind ~= RESERVE_NONE or code == CODE_CANNOT_FIT then
        final = FINAL
      end
      denied_out[#denied_out + 1] = 0
      denied_out[#denied_out + 1] = final
      return ban_count(denied_out, max_wait)
    end
    if next_state then
      cache[K[i]] = next_state
      pending[i] = next_state
      report(out, i, CODE_ALLOWED, next_state, 0, algorithm(i).receipt(i, next_state))
    else
      pending[i] = false
      report(out, i, CODE_ALLOWED, shown, 0, STAMP_NONE)
    end
    delay = math.max(delay, wait)
  end
  for i = 1, n do
    if pending[i] then
      store(i, pending[i])
    end
  end
  out[#out + 1] = delay
  out[#out + 1] = NOT_FINAL
  return out
end

-- A check: every charge or none (all-or-nothing).
local function op_check()
  local out = reply_table()
  for i = 1, n do
    local st = current(i)
    local code, next_state, retry, less = judge(i, st)
    if code ~= CODE_ALLOWED then
      -- Nothing was written; every policy reports its state as it is.
      cache = {}
      return ban_count(peek_all(i, code, retry, less), nil)
    end
    if next_state and n == 1 then
      -- The only charge: written at once.
      store(i, next_state)
      report(out, i, code, next_state, retry, algorithm(i).receipt(i, next_state))
    elseif next_state then
      cache[K[i]] = next_state
      pending[i] = next_state
      report(out, i, code, next_state, retry, algorithm(i).receipt(i, next_state))
    else
      pending[i] = false
      report(out, i, code, st, retry, STAMP_NONE)
    end
  end
  -- In charge order, so a key charged twice in one call ends with its last (cumulative)
  -- state.
  if n > 1 then
    for i = 1, n do
      if pending[i] then
        store(i, pending[i])
      end
    end
  end
  return out
end

-- The limiter's entry: KEYS and ARGV of one call (see above).
local function limiter(keys, args)
  if not start(keys, args, args[ARG_NOW], args[ARG_STALE], args[ARG_MIN_TTL]) then
    return {server_now, STATUS_STALE}
  end
  local op = args[ARG_OP]
  local head = ARGS_HEAD
  local max_wait = nil
  if op == OP_RESERVE then
    max_wait = args[ARG_MAX_WAIT] + 0
    head = head + 1
  end
  -- Keys per charge: the state, and its reset fence in the ops that read or write fences.
  local per_charge = 1
  if op == OP_REFUND or op == OP_CORRECT or op == OP_RESET then
    per_charge = 2
  end
  n = #keys / per_charge
  if #args ~= head + CHARGE_ARGS * n then
    -- The bans' tail: its last value is how many bans (their keys come last).
    n = (#keys - args[#args]) / per_charge
    bans_start(keys, args, head + CHARGE_ARGS * n)
  elseif next(ban_of) ~= nil then
    ban_of = {}
  end
  -- The stamp is read only by the ops that use it.
  local stamps = op ~= OP_CHECK and op ~= OP_PEEK and op ~= OP_INSPECT
  for i = 1, n do
    local at = head + CHARGE_ARGS * (i - 1)
    base[i] = at
    SUFFIX[i] = false
    ALG[i] = args[at + CHARGE_ALGO]
    P1[i] = args[at + CHARGE_P1] + 0
    P2[i] = args[at + CHARGE_P2] + 0
    P3[i] = args[at + CHARGE_P3] + 0
    local cost = args[at + CHARGE_COST]
    if cost == '1' then
      COST[i] = 1
    else
      COST[i] = cost + 0
    end
    if stamps then
      STAMP[i] = args[at + CHARGE_STAMP] + 0
    end
  end
  if op == OP_CHECK or op == OP_RESERVE then
    local banned = ban_precheck(max_wait)
    if banned then
      return banned
    end
  end
  if op == OP_CHECK then
    return op_check()
  elseif op == OP_RESERVE then
    return op_reserve(max_wait)
  elseif op == OP_PEEK then
    return peek_all()
  elseif op == OP_REFUND then
    return op_refund()
  elseif op == OP_CORRECT then
    return op_correct()
  elseif op == OP_RESET then
    return op_reset()
  elseif op == OP_INSPECT then
    return op_inspect()
  end
  return redis.error_reply('ratekeeper: unknown op ' .. tostring(op))
end
