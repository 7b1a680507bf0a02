-- Sliding window log, the twin of ratekeeper_core::algorithm::SlidingLog (running totals, as
-- the memory store's SlidingLogState), in integer µs. Parameters: P1 = W, the window; P2 =
-- limit. State: a sorted set, one member "<ts>:<units>:<end>" per log entry (end = running
-- total of units through it), scored by its timestamp ts (µs); absent = empty. An entry
-- counts while ts + W > now. The units of the live entries are one subtraction and a
-- denial's entry is a binary search by rank: a check reads O(log e) members, not the whole
-- log. In a call the state is {first = oldest live entry, newest = newest entry, rank = rank
-- of first, count = members, used = live units}; entries are {ts, units, end}.
local sliding_log = {}

function sliding_log.parse(m)
  if not m then
    return nil
  end
  local a, b, c = string.match(m, '^(%d+):(%d+):(%d+)$')
  if a then
    return {tonumber(a), tonumber(b), tonumber(c)}
  end
  return nil
end

function sliding_log.member(e)
  return string.format('%d:%d:%d', e[1], e[2], e[3])
end

function sliding_log.read(i)
  local key, w = K[i], P1[i]
  local parse = sliding_log.parse
  local cut = string.format('%d', now - w)
  local first = parse(redis.call('ZRANGEBYSCORE', key, '(' .. cut, '+inf', 'LIMIT', 0, 1)[1])
  if not first then
    return {used = 0}
  end
  local newest = parse(redis.call('ZRANGE', key, -1, -1)[1])
  -- The oldest live entry's rank: the number of expired members before it.
  local rank = redis.call('ZCOUNT', key, '-inf', cut)
  local count = redis.call('ZCARD', key)
  return {first = first, newest = newest, rank = rank, count = count,
    used = newest[3] - (first[3] - first[2])}
end

-- The log is read whole at now: the state is current as read.
function sliding_log.current(_, st)
  return st
end

-- How long until the entry stamped ts stops counting (at most W: an entry stamped in the
-- future is read as leaving W from now).
function sliding_log.expires_in(i, ts)
  local w = P1[i]
  return math.min(math.max(ts + w - now, 0), w)
end

-- The entry at `rank` (a ZRANGE by rank: O(log e)).
function sliding_log.at(i, rank)
  return sliding_log.parse(redis.call('ZRANGE', K[i], rank, rank)[1])
end

-- Writes the newest entry of a charge: drops the expired members, rewrites the entry
-- stamped e[1], and sets PX to the time until it expires (it is the newest).
function sliding_log.write_newest(i, e)
  local key, w = K[i], P1[i]
  redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now - w))
  local fts = string.format('%d', e[1])
  redis.call('ZREMRANGEBYSCORE', key, fts, fts)
  redis.call('ZADD', key, fts, sliding_log.member(e))
  redis.call('PEXPIRE', key, px(e[1] + w - now))
end

-- A charge always changes (or adds) the newest entry.
function sliding_log.store(i, st)
  if st.newest then
    sliding_log.write_newest(i, st.newest)
  end
end

function sliding_log.capacity(i)
  return P2[i]
end

-- The newest entry after `cost` more units at now: merged into the newest entry when it is
-- live and stamped now or later, else a new entry stamped now.
function sliding_log.grown(st, cost)
  local last = st.newest
  if st.first and last[1] >= now then
    return {last[1], last[2] + cost, last[3] + cost}
  end
  local total = 0
  if last then
    total = last[3]
  end
  return {now, cost, total + cost}
end

-- used = units of the live entries; allowed when used + n <= limit; denied: retry_after =
-- the expiry of the first entry (oldest first) at which the units expired so far reach
-- used + n - limit (a binary search over the running totals).
function sliding_log.verdict(i, st)
  local cost, limit = COST[i], P2[i]
  if cost > limit then
    return CODE_CANNOT_FIT, nil, 0
  end
  if cost == 0 then
    return CODE_ALLOWED, nil, 0
  end
  if cost <= limit - st.used then
    local newest = sliding_log.grown(st, cost)
    local first = st.first or newest
    return CODE_ALLOWED, {first = first, newest = newest, rank = st.rank, count = st.count,
      used = st.used + cost}, 0
  end
  local need = st.used + cost - limit
  local before = st.first[3] - st.first[2]
  local lo, hi = st.rank, st.count - 1
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    local e = sliding_log.at(i, mid)
    if e[3] - before >= need then
      hi = mid
    else
      lo = mid + 1
    end
  end
  local k = sliding_log.at(i, lo) or st.newest
  return CODE_DENIED, nil, sliding_log.expires_in(i, k[1])
end

-- remaining, reset_after µs (until the newest entry expires) and hold (until the oldest
-- live entry expires).
function sliding_log.row(i, st)
  local remaining = math.max(P2[i] - st.used, 0)
  if st.first then
    return remaining, sliding_log.expires_in(i, st.newest[1]),
      sliding_log.expires_in(i, st.first[1])
  end
  return remaining, 0, HOLD_UNBOUNDED
end

-- The receipt of a charge: the timestamp of the entry it added to.
function sliding_log.receipt(_, st)
  return st.newest[1]
end

-- Gives back at most COST[i] units of the entry stamped s, while s + W > now; the running
-- totals of the entries from it on drop by what comes back (O(entries after it), usually
-- none: the refunded charge is mostly the newest).
function sliding_log.give_back(i, s)
  local key, w, parse, member = K[i], P1[i], sliding_log.parse, sliding_log.member
  if s + w <= now then
    return
  end
  local fs = string.format('%d', s)
  local e = parse(redis.call('ZRANGEBYSCORE', key, fs, fs)[1])
  if not e then
    return
  end
  local back = math.min(COST[i], e[2])
  local later = redis.call('ZRANGEBYSCORE', key, '(' .. fs, '+inf')
  redis.call('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now - w))
  redis.call('ZREMRANGEBYSCORE', key, fs, '+inf')
  if e[2] > back then
    redis.call('ZADD', key, fs, member({e[1], e[2] - back, e[3] - back}))
  end
  for _, m in ipairs(later) do
    local x = parse(m)
    if x then
      redis.call('ZADD', key, string.format('%d', x[1]), member({x[1], x[2], x[3] - back}))
    end
  end
  -- Emptying the set deleted the key (and its TTL): PX again from the newest entry left.
  local newest = parse(redis.call('ZRANGE', key, -1, -1)[1])
  if newest then
    redis.call('PEXPIRE', key, px(newest[1] + w - now))
  end
  cache[key] = nil
end

-- Charges COST[i] units at now without refusing: cost units in an entry stamped now (merged
-- into the newest when it is stamped now or later). Written at once; returns nil (the set's
-- ranks changed: it is read again).
function sliding_log.debit(i, st)
  sliding_log.write_newest(i, sliding_log.grown(st, COST[i]))
  cache[K[i]] = nil
  return nil
end

-- The reset fence of key i: max(newest entry's ts, now), live until fence + W.
function sliding_log.fence(i)
  local newest = sliding_log.parse(redis.call('ZRANGE', K[i], -1, -1)[1])
  local fence = now
  if newest then
    fence = math.max(newest[1], now)
  end
  return fence, fence + P1[i] - now
end
