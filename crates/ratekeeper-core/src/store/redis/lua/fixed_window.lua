-- Fixed window, the twin of ratekeeper_core::algorithm::FixedWindow, in integer µs.
-- Parameters: P1 = W, the window; P2 = limit. State "<window>:<count>:<W>" with window =
-- floor(t / W); absent = count 0. In a call the state is {window, count}. Counts are the
-- units charged, read as stored: a count above the limit (a correction's debt, or units
-- charged under a higher limit) counts whole, as in the memory store.
local fixed_window = {}

-- The stored state under the window in force: written under another window length, the
-- units it still counts at now move into the current window of the new length, so a changed
-- W never mixes windows and never frees units.
function fixed_window.load(i, raw)
  if raw then
    local a, b, d = string.match(raw, '^(%d+):(%d+):(%d+)$')
    if a then
      local w, c, w_old = tonumber(a), tonumber(b), tonumber(d)
      local len = P1[i]
      if w_old == len then
        return {w, c}
      end
      if (w + 1) * w_old > now then
        return {math.floor(now / len), c}
      end
    end
  end
  return {0, 0}
end

-- The state of key i as stored, under the parameters in force.
function fixed_window.read(i)
  return fixed_window.load(i, redis.call('GET', K[i]))
end

-- The state rolled to the window of now (counts as stored).
function fixed_window.current(i, st)
  local w = math.floor(now / P1[i])
  if st[1] == w then
    return {w, st[2]}
  end
  return {w, 0}
end

-- µs until window w ends.
function fixed_window.until_end(i, w)
  return (w + 1) * P1[i] - now
end

-- Writes the state (PX until the window ends; deleted when empty).
function fixed_window.store(i, st)
  if st[2] <= 0 then
    redis.call('DEL', K[i])
  else
    redis.call('SET', K[i], string.format('%d:%d%s', st[1], st[2], text(i, CHARGE_P1)),
      'PX', px(fixed_window.until_end(i, st[1])))
  end
end

function fixed_window.capacity(i)
  return P2[i]
end

function fixed_window.verdict(i, st)
  local cost, limit = COST[i], P2[i]
  if cost > limit then
    return CODE_CANNOT_FIT, nil, 0
  end
  if cost == 0 then
    return CODE_ALLOWED, nil, 0
  end
  if cost <= limit - st[2] then
    return CODE_ALLOWED, {st[1], st[2] + cost}, 0
  end
  return CODE_DENIED, nil, fixed_window.until_end(i, st[1])
end

-- remaining, reset_after µs and hold (the fields change only with time until the window
-- ends).
function fixed_window.row(i, st)
  local until_end = fixed_window.until_end(i, st[1])
  local reset = 0
  if st[2] > 0 then
    reset = until_end
  end
  return math.max(P2[i] - st[2], 0), reset, until_end
end

-- The receipt of a charge: the index of the window it counted in.
function fixed_window.receipt(_, st)
  return st[1]
end

-- Gives back COST[i] units of the charge with receipt s: only in the window it counted in.
function fixed_window.give_back(i, s, _, stored)
  local st = fixed_window.current(i, stored(i))
  if st[1] == s and st[2] > 0 then
    st = {st[1], math.max(st[2] - COST[i], 0)}
    cache[K[i]] = st
    fixed_window.store(i, st)
  end
end

-- Charges COST[i] units at now without refusing: count += cost in the window of now.
function fixed_window.debit(i, st)
  st = fixed_window.current(i, st)
  return {st[1], st[2] + COST[i]}
end

-- The reset fence of key i: the current window index, live until the window ends.
function fixed_window.fence(i)
  local fence = math.floor(now / P1[i])
  return fence, (fence + 1) * P1[i] - now
end
