-- ratekeeper shared concurrency slots: one sorted set per (name, client key)
-- whose members are slot ids scored by the expiry of their lease, in Redis TIME ms.
--
-- KEYS[1]  the sorted set "<prefix>:v2:{<client key>}:conc:<name>".
-- ARGV[1]  'acquire', 'renew' or 'release'.
-- ARGV[2]  the slot id (unique per acquisition: instance id and a counter).
-- ARGV[3]  max slots of the key (acquire).
-- ARGV[4]  lease in ms (acquire, renew).
--
-- acquire: drops the expired leases (score <= now), then adds the slot with expiry
--          now + lease when fewer than max are held. Returns {1, held} or {0, held}.
-- renew:   moves the slot's expiry to now + lease if it is still held. {1, held} or
--          {0, held} when the slot already expired (it is not taken back).
-- release: removes the slot. {1, held}.
-- Every write sets PX = lease: no member expires later than now + lease, so the key never
-- outlives its slots and is never left without a TTL (an emptied set is deleted by Redis).
local clock = redis.call('TIME')
local now = tonumber(clock[1]) * 1000 + math.floor(tonumber(clock[2]) / 1000)
local key, op, id = KEYS[1], ARGV[1], ARGV[2]
if op == 'release' then
  redis.call('ZREM', key, id)
  return {1, redis.call('ZCARD', key)}
end
local lease = tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
if op == 'renew' then
  if redis.call('ZSCORE', key, id) then
    redis.call('ZADD', key, 'XX', now + lease, id)
    redis.call('PEXPIRE', key, lease)
    return {1, redis.call('ZCARD', key)}
  end
  return {0, redis.call('ZCARD', key)}
end
local held = redis.call('ZCARD', key)
if held >= tonumber(ARGV[3]) then
  return {0, held}
end
redis.call('ZADD', key, now + lease, id)
redis.call('PEXPIRE', key, lease)
return {1, held + 1}
