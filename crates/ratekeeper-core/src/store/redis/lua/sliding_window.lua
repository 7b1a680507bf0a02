-- Sliding window counter, the twin of ratekeeper_core::algorithm::SlidingWindow, in integer
-- µs. Parameters: P1 = W, the window; P2 = limit. State "<window>:<current>:<previous>:<W>";
-- absent = both 0. In a call the state is {window, current, previous}. Counts are read as
-- stored (a debt whole). The Rust side keeps 2 * limit * W below 2^53, so every product
-- here is an exact double.
local sliding_window = {}

-- The stored state under the window in force: written under another window length, the
-- units it still counts at now (its estimate) move into the current window of the new
-- length.
function sliding_window.load(i, raw)
  if raw then
    local a, b, d, e = string.match(raw, '^(%d+):(%d+):(%d+):(%d+)$')
    if a then
      local w, c, p, w_old = tonumber(a), tonumber(b), tonumber(d), tonumber(e)
      local len = P1[i]
      if w_old == len then
        return {w, c, p}
      end
      local wo = math.floor(now / w_old)
      local el = now - wo * w_old
      local est = 0
      if w == wo then
        est = p * (w_old - el) / w_old + c
      elseif w + 1 == wo then
        est = c * (w_old - el) / w_old
      end
      return {math.floor(now / len), math.ceil(est), 0}
    end
  end
  return {0, 0, 0}
end

-- The state of key i as stored, under the parameters in force.
function sliding_window.read(i)
  return sliding_window.load(i, redis.call('GET', K[i]))
end

-- The state rolled to the window of now (counts as stored).
function sliding_window.current(i, st)
  local w = math.floor(now / P1[i])
  if st[1] == w then
    return {w, st[2], st[3]}
  elseif st[1] + 1 == w then
    return {w, 0, st[2]}
  end
  return {w, 0, 0}
end

function sliding_window.elapsed(i, st)
  return now - st[1] * P1[i]
end

-- The smallest elapsed e in [0, W] at which previous * (W - e) + (current + cost) * W <=
-- limit * W, to the ns like the memory store: e (µs) and `less` (ns, 0..999), meaning
-- e * 1000 - less ns; nil when current + cost > limit. floor(room * W * 1000 / previous) is
-- q * 1000 + floor(r * 1000 / previous) with room * W = q * previous + r, so every
-- intermediate stays below 2^53 (the Rust side keeps 2 * limit * W there; r < previous, so
-- r * 1000 too while a count, a debt included, is below 2^43) and is exact.
function sliding_window.earliest(i, previous, current, cost)
  local room = P2[i] - current - cost
  if room < 0 then
    return nil, 0
  end
  if previous == 0 then
    return 0, 0
  end
  local w = P1[i]
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
function sliding_window.budget(i, st)
  local limit, w = P2[i], P1[i]
  local left = w - sliding_window.elapsed(i, st)
  if st[3] > 0 and left > math.floor(limit * w / st[3]) then
    return 0
  end
  return math.floor((limit * w - st[3] * left) / w)
end

-- µs until the state is "absent": the end of the next window while the current one
-- counts, of this one while only the previous does.
function sliding_window.reset(i, st)
  local windows_left = 0
  if st[2] > 0 then
    windows_left = 2
  elseif st[3] > 0 then
    windows_left = 1
  end
  return math.max(windows_left * P1[i] - sliding_window.elapsed(i, st), 0)
end

function sliding_window.store(i, st)
  if st[2] <= 0 and st[3] <= 0 then
    redis.call('DEL', K[i])
  else
    redis.call('SET', K[i],
      string.format('%d:%d:%d%s', st[1], st[2], st[3], text(i, CHARGE_P1)), 'PX',
      px(sliding_window.reset(i, st)))
  end
end

function sliding_window.capacity(i)
  return P2[i]
end

-- code, new state, retry_after µs, and ns to take off retry_after (see `earliest`).
function sliding_window.verdict(i, st)
  local cost, limit, w = COST[i], P2[i], P1[i]
  if cost > limit then
    return CODE_CANNOT_FIT, nil, 0
  end
  if cost == 0 then
    return CODE_ALLOWED, nil, 0
  end
  -- Allowed when previous * (W - elapsed) + (current + n) * W <= limit * W, that is from
  -- the earliest elapsed on (exact whatever the counts, a debt too).
  local elapsed = sliding_window.elapsed(i, st)
  local e, less = sliding_window.earliest(i, st[3], st[2], cost)
  if e and e <= elapsed then
    return CODE_ALLOWED, {st[1], st[2] + cost, st[3]}, 0
  end
  if e then
    return CODE_DENIED, nil, e - elapsed, less
  end
  e, less = sliding_window.earliest(i, st[2], 0, cost)
  if not e then
    e, less = w, 0
  end
  return CODE_DENIED, nil, (w - elapsed) + e, less
end

-- remaining, reset_after µs and hold: the fields change only with time until the window
-- ends or the estimate frees one more whole unit of remaining.
function sliding_window.row(i, st)
  local remaining = math.max(sliding_window.budget(i, st) - st[2], 0)
  local elapsed = sliding_window.elapsed(i, st)
  local hold = P1[i] - elapsed
  local target = remaining + st[2] + 1
  if st[3] > 0 and target <= P2[i] then
    -- The budget reaches `target` when previous * (W - e) <= (limit - target) * W: the
    -- earliest e of a cost of `target` on an empty current window; rounded down to a µs.
    local e, less = sliding_window.earliest(i, st[3], 0, target)
    if e then
      if less > 0 then
        e = e - 1
      end
      hold = math.min(hold, math.max(e - elapsed, 0))
    end
  end
  return remaining, sliding_window.reset(i, st), hold
end

-- The receipt of a charge: the index of the window it counted in.
function sliding_window.receipt(_, st)
  return st[1]
end

-- Gives back COST[i] units of the charge with receipt s: from the current count in the
-- window it counted in, from the previous count in the next one, later nothing.
function sliding_window.give_back(i, s, _, stored)
  local st = sliding_window.current(i, stored(i))
  local cost = COST[i]
  if st[1] == s and st[2] > 0 then
    st = {st[1], math.max(st[2] - cost, 0), st[3]}
  elseif st[1] == s + 1 and st[3] > 0 then
    st = {st[1], st[2], math.max(st[3] - cost, 0)}
  else
    return
  end
  cache[K[i]] = st
  sliding_window.store(i, st)
end

-- Charges COST[i] units at now without refusing: current += cost in the window of now.
function sliding_window.debit(i, st)
  st = sliding_window.current(i, st)
  return {st[1], st[2] + COST[i], st[3]}
end

-- The reset fence of key i: the current window index, live until the next window ends (a
-- refund reaches one window back).
function sliding_window.fence(i)
  local fence = math.floor(now / P1[i])
  return fence, (fence + 2) * P1[i] - now
end
