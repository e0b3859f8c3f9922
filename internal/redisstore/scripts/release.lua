-- release: delete the caller's record so that a retry runs the operation.
-- Mirrors idem.ApplyRelease: a completed record is never released.
--
-- KEYS[1]  record key
-- ARGV[1]  attempt token
--
-- Returns 1 when deleted, 0 when no record exists, -1 when the token does
-- not hold the record or it completed.
-- Publishes on the channel KEYS[1] when a duplicate waits (see watch.lua).

local cur, answer = held(KEYS[1], ARGV[1], 'w')
if not cur then
  return answer
end
redis.call('DEL', KEYS[1])
if cur[3] then
  redis.call('PUBLISH', KEYS[1], 'r')
end
return 1
