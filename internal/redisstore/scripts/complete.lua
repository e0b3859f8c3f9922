-- complete: store the operation's response in the caller's record.
-- Mirrors idem.ApplyComplete: allowed from in flight, and from unknown when
-- the caller's own lease ran out (the upstream did answer after all);
-- repeating it on the completed record is a no-op.
--
-- KEYS[1]  record key
-- ARGV[1]  attempt token
-- ARGV[2]  retention, milliseconds
-- ARGV[3]  response status
-- ARGV[4]  encoded response headers
-- ARGV[5]  response body
-- ARGV[6]  response flags: 1 body not kept, 2 sealed (package seal), or both
--
-- Returns 1 when stored (or already stored by this token), 0 when no record
-- exists, -1 when the token does not hold the record.
-- Publishes on the channel KEYS[1] when a duplicate waits (field w; see
-- watch.lua).

local cur = redis.call('HMGET', KEYS[1], 's', 't', 'w')
if not cur[1] then
  return 0
end
if cur[2] ~= ARGV[1] then
  return -1
end
if cur[1] == 'c' then
  return 1
end
redis.call('HSET', KEYS[1], 's', 'c', 'st', ARGV[3], 'h', ARGV[4], 'b', ARGV[5], 'o', ARGV[6])
redis.call('HDEL', KEYS[1], 'l')
redis.call('PEXPIRE', KEYS[1], ARGV[2])
if cur[3] then
  redis.call('HDEL', KEYS[1], 'w')
  redis.call('PUBLISH', KEYS[1], 'c')
end
return 1
