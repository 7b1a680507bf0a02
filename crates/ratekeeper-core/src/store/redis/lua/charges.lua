-- The charges of a call: each key's algorithm (by id), its state read once per call
-- (cached), and its row in the reply.
local ALGORITHMS = {
  [ALGO_GCRA] = gcra,
  [ALGO_FIXED_WINDOW] = fixed_window,
  [ALGO_SLIDING_WINDOW] = sliding_window,
  [ALGO_SLIDING_LOG] = sliding_log,
}

-- The algorithm of charge i.
local function algorithm(i)
  return ALGORITHMS[ALG[i]]
end

-- The state of charge i's key as stored (under the parameters in force), read once per
-- call.
local function load(i)
  local key = K[i]
  local v = cache[key]
  if v == nil then
    v = ALGORITHMS[ALG[i]].read(i)
    cache[key] = v
  end
  return v
end

-- The state at now (GCRA: max(stored, now); windows: rolled to the window of now).
local function current(i)
  return ALGORITHMS[ALG[i]].current(i, load(i))
end

-- Writes `st` as charge i's state and keeps it for the rest of the call.
local function store(i, st)
  cache[K[i]] = st
  ALGORITHMS[ALG[i]].store(i, st)
end

-- code, new state (nil: no change), retry_after µs, ns off retry_after.
local function verdict(i, st)
  return ALGORITHMS[ALG[i]].verdict(i, st)
end

-- The largest cost that can ever fit: burst for GCRA, limit for the windows and the log.
local function capacity(i)
  return ALGORITHMS[ALG[i]].capacity(i)
end

-- Appends charge i's row to `out`: code, remaining, reset_after µs, retry_after µs, ns to
-- take off retry_after (`less`, sliding window counter), receipt stamp, hold (µs the row's
-- fields change only with elapsed time, HOLD_UNBOUNDED: as long as the key's state is not
-- written).
local function report(out, i, code, st, retry, stamp, less)
  local remaining, reset, hold = ALGORITHMS[ALG[i]].row(i, st)
  local at = #out
  out[at + ROW_CODE] = code
  out[at + ROW_REMAINING] = remaining
  out[at + ROW_RESET] = reset
  out[at + ROW_RETRY] = retry
  out[at + ROW_LESS] = less or 0
  out[at + ROW_STAMP] = stamp
  out[at + ROW_HOLD] = hold
end

-- A reply's table, sized at once for the rows of a call of up to 4 charges (a table that
-- grows is copied at 4, 8 and 16 values).
local function reply_table()
  if n == 1 then
    return {server_now, STATUS_DONE, nil, nil, nil, nil, nil, nil, nil}
  elseif n <= 4 then
    return {server_now, STATUS_DONE, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil,
      nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil, nil}
  end
  return {server_now, STATUS_DONE}
end

-- Every policy's state as it is now (nothing written). `denied` (optional) is the charge
-- that refused a check, with its code and retry_after: it keeps them, since it was judged
-- together with the call's earlier charges of the same key (a duplicate charge), while its
-- remaining and reset_after are the state as it is.
local function peek_all(denied, denied_code, denied_retry, denied_less)
  local out = reply_table()
  for i = 1, n do
    local st = current(i)
    local code, _, retry, less = verdict(i, st)
    if i == denied then
      code, retry, less = denied_code, denied_retry, denied_less
    end
    report(out, i, code, st, retry, STAMP_NONE, less)
  end
  return out
end

-- The units the call's charges before charge i ask of its key (0 when it is the first
-- charge of its key). Key names are interned strings: comparing two is one pointer, and a
-- call holds a request's few policies, so a scan costs less than a table.
local function earlier(i)
  local key, total = K[i], 0
  for j = 1, i - 1 do
    if K[j] == key then
      total = total + COST[j]
    end
  end
  return total
end

-- Charges of one call on the same key (a duplicate charge: one policy and client key
-- charged twice) are cumulative, as in the memory store: each is judged on the state the
-- earlier ones left, and a total above the capacity can never fit, whatever each cost
-- alone.
local function judge(i, st)
  if i == 1 then
    -- No earlier charge: the total is the cost, which `verdict` weighs against the
    -- capacity itself.
    return verdict(i, st)
  end
  local total = earlier(i) + COST[i]
  if total > capacity(i) then
    return CODE_CANNOT_FIT, nil, 0, 0
  end
  return verdict(i, st)
end
