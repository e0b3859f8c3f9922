-- mark_unknown: record that the caller's attempt ended with no known outcome.
-- Mirrors idem.ApplyMarkUnknown.
--
-- KEYS[1]  record key
-- ARGV[1]  attempt token
-- ARGV[2]  retention, milliseconds
--
-- Returns 1 when marked (or already unknown), 0 when no record exists, -1
-- when the token does not hold the record or it completed.
-- Publishes on the channel KEYS[1] when a duplicate waits (see watch.lua).

local cur, answer = held(KEYS[1], ARGV[1], 'w')
if not cur then
  return answer
end
if cur[1] == 'u' then
  return 1
end
redis.call('HSET', KEYS[1], 's', 'u')
redis.call('HDEL', KEYS[1], 'l', 'w')
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if cur[3] then
  redis.call('PUBLISH', KEYS[1], 'u')
end
return 1
