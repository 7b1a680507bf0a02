-- The fleet registry: every instance of a Redis store registers itself here every
-- 250 ms, so each instance knows how many share the quota (the fail-soft failure policy
-- divides each policy by that number while Redis is unreachable).
--
-- KEYS[1]  the registry, a sorted set: member = instance id, score = expiry (Redis TIME, ms)
-- ARGV[1]  this instance's id
-- ARGV[2]  how long a registration lives without renewal (ms)
--
-- Returns the number of live instances, this one included. Every write sets PX (the
-- registry disappears with its last instance).
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZADD', KEYS[1], now + ttl, ARGV[1])
redis.call('PEXPIRE', KEYS[1], ttl)
return redis.call('ZCARD', KEYS[1])
