-- renew: extend the lease of the caller's in-flight record.
-- Mirrors idem.ApplyRenew.
--
-- KEYS[1]  record key
-- ARGV[1]  attempt token
-- ARGV[2]  lease, milliseconds, counted from the server's TIME
--
-- Returns 1 when renewed, 0 when no record exists, -1 when the token does
-- not hold an in-flight record.

local cur, answer = held(KEYS[1], ARGV[1])
if not cur then
  return answer
end
if cur[1] ~= 'i' then
  return -1
end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('HSET', KEYS[1], 'l', now + tonumber(ARGV[2]))
return 1
